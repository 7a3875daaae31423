"""Index benchmark: full index of the sample kiln and of a generated kiln, then re-index after
one changed note (goal: <= 2% of the full time), and a re-index with nothing changed.

    $V/python bench/index.py                 # sample kiln + a generated 10,000-note kiln
    $V/python bench/index.py --notes 2000    # a smaller generated kiln
    $V/python bench/index.py --skip-generated
    $V/python bench/index.py --modes [--notes 2000] [--seconds 60]
        # `cru mcp` while its index builds in the background, in a worker process, in a thread,
        # and with no build running (the writer lock held by this script): the other calls'
        # latency, the build's progress, the peak RSS of cru mcp (and its worker)
    $V/python bench/index.py --first-answer [--notes 10000]
        # time from spawning `cru mcp` on a kiln never indexed to its first semantic_search answer
    $V/python bench/index.py --first-answer-against REF [--rounds 5] [--notes 10000] [--second-start]
        # the same, this code against the code of git REF (e.g. HEAD~1), alternated, same run;
        # --second-start: on a kiln each code indexed a little before (saved words, 32 notes embedded)
    $V/python bench/index.py --first-answer-indexed 3
        # the same on the embedded sample kiln (the query model loads): graph built vs cached
    $V/python bench/index.py --command-models 2 [--notes 2000] [--with-old]
        # `cru kiln index` with the default embedder (OpenVINO bf16 where the CPU has it) vs
        # onnxruntime fp32 vs the int8 option, alternated; --with-old: and the code before issue 15

Each kiln is copied (or generated) into a temporary folder, so its index starts empty.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# This folder holds mcp.py (a benchmark): keep it off sys.path so `import mcp` finds the SDK.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from crucible.config import Config  # noqa: E402
from crucible.kiln.index import LOCK_FILE, IndexProgress, IndexReport, KilnIndex  # noqa: E402

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

    saved = kiln / ".crucible" / "lexical-kiln.idx"
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


# --- cru mcp while the index builds ---------------------------------------------------------

CRU = str(Path(sys.executable).parent / "cru")
TOPICS = ["lantern harbor", "quartz falcon over the prairie", "glacier river", "violin thunder",
          "compiler kernel", "orchid pepper", "walnut yarn", "beacon jetty"]


def _tree_rss(root_pid: int) -> int:
    """RSS in bytes of a process and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry)
        children.setdefault(int(fields[1]), []).append(pid)
        rss[pid] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [root_pid]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total


def _code_of(base: Path, ref: str) -> tuple[str, Path]:
    """(short commit, folder) of git `ref`'s packages, extracted once under `base`."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", ref], capture_output=True,
                            text=True, check=True).stdout.strip()
    folder = base / f"code-{commit}"
    if not folder.is_dir():
        folder.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "crucible", "acp_host", "mcp_bridge"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return commit, folder


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def idle_against(base: Path, ref: str, rounds: int, seconds: float) -> None:
    """`cru mcp` (this code, and git `ref`'s) on the sample kiln, embedded: once its index is
    ready, the CPU it spends over `seconds` with nothing asked (a session left open all day),
    alternated, same run."""
    import statistics

    import trio
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters

    code = {"this": REPO, ref: _code_of(base, ref)[1]}
    kiln = base / "idle-against"
    sync_kiln(SHARED_KILN, kiln)
    subprocess.run([sys.executable, "-c", FIRST_ANSWER, "kiln", "index", "--kiln", str(kiln)], check=True,
                   cwd=str(base), capture_output=True)

    async def once(pythonpath: Path) -> float:
        env = {**os.environ, "PYTHONPATH": str(pythonpath)}
        params = StdioServerParameters(command=sys.executable, args=["-c", FIRST_ANSWER, "mcp", "--kiln", str(kiln)],
                                       env=env, cwd=str(base))
        async with Client(params, mode="legacy") as c:
            while True:
                r = await c.call_tool("get_kiln_stats", {})
                if (r.structured_content or {}).get("index", {}).get("phase") == "ready":
                    break
                await trio.sleep(0.2)
            await trio.sleep(2)  # the query model's background load, if any, ends
            pid = next(p for p, cmd in _commands() if b"mcp" in cmd and str(kiln).encode() in cmd
                       and FIRST_ANSWER.encode() in cmd)
            before = _cpu_seconds(pid)
            await trio.sleep(seconds)
            return _cpu_seconds(pid) - before

    spent: dict[str, list[float]] = {name: [] for name in code}
    for _ in range(rounds):
        for name, path in code.items():
            spent[name].append(trio.run(once, path))
    print(f"cru mcp idle on the sample kiln, index ready: CPU seconds over {seconds:.0f} s "
          f"({rounds} rounds, alternated):")
    for name, xs in spent.items():
        print(f"  {name:10s} median {statistics.median(xs):.3f}  ({' '.join(f'{x:.3f}' for x in xs)})")


def _commands() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, argv) of every process (from /proc)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                yield int(entry), Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue


def _cru_mcp_pid(kiln: Path) -> int | None:
    for pid, cmd in _commands():
        if b"mcp" in cmd and str(kiln).encode() in cmd and any(c.endswith(b"cru") for c in cmd[:2]):
            return pid
    return None


async def session_run(kiln: Path, mode: str, seconds: float, extra_env: dict[str, str] | None = None,
                      ) -> dict[str, Any]:
    """Spawn `cru mcp` on `kiln`, time its first semantic_search answer, then call tools in turn
    for `seconds` (or until the index is ready), timing each; sample the RSS of its process tree."""
    import trio
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters

    env = {**os.environ, "CRUCIBLE_INDEX_MODE": mode, **(extra_env or {})}
    params = StdioServerParameters(command=CRU, args=["mcp", "--kiln", str(kiln)], env=env)
    times: dict[str, list[float]] = {}
    peak = 0
    out: dict[str, Any] = {"mode": mode}
    started = time.perf_counter()
    async with Client(params, mode="legacy") as c:
        r = await c.call_tool("semantic_search", {"query": "lantern harbor", "limit": 5})
        out["first_answer"] = time.perf_counter() - started
        out["first_index"] = (r.structured_content or {}).get("index")
        pid = _cru_mcp_pid(kiln)
        note = min(p.relative_to(kiln).as_posix() for p in kiln.rglob("*.md"))  # noqa: ASYNC240 - once
        calls: list[tuple[str, dict[str, Any]]] = [
            ("get_kiln_roots", {}),
            ("read_note", {"path": note}),
            ("text_search", {"query": "harbor", "limit": 5}),
            ("semantic_search", {"query": "", "limit": 5}),
        ]
        done = trio.Event()

        async def sample() -> None:
            nonlocal peak
            while not done.is_set() and pid is not None:
                peak = max(peak, _tree_rss(pid))
                with trio.move_on_after(0.5):
                    await done.wait()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample)
            i = 0
            state: dict[str, Any] = {}
            while time.perf_counter() - started < seconds:
                for name, args in calls:
                    if name == "semantic_search":
                        args = {"query": TOPICS[i % len(TOPICS)], "limit": 5}
                    t0 = time.perf_counter()
                    await c.call_tool(name, args)
                    times.setdefault(name, []).append(time.perf_counter() - t0)
                i += 1
                if i % 10 == 0:
                    r = await c.call_tool("get_kiln_stats", {})
                    state = dict((r.structured_content or {}).get("index", {}))
                    if state.get("phase") == "ready":
                        break
            r = await c.call_tool("get_kiln_stats", {})
            state = dict((r.structured_content or {}).get("index", {}))
            done.set()
    out["elapsed"] = time.perf_counter() - started
    out["state"] = state
    out["peak_rss"] = peak
    out["times"] = times
    return out


def _p(samples: list[float], q: float) -> float:
    xs = sorted(samples)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] * 1000 if xs else float("nan")


def modes(base: Path, notes: int, seconds: float) -> None:
    """Thread vs worker process vs no build: the latency of the session's other calls."""
    import fcntl

    import trio

    src = base / f"generated-{notes}"
    if not src.is_dir():
        generate_kiln(src, notes)
    results = []
    for mode in ("none", "thread", "process"):  # none: the lock held here, nothing builds
        kiln = base / f"modes-{mode}"
        shutil.rmtree(kiln, ignore_errors=True)
        shutil.copytree(src, kiln, ignore=shutil.ignore_patterns(".crucible"))
        holder = None
        if mode == "none":  # another writer holds the lock: the session builds nothing
            (kiln / LOCK_FILE).parent.mkdir(parents=True, exist_ok=True)
            holder = open(kiln / LOCK_FILE, "a+")  # noqa: SIM115 - held for the run
            fcntl.flock(holder.fileno(), fcntl.LOCK_EX)
        print(f"modes: {mode} ...", flush=True)
        try:
            result = trio.run(session_run, kiln, "thread" if mode == "none" else mode, seconds)
            results.append({**result, "mode": mode})
        finally:
            if holder is not None:
                holder.close()
    print(f"\ncru mcp on {notes} generated notes, calls in turn for up to {seconds:g}s while the index "
          "builds (ms):")
    for r in results:
        st = r["state"]
        print(f"  {r['mode']:8s} first answer {r['first_answer']:.2f}s; after {r['elapsed']:.0f}s: "
              f"{st.get('phase')} {100 * float(st.get('embedded') or 0):.0f}% embedded; peak RSS "
              f"{r['peak_rss'] / 2**20:.0f} MiB (cru mcp + worker)")
        for name, samples in r["times"].items():
            print(f"      {name:16s} p50 {_p(samples, 0.5):7.1f}  p95 {_p(samples, 0.95):7.1f}  n={len(samples)}")


def first_answer(base: Path, notes: int) -> None:
    import trio

    src = base / f"generated-{notes}"
    if not src.is_dir():
        generate_kiln(src, notes)
    kiln = base / "first-answer"
    shutil.rmtree(kiln, ignore_errors=True)
    shutil.copytree(src, kiln, ignore=shutil.ignore_patterns(".crucible"))
    cold = trio.run(session_run, kiln, "process", 0.0)
    # Again: the lexical index is saved now, and a few notes are embedded (so the search has
    # vectors to use, and the query model to load).
    index = KilnIndex.open(kiln, Config())
    try:
        index.update_paths(sorted(p.relative_to(kiln).as_posix() for p in kiln.rglob("*.md"))[:32])
    finally:
        index.close()
    warm = trio.run(session_run, kiln, "process", 0.0)
    for label, r in (("never indexed", cold), ("second start, a few notes embedded", warm)):
        print(f"first answer on {notes} notes ({label}): {r['first_answer']:.2f}s from spawning cru mcp "
              f"(goal <= 5 s); index {r['first_index']}", flush=True)


FIRST_ANSWER = "import sys; from crucible.cli import main; sys.argv[0] = 'cru'; sys.exit(main())"


def _builders_running() -> bool:
    """Whether an index worker (`python -m crucible.kiln.builder`) of an earlier run is alive."""
    return any(b"crucible.kiln.builder" in cmd for _, cmd in _commands())


# A second start: the lexical index saved and a few notes embedded by the code under test.
SECOND_START = """
import sys
from pathlib import Path
from crucible.config import Config
from crucible.kiln.index import KilnIndex
kiln = Path(sys.argv[1])
index = KilnIndex.open(kiln, Config())
index.update_paths(sorted(p.relative_to(kiln).as_posix() for p in kiln.rglob("*.md"))[:32])
index.close()
"""


def first_answer_against(base: Path, notes: int, ref: str, rounds: int, second_start: bool = False) -> None:
    """`cru mcp` (this code, and the code of git `ref`) on a kiln never indexed (or, with
    `second_start`, indexed by that code a little: see SECOND_START): time from spawning it to
    its first semantic_search answer, alternated, same run."""
    import statistics

    import trio
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters

    src = base / f"generated-{notes}"
    if not src.is_dir():
        generate_kiln(src, notes)
    code = {"this": REPO, ref: _code_of(base, ref)[1]}
    kiln = base / "first-answer-against"

    async def once(pythonpath: Path) -> float:
        env = {**os.environ, "PYTHONPATH": str(pythonpath)}  # before the venv's editable install
        params = StdioServerParameters(command=sys.executable, args=["-c", FIRST_ANSWER, "mcp", "--kiln", str(kiln)],
                                       env=env, cwd=str(base))
        started = time.perf_counter()
        async with Client(params, mode="legacy") as c:
            r = await c.call_tool("semantic_search", {"query": "lantern harbor", "limit": 5})
            took = time.perf_counter() - started
            assert (r.structured_content or {}).get("index", {}).get("notes") == notes, r
        return took

    times: dict[str, list[float]] = {name: [] for name in code}
    for _ in range(rounds):
        for name, path in code.items():
            waited = time.monotonic()  # the last run's worker may outlive its cru mcp briefly
            while _builders_running() and time.monotonic() - waited < 15:
                time.sleep(0.2)
            shutil.rmtree(kiln, ignore_errors=True)
            shutil.copytree(src, kiln, ignore=shutil.ignore_patterns(".crucible"))
            if second_start:
                subprocess.run([sys.executable, "-c", SECOND_START, str(kiln)], check=True, cwd=str(base),
                               env={**os.environ, "PYTHONPATH": str(path)})
            times[name].append(trio.run(once, path))
    state = "on a second start (32 notes embedded)" if second_start else "never indexed"
    print(f"first answer on {notes} notes {state}, from spawning cru mcp (s; {rounds} rounds, alternated):")
    for name, xs in times.items():
        print(f"  {name:10s} median {statistics.median(xs):.2f}  ({' '.join(f'{x:.2f}' for x in xs)})")
    print(f"  this / {ref}: {statistics.median(times['this']) / statistics.median(times[ref]):.2f}x")


def first_answer_indexed(rounds: int) -> None:
    """`cru mcp` on the sample kiln, fully embedded: its first semantic_search loads the query
    model. The embedder's graph built in that process (an empty cache) against read from
    Crucible's cache, alternated, same run."""
    import trio

    kiln = cache_dir() / "crucible-docs"  # bench/search.py's copy, kept embedded
    sync_kiln(SHARED_KILN, kiln)
    index = KilnIndex.open(kiln, Config())
    try:
        index.update()
    finally:
        index.close()
    times: dict[str, list[float]] = {"built": [], "cached": []}
    with tempfile.TemporaryDirectory(prefix="crucible-bench-graph-") as cache:
        for _ in range(rounds):
            for kind in ("built", "cached"):
                if kind == "built":
                    shutil.rmtree(Path(cache) / "crucible", ignore_errors=True)
                r = trio.run(session_run, kiln, "process", 0.0, {"XDG_CACHE_HOME": cache})
                assert r["first_index"] is None or r["first_index"].get("embedded") == 1.0, r["first_index"]
                times[kind].append(r["first_answer"])
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    for kind, t in med.items():
        print(f"first semantic_search from spawning cru mcp, indexed sample kiln, graph {kind}: {t:.2f}s "
              f"(median of {rounds})")
    print(f"cached / built: {med['cached'] / med['built']:.2f}x")


# --- the whole build on a large kiln: today's code vs this one, with a profile -----------------

OLD_COMMIT = "c385176"  # main before issue 15: the index built inside the first search
OLD_BUILD = """
import json, sys, time
from pathlib import Path
from crucible.config import Config
import crucible.kiln.index
from crucible.kiln.index import KilnIndex
assert "old-code" in crucible.kiln.index.__file__, crucible.kiln.index.__file__
index = KilnIndex.open(Path(sys.argv[1]), Config(), rebuild=True)
index.embedder.embed(["warm up"])
t, cpu = time.perf_counter(), time.process_time()
report = index.update()
print(json.dumps({"elapsed": time.perf_counter() - t, "cpu": time.process_time() - cpu,
                  "chunks": report.chunks_embedded}))
index.close()
"""


def _load() -> str:
    return f"load average {os.getloadavg()[0]:.1f}"


class Stages:
    """Busy time per stage of a build (the stages overlap: the pipeline runs them in threads)."""

    def __init__(self) -> None:
        self.busy: dict[str, float] = {}
        self.cpu = 0.0  # CPU seconds of the whole build
        self.lock = __import__("threading").Lock()

    def wrap(self, owner: Any, name: str, label: str) -> None:
        inner = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                with self.lock:
                    self.busy[label] = self.busy.get(label, 0.0) + time.perf_counter() - t0

        setattr(owner, name, timed)


def profiled_build(kiln: Path, config: Config) -> tuple[IndexReport, float, Stages]:
    from crucible.kiln import embedder as E
    from crucible.kiln import index as I
    from crucible.kiln import lexical as L
    from crucible.kiln import store as St

    stages = Stages()
    index = KilnIndex.open(kiln, config, rebuild=True)
    index.embedder.embed(["warm up"])  # the model loads outside the timing, as for the old code
    runtime = E._runtime(index.embedder.threads, index.embedder.int8)  # type: ignore[attr-defined]

    class Timed:
        def __init__(self, inner: Any, method: str, label: str) -> None:
            self.inner = inner
            setattr(self, method, self._timed(getattr(inner, method), label))

        def _timed(self, fn: Any, label: str) -> Any:
            def call(*a: Any, **k: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    with stages.lock:
                        stages.busy[label] = stages.busy.get(label, 0.0) + time.perf_counter() - t0
            return call

    runtime.tokenizer = Timed(runtime.tokenizer, "encode_batch", "embed: tokenize")  # type: ignore[assignment]
    runtime.session = Timed(runtime.session, "run", "embed: onnx")
    stages.wrap(I, "read_note", "read + parse notes")
    stages.wrap(I, "chunk_note", "chunk")
    stages.wrap(I, "_file_hash", "scan: hash files")
    stages.wrap(St.ChromaStore, "stored_vectors", "chroma: read old vectors")
    stages.wrap(St.ChromaStore, "write", "chroma: write rows")
    stages.wrap(L.LexicalIndex, "refresh", "lexical: read + tokenize")
    stages.wrap(I.KilnIndex, "save_lexical", "lexical: save")
    try:
        t0, cpu0 = time.perf_counter(), time.process_time()
        report = index.update()
        wall = time.perf_counter() - t0
        stages.cpu = time.process_time() - cpu0  # every thread of this process
    finally:
        index.close()
    return report, wall, stages


def compare_old(base: Path, notes: int, model: str | None = None) -> None:
    from crucible.config import EmbedderConfig

    config = Config(embedder=EmbedderConfig(model=model)) if model else Config()
    src = base / f"generated-{notes}"
    if not src.is_dir():
        generate_kiln(src, notes)
    old_code = _old_code(base)
    kilns = {}
    for which in ("old", "new"):
        kilns[which] = base / f"compare-{which}"
        shutil.rmtree(kilns[which], ignore_errors=True)
        shutil.copytree(src, kilns[which], ignore=shutil.ignore_patterns(".crucible"))
    print(f"full build of {notes} notes with today's code ({OLD_COMMIT}) ... ({_load()})", flush=True)
    env = {**os.environ, "PYTHONPATH": str(old_code)}
    done = subprocess.run([sys.executable, "-c", OLD_BUILD, str(kilns["old"])], env=env, cwd=old_code,
                          capture_output=True, text=True, check=True)
    old = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"  today's code: {old['elapsed']:.0f}s ({old['cpu']:.0f} CPU s) for {old['chunks']} chunks "
          f"({_load()})", flush=True)
    print(f"full build of {notes} notes with this code (profiled; embedder {model or 'default'}) ...",
          flush=True)
    report, wall, stages = profiled_build(kilns["new"], config)
    # CPU seconds: the steadier figure when other work shares the machine unevenly over the run.
    print(f"  this code: {wall:.0f}s ({stages.cpu:.0f} CPU s) for {report.chunks_embedded} chunks = "
          f"{wall / old['elapsed']:.2f}x today's wall time ({old['elapsed']:.0f}s; goal <= 0.5x), "
          f"{stages.cpu / old['cpu']:.2f}x its CPU time ({_load()})", flush=True)
    print("  busy time per stage (they overlap; % of the wall time):")
    for label, busy in sorted(stages.busy.items(), key=lambda kv: -kv[1]):
        print(f"    {label:28s} {busy:8.1f}s  {100 * busy / wall:5.1f}%")
    index = KilnIndex.open(kilns["new"], config)
    try:
        note = next(iter(sorted(kilns["new"].rglob("*.md"))))
        note.write_text(note.read_text() + "\nOne more paragraph about the lantern in the harbor.\n")
        one = index.update()
    finally:
        index.close()
    print(f"  one changed note: {one.elapsed:.2f}s = {100 * one.elapsed / wall:.2f}% of the full build "
          "(goal <= 2%)", flush=True)


def _old_code(base: Path) -> Path:
    """The package as it was before issue 15 (OLD_COMMIT), extracted once under `base`."""
    old_code = base / f"old-code-{OLD_COMMIT}"
    if not old_code.is_dir():
        old_code.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", OLD_COMMIT, "crucible"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old_code)], input=archive, check=True)
    return old_code


def command_models(base: Path, notes: int, rounds: int, with_old: bool = False, against: str | None = None,
                   models: bool = True) -> None:
    """`cru kiln index` (the command a person types) on copies of a generated kiln, alternated in
    new processes, same run, wall and CPU time: the default embedder (`auto`: OpenVINO in bfloat16
    where the CPU has it), onnxruntime in fp32 (the default before), the int8 option; with
    `with_old`, also the code before issue 15's `cru kiln index` (OLD_COMMIT), the build time the
    issue's "half of today's" is measured against; with `against`, that git ref's `cru kiln
    index` too (its default embedder); without `models`, only the default of this code."""
    import resource

    src = base / f"generated-{notes}"
    if not src.is_dir():
        generate_kiln(src, notes)
    configs = {"fp32 onnxruntime": '[embedder]\nruntime = "onnxruntime"\n',
               "int8 (option)": '[embedder]\nmodel = "all-MiniLM-L6-v2-int8"\n'}
    commands: dict[str, tuple[list[str], dict[str, str]]] = {}
    clean = {k: v for k, v in os.environ.items() if k not in ("CRUCIBLE_CONFIG", "PYTHONPATH")}
    clean["XDG_CONFIG_HOME"] = str(base / "no-config")  # no person's config in the way
    if with_old:
        commands[f"before issue 15 ({OLD_COMMIT})"] = (
            [sys.executable, "-m", "crucible.cli"], {**clean, "PYTHONPATH": str(_old_code(base))})
    if against:
        commands[f"at {against}"] = (
            [sys.executable, "-m", "crucible.cli"], {**clean, "PYTHONPATH": str(_code_of(base, against)[1])})
    commands["default (auto)"] = ([CRU], clean)
    for label, text in configs.items() if models else ():
        config = base / f"{label.split()[0]}.toml"
        config.write_text(text)
        commands[label] = ([CRU], {**clean, "CRUCIBLE_CONFIG": str(config)})
    figures: dict[str, list[tuple[float, float]]] = {label: [] for label in commands}
    for rnd in range(rounds):
        order = list(figures) if rnd % 2 == 0 else list(reversed(figures))
        for label in order:
            kiln = base / "command-models"
            shutil.rmtree(kiln, ignore_errors=True)
            shutil.copytree(src, kiln, ignore=shutil.ignore_patterns(".crucible"))
            command, env = commands[label]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            subprocess.run([*command, "kiln", "index", "--kiln", str(kiln)], env=env, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=base)
            wall = time.perf_counter() - started
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            figures[label].append((wall, cpu))
            print(f"  {label}: {wall:.1f}s wall, {cpu:.1f} CPU s ({_load()})", flush=True)
    best = {label: min(runs) for label, runs in figures.items()}
    ref_label = next(iter(best))  # the code before issue 15 if timed, else this default
    ref = best[ref_label]
    print(f"cru kiln index on {notes} generated notes, best of {rounds} (ratios to {ref_label}):")
    for label, (wall, cpu) in best.items():
        print(f"  {label:26s} {wall:7.1f}s wall {cpu:7.1f} CPU s = {wall / ref[0]:.2f}x wall, "
              f"{cpu / ref[1]:.2f}x CPU")


def show(label: str, what: str, r: IndexReport) -> None:
    print(f"  [{label}] {what}: {r.elapsed:.3f}s, notes indexed {r.notes_indexed} "
          f"unchanged {r.notes_unchanged} removed {r.notes_removed}, chunks embedded "
          f"{r.chunks_embedded} kept {r.chunks_reused}, skipped {len(r.skipped)} "
          f"degraded {len(r.degraded)}", flush=True)


def main() -> int:
    # Stopped (a timeout, kill): leave by an exception, so subprocess.run kills the `cru` it
    # waits for and each MCP client closes its `cru mcp`'s stdin, instead of orphaning them.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--notes", type=int, default=None,
                    help="size of the generated kiln (default 10,000; 2,000 for --modes)")
    ap.add_argument("--skip-shared", action="store_true")
    ap.add_argument("--skip-generated", action="store_true")
    ap.add_argument("--costs-only", metavar="KILN", type=Path,
                    help="only the search costs, on a kiln indexed before (see --keep)")
    ap.add_argument("--keep", action="store_true",
                    help="build in $CRUCIBLE_DEV_CACHE/bench/ and keep the kilns (else a temp dir)")
    ap.add_argument("--modes", action="store_true", help="cru mcp while its index builds: thread vs worker")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long --modes calls tools")
    ap.add_argument("--first-answer", action="store_true", help="cru mcp start -> first search answer")
    ap.add_argument("--first-answer-against", metavar="REF", help="--first-answer, this code vs git REF")
    ap.add_argument("--rounds", type=int, default=5, help="--first-answer-against: rounds")
    ap.add_argument("--second-start", action="store_true",
                    help="--first-answer-against: on a kiln that code indexed a little before")
    ap.add_argument("--idle-against", metavar="REF",
                    help="cru mcp's CPU while idle with its index ready, this code vs git REF (--rounds, --seconds)")
    ap.add_argument("--first-answer-indexed", type=int, metavar="ROUNDS",
                    help="cru mcp on the embedded sample kiln -> first answer, graph built vs cached")
    ap.add_argument("--embedder-model", help="--compare-old: embed with this model (e.g. all-MiniLM-L6-v2-int8)")
    ap.add_argument("--compare-old", action="store_true",
                    help="the whole build, today's code vs this code in one run, with a profile")
    ap.add_argument("--command-models", type=int, metavar="ROUNDS",
                    help="`cru kiln index`: the default embedder vs onnxruntime fp32 vs the int8 option")
    ap.add_argument("--with-old", action="store_true",
                    help="--command-models: also the code before issue 15's `cru kiln index`")
    ap.add_argument("--against", metavar="REF",
                    help="--command-models: also `cru kiln index` of this git ref (e.g. a session's start)")
    ap.add_argument("--default-only", action="store_true",
                    help="--command-models: of this code, only the default embedder")
    args = ap.parse_args()
    if args.command_models:
        base = cache_dir() / "sessions"
        base.mkdir(parents=True, exist_ok=True)
        command_models(base, args.notes or 2000, args.command_models, args.with_old, args.against,
                       models=not args.default_only)
        return 0
    modes_notes = args.notes or 2000
    args.notes = args.notes or 10_000
    if args.first_answer_indexed:
        first_answer_indexed(args.first_answer_indexed)
        return 0
    if args.idle_against:
        base = cache_dir() / "sessions"
        base.mkdir(parents=True, exist_ok=True)
        idle_against(base, args.idle_against, args.rounds, args.seconds)
        return 0
    if args.first_answer_against:
        base = cache_dir() / "sessions"
        base.mkdir(parents=True, exist_ok=True)
        first_answer_against(base, args.notes, args.first_answer_against, args.rounds, args.second_start)
        return 0
    if args.compare_old:
        base = cache_dir() / "sessions"
        base.mkdir(parents=True, exist_ok=True)
        compare_old(base, args.notes, args.embedder_model)
        return 0
    if args.modes or args.first_answer:
        base = cache_dir() / "sessions"
        base.mkdir(parents=True, exist_ok=True)
        if args.first_answer:
            first_answer(base, args.notes)
        if args.modes:
            modes(base, modes_notes, args.seconds)
        return 0
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
