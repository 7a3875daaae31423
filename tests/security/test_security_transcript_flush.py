"""17.7, the writer's side: a session's events reach its files as they happen — the prompt and
every tool call at once, streamed text within FLUSH_EVERY (1 s) — while a stream of chunks is
not one write each. A message cut by a timed flush goes on in an event marked "cont", which
the readers join back. (The end-to-end proof, kill -9 of `cru chat -p` mid-turn, is in
test_security_hard_stop.py.)"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from crucible import session_store
from crucible.session_store import FLUSH_EVERY, SessionMeta, SessionStore

SID = "20260101-120000-abcdef"


def _on_disk(store: SessionStore) -> list[dict[str, Any]]:
    text = (store.root / SID / "events.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def test_prompt_and_tool_calls_at_once_streamed_text_within_a_second(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(session_store, "time", SimpleNamespace(time=time.time, strftime=time.strftime,
                                                               monotonic=lambda: now[0]))
    store = SessionStore(tmp_path / "sessions")
    writer = store.create(SessionMeta(id=SID, agent="scripted", created=0, updated=0, cwd="/proj"))
    try:
        writer.append({"type": "user_message", "text": "my question"})
        assert [(e["type"], e["text"]) for e in _on_disk(store)] == [("user_message", "my question")]
        assert store.meta(SID).title == "my question"  # listed even if the turn never ends

        for word in ("streamed ", "in ", "pieces "):
            writer.append({"type": "agent_message", "text": word})
        now[0] += FLUSH_EVERY / 2
        writer.flush_due()
        assert len(_on_disk(store)) == 1  # buffered: not a write per chunk
        now[0] += FLUSH_EVERY / 2
        writer.flush_due()  # a second old: written
        assert _on_disk(store)[-1]["text"] == "streamed in pieces "

        writer.append({"type": "agent_message", "text": "and the rest"})
        writer.append({"type": "tool_call", "id": "t1", "title": "Run tests", "kind": "execute",
                       "status": "pending"})
        # The tool call is written at once, and the message part before it with it.
        tail = _on_disk(store)[-2:]
        assert tail[0]["type"] == "agent_message" and tail[0]["text"] == "and the rest" and tail[0]["cont"] is True
        assert tail[1]["type"] == "tool_call" and tail[1]["title"] == "Run tests"
    finally:
        writer.close()
    # Readers join the cut message back into one.
    assert store.history_as_context(SID) == "User: my question\n\nAssistant: streamed in pieces and the rest"
    assert "streamed in pieces and the rest" in store.transcript(SID)
