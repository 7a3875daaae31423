"""Search benchmark on the sample kiln (../shared/kilns/crucible-docs), all in one run:

- quality: recall@5 and MRR@10 of BM25 (baseline), of dense note rankings (best chunk, note
  vector, blends) and of their reciprocal-rank fusions, on bench/queries.json;
- latency: semantic_search and hybrid_search p50/p95 against a raw Chroma query plus the
  query embedding (goal: <= 2x).

    $V/python bench/search.py [--repeat 3]

The kiln is copied into $CRUCIBLE_DEV_CACHE/bench/crucible-docs and its index kept there, so
only the first run embeds the whole kiln.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from index import REPO, SHARED_KILN, Printer, cache_dir, sync_kiln  # noqa: E402  (bench/index.py)

from crucible.config import Config  # noqa: E402
from crucible.kiln import search as S  # noqa: E402
from crucible.kiln.index import KilnIndex  # noqa: E402

QUERIES = Path(__file__).resolve().parent / "queries.json"


def metrics(ranked: list[str], expected: set[str]) -> tuple[float, float]:
    """(hit in the top 5, reciprocal rank of the first expected note within the top 10)."""
    r5 = 1.0 if expected & set(ranked[:5]) else 0.0
    mrr = next((1.0 / (i + 1) for i, p in enumerate(ranked[:10]) if p in expected), 0.0)
    return r5, mrr


def percentiles(samples: list[float]) -> tuple[float, float]:
    xs = sorted(samples)
    p50 = statistics.median(xs)
    p95 = xs[min(len(xs) - 1, int(round(0.95 * (len(xs) - 1))))]
    return p50 * 1000, p95 * 1000


def quality(index: KilnIndex, queries: list[dict[str, Any]], title: str, show_misses: bool) -> None:
    weights = [1.0, 0.7, 0.5, 0.3, 0.0]
    names = ["bm25"] + [f"dense w={w}" for w in weights] + [f"hybrid w={w}" for w in weights]
    names += ["hybrid w=0.3 k=10", "hybrid default", "semantic default"]
    scores: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    misses: dict[str, list[str]] = {"hybrid default": [], "bm25": [], "semantic default": []}
    for q in queries:
        text, expected = q["query"], set(q["expected"])
        vec = index.embed_query(text)
        lexical = [p for p, _ in S.lexical_ranking(index, text, S.FUSION_DEPTH)]
        scores["bm25"].append(metrics(lexical, expected))
        for w in weights:
            dense = [d.path for d, _ in S.dense_ranking(index, vec, S.FUSION_DEPTH, w)]
            scores[f"dense w={w}"].append(metrics(dense, expected))
            fused = [p for p, _ in S.rrf([dense, lexical])]
            scores[f"hybrid w={w}"].append(metrics(fused, expected))
            if w == 0.3:
                scores["hybrid w=0.3 k=10"].append(
                    metrics([p for p, _ in S.rrf([dense, lexical], k=10)], expected))
        for name, fn in (("hybrid default", S.hybrid_search), ("semantic default", S.semantic_search)):
            got = [r.path for r in fn(index, text, 10)]
            scores[name].append(metrics(got, expected))
            if not expected & set(got[:5]):
                misses[name].append(f"{text!r} -> {got[:3]}")
        if not expected & set(lexical[:5]):
            misses["bm25"].append(f"{text!r} -> {lexical[:3]}")
    print(f"\nquality on the {title}: {len(queries)} queries (recall@5, MRR@10):")
    for name in names:
        r5 = statistics.mean(s[0] for s in scores[name])
        mrr = statistics.mean(s[1] for s in scores[name])
        print(f"  {name:22s} recall@5 {r5:.3f}  MRR@10 {mrr:.3f}")
    if show_misses:
        for name, items in misses.items():
            if items:
                print(f"  misses of {name}:")
                for m in items:
                    print(f"    {m}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--repeat", type=int, default=3, help="latency rounds over the query set")
    args = ap.parse_args()
    if not SHARED_KILN.is_dir():
        print(f"the sample kiln ../shared/kilns/{SHARED_KILN.name} is not there")
        return 1
    kiln = cache_dir() / "crucible-docs"
    sync_kiln(SHARED_KILN, kiln)
    index = KilnIndex.open(kiln, Config())
    report = index.update(progress=Printer("index"))
    print(f"index: {index.count_notes()} notes, {index.count_chunks()} chunks "
          f"({report.notes_indexed} notes re-indexed now, {report.elapsed:.1f}s)")
    queries = json.loads(QUERIES.read_text())["queries"]
    print(f"queries: {len(queries)}")
    quality(index, queries, "sample kiln, bench/queries.json", show_misses=True)

    # Held out: the chunk weight and fusion were chosen on the set above; this one (the
    # project's fixture kiln and tests/kiln_core/queries.json) was not looked at for that.
    fixture = cache_dir() / "fixture-kiln"
    sync_kiln(REPO / "fixtures" / "kiln", fixture)
    held = KilnIndex.open(fixture, Config())
    held.update()
    pairs = json.loads((REPO / "tests" / "kiln_core" / "queries.json").read_text())
    quality(held, [{"query": q["query"], "expected": [q["expected"]]} for q in pairs],
            "fixture kiln, tests/kiln_core/queries.json (held out)", show_misses=True)
    held.close()

    # -- latency ----------------------------------------------------------------------------
    collection = index.chunk_collection

    def raw(text: str) -> object:
        vec = index.embed_query(text)
        return collection.query(query_embeddings=[vec], n_results=10,
                                include=["metadatas", "documents", "distances"])

    runs: dict[str, Callable[[str], object]] = {
        "raw chroma + embed": raw,
        "semantic_search": lambda t: S.semantic_search(index, t, 10),
        "hybrid_search": lambda t: S.hybrid_search(index, t, 10),
        "bm25 only": lambda t: S.lexical_ranking(index, t, 10),
    }
    for fn in runs.values():  # warm up: model load, lexical index build
        fn(queries[0]["query"])
    times: dict[str, list[float]] = {n: [] for n in runs}
    for _ in range(args.repeat):
        for q in queries:
            for name, fn in runs.items():  # interleaved, so load affects all alike
                t0 = time.perf_counter()
                fn(q["query"])
                times[name].append(time.perf_counter() - t0)
    base50, base95 = percentiles(times["raw chroma + embed"])
    print(f"\nlatency over {len(times['raw chroma + embed'])} queries (ms):")
    for name, samples in times.items():
        p50, p95 = percentiles(samples)
        print(f"  {name:20s} p50 {p50:7.1f}  p95 {p95:7.1f}   x{p50 / base50:.2f} / x{p95 / base95:.2f}"
              " of raw")
    index.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
