"""Fixtures for driving `cru chat` against the scripted agent as a real subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTED = REPO / "fixtures" / "scripted_agent.py"


class ChatRunner:
    def __init__(self, cru: str, env: dict[str, str], kiln: Path, tmp: Path) -> None:
        self.cru, self.env, self.kiln, self.tmp = cru, env, kiln, tmp
        self.log = tmp / "agent-log.jsonl"

    def agent_command(self, script: dict[str, Any] | None) -> str:
        path = self.tmp / "script.json"
        path.write_text(json.dumps({"log": str(self.log), **(script or {})}))
        return f"{sys.executable} {SCRIPTED} {path}"

    def argv(self, script: dict[str, Any] | None, prompt: str, *extra: str) -> list[str]:
        return [self.cru, "chat", "--agent-command", self.agent_command(script), "--kiln", str(self.kiln),
                "-p", prompt, *extra]

    def run(self, script: dict[str, Any] | None, prompt: str, *extra: str,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(script, prompt, *extra), env=self.env, capture_output=True, text=True,
                              timeout=timeout, cwd=self.tmp)

    def spawn(self, script: dict[str, Any] | None, prompt: str, *extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(script, prompt, *extra), env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=self.tmp, start_new_session=True)

    def agent_log(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def wait_for_log(self, pred: Any, timeout: float = 30) -> dict[str, Any]:
        """Poll the agent's log file written by another process (no other channel exists)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for entry in self.agent_log():
                if pred(entry):
                    return entry
            time.sleep(0.05)
        raise AssertionError(f"agent log never matched; log: {self.agent_log()[-5:]}")


@pytest.fixture
def chat(cru_bin: str, clean_env: dict[str, str], kiln: Path, tmp_path: Path) -> Iterator[ChatRunner]:
    yield ChatRunner(cru_bin, clean_env, kiln, tmp_path)


def group_gone(pgid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    os.killpg(pgid, signal.SIGKILL)
    return False


class RawEditor:
    """`cru acp` over its stdio, as an editor: NDJSON JSON-RPC, answers matched by id."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        self.next_id = 0

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.next_id += 1
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method,
                                          "params": params}) + "\n")
        self.proc.stdin.flush()
        while True:
            line = self.proc.stdout.readline()
            assert line, "cru acp closed its output"
            frame = json.loads(line)
            if frame.get("id") == self.next_id and "method" not in frame:
                return frame

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)
