"""`cru session list|show|export|resume|create`: saved sessions from the command line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

from crucible.chat import cmd_chat
from crucible.session_store import SessionStore


def cmd_list(args: argparse.Namespace) -> int:
    metas = SessionStore().list()
    if not metas:
        print("no saved sessions yet", file=sys.stderr)
        return 0
    for m in metas:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(m.updated))
        card = f" card={m.card}" if m.card else ""
        print(f"{m.id}  {when}  {m.agent}{card}  turns={m.turns}  {m.title}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    print(SessionStore().transcript(args.id))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    store = SessionStore()
    meta = store.meta(args.id)
    print(json.dumps({"session": asdict(meta), "events": list(store.events(meta.id))}, ensure_ascii=False))
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    meta = SessionStore().meta(args.id)
    ns = argparse.Namespace(**{**vars(args), "resume": meta.id, "agent": None, "agent_command": None,
                               "kiln": meta.kiln or None, "card": meta.card, "cwd": meta.cwd, "prompt": None,
                               "format": "text", "approve_all": False, "deny_all": False, "record": None})
    return cmd_chat(ns)


def cmd_session_create(args: argparse.Namespace) -> int:
    """`cru session create --agent CARD`: a session from a card, as `cru chat --card CARD`."""
    ns = argparse.Namespace(**{**vars(args), "card": args.agent, "agent": None, "agent_command": None,
                               "cwd": None, "prompt": None, "format": "text", "approve_all": False,
                               "deny_all": False, "record": None, "resume": None})
    return cmd_chat(ns)
