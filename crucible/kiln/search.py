"""Ranked search over a kiln's index: semantic (the vector store) and hybrid (semantic fused
with the lexical BM25 index). Text and property search, which read the files, are in
`filesearch`; `run_search` dispatches to either.

Every function blocks and returns one `SearchHit` per note, best first, with the note's best
chunk as the snippet and that chunk's heading. Paths are kiln-relative.

How notes are ranked by meaning (measured in bench/search.py on the sample kiln):
a note's score blends its best chunk's cosine similarity with that of its note vector (the
mean of its chunk vectors), because "best chunk" alone lets huge notes win by sheer number of
chunks, and the note vector alone misses a note whose one section answers the query.
The hybrid fuses that ranking with the lexical index's (BM25 over whole notes and over their
sections, `lexical.LexicalIndex.search`) by `fuse`, a convex combination of normalised scores.
recall@5 / MRR@10 of the hybrid: the project's own 50 queries 1.00 / 0.96; 85 written without
a word of the note's title 0.94 / 0.84; 76 written blind 0.99 / 0.90; 120 generated of a word
only one note has and a common one 0.95 / 0.88; 80 camelCase names one note has, typed whole
1.00 / 0.96 (typed as words, "graduation state": 0.60 / 0.42) — so hybrid is the default everywhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

from crucible.errors import CrucibleError
from crucible.kiln.chunking import StoredChunk, chunk_note
from crucible.kiln.filesearch import SNIPPET_CHARS, check_query, property_search, text_search
from crucible.kiln.late_interaction import PIECES_WEIGHT, RERANK_DEPTH, rerank
from crucible.kiln.lexical import counts_of, min_max
from crucible.kiln.notes import read_note
from mcp_bridge.kiln_api import SearchHit

if TYPE_CHECKING:  # this module is imported before chromadb is: a search by words needs none
    from crucible.kiln.index import KilnIndex

SearchMode = Literal["hybrid", "semantic", "text", "property"]
# The default for `cru kiln search` and the agents' `semantic_search` tool: see bench/search.py.
DEFAULT_MODE: SearchMode = "hybrid"

# Weight of the best chunk against the note vector in the semantic score, chosen on the
# project's own query set (bench/search.py --variants): 0.3 until each chunk carried its note's
# description (chunking._context_line), 0.5 since; the hard and blind sets only check it.
CHUNK_WEIGHT = 0.5
# How deep each ranking goes into the fusion, and the weight of meaning against words in it:
# 0.5, the neutral choice, made before any query set was looked at (a convex combination of
# normalised scores beat reciprocal-rank fusion in Bruch et al. 2023, "An Analysis of Fusion
# Functions for Hybrid Retrieval"); on the tuning sets it matched or beat the former RRF.
FUSION_DEPTH = 50
FUSION_ALPHA = 0.5


def meaning_weight(best_similarity: float, related: float | None) -> float:
    """The dense ranking's weight in the fusion for one query: FUSION_ALPHA when the embedder's
    best chunk is at least `related` (its similarity for text clearly about the same thing),
    less in proportion below it, down to 0 at 0 (unrelated text: a query's median similarity to
    the docs kiln's chunks is 0.07). Min-max scaling stretches any dense list to [0, 1], so a
    query the model cannot read (a name, an identifier, a word found in one note: "quokka
    migration", best similarity 0.30) ranked its noise as high as a paraphrase's match and
    pushed the one note with the word below notes about "migration". `related` None (an
    embedder whose similarity scale is not known here: a server's): always FUSION_ALPHA."""
    if related is None:
        return FUSION_ALPHA
    return FUSION_ALPHA * min(1.0, max(0.0, best_similarity) / related)


# ---------------------------------------------------------------------------------------------
# Snippets


def _body(chunk_text: str) -> str:
    """A stored chunk's content without its "Title > Heading" first line."""
    head, sep, rest = chunk_text.partition("\n\n")
    return rest if sep else head


def snippet(text: str, query: str = "", chars: int = SNIPPET_CHARS) -> str:
    """About `chars` of `text` on one line, starting near the first query word it contains."""
    flat = " ".join(text.split())
    if len(flat) <= chars:
        return flat
    start = 0
    words = [w for w in re.findall(r"[^\W_]{3,}", query.lower())]
    lower = flat.lower()
    hits = [i for i in (lower.find(w) for w in words) if i >= 0]
    if hits:
        start = max(0, min(hits) - chars // 4)
        space = flat.rfind(" ", 0, start)
        start = space + 1 if start and space >= 0 else start
    cut = flat[start:start + chars]
    if start + chars < len(flat):
        cut = cut[: cut.rfind(" ")] if " " in cut else cut
        cut += " …"
    return ("… " if start else "") + cut


def _from_chunk(chunk: StoredChunk, score: float, query: str) -> SearchHit:
    return SearchHit(
        path=chunk.path, title=chunk.title or _stem(chunk.path), score=round(score, 4),
        heading=chunk.heading, snippet=snippet(_body(chunk.text), query), line=chunk.line,
    )


def _stem(path: str) -> str:
    return Path(path).stem


# ---------------------------------------------------------------------------------------------
# Semantic


@dataclass
class Dense:
    """A note found by meaning."""

    path: str
    chunk_sim: float | None  # its best chunk's similarity, if one of its chunks was retrieved
    chunk_id: str | None
    note_sim: float | None  # its note vector's similarity


def dense_ranking(
    index: KilnIndex, vector: np.ndarray, depth: int, chunk_weight: float = CHUNK_WEIGHT
) -> list[tuple[Dense, float]]:
    """Notes ranked by meaning: chunk_weight * best chunk + (1 - chunk_weight) * note vector.

    Chunks and note vectors are each retrieved from Chroma; a note found one way gets its other
    similarity exactly (its note vector is fetched) or bounded (a note none of whose chunks
    made the list scores at most the last chunk retrieved)."""
    chunks = index.chroma.query_chunks(vector, max(60, 3 * depth))
    notes = index.chroma.query_notes(vector, max(30, 2 * depth))
    found: dict[str, Dense] = {}
    for chunk_id, path, sim in chunks:  # best first: a note's first chunk is its best
        if path not in found:
            found[path] = Dense(path, sim, chunk_id, None)
    for path, sim in notes:
        found.setdefault(path, Dense(path, None, None, None)).note_sim = sim
    missing = [p for p, d in found.items() if d.note_sim is None]
    for path, vec in index.chroma.note_vectors(missing).items():
        found[path].note_sim = float(np.dot(vec, vector))
    floor = chunks[-1][2] if chunks else 0.0
    ranked = []
    for d in found.values():
        chunk_sim = d.chunk_sim if d.chunk_sim is not None else floor
        ranked.append((d, chunk_weight * chunk_sim + (1.0 - chunk_weight) * (d.note_sim or 0.0)))
    ranked.sort(key=lambda r: (-r[1], r[0].path))
    return ranked[:depth]


def _best_chunks(
    index: KilnIndex, paths: list[str], dense: dict[str, Dense], vector: np.ndarray, query: str
) -> dict[str, StoredChunk]:
    """The snippet chunk of each result: its best retrieved chunk; else, for a note found by its
    note vector, its chunk nearest the query; else (found by words only) its best BM25 chunk."""
    by_id = {d.chunk_id: d.path for p in paths if (d := dense.get(p)) and d.chunk_id}
    out = {by_id[i]: c for i, c in index.chroma.chunks_by_id(list(by_id)).items()}
    by_vector = [p for p in paths if p not in out and p in dense]
    for path, chunks in index.chroma.note_chunks(by_vector, embeddings=True).items():
        scored = [(float(np.dot(c.embedding, vector)), c) for c in chunks if c.embedding is not None]
        if scored:
            out[path] = max(scored, key=lambda s: s[0])[1]
    by_words = [p for p in paths if p not in out]
    # Found by words alone: the chunk with most of the query's words, from the chunks as the
    # index holds them when they are current (reading and chunking the file again cost up to
    # 35 ms for a note of 256 sections: most of a search's slowest answers); else from the file.
    stored = index.chroma.note_chunks(sorted(index.current_on_disk(by_words))) if by_words else {}
    idf = index.query_idf(query) if by_words else {}
    for path in by_words:
        held = stored.get(path)
        best = held[_most_words([c.text for c in held], idf)] if held else _lexical_best_chunk(index, path, idf)
        if best is not None:
            out[path] = best
    return out


class Words(Protocol):
    """What a search by words reads: an open `KilnIndex`, or a `lexical.LexicalView` while the
    index opens."""

    root: Path

    def lexical_search(self, query: str, limit: int) -> list[tuple[str, float]]: ...
    def query_idf(self, query: str) -> dict[str, float]: ...
    def note_title(self, path: str) -> str | None: ...


def _lexical_best_chunk(index: Words, path: str, idf: dict[str, float]) -> StoredChunk | None:
    """The chunk of the note on disk with the most weight of the query's terms (`idf`; its first
    if none): for a note found by its words alone, perhaps not embedded yet."""
    try:
        note = read_note(index.root, path)
    except CrucibleError:  # gone or unreadable since it was indexed
        return None
    chunks = chunk_note(note)
    best = chunks[_most_words([c.text for c in chunks], idf)]
    return StoredChunk(path=path, ordinal=best.ordinal, heading=" > ".join(best.heading_path) or None,
                       line=best.start_line + 1, title=note.title, text=best.text)


def _most_words(texts: list[str], idf: dict[str, float]) -> int:
    """The index of the text with the most weight of the query's terms (the first if none): `idf`,
    the query's terms as a search by words reads them (`Words.query_idf`: a name typed whole or as
    its words apart weighs as the name)."""
    terms = set(idf)
    best, best_score = 0, 0.0
    for i, text in enumerate(texts):
        counts = counts_of(terms, text)
        score = sum(idf[t] * counts[t] / (counts[t] + 1.2) for t in terms if t in counts)
        if score > best_score:
            best, best_score = i, score
    return best


def _hits(
    index: Words, ranked: list[tuple[str, float]], best: dict[str, StoredChunk], query: str
) -> list[SearchHit]:
    """The ranked notes as results, each with its `best` chunk as the snippet."""
    results = []
    for path, score in ranked:
        chunk = best.get(path)
        if chunk is None:  # a note deleted or unreadable since it was indexed
            results.append(SearchHit(path=path, title=index.note_title(path) or _stem(path),
                                     score=round(score, 4), heading=None, snippet=""))
        else:
            results.append(_from_chunk(chunk, score, query))
    return results


def _results(
    index: KilnIndex, ranked: list[tuple[str, float]], dense: dict[str, Dense], vector: np.ndarray,
    query: str,
) -> list[SearchHit]:
    return _hits(index, ranked, _best_chunks(index, [p for p, _ in ranked], dense, vector, query), query)


def semantic_search(index: KilnIndex, query: str, limit: int = 10) -> list[SearchHit]:
    """Notes by meaning (Chroma vectors only)."""
    check_query(query, limit)
    return index.reading(lambda: _semantic(index, query, limit))


def _semantic(index: KilnIndex, query: str, limit: int) -> list[SearchHit]:
    vector = index.embed_query(query)
    ranked = dense_ranking(index, vector, limit)
    dense = {d.path: d for d, _ in ranked}
    return _results(index, [(d.path, score) for d, score in ranked], dense, vector, query)


# ---------------------------------------------------------------------------------------------
# Hybrid


def lexical_ranking(index: Words, query: str, depth: int) -> list[tuple[str, float]]:
    """Notes by their words: BM25 over whole notes and over their sections, averaged."""
    return index.lexical_search(query, depth)


def words_search(words: Words, query: str, limit: int = 10) -> list[SearchHit]:
    """Notes by words alone: what `hybrid_search` answers with no vectors to use (the same
    scores and snippets), without the vector store."""
    check_query(query, limit)
    lexical = lexical_ranking(words, query, max(FUSION_DEPTH, limit))
    top = fuse([], lexical, not_embedded={p for p, _ in lexical})[:limit]
    idf = words.query_idf(query)
    best = {p: c for p, _ in top if (c := _lexical_best_chunk(words, p, idf)) is not None}
    return _hits(words, top, best, query)


def fuse(
    dense: list[tuple[str, float]], lexical: list[tuple[str, float]], *, alpha: float = FUSION_ALPHA,
    not_embedded: set[str] | frozenset[str] = frozenset(),
) -> list[tuple[str, float]]:
    """Convex combination of the two rankings' scores, each min-max normalised over its list:
    alpha * dense + (1 - alpha) * lexical, in [0, 1] (1.0: first in both). A note absent from a
    list scores 0 there, except a note not embedded yet (a partial index): its words stand in
    for its missing vectors, so it is not pushed down for being late."""

    d, lex = min_max(dense), min_max(lexical)
    fused: dict[str, tuple[float, float]] = {}
    for path in d.keys() | lex.keys():
        words = lex.get(path, 0.0)
        meaning = d.get(path, words if path in not_embedded else 0.0)
        # Tied, a note found by the ranking that weighs more comes first: min-max puts each
        # list's last at 0, as if absent, and with the meaning weighed 0 (a name the model cannot
        # read) the last note holding the name tied with every note the model merely returned.
        found = alpha * (path in d) + (1.0 - alpha) * (path in lex)
        fused[path] = (alpha * meaning + (1.0 - alpha) * words, found)
    ranked = sorted(fused.items(), key=lambda kv: (-kv[1][0], -kv[1][1], kv[0]))
    return [(path, score) for path, (score, _) in ranked]


def hybrid_search(index: KilnIndex, query: str, limit: int = 10, *, by_meaning: bool = True) -> list[SearchHit]:
    """Notes by meaning and by words: the dense and BM25 rankings fused (see `fuse`).
    `by_meaning=False`: by words alone (the caller will not wait for the query embedder)."""
    check_query(query, limit)
    return index.reading(lambda: _hybrid(index, query, limit, by_meaning),
                         fallback=lambda: words_search(index, query, limit))


def _hybrid(index: KilnIndex, query: str, limit: int, by_meaning: bool) -> list[SearchHit]:
    depth = max(FUSION_DEPTH, limit)
    ranked: list[tuple[Dense, float]] = []
    pieces: np.ndarray | None = None
    # Lexical first: with no vectors yet (or vectors of another embedder, rebuilt in the
    # background), the words alone answer; what is embedded joins as it comes.
    if by_meaning and not index.needs_rebuild and index.count_notes() > 0:
        vector, pieces = index.embed_query_pieces(query)
        ranked = dense_ranking(index, vector, depth)
    if not ranked:
        return words_search(index, query, limit)
    lexical = lexical_ranking(index, query, depth)
    embedded = index.embedded_paths()
    best = max((d.chunk_sim for d, _ in ranked if d.chunk_sim is not None), default=0.0)
    # An embedder that does not say (a test's stand-in, a server's model) keeps the fixed weight.
    alpha = meaning_weight(best, getattr(index.embedder, "related_similarity", None))
    # An identifier the kiln holds ("--cap-add", "config.toml") is read by the model as its
    # common words: its share of the query is left to the words.
    literal = index.literal_share(query)
    alpha *= 1.0 - literal
    top = fuse([(d.path, score) for d, score in ranked], lexical, alpha=alpha,
               not_embedded={p for p, _ in lexical if p not in embedded})
    if pieces is not None:
        # The first notes compared with the query word piece by word piece (late_interaction).
        head = top[:max(RERANK_DEPTH, limit)]
        top = rerank(head, index.piece_scores(pieces, [p for p, _ in head]),
                     weight=PIECES_WEIGHT * (1.0 - literal)) + top[len(head):]
    dense = {d.path: d for d, _ in ranked}
    return _results(index, top[:limit], dense, vector, query)


def run_search(
    mode: SearchMode, root: Path, index: KilnIndex | None, query: str, limit: int = 10, *,
    regex: bool = False, case_sensitive: bool = False,
) -> list[SearchHit]:
    """One entry point for callers that take a mode (the CLI); text/property need no index."""
    if mode == "text":
        return text_search(root, query, limit, regex=regex, case_sensitive=case_sensitive)
    if mode == "property":
        return property_search(root, query, limit=limit)
    if index is None:
        raise CrucibleError(f"{mode} search needs the index", "cru kiln index")
    if mode == "semantic":
        return semantic_search(index, query, limit)
    return hybrid_search(index, query, limit)


__all__ = [
    "DEFAULT_MODE", "SearchMode", "hybrid_search", "property_search", "run_search",
    "semantic_search", "snippet", "text_search", "words_search",
]
