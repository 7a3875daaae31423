"""`cru kiln index | search | info`: thin handlers over kiln.index and kiln.search.

Progress goes to stderr (a prompt-toolkit progress bar on a terminal, plain lines otherwise);
results and summaries go to stdout, as JSON with --json.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from crucible.config import Config, load_config, resolve_kiln
from crucible.errors import CrucibleError
from crucible.kiln.index import STORE_DIR, IndexProgress, IndexReport, KilnIndex
from crucible.kiln.lexical import LexicalView, load_lexical
from crucible.kiln.model_store import ensure_model_for
from crucible.kiln.paths import RESERVED_DIR, iter_markdown, kiln_sizes, reserved_dir
from crucible.kiln.search import DEFAULT_MODE, SearchMode, run_search, words_search
from crucible.kiln.writer_status import build_status, other_cru, stopped_hint, wait_while_stopped
from crucible.terminal import counted, human_size
from mcp_bridge.kiln_api import SearchHit, shown_percent

# Plain progress lines: at most one every this many seconds (plus the first and the last).
PLAIN_EVERY = 2.0


def _setup(args: argparse.Namespace) -> tuple[Path, Config]:
    config = load_config(getattr(args, "config", None))
    root = resolve_kiln(getattr(args, "kiln", None), config)
    return root, config


def _print_json(data: Any) -> None:
    print(json.dumps(data, ensure_ascii=False, indent=2))


# ---------------------------------------------------------------------------------------------
# index


Shows = tuple[Callable[[IndexProgress], None], Callable[[dict[str, Any] | None], bool]]


@contextmanager
def _progress_bar() -> Iterator[Shows]:
    """A prompt-toolkit progress bar on stderr: notes scanned, then chunks embedded (rate, ETA)."""
    # prompt_toolkit (~0.15 s): only a terminal shows the bar
    from prompt_toolkit.output import create_output
    from prompt_toolkit.shortcuts import ProgressBar
    from prompt_toolkit.shortcuts.progress_bar import formatters as f

    fmt = [
        f.Label(suffix=": "), f.Percentage(), f.Text(" "), f.Bar(sym_a="#", sym_b="#", sym_c="."),
        f.Text(" "), f.Progress(), f.Text("  "), f.IterationsPerSecond(), f.Text("/s  eta "),
        f.TimeLeft(),
    ]
    with ProgressBar(title="indexing the kiln", formatters=fmt,
                     output=create_output(stdout=sys.stderr)) as pb:
        counters: dict[str, Any] = {}

        def waiting(status: dict[str, Any] | None) -> bool:
            """Another cru holds the writer lock: show its progress until it is done."""
            status = status or {}
            label = f"waiting for {other_cru(status)}{stopped_hint(status)}"
            c = counters.get("wait") or counters.setdefault(
                "wait", pb(label=label, total=int(status.get("notes_total") or 0) or None))
            if status.get("notes_total"):
                c.total = int(status["notes_total"])
            c.items_completed = int(status.get("notes_done") or 0)
            pb.invalidate()
            return True

        def show(p: IndexProgress) -> None:
            if p.phase == "scan":
                c = counters.get("scan") or counters.setdefault("scan", pb(label="notes", total=p.notes_total))
                c.items_completed = p.notes_done
            else:
                scan = counters.get("scan")
                if scan is not None and not scan.done:
                    scan.items_completed = scan.total or 0
                    scan.done = True
                c = counters.get("embed") or counters.setdefault(
                    "embed", pb(label="chunks", total=p.chunks_total)
                )
                c.total = p.chunks_total
                c.items_completed = p.chunks_done
            pb.invalidate()

        yield show, waiting
        for c in counters.values():
            if c.total is not None:
                c.items_completed = c.total
            c.done = True


@contextmanager
def _progress_lines() -> Iterator[Shows]:
    """Plain progress lines on stderr, for logs and pipes."""
    state: dict[str, float] = {"last": 0.0, "embed_start": time.monotonic()}

    def show(p: IndexProgress) -> None:
        now = time.monotonic()
        if p.phase == "scan":
            state["embed_start"] = now  # embedding starts when scanning ends
        final = (p.phase == "embed" and p.chunks_done >= p.chunks_total) or (
            p.phase == "scan" and p.notes_done + 1 >= p.notes_total
        )
        if now - state["last"] < PLAIN_EVERY and not final:
            return
        state["last"] = now
        if p.phase == "scan":
            line = f"index: scanned {min(p.notes_done + 1, p.notes_total)}/{p.notes_total} notes"
        else:
            spent = now - state["embed_start"]
            rate = p.chunks_done / spent if spent > 0 else 0.0
            eta = (p.chunks_total - p.chunks_done) / rate if rate > 0 else 0.0
            line = (f"index: embedded {p.chunks_done}/{p.chunks_total} chunks "
                    f"({rate:.1f}/s, eta {eta:.0f}s)")
        print(line, file=sys.stderr, flush=True)

    def waiting(status: dict[str, Any] | None) -> bool:
        now = time.monotonic()
        if now - state["last"] >= PLAIN_EVERY:
            state["last"] = now
            status = status or {}
            done = (f": {status['notes_done']}/{status['notes_total']} notes"
                    if status.get("notes_total") else "")
            print(f"index: waiting for {other_cru(status)} that is updating "
                  f"this kiln's index{done}{stopped_hint(status)}", file=sys.stderr, flush=True)
        return True

    yield show, waiting


def _summary(report: IndexReport, index: KilnIndex) -> str:
    lines = []
    if report.rebuilt:
        lines.append(f"rebuilt the index: {report.rebuilt}")
    lines.append(
        f"indexed {report.notes_indexed} notes ({report.chunks_embedded} chunks embedded, "
        f"{report.chunks_reused} kept), {report.notes_unchanged} unchanged, "
        f"{report.notes_removed} removed, in {report.elapsed:.1f}s"
    )
    engine = getattr(index.embedder, "engine", None)  # the built-in model's runtime
    lines.append(f"index: {index.store} ({index.embedder.name}{f' on {engine}' if engine else ''})")
    for label, items in (("skipped", report.skipped), ("indexed with problems", report.degraded)):
        if items:
            lines.append(f"{label} ({len(items)}):")
            lines.extend(f"  {path}: {reason}" for path, reason in items)
    return "\n".join(lines)


def cmd_index(args: argparse.Namespace) -> int:
    root, config = _setup(args)
    rebuild = bool(getattr(args, "rebuild", False))
    ensure_model_for(config.embedder.provider)  # an installed cru fetches its weights once
    progress = _progress_bar if sys.stderr.isatty() else _progress_lines
    index: KilnIndex | None = None
    try:
        with progress() as (show, waiting):
            # One writer per kiln: a session indexing in the background (or another `cru kiln
            # index`) is waited for, with its progress shown; then this one runs. Waited for
            # before the store is opened too: opening waits in silence on Chroma's database
            # while the other writes to it (a writer paused mid-write kept this command quiet).
            while (status := build_status(root)) is not None and waiting(status):
                time.sleep(0.5)
            index = KilnIndex.open(root, config, rebuild=rebuild)
            report = index.update(progress=show, rebuild=rebuild, wait=waiting)
        index.warm_lexical()  # saved under .crucible/: the next search needs no rebuild
        if args.json:
            _print_json(report.to_json())
        else:
            print(_summary(report, index))
    finally:
        if index is not None:
            index.close()
    return 0


# ---------------------------------------------------------------------------------------------
# search


def _format_result(n: int, r: SearchHit) -> str:
    head = f"{n}. {r.path}"
    if r.title and r.title != Path(r.path).stem:
        head += f" — {r.title}"
    head += f"  ({r.score:g})"
    lines = [head]
    where = " > ".join(x for x in (r.heading,) if x)
    if r.line is not None:
        where = f"{where}  (line {r.line})" if where else f"line {r.line}"
    if where:
        lines.append(f"   § {where}")
    if r.matches and len(r.matches) > 1:
        lines.extend(f"   {m.line}: {m.text}" for m in r.matches[:5])
    elif r.snippet:
        lines.append(f"   {r.snippet}")
    return "\n".join(lines)


def cmd_search(args: argparse.Namespace) -> int:
    root, config = _setup(args)
    mode: SearchMode = args.mode or ("text" if getattr(args, "regex", False) else DEFAULT_MODE)
    index: KilnIndex | None = None
    share: dict[str, Any] | None = None
    try:
        if mode == "hybrid" and _no_index(root, config):
            results, share = _search_by_words(root, config, args.query, args.limit)
            _print_results(args, results, share)
            return 0
        if mode in ("semantic", "hybrid"):
            try:
                index = _open_existing(root, config)
            except CrucibleError as exc:
                # A store that cannot be opened (damaged, a link inside it, its server down): the
                # words still answer, with the problem and its fix; not a `.crucible` that is a
                # link (the saved words would be read through it).
                if mode == "semantic" or (root / RESERVED_DIR).is_symlink():
                    raise
                results, share = _search_by_words(root, config, args.query, args.limit, problem=exc)
                _print_results(args, results, share)
                return 0
            if index.count_notes() == 0:
                if next(iter_markdown(root), None) is None:  # indexed, and nothing to index
                    raise CrucibleError("the kiln has no notes: no markdown (.md) file in it",
                                        "add notes, or point --kiln (or $CRUCIBLE_KILN, or `kiln =` in the config) "
                                        "at the folder that holds yours")
                raise CrucibleError("the kiln's index is empty", "cru kiln index")
        results = run_search(
            mode, root, index, args.query, args.limit,
            regex=getattr(args, "regex", False), case_sensitive=getattr(args, "case_sensitive", False),
        )
        if index is not None:
            share = _searched_share(index)
    finally:
        if index is not None:
            index.close()
    _print_results(args, results, share)
    return 0


def _print_results(args: argparse.Namespace, results: list[SearchHit], share: dict[str, Any] | None) -> None:
    if args.json:
        _print_json({"results": [r.to_json() for r in results], **({"index": share} if share else {})})
    elif not results:
        print("no results", file=sys.stderr)
    else:
        print("\n\n".join(_format_result(i + 1, r) for i, r in enumerate(results)))


def _no_index(root: Path, config: Config) -> bool:
    """The kiln has no index at all (an embedded store never made; not a damaged one)."""
    return not config.index.url and not (root / RESERVED_DIR).is_symlink() and not (root / STORE_DIR).is_dir()


def _search_by_words(
    root: Path, config: Config, query: str, limit: int, problem: CrucibleError | None = None
) -> tuple[list[SearchHit], dict[str, Any]]:
    """A kiln never indexed, or whose index cannot be opened (`problem`): its notes by their
    words (those a session saved, brought up to date, else read now: seconds for 10,000
    notes), kept in memory only (a search writes nothing into the kiln), as `semantic_search`
    answers before the index is built; a line on stderr says so. Read as a first build reads
    them: one search needs no links or postings."""
    lexical, _ = load_lexical(root, config.index.collection, deferred=True)
    results = words_search(LexicalView(root, lexical, threading.RLock()), query, limit)
    if problem is None:
        print("index: the kiln has no index yet: the results are matched by their words only "
              "(`cru kiln index` builds it, to search by meaning)", file=sys.stderr)
        return results, {"embedded": 0.0, "notes": len(lexical)}
    fix = f" (fix: {problem.fix})" if problem.fix else ""
    print(f"index: {problem.message}: the results are matched by their words only{fix}", file=sys.stderr)
    return results, {"embedded": 0.0, "notes": len(lexical), "problem": problem.message,
                     **({"fix": problem.fix} if problem.fix else {})}


def _searched_share(index: KilnIndex) -> dict[str, Any]:
    """How much of the kiln was searched by meaning (as `semantic_search` says it), and a line on
    stderr when not all of it was: results by words alone are not what the person asked for."""
    embedded, notes = index.embedded_share()
    reason = index.needs_rebuild  # only hybrid gets here with one: semantic refuses it
    if reason:
        embedded = 0
        print(f"index: {reason}: `cru kiln index` rebuilds it; until then the results are matched by "
              "their words only", file=sys.stderr)
    elif embedded < notes:
        print(f"index: {embedded} of the kiln's {notes} notes are embedded; the rest were matched by "
              "their words only (`cru kiln index` embeds them)", file=sys.stderr)
    return {"embedded": round(embedded / notes, 4) if notes else 1.0, "notes": notes}


def _open_existing(root: Path, config: Config) -> KilnIndex:
    """Open the index without creating an embedded store in a kiln that has none."""
    if (root / RESERVED_DIR).is_symlink():
        reserved_dir(root)  # refuses it with the fix: not "no index yet", then that at the index
    if _no_index(root, config):
        raise CrucibleError("the kiln has no index yet", "cru kiln index")
    if not config.index.url:
        _wait_while_the_writer_is_stopped(root)
    return KilnIndex.open(root, config)


def _wait_while_the_writer_is_stopped(root: Path) -> None:
    """Say once whom the opening would wait for, and wait here, where Ctrl-C works."""
    said = False

    def wait(status: dict[str, Any]) -> bool:
        nonlocal said
        if not said:
            print(f"index: waiting for {other_cru(status)} that is writing this kiln's index"
                  f"{stopped_hint(status)}", file=sys.stderr, flush=True)
            said = True
        time.sleep(0.5)
        return True

    wait_while_stopped(root, wait)


# ---------------------------------------------------------------------------------------------
# info


def kiln_stats(root: Path) -> dict[str, Any]:
    sizes = kiln_sizes(root)
    return {"name": root.name, "total_files": sizes.files, "markdown_files": sizes.markdown_files,
            "total_size_bytes": sizes.total_bytes, "links_not_followed": sizes.unfollowed}


def cmd_info(args: argparse.Namespace) -> int:
    root, config = _setup(args)
    info = kiln_stats(root)
    index_info: dict[str, Any]
    try:
        index = _open_existing(root, config)
    except CrucibleError as exc:
        index_info = {"status": "none" if _no_index(root, config) else "unusable", "problem": exc.message,
                      "fix": exc.fix}
    else:
        try:
            status = index.status()
            embedded, notes = index.embedded_share()
        except CrucibleError as exc:
            index_info = {"status": "unusable", "problem": exc.message, "fix": exc.fix}
        else:
            index_info = {"status": "needs rebuild" if status.needs_rebuild else
                          ("stale" if status.stale else "up to date"), **status.model_dump(),
                          "embedded": round(embedded / notes, 4) if notes else 1.0,
                          "building": build_status(root)}
        finally:
            index.close()
    info["index"] = index_info
    if args.json:
        _print_json(info)
        return 0
    print(f"kiln: {info['name']}")
    print(f"files: {info['total_files']} ({info['markdown_files']} markdown), "
          f"{info['total_size_bytes']} bytes")
    if info["links_not_followed"]:
        n = info["links_not_followed"]
        print(f"  {n} {'link is' if n == 1 else 'links are'} not followed (to a folder, out of the kiln, "
              "or broken): `cru kiln index` lists them")
    if index_info["status"] in ("none", "unusable"):
        print(f"index: {index_info['problem']} (fix: {index_info['fix']})")
    else:
        # While another cru updates it, "stale" is what a build looks like from outside: say so.
        word = "being updated" if index_info["building"] is not None else index_info["status"]
        print(f"index: {word}: {index_info['notes']} notes, {index_info['chunks']} "
              f"chunks, embedder {index_info['embedder']}, store {index_info['store']}")
        if index_info["word_pieces_problem"] is not None:
            print(f"  word pieces: not kept: {index_info['word_pieces_problem']}")
        elif index_info["word_pieces"] is not None:
            print(f"  word pieces: {counted(index_info['word_pieces'], 'note')}, "
                  f"{human_size(index_info['word_pieces_bytes'])} (`[index] word_pieces = false` turns them off)")
        if index_info["embedded"] < 1.0:
            print(f"  embedded: {shown_percent(index_info['embedded'])}% of the kiln's notes (the others are found "
                  "by their words only until they are)")
        building = index_info["building"]
        if building is not None:
            done = (f": {building['notes_done']}/{building['notes_total']} notes"
                    if building.get("notes_total") else "")
            print(f"  being updated now by {other_cru(building)}{done}")
        if index_info["stale"]:
            stale = index_info["stale"]
            print(f"  {stale} {'note is' if stale == 1 else 'notes are'} not up to date in the index (new, "
                  "changed or deleted since, or not reached by a build that was stopped): cru kiln index")
        if index_info["needs_rebuild"]:
            print(f"  {index_info['needs_rebuild']}: cru kiln index")
    return 0
