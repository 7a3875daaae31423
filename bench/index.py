"""Index benchmark: full index of the sample kiln and of a generated kiln, then re-index after
one changed note (goal: <= 2% of the full time), and a re-index with nothing changed.

    $V/python bench/index.py                 # sample kiln + a generated 10,000-note kiln
    $V/python bench/index.py --notes 2000    # a smaller generated kiln
    $V/python bench/index.py --skip-generated

Each kiln is copied (or generated) into a temporary folder, so its index starts empty.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from crucible.config import Config
from crucible.kiln.index import IndexProgress, IndexReport, KilnIndex

REPO = Path(__file__).resolve().parent.parent
SHARED_KILN = REPO.parent / "shared" / "kilns" / "crucible-docs"


def cache_dir() -> Path:
    base = os.environ.get("CRUCIBLE_DEV_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "crucible-dev"
    )
    return Path(base) / "bench"


def sync_kiln(src: Path, dst: Path) -> None:
    """Make `dst` hold exactly `src`'s files (its own .crucible/ kept), copying only what
    differs, so an index cached in `dst` stays valid across runs."""
    dst.mkdir(parents=True, exist_ok=True)
    wanted: set[str] = set()
    for path in src.rglob("*"):
        rel = path.relative_to(src).as_posix()
        if rel.startswith(".crucible") or not path.is_file():
            continue
        wanted.add(rel)
        target = dst / rel
        if not target.is_file() or target.read_bytes() != path.read_bytes():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    for path in sorted(dst.rglob("*"), reverse=True):
        rel = path.relative_to(dst).as_posix()
        if rel.startswith(".crucible"):
            continue
        if path.is_file() and rel not in wanted:
            path.unlink()


class Printer:
    """Progress lines every few seconds."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.last = 0.0
        self.start = time.perf_counter()

    def __call__(self, p: IndexProgress) -> None:
        now = time.perf_counter()
        if now - self.last < 5:
            return
        self.last = now
        spent = now - self.start
        if p.phase == "scan":
            print(f"  [{self.label}] {spent:6.1f}s scanned {p.notes_done}/{p.notes_total} notes",
                  flush=True)
        else:
            print(f"  [{self.label}] {spent:6.1f}s embedded {p.chunks_done}/{p.chunks_total} chunks",
                  flush=True)


WORDS = """garden river mountain compiler kernel planet recipe violin harbor lantern orbit
protocol archive meadow glacier circuit novel thunder pixel canyon ledger beacon quartz falcon
prairie cipher galaxy harvest island jungle kettle lagoon marble nebula oasis paddle quiver
rhythm saddle timber umbrella valley walnut yonder zephyr anchor bridge candle dragon ember
forest granite horizon ivory jasmine kayak lemon magnet needle orchid pepper quill ribbon
summit tunnel velvet whistle yarn zenith atlas bamboo cobalt dune echo fjord geyser hollow
indigo jetty kiln lotus mosaic nectar opal prism quarry relic sonnet tide utopia vortex
willow xenon yeast zinc""".split()


def generate_kiln(folder: Path, n: int, seed: int = 7) -> None:
    """`n` notes in 100-note folders: frontmatter, a title, two or three sections of prose
    made of a fixed vocabulary, wikilinks to other notes and tags (deterministic)."""
    rng = random.Random(seed)

    def sentence() -> str:
        words = rng.choices(WORDS, k=rng.randint(8, 16))
        return " ".join(words).capitalize() + "."

    for i in range(n):
        sub = folder / f"area-{i // 100:03d}"
        sub.mkdir(parents=True, exist_ok=True)
        topic = " ".join(rng.sample(WORDS, 2))
        links = " ".join(f"[[note-{rng.randrange(n):05d}]]" for _ in range(3))
        sections = []
        for h in range(rng.randint(2, 3)):
            para = " ".join(sentence() for _ in range(rng.randint(2, 4)))
            sections.append(f"## Part {h + 1}: {rng.choice(WORDS)}\n\n{para}")
        text = (
            f"---\ntags: [{rng.choice(WORDS)}, generated]\nstatus: {rng.choice(['draft', 'done'])}\n---\n"
            f"# Note {i}: {topic}\n\n{sentence()} See {links}.\n\n" + "\n\n".join(sections) + "\n"
        )
        (sub / f"note-{i:05d}.md").write_text(text)


def run(label: str, kiln: Path, change: str) -> dict[str, float]:
    config = Config()
    index = KilnIndex.open(kiln, config, rebuild=True)
    try:
        print(f"{label}: full index ...", flush=True)
        full = index.update(progress=Printer(label))
        show(label, "full", full)
        nothing = index.update()
        show(label, "no change", nothing)
        note = kiln / change
        note.write_text(note.read_text() + "\nOne more paragraph about the lantern in the harbor.\n")
        one = index.update()
        show(label, "1 changed", one)
        status = index.status()
    finally:
        index.close()
    search_costs(label, kiln)
    ratio = one.elapsed / full.elapsed if full.elapsed else float("nan")
    print(f"{label}: {status.notes} notes, {status.chunks} chunks; full {full.elapsed:.1f}s "
          f"({full.chunks_embedded / full.elapsed:.1f} chunks/s); one changed note "
          f"{one.elapsed:.3f}s = {100 * ratio:.2f}% of full (goal <= 2%); "
          f"no change {nothing.elapsed:.3f}s", flush=True)
    return {"full": full.elapsed, "one": one.elapsed, "nothing": nothing.elapsed, "ratio": ratio}


def search_costs(label: str, kiln: Path) -> None:
    """What a new process pays before its first search on this kiln, and per search after."""
    from crucible.kiln.filesearch import property_search, text_search
    from crucible.kiln.search import hybrid_search

    def timed(fn: Callable[[], object]) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def first_search() -> tuple[float, float, float]:
        index = KilnIndex.open(kiln, Config())
        try:
            index.embed_query("warm up the model")
            bm25 = timed(lambda: index.lexical_search("warm", 1))
            first = timed(lambda: hybrid_search(index, "lantern harbor at night", 10))
            again = timed(lambda: hybrid_search(index, "quartz falcon over the prairie", 10))
        finally:
            index.close()
        return bm25, first, again

    saved = kiln / ".crucible" / "lexical-kiln.json"
    saved.unlink(missing_ok=True)
    built, first, again = first_search()  # builds the BM25 index from Chroma, saves it
    loaded, _, _ = first_search()  # loads the saved one
    # Queries that match nothing, so every note is read (cold: from disk; warm: from the cache).
    text1 = timed(lambda: text_search(kiln, "no such words anywhere", 10))
    text2 = timed(lambda: text_search(kiln, "no such words anywhere", 10))
    (kiln / ".crucible" / "properties.json").unlink(missing_ok=True)
    prop1 = timed(lambda: property_search(kiln, "status:unheard-of", limit=10))
    prop2 = timed(lambda: property_search(kiln, "status:unheard-of", limit=10))
    import crucible.kiln.filesearch as search_mod  # a new process: only the saved properties left

    search_mod._stores.clear()
    search_mod._cache = search_mod._NoteCache()
    prop3 = timed(lambda: property_search(kiln, "status:unheard-of", limit=10))
    print(f"{label}: BM25 index in a new process: built from Chroma {built:.2f}s, loaded from "
          f".crucible/ {loaded:.2f}s ({saved.stat().st_size // 1024} KiB); hybrid search "
          f"{first * 1000:.0f} ms then {again * 1000:.0f} ms; text search {text1:.2f}s cold, "
          f"{text2:.2f}s warm; property search {prop1:.2f}s cold, {prop2:.2f}s warm, "
          f"{prop3:.2f}s in a new process", flush=True)


def show(label: str, what: str, r: IndexReport) -> None:
    print(f"  [{label}] {what}: {r.elapsed:.3f}s, notes indexed {r.notes_indexed} "
          f"unchanged {r.notes_unchanged} removed {r.notes_removed}, chunks embedded "
          f"{r.chunks_embedded} kept {r.chunks_reused}, skipped {len(r.skipped)} "
          f"degraded {len(r.degraded)}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--notes", type=int, default=10_000, help="size of the generated kiln")
    ap.add_argument("--skip-shared", action="store_true")
    ap.add_argument("--skip-generated", action="store_true")
    ap.add_argument("--costs-only", metavar="KILN", type=Path,
                    help="only the search costs, on a kiln indexed before (see --keep)")
    ap.add_argument("--keep", action="store_true",
                    help="build in $CRUCIBLE_DEV_CACHE/bench/ and keep the kilns (else a temp dir)")
    args = ap.parse_args()
    if args.costs_only:
        search_costs(args.costs_only.name, args.costs_only)
        return 0
    with tempfile.TemporaryDirectory(prefix="crucible-bench-index-") as tmp_dir:
        tmp = str(cache_dir() / "index-kilns") if args.keep else tmp_dir
        if args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        if not args.skip_shared:
            if SHARED_KILN.is_dir():
                kiln = Path(tmp) / "crucible-docs"
                sync_kiln(SHARED_KILN, kiln)
                run("sample kiln", kiln, "Help/Wikilinks.md")
            else:
                print(f"sample kiln not found at ../shared/kilns/{SHARED_KILN.name}: skipped")
        if not args.skip_generated:
            kiln = Path(tmp) / "generated"
            started = time.perf_counter()
            generate_kiln(kiln, args.notes)
            print(f"generated {args.notes} notes in {time.perf_counter() - started:.1f}s")
            run(f"generated {args.notes}", kiln, "area-000/note-00042.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
