"""The lexical index: words (lower-cased, stop words dropped, English-stemmed) and Okapi BM25
over whole notes, saved as term counts under .crucible/ so a new process need not rebuild it."""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

import snowballstemmer

_WORD = re.compile(r"[^\W_]+")
_STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it
    its itself just me more most my myself no nor not of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself yourselves
    s t don doesn isn""".split()
)
_stemmer = snowballstemmer.stemmer("english")
_stem_lock = threading.Lock()  # the snowball stemmer object is not thread-safe


@lru_cache(maxsize=200_000)
def _stem(word: str) -> str:
    with _stem_lock:
        return str(_stemmer.stemWord(word))


def tokenize(text: str) -> list[str]:
    """Lower-cased, stop words dropped, English-stemmed words: the lexical index's terms."""
    return [_stem(w) for w in _WORD.findall(text.lower()) if w not in _STOPWORDS]


class Bm25:
    """Okapi BM25 over an inverted index that can add and drop single documents.

    Ours rather than rank-bm25/bm25s: those build a static corpus and must redo the whole of
    it when one note changes, while the watcher updates notes one at a time.
    """

    def __init__(self, k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self._postings: dict[str, dict[str, int]] = {}
        self._doc_terms: dict[str, tuple[str, ...]] = {}
        self._doc_len: dict[str, int] = {}
        self._total_len = 0

    def __len__(self) -> int:
        return len(self._doc_len)

    def __contains__(self, doc_id: str) -> bool:
        return doc_id in self._doc_len

    def add(self, doc_id: str, tokens: Sequence[str]) -> None:
        self.remove(doc_id)
        counts = Counter(tokens)
        for term, n in counts.items():
            self._postings.setdefault(term, {})[doc_id] = n
        self._doc_terms[doc_id] = tuple(counts)
        self._doc_len[doc_id] = len(tokens)
        self._total_len += len(tokens)

    def add_counts(self, doc_id: str, counts: dict[str, int], length: int) -> None:
        """Add a document by its term counts (as saved by `counts`)."""
        self.remove(doc_id)
        for term, n in counts.items():
            self._postings.setdefault(term, {})[doc_id] = n
        self._doc_terms[doc_id] = tuple(counts)
        self._doc_len[doc_id] = length
        self._total_len += length

    def counts(self, doc_id: str) -> dict[str, int]:
        return {t: self._postings[t][doc_id] for t in self._doc_terms.get(doc_id, ())}

    def length(self, doc_id: str) -> int:
        return self._doc_len.get(doc_id, 0)

    def remove(self, doc_id: str) -> None:
        terms = self._doc_terms.pop(doc_id, None)
        if terms is None:
            return
        for term in terms:
            posting = self._postings[term]
            del posting[doc_id]
            if not posting:
                del self._postings[term]
        self._total_len -= self._doc_len.pop(doc_id)

    def idf(self, term: str) -> float:
        n = len(self._doc_len)
        df = len(self._postings.get(term, ()))
        return math.log(1.0 + (n - df + 0.5) / (df + 0.5))

    def search(self, query_tokens: Sequence[str], limit: int) -> list[tuple[str, float]]:
        if not self._doc_len:
            return []
        avg = self._total_len / len(self._doc_len) or 1.0
        k1, b = self.k1, self.b
        scores: dict[str, float] = {}
        for term in set(query_tokens):
            posting = self._postings.get(term)
            if not posting:
                continue
            idf = self.idf(term)
            for doc_id, tf in posting.items():
                norm = k1 * (1.0 - b + b * self._doc_len[doc_id] / avg)
                scores[doc_id] = scores.get(doc_id, 0.0) + idf * tf * (k1 + 1.0) / (tf + norm)
        ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))
        return ranked[:limit]


class LexicalIndex:
    """BM25 over whole notes (title counted twice, then the text of every chunk).

    Saved as JSON under .crucible/ (term counts only, never code: a kiln is not trusted input)
    and tagged with the index generation it matches, so a new process loads it instead of
    re-reading every chunk from Chroma."""

    FORMAT = 1

    def __init__(self) -> None:
        self.bm25 = Bm25()
        self.titles: dict[str, str] = {}

    def set_note(self, path: str, title: str, texts: Iterable[str]) -> None:
        tokens = tokenize(title) * 2
        for text in texts:
            tokens.extend(tokenize(text))
        self.titles[path] = title
        self.bm25.add(path, tokens)

    def drop_note(self, path: str) -> None:
        self.titles.pop(path, None)
        self.bm25.remove(path)

    def search(self, query: str, limit: int) -> list[tuple[str, float]]:
        return self.bm25.search(tokenize(query), limit)

    def to_json(self, tag: str) -> dict[str, Any]:
        return {
            "format": self.FORMAT, "tag": tag,
            "notes": {p: [t, self.bm25.length(p), self.bm25.counts(p)] for p, t in self.titles.items()},
        }

    @classmethod
    def from_json(cls, data: Any, tag: str) -> LexicalIndex | None:
        """The saved index if it is for `tag` and well-formed, else None."""
        if not isinstance(data, dict) or data.get("format") != cls.FORMAT or data.get("tag") != tag:
            return None
        lex = cls()
        try:
            for path, (title, length, counts) in data["notes"].items():
                lex.titles[str(path)] = str(title)
                lex.bm25.add_counts(str(path), {str(t): int(n) for t, n in counts.items()}, int(length))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        return lex
