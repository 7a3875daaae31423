"""`cru session list|show|export|resume|search|create`: saved conversations from the command line.

A conversation is one entry whatever happened to the agent process (crucible/session_store.py);
an ID may be any unique prefix. `show` and `export --format md` draw a conversation once, each
tool call once with its arguments and its result; `export --format json` is every record.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from crucible.permissions import bridge_tool_name
from crucible.session_store import (
    INTERRUPTED,
    Conversation,
    SessionStore,
    conversation_line,
    message_records,
    search_conversations,
    when_text,
)
from crucible.terminal import counted, sanitize


def cmd_list(args: argparse.Namespace) -> int:
    convs = SessionStore().conversations(include_empty=getattr(args, "all", False),
                                         include_children=getattr(args, "all", False))
    if getattr(args, "json", False):
        print(json.dumps([_conversation_json(c) for c in convs], ensure_ascii=False))
        return 0
    if not convs:
        print("no saved sessions yet", file=sys.stderr)
        return 0
    for conv in convs:
        print(conversation_line(conv))
    return 0


def _conversation_json(conv: Conversation) -> dict[str, Any]:
    return {"id": conv.id, "title": conv.title, "agent": conv.agent, "card": conv.card, "turns": conv.turns,
            "updated": conv.updated, "entries": conv.ids}


# -- show / export -----------------------------------------------------------------------------


def render_markdown(conv: Conversation, records: Iterable[dict[str, Any]]) -> str:
    """A conversation as markdown: the messages, and each tool call once (where it started, in
    its final state) with its arguments and its result."""
    first = conv.entries[0]
    lines = [f"# {conv.title or 'Session ' + conv.id}", "",
             f"session {conv.id} · agent {conv.agent}" + (f" · card {conv.card}" if conv.card else "")
             + f" · cwd {conv.latest.cwd} · {when_text(first.created)} – {when_text(conv.updated)} · {counted(conv.turns, 'turn')}"]
    records = list(message_records(records))
    # A tool call's records, by (turn, id): ids are the agent's, unique within a turn only.
    keys: list[tuple[int, str] | None] = []
    final: dict[tuple[int, str], dict[str, Any]] = {}
    turn = 0
    for record in records:
        key = (turn, str(record["id"])) if record.get("type") == "tool_call" and record.get("id") else None
        keys.append(key)
        if key is not None:
            final[key] = {**final.get(key, {}), **record}
        if record.get("type") in ("turn_end", "resumed"):
            turn += 1
    drawn: set[tuple[int, str]] = set()
    section = None

    def heading(name: str | None) -> None:
        nonlocal section
        if name != section and name is not None:
            lines.extend(["", name, ""])
        section = name

    said = False  # a message drawn yet
    for record, key in zip(records, keys, strict=True):
        kind = record.get("type")
        text = str(record.get("text", ""))
        if kind not in ("user_message", "history_user_message", "agent_message", "agent_thought"):
            section = None  # the next message gets its heading again
        if kind in ("user_message", "history_user_message"):
            heading("## You")
            lines.append(text)
            said = True
        elif kind == "agent_message":
            heading("## Agent")
            lines.append(text)
            said = True
        elif kind == "agent_thought":
            heading("### Thinking")
            lines.append("> " + text.replace("\n", "\n> "))
        elif kind == "tool_call":
            if key is not None and key in drawn:
                continue
            if key is not None:
                drawn.add(key)
            lines.extend(_tool_lines(final[key] if key is not None else record))
        elif kind == "permission":
            lines.append(f"- permission for `{record.get('title', '')}`: {record.get('decision', '')}"
                         + (f" ({record['reason']})" if record.get("reason") else ""))
        elif kind == "error":
            lines.extend(["", f"**error:** {record.get('message', '')}"])
        elif kind == "warning":
            lines.extend(["", f"*warning: {record.get('message', '')}*"])
        elif kind == "turn_end" and record.get("error"):
            lines.extend(["", f"**the turn failed:** {record['error']}"])
        elif kind == "turn_end" and record.get("stop_reason") == INTERRUPTED:
            lines.extend(["", f"*the turn was cut short: {record.get('why') or 'the session closed'}*"])
        elif kind == "turn_end" and record.get("stop_reason") not in (None, "end_turn"):
            # as the chat said it: a cancelled or cut-short answer is not read as a whole one
            reason = str(record["stop_reason"])
            lines.extend(["", "*the turn was cancelled*" if reason == "cancelled"
                          else f"*the turn ended with stopReason {reason}*"])
        elif kind == "resumed" and said:  # (a session of no turn resumed: nothing to go on from)
            lines.extend(["", f"*── resumed with {record.get('agent', '')} ──*"])
        elif kind == "plan":
            entries = record.get("entries") or []
            lines.extend(["", "Plan:"] + [f"- [{'x' if e.get('status') == 'completed' else ' '}] "
                                          f"{e.get('content', '')}" for e in entries if isinstance(e, dict)])
    return sanitize("\n".join(lines).rstrip() + "\n")


def _tool_lines(call: dict[str, Any]) -> list[str]:
    title = str(call.get("title") or call.get("id", ""))
    # A bridge tool by its own name, as the chat shows it (not `crucible_x` or `mcp__crucible__x`)
    out = ["", f"- tool `{bridge_tool_name(title) or title}` ({call.get('kind') or 'other'}): "
               f"{call.get('status') or 'pending'}"]
    if call.get("input"):
        out.append(f"  - arguments: `{call['input']}`")
    for path in call.get("diffs") or []:
        out.append(f"  - changed `{path}`")
    if call.get("output"):
        out.extend(["  - result:", "", "    ```", *("    " + line for line in str(call["output"]).splitlines()),
                    "    ```"])
    return out


def cmd_show(args: argparse.Namespace) -> int:
    store = SessionStore()
    conv = store.conversation(args.id)
    print(render_markdown(conv, (r for sid in conv.ids for r in store.events(sid))), end="")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    store = SessionStore()
    conv = store.conversation(args.id)
    records = [r for sid in conv.ids for r in store.events(sid)]
    if getattr(args, "format", "json") == "md":
        print(render_markdown(conv, records), end="")
        return 0
    print(json.dumps({"session": asdict(conv.entries[0]), "entries": [asdict(m) for m in conv.entries],
                      "events": records}, ensure_ascii=False))
    return 0


# -- search ------------------------------------------------------------------------------------


def cmd_search(args: argparse.Namespace) -> int:
    hits = search_conversations(SessionStore(), args.query, limit=args.limit)
    if getattr(args, "json", False):
        print(json.dumps([{**_conversation_json(h.conversation), "score": round(h.score, 4), "snippet": h.snippet}
                          for h in hits], ensure_ascii=False))
        return 0
    if not hits:
        print(f"no saved session mentions {args.query!r}", file=sys.stderr)
        return 1
    for hit in hits:
        print(conversation_line(hit.conversation))
        if hit.snippet:
            print("    " + sanitize(hit.snippet))
    return 0


# -- resume / create ---------------------------------------------------------------------------

# What a chat started from `cru session resume|create` has when its parser did not give it.
_CHAT_DEFAULTS: dict[str, Any] = {"agent": None, "agent_command": None, "kiln": None, "card": None, "cwd": None,
                                  "prompt": None, "format": "text", "approve_all": False, "deny_all": False,
                                  "record": None, "resume": None, "model": None, "mode": None}


def cmd_resume(args: argparse.Namespace) -> int:
    """The conversation goes on with its own agent, card, kiln and cwd, unless told otherwise
    (crucible.chat.build_options reads them from the saved session)."""
    from crucible.chat import cmd_chat  # the session stack, only for a chat

    store = SessionStore()
    first = store.conversation(args.id).id
    ns = argparse.Namespace(**{**_CHAT_DEFAULTS, **vars(args), "resume": first})
    return cmd_chat(ns)


def cmd_session_create(args: argparse.Namespace) -> int:
    """`cru session create --agent CARD`: a session from a card, as `cru chat --card CARD`."""
    from crucible.chat import cmd_chat  # the session stack, only for a chat

    ns = argparse.Namespace(**{**_CHAT_DEFAULTS, **vars(args), "card": args.agent, "agent": None})
    return cmd_chat(ns)
