"""Helpers for tests/delegation (fixtures: conftest.py). A parent and its children are real
scripted-agent subprocesses: config profiles `[agents.parent]` / `[agents.child]` /
`[agents.other]` run `fixtures/scripted_agent.py` with their own script, cards in
`KILN/.crucible/agents/` point at them, all in a tmp config."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCRIPTED = REPO / "fixtures" / "scripted_agent.py"
HTTP_CAPS = {"agentCapabilities": {"mcpCapabilities": {"http": True, "sse": False}}}


def delegate_step(target: str, prompt: str, *, as_: str = "delegate", **extra: Any) -> dict[str, Any]:
    return {"mcp_call": {"server": "crucible", "tool": "delegate_session",
                         "arguments": {"target": target, "prompt": prompt, **extra}}, "as": as_, "echo": True}


def tool_step(tool: str, arguments: dict[str, Any], as_: str) -> dict[str, Any]:
    return {"mcp_call": {"server": "crucible", "tool": tool, "arguments": arguments}, "as": as_, "echo": True}


def agent_script(*turn: dict[str, Any], http: bool = True, **extra: Any) -> dict[str, Any]:
    script: dict[str, Any] = {"new_session": {"list_mcp_tools": True}, "prompts": [list(turn)]}
    if http:
        script["initialize"] = {"result": HTTP_CAPS}
    script.update(extra)
    return script


def card_text(description: str, body: str, **front: Any) -> str:
    lines = ["---", f"description: {json.dumps(description)}"]
    for key, value in front.items():
        lines.append(f"{key}: {json.dumps(value)}")  # JSON is YAML
    return "\n".join(lines) + "\n---\n" + body + "\n"


class Setup:
    """A tmp kiln, config and scripts; `write()` after changing them."""

    def __init__(self, tmp: Path, kiln_src: Path, env: dict[str, str]) -> None:
        self.tmp = tmp
        self.kiln = tmp / "kiln"
        shutil.copytree(kiln_src, self.kiln, ignore=shutil.ignore_patterns(".crucible"))
        self.cards_dir = self.kiln / ".crucible" / "agents"
        self.cards_dir.mkdir(parents=True)
        self.config = tmp / "config.toml"
        self.env = {**env, "CRUCIBLE_CONFIG": str(self.config)}
        self.scripts: dict[str, dict[str, Any]] = {}
        self.delegation: dict[str, Any] = {}
        self.permissions: dict[str, str] = {"delegate_session": "allow", "get_job_result": "allow",
                                            "list_jobs": "allow", "cancel_job": "allow"}

    def log(self, name: str) -> Path:
        return self.tmp / f"{name}-log.jsonl"

    def script_path(self, name: str) -> Path:
        return self.tmp / f"{name}.json"

    def card(self, name: str, description: str, body: str, **front: Any) -> None:
        (self.cards_dir / f"{name}.md").write_text(card_text(description, body, **front), encoding="utf-8")

    def write(self) -> None:
        lines = []
        for name, script in self.scripts.items():
            self.script_path(name).write_text(json.dumps({"log": str(self.log(name)), **script}))
            lines += [f"[agents.{name}]", f"command = {json.dumps(sys.executable)}",
                      f"args = [{json.dumps(str(SCRIPTED))}, {json.dumps(str(self.script_path(name)))}]", ""]
        lines.append("[permissions]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in self.permissions.items()]
        if self.delegation:
            lines += ["", "[delegation]"] + [f"{k} = {json.dumps(v)}" for k, v in self.delegation.items()]
        self.config.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def entries(self, name: str) -> list[dict[str, Any]]:
        path = self.log(name)
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def results(self, name: str, as_: str) -> list[dict[str, Any]]:
        return [e["result"] for e in self.entries(name) if e.get("kind") == "result" and e.get("as") == as_]

    def prompts(self, name: str) -> list[str]:
        """The text of every session/prompt the agent `name` received."""
        out = []
        for e in self.entries(name):
            frame = e.get("frame", {}) if e.get("kind") == "in" else {}
            if frame.get("method") == "session/prompt":
                out.append("\n".join(b.get("text", "") for b in frame["params"]["prompt"]))
        return out

    def run(self, agent: str, prompt: str, *extra: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        cru = str(Path(sys.executable).parent / "cru")
        argv = [cru, "chat", "-a", agent, "--kiln", str(self.kiln), "--cwd", str(self.tmp), "-p", prompt, *extra]
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout, cwd=self.tmp)


def tool_text(result: dict[str, Any]) -> str:
    """The text an agent reads from an MCP tools/call answer."""
    res = result.get("result") or {}
    return "\n".join(c.get("text", "") for c in res.get("content", []))


def tool_json(result: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(tool_text(result))
    return data


def pids_running(marker: str) -> list[int]:
    """Processes whose command line contains `marker` (a script path unique to one test)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{entry}/stat").read_text().split(") ", 1)[1][:1]
        except (OSError, IndexError):
            continue
        if marker in cmdline and state != "Z":
            found.append(int(entry))
    return found


def wait_until(pred: Any, timeout: float = 30) -> bool:
    """Poll state another process writes (its log, /proc): no other channel exists."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return bool(pred())
