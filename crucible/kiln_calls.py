"""Crucible's own bridge (kiln) tools as a person reads them, whatever the agent calls them:
a clean title (`mcp__crucible__create_note` → `create_note notes/x.md`), a search's query and
its top hits (`path — title`), a note write as a diff against the note as it was before.

Pure functions over a tool call's merged state (acp_host.session.ToolCall), plus
`proposed_write`, which reads the note from the kiln (call it in a thread), and
`kiln_search_text`: the `/kiln-search` command of `cru chat` and `cru acp`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from acp_host.session import ToolCall
from crucible.bounded_load import load_json_head
from crucible.errors import CrucibleError
from crucible.kiln.paths import resolve_in_kiln
from crucible.permissions import tool_key_from_acp

if TYPE_CHECKING:  # the bridge's server, for a type only: this module is imported by the TUI's drawing
    from mcp_bridge.server import BridgeServer

SEARCH_TOOLS = frozenset({"semantic_search", "text_search", "property_search"})
# The kiln tools' names (mcp_bridge.tools.KILN_TOOLS: not imported, this module draws the chat
# before the bridge loads; a test holds the two equal) and the delegation tools'.
KILN_TOOL_NAMES = frozenset({
    "create_note", "read_note", "read_metadata", "update_note", "delete_note", "list_notes", "semantic_search",
    "text_search", "property_search", "get_kiln_info", "get_kiln_roots", "get_kiln_stats",
})
DELEGATION_TOOL_NAMES = frozenset({"delegate_session", "list_jobs", "get_job_result", "cancel_job"})
WRITE_TOOLS = frozenset({"create_note", "update_note"})
TOP_HITS = 5
_SUBJECT_KEYS = ("path", "query", "folder", "pattern", "tag", "key", "target", "card", "job_id")
_MAX_NOTE_BYTES = 2 * 1024 * 1024  # a bigger note is not diffed in the chat


@dataclass(frozen=True)
class BridgeCall:
    """A call of one of the bridge's tools: its bare name and its arguments (as far as known)."""

    name: str
    args: dict[str, Any]

    @property
    def title(self) -> str:
        """`create_note notes/x.md`, `semantic_search "sourdough starter"`."""
        for key in _SUBJECT_KEYS:
            value = self.args.get(key)
            if isinstance(value, str) and value:
                value = value if len(value) <= 80 else value[:79] + "…"
                return f'{self.name} "{value}"' if key == "query" else f"{self.name} {value}"
        return self.name


def call_arguments(call: ToolCall) -> dict[str, Any] | None:
    """The call's arguments: its rawInput, or (Gemini asks before it announces a call) a JSON
    object in its text content while it has not run yet."""
    if isinstance(call.raw_input, dict):
        return call.raw_input
    if call.status in ("completed", "failed"):
        return None  # the text is the result now
    for block in call.content:
        inner = block.get("content") if block.get("type") == "content" else None
        if isinstance(inner, dict) and inner.get("type") == "text":
            parsed = _json(inner.get("text"))
            if isinstance(parsed, dict):
                return parsed
    return None


def bridge_source(name: str) -> str:
    """Where a tool of Crucible's bridge comes from, as the chat labels it: the kiln, a Lua
    plugin (`lua_*`), delegation, else one of the person's MCP servers (the gateway)."""
    if name in KILN_TOOL_NAMES:
        return "kiln"
    if name in DELEGATION_TOOL_NAMES:
        return "delegation"
    return "plugin" if name.startswith("lua_") else "mcp"


def bridge_call(call: ToolCall, known_args: dict[str, Any] | None = None) -> BridgeCall | None:
    """The bridge tool `call` runs, or None when it is some other tool."""
    key = tool_key_from_acp({"toolCallId": call.tool_call_id, "title": call.title, "kind": call.kind})
    if not key.bridge:
        return None
    return BridgeCall(key.name, call_arguments(call) or known_args or {})


_MAX_JSON_CHARS = 2_000_000  # a bigger result is shown as text, not parsed at each redraw


def _json(value: Any) -> Any:
    if isinstance(value, str) and len(value) <= _MAX_JSON_CHARS and value.lstrip()[:1] in ("{", "["):
        try:
            return load_json_head(value)  # the agent's text: nesting bounded; lines after it ignored
        except ValueError:
            return None
    return value if isinstance(value, dict | list) else None


def result_payload(call: ToolCall, wanted: str) -> dict[str, Any] | None:
    """The tool's structured result holding the key `wanted`, wherever the agent put it: the
    rawOutput (a dict, or wrapped as {"output": "<json>"}, {"result": …}, content blocks), or the
    JSON text of its content."""
    candidates: list[Any] = [call.raw_output]
    for block in call.content:
        inner = block.get("content") if block.get("type") == "content" else None
        if isinstance(inner, dict) and inner.get("type") == "text":
            candidates.append(inner.get("text"))
    for candidate in candidates:
        found = _find(candidate, wanted, depth=0)
        if found is not None:
            return found
    return None


def _find(value: Any, wanted: str, depth: int) -> dict[str, Any] | None:
    if depth > 4:
        return None
    data = _json(value)
    if isinstance(data, dict):
        if wanted in data:
            return data
        for key in ("structuredContent", "output", "result", "content", "text"):
            if key in data:
                found = _find(data[key], wanted, depth + 1)
                if found is not None:
                    return found
    elif isinstance(data, list):
        for item in data[:8]:
            found = _find(item, wanted, depth + 1)
            if found is not None:
                return found
    return None


def search_result(call: ToolCall, limit: int = TOP_HITS) -> tuple[list[tuple[str, str]], int, str | None] | None:
    """The top hits of a search call as (path, title), how many it found in all, and its notice
    line (semantic_search's while the index builds); None until its result is known."""
    payload = result_payload(call, "results")
    results = payload.get("results") if payload is not None else None
    if payload is None or not isinstance(results, list):
        return None
    hits = []
    for hit in results[:limit]:
        if isinstance(hit, dict) and isinstance(hit.get("path"), str):
            hits.append((hit["path"], str(hit.get("title") or "")))
    notice = payload.get("notice")
    return hits, len(results), notice if isinstance(notice, str) else None


def summary_line(bridge: BridgeCall, call: ToolCall) -> str | None:
    """One line of what a finished note or kiln call did, from its result."""
    name = bridge.name
    if name == "read_note":
        data = result_payload(call, "total_lines")
        if data is not None:
            return f"lines {data.get('start_line')}–{data.get('end_line')} of {data.get('total_lines')}"
    elif name in ("create_note", "update_note", "delete_note"):
        data = result_payload(call, "action")
        if data is not None:
            return f"{data.get('action')} {data.get('path')} ({data.get('size_bytes')} bytes)"
    elif name == "list_notes":
        data = result_payload(call, "notes")
        notes = data.get("notes") if data is not None else None
        if isinstance(notes, list):
            paths = [str(n.get("path")) for n in notes[:TOP_HITS] if isinstance(n, dict)]
            more = int(data.get("total") or len(notes)) - len(paths) if data is not None else 0
            return ", ".join(paths) + (f" … {more} more" if more > 0 else "")
    elif name == "read_metadata":
        data = result_payload(call, "frontmatter")
        if data is not None:
            tags = data.get("tags") or []
            return f"{data.get('title')}" + (f" · tags: {', '.join(map(str, tags))}" if tags else "")
    return None


@dataclass(frozen=True)
class ProposedWrite:
    """A note write as a diff: the note's text before and after."""

    path: str
    old: str
    new: str


def proposed_write(kiln: Path, bridge: BridgeCall) -> ProposedWrite | None:
    """What create_note / update_note would make of the note, read from the kiln now (blocking:
    run it in a thread, before the write). None when it cannot be worked out (no path, a note
    too big, broken frontmatter: the call's arguments are shown instead)."""
    # ruamel.yaml, only when a note write shows up (the chat starts without it)
    from crucible.kiln.notes import merge_frontmatter, replace_body

    args = bridge.args
    path = args.get("path")
    if bridge.name not in WRITE_TOOLS or not isinstance(path, str) or not path:
        return None
    rel = path if path.endswith(".md") else path + ".md"
    try:
        target = resolve_in_kiln(kiln, rel, for_write=True)
        old = ""
        if target.is_file():
            if target.stat().st_size > _MAX_NOTE_BYTES:
                return None
            old = target.read_text(encoding="utf-8", errors="replace")
        frontmatter = args.get("frontmatter") if isinstance(args.get("frontmatter"), dict) else None
        if bridge.name == "create_note":
            content = args.get("content")
            body = content if isinstance(content, str) else ""
            new = merge_frontmatter(body, frontmatter) if frontmatter else body
        else:
            new = old
            remove = [k for k in args.get("remove_keys") or [] if isinstance(k, str)]
            if frontmatter or remove:
                new = merge_frontmatter(new, frontmatter or {}, remove)
            body_arg = args.get("body")
            if isinstance(body_arg, str):
                new = replace_body(new, body_arg)
    except (CrucibleError, OSError, ValueError):
        return None
    except Exception:  # a preview must never break the chat (odd YAML values the dumper refuses)
        return None
    return ProposedWrite(rel, old, new)


KILN_SEARCH_USAGE = "Usage: /kiln-search WHAT TO LOOK FOR"
SNIPPET_CHARS = 120


async def kiln_search_text(bridge: BridgeServer | None, query: str) -> str:
    """`/kiln-search QUERY`: the session's notes for QUERY (semantic_search, 5 of them) as lines
    to read, without a model turn; how far the index is when it is not complete."""
    if not query:
        return KILN_SEARCH_USAGE
    if bridge is None:
        return "The kiln tools are not available in this session."
    result = await bridge.call_tool("semantic_search", {"query": query, "limit": TOP_HITS})
    data = result.structured_content or {}
    hits = data.get("results") if isinstance(data, dict) else None
    if result.is_error or not isinstance(hits, list):
        return "".join(getattr(c, "text", "") for c in result.content) or "The search failed."
    if not hits:
        return f"No notes match {query!r}."
    lines = [f"Notes for {query!r}:"]
    for h in hits:
        snippet = str(h.get("snippet") or "")
        if len(snippet) > SNIPPET_CHARS:  # five hits on one screen
            snippet = snippet[:SNIPPET_CHARS].rsplit(" ", 1)[0] + " …"
        lines.append(f"- {h.get('title') or h.get('path')} ({h.get('path')}): {snippet}".rstrip(": "))
    notice = data.get("notice")
    if isinstance(notice, str) and notice:
        lines.append(notice)
    return "\n".join(lines)
