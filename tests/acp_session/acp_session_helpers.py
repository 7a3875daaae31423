"""Helpers for the ACP session tests (imported by name: tests have no packages): scripted agents as real subprocesses, turn collection."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from acp_host.session import AcpSession, Event, TurnEnded

REPO = Path(__file__).resolve().parents[2]
SCRIPTED_AGENT = REPO / "fixtures" / "scripted_agent.py"
SDK_AGENT = REPO / "fixtures" / "sdk_agent.py"


class Scripted:
    """Writes a script for the scripted agent and reads back what the agent saw."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path
        self.log = tmp_path / "agent-log.jsonl"
        self.script_path = tmp_path / "script.json"

    def argv(self, script: dict[str, Any]) -> list[str]:
        self.script_path.write_text(json.dumps({"log": str(self.log), **script}))
        return [sys.executable, str(SCRIPTED_AGENT), str(self.script_path)]

    def records(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def results(self, step: str) -> list[Any]:
        return [r["result"] for r in self.records() if r["kind"] == "result" and r["step"] == step]

    def permission_answers(self) -> list[dict[str, Any]]:
        """Every answer the client sent to the agent's permission requests, as logged."""
        frames = [r["frame"] for r in self.records() if r["kind"] == "in"]
        return [
            f
            for f in frames
            if "method" not in f and isinstance(f.get("result"), dict) and "outcome" in f["result"]
        ]


async def run_turn(session: AcpSession, prompt: str | list[Any]) -> tuple[TurnEnded, list[Event]]:
    """Prompt and collect every event up to and including TurnEnded."""
    events: list[Event] = []

    async def consume() -> None:
        async for event in session.events:
            events.append(event)
            if isinstance(event, TurnEnded):
                return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consume)
        result = await session.prompt(prompt)
    return result, events


def texts(events: list[Event], kind: type) -> str:
    return "".join(getattr(e, "text", "") for e in events if isinstance(e, kind))


OnEvent = Callable[[Event], Any]
