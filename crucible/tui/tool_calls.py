"""Tool calls as the transcript draws them: the call's title, kind and status, then its diffs,
terminal output or result (a kiln tool as `kiln_lines` reads it: its hits, its note's diff),
each part cut at SECTION_LINES unless expanded; `ToolEntry` is a call's entry, redrawn as the
call changes. The permission dialog draws its diffs and arguments with these functions too."""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

from crucible.events import content_text
from crucible.kiln_calls import (
    SEARCH_TOOLS,
    WRITE_TOOLS,
    BridgeCall,
    ProposedWrite,
    bridge_call,
    bridge_source,
    call_arguments,
    search_result,
    summary_line,
)
from crucible.terminal import sanitize, sanitize_line
from crucible.tui.markdown import Fragments
from crucible.tui.transcript import BlockEntry

if TYPE_CHECKING:
    from crucible.tui.feed import Feed

SECTION_LINES = 40  # of a tool call's diff / input / output shown in the transcript (Ctrl-E: all)
EXPAND_KEY = "Ctrl-E"

_STATUS_STYLE = {"completed": "class:tool.ok", "failed": "class:tool.failed", "in_progress": "class:tool.running",
                 "pending": "class:tool.pending"}


def _capped(lines: list[Fragments], limit: int | None = SECTION_LINES) -> list[Fragments]:
    if limit is None or len(lines) <= limit:
        return lines
    return lines[:limit] + [[("class:dim", f"  … {len(lines) - limit} more lines ({EXPAND_KEY} shows all)")]]


def display_path(path: str, cwd: Path | None = None) -> str:
    """A diff's path as the person reads it: relative to the session's folder when inside it."""
    if cwd is not None and path.startswith("/"):
        try:
            return PurePath(path).relative_to(cwd).as_posix()
        except ValueError:
            pass
    return path


def diff_lines(diff: dict[str, Any], limit: int | None = SECTION_LINES, cwd: Path | None = None) -> list[Fragments]:
    """A diff content block as red/green unified-diff lines (`a/`, `b/` before a relative path;
    an absolute one is shown as it is)."""
    old = diff.get("oldText") or ""
    new = diff.get("newText") or ""
    path = sanitize(display_path(str(diff.get("path", "")), cwd))
    prefix_a, prefix_b = ("", "") if path.startswith("/") else ("a/", "b/")
    out: list[Fragments] = []
    for line in difflib.unified_diff(str(old).splitlines(), str(new).splitlines(), fromfile=prefix_a + path,
                                     tofile=prefix_b + path, lineterm="", n=2):
        line = sanitize(line)
        if line.startswith(("+++", "---")):
            style = "class:diff.file"
        elif line.startswith("+"):
            style = "class:diff.add"
        elif line.startswith("-"):
            style = "class:diff.del"
        elif line.startswith("@@"):
            style = "class:diff.hunk"
        else:
            style = "class:diff.ctx"
        out.append([(style, "  " + line)])
    if not out:
        out.append([("class:dim", f"  {path}: no changes")])
    return _capped(out, limit)


def text_block_lines(text: str, style: str = "class:tool.output", indent: str = "  ",
                     limit: int | None = SECTION_LINES) -> list[Fragments]:
    lines = sanitize(text).split("\n")
    return _capped([[(style, indent + line)] for line in lines], limit)


def pretty(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def write_lines(write: ProposedWrite, limit: int | None = SECTION_LINES) -> list[Fragments]:
    """A note write as a diff against the note (a new note: all of it added)."""
    return diff_lines({"path": write.path, "oldText": write.old, "newText": write.new}, limit)


def kiln_lines(bridge: BridgeCall, call: Any, write: ProposedWrite | None, limit: int | None) -> list[Fragments] | None:
    """A bridge tool's body as a person wants it, or None to show its raw result."""
    status = call.status or "pending"
    if bridge.name in SEARCH_TOOLS:
        found = search_result(call)
        if found is None:
            return [] if status not in ("completed", "failed") else None
        hits, total, notice = found
        lines: list[Fragments] = [[("class:tool.output", "  "), ("class:tool.path", sanitize(path)),
                                   ("class:dim", " — "), ("class:tool.output", sanitize(title))]
                                  for path, title in hits]
        if total > len(hits):
            lines.append([("class:dim", f"  … {total - len(hits)} more")])
        if not hits:
            lines.append([("class:dim", "  no matches")])
        if notice:  # how far the index is, while it builds
            lines.append([("class:dim", "  " + sanitize(notice))])
        return lines
    if bridge.name in WRITE_TOOLS and write is not None:
        lines = write_lines(write, limit)
        done = summary_line(bridge, call) if status in ("completed", "failed") else None
        return lines + ([[("class:dim", "  " + sanitize(done))]] if done else [])
    if status in ("completed", "failed"):
        done = summary_line(bridge, call)
        if done is not None:
            return [[("class:tool.output", "  " + sanitize(done))]]
    if bridge.name in WRITE_TOOLS:  # no note to diff against (yet): what is to be written
        body = bridge.args.get("content", bridge.args.get("body"))
        if isinstance(body, str) and status not in ("completed", "failed"):
            return _capped([[("class:diff.add", "  +" + line)] for line in sanitize(body).split("\n")], limit)
    return None


def tool_call_lines(call: Any, terminal_text: Callable[[str], str | None] | None = None, *,
                    limit: int | None = SECTION_LINES, args: dict[str, Any] | None = None,
                    write: ProposedWrite | None = None, diffs_elsewhere: bool = False,
                    cwd: Path | None = None) -> list[Fragments]:
    """A tool call: title, kind, status, then its diffs, terminal output or result. A bridge
    (kiln) tool reads as `create_note notes/x.md` with its hits or its diff (`kiln_lines`).
    `diffs_elsewhere`: the permission dialog shows this call's diff now (not twice)."""
    status = call.status or "pending"
    mark = {"completed": "✓", "failed": "✗", "in_progress": "…"}.get(status, "•")
    bridge = bridge_call(call, args)
    title = bridge.title if bridge is not None else (call.title or call.tool_call_id)
    head: Fragments = [
        (_STATUS_STYLE.get(status, "class:tool.pending"), f"{mark} "),
        ("class:tool.title", sanitize_line(title)),
        ("class:dim", f"  [{bridge_source(bridge.name)}] " if bridge is not None else f"  [{sanitize_line(call.kind or 'other')}] "),
        (_STATUS_STYLE.get(status, "class:tool.pending"), status),
    ]
    lines: list[Fragments] = [head]
    if bridge is not None:
        body = kiln_lines(bridge, call, None if diffs_elsewhere else write, limit)
        if diffs_elsewhere and bridge.name in WRITE_TOOLS:
            return lines + [[("class:dim", "  (its diff is in the permission dialog below)")]]
        if body is not None:
            return lines + body
    for loc in call.locations[:3]:
        if isinstance(loc.get("path"), str):
            lines.append([("class:dim", "  at " + sanitize(display_path(loc["path"], cwd)))])
    shown_content = False
    seen_diffs: set[tuple[str, str, str]] = set()
    for block in call.content:
        kind = block.get("type")
        if kind == "diff":
            shown_content = True
            ident = (str(block.get("path")), str(block.get("oldText")), str(block.get("newText")))
            if ident in seen_diffs:
                continue
            seen_diffs.add(ident)
            if diffs_elsewhere:
                lines.append([("class:dim", "  (its diff is in the permission dialog below)")])
                continue
            lines.extend(diff_lines(block, limit, cwd))
        elif kind == "terminal":
            term_id = str(block.get("terminalId", ""))
            out = terminal_text(term_id) if terminal_text else None
            lines.append([("class:dim", f"  $ terminal {sanitize(term_id)}")])
            if out:
                lines.extend(text_block_lines(out.rstrip("\n"), "class:terminal", limit=limit))
            shown_content = True
        elif kind == "content":
            inner = block.get("content")
            text = content_text(inner) if isinstance(inner, dict) and status in ("completed", "failed") else None
            if text is not None:
                lines.extend(text_block_lines(text.rstrip("\n"), limit=limit))
                shown_content = True
    if not shown_content and call.raw_output is not None and status in ("completed", "failed"):
        lines.extend(text_block_lines(pretty(call.raw_output).rstrip("\n"), limit=limit))
    return lines


class ToolEntry(BlockEntry):
    """A tool call in the transcript: redrawn as its call changes; cut at SECTION_LINES unless
    expanded (Ctrl-E on the focused one); marked while focused (Alt-↑/Alt-↓)."""

    def __init__(self, feed: Feed, call: Any, *, history: bool = False) -> None:
        super().__init__(history=history)
        self.feed = feed
        self.call = call
        self.args: dict[str, Any] | None = None  # the first arguments seen (a result may replace them)
        self.write: ProposedWrite | None = None  # a note write: the note before and after
        self.expanded = False
        self.focused = False
        self.asking = False  # the permission dialog shows this call now

    def update(self, call: Any) -> None:
        self.call = call
        if not self.args:  # (Claude's first update of a call has empty arguments)
            self.args = call_arguments(call)
        self.redraw()

    def redraw(self) -> None:
        lines = tool_call_lines(self.call, self.feed.terminal_text, limit=None if self.expanded else SECTION_LINES,
                                args=self.args, write=self.write, diffs_elsewhere=self.asking, cwd=self.feed.cwd)
        if self.focused:
            lines[0] = [("class:focus", "▶ "), *lines[0]]
        self.set_lines(lines)
