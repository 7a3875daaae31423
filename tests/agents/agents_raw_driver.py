"""A minimal raw NDJSON JSON-RPC client for ACP agents, on threads — independent of
`acp_host`, so the real-agent tests prove the agents, the fake LLM and the environment on
their own. (A uniquely named module: test files import it; `conftest` names clash across dirs.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
ECHO_SERVER = REPO_ROOT / "fixtures" / "echo_mcp_server.py"


class RpcError(Exception):
    def __init__(self, method: str, error: dict[str, Any]) -> None:
        super().__init__(f"{method} failed: {error.get('code')} {error.get('message')!r} {error.get('data', '')}")
        self.error = error


@dataclass
class RawAgent:
    """One agent process spoken to over raw NDJSON JSON-RPC on its stdio."""

    proc: subprocess.Popen[bytes]
    stderr_path: Path
    notifications: list[dict[str, Any]] = field(default_factory=list)
    agent_requests: list[dict[str, Any]] = field(default_factory=list)
    non_json_lines: list[bytes] = field(default_factory=list)
    _responses: dict[int, dict[str, Any]] = field(default_factory=dict)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _next_id: int = 0
    _eof: bool = False
    # How to answer permission requests: allow (once) or reject (once), chosen by option kind.
    allow: bool = True

    def __post_init__(self) -> None:
        self._write_lock = threading.Lock()
        threading.Thread(target=self._read, name="raw-agent-reader", daemon=True).start()

    # --- wire
    def _send(self, msg: dict[str, Any]) -> None:
        data = (json.dumps(msg) + "\n").encode()
        with self._write_lock:
            assert self.proc.stdin is not None
            self.proc.stdin.write(data)
            self.proc.stdin.flush()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                self.non_json_lines.append(line)
                continue
            if "method" in msg and "id" in msg:
                with self._cond:
                    self.agent_requests.append(msg)
                    self._cond.notify_all()
                self._answer(msg)
            elif "method" in msg:
                with self._cond:
                    self.notifications.append(msg)
                    self._cond.notify_all()
            else:
                with self._cond:
                    self._responses[msg.get("id")] = msg
                    self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def _answer(self, msg: dict[str, Any]) -> None:
        method, params = msg["method"], msg.get("params") or {}
        result: dict[str, Any] | None = None
        error: dict[str, Any] | None = None
        if method == "session/request_permission":
            # Option ids differ per agent (claude: allow/allow_always/reject): choose by kind.
            by_kind = {o.get("kind"): o["optionId"] for o in params.get("options", [])}
            wanted = ("allow_once", "allow_always") if self.allow else ("reject_once", "reject_always")
            chosen = by_kind.get(wanted[0]) or by_kind.get(wanted[1])
            result = ({"outcome": {"outcome": "selected", "optionId": chosen}} if chosen
                      else {"outcome": {"outcome": "cancelled"}})
        elif method == "fs/read_text_file":
            p = Path(params["path"])
            # A missing file must read as empty: Gemini's write fails on an error reply.
            result = {"content": p.read_text(encoding="utf-8") if p.is_file() else ""}
        elif method == "fs/write_text_file":
            Path(params["path"]).write_text(params["content"], encoding="utf-8")
            result = {}
        else:
            error = {"code": -32601, "message": f"method not found: {method}"}
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": msg["id"]}
        reply.update({"result": result} if error is None else {"error": error})
        try:
            self._send(reply)
        except OSError:
            pass

    # --- API
    def request(self, method: str, params: dict[str, Any], timeout: float = 90.0) -> dict[str, Any]:
        with self._cond:
            self._next_id += 1
            rid = self._next_id
        self._send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        deadline = time.monotonic() + timeout
        with self._cond:
            while rid not in self._responses:
                left = deadline - time.monotonic()
                if self._eof:
                    raise RpcError(method, {"message": f"the agent exited (code {self.proc.poll()}); "
                                                       f"stderr: {self.stderr_tail()}"})
                if left <= 0:
                    raise TimeoutError(f"{method}: no answer in {timeout} s; stderr: {self.stderr_tail()}")
                self._cond.wait(left)
            resp = self._responses.pop(rid)
        if "error" in resp:
            raise RpcError(method, resp["error"])
        return dict(resp.get("result") or {})

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self._send({"jsonrpc": "2.0", "method": method, "params": params})

    def updates(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The `update` objects of every session/update so far (optionally of one kind)."""
        with self._cond:
            ups = [n["params"]["update"] for n in self.notifications if n["method"] == "session/update"]
        return [u for u in ups if kind is None or u.get("sessionUpdate") == kind]

    def message_text(self) -> str:
        return "".join(u["content"].get("text", "") for u in self.updates("agent_message_chunk")
                       if isinstance(u.get("content"), dict))

    def stderr_tail(self, n: int = 2000) -> str:
        try:
            return self.stderr_path.read_text(encoding="utf-8", errors="replace")[-n:]
        except OSError:
            return ""

    def close(self) -> None:
        """Close stdin, give it ~2 s, SIGTERM the group, then wait for the whole group to go:
        Claude's CLI still writes into HOME after the adapter exits."""
        pgid = self.proc.pid
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
            if _wait_group_gone(pgid, timeout=5):
                break
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(d.name))
    return out


def _wait_group_gone(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not group_members(pgid):
            return True
        time.sleep(0.05)  # teardown only: there is no way to wait on a process group
    return not group_members(pgid)


def echo_mcp_entry(log: Path, result: str) -> dict[str, Any]:
    """A stdio mcpServers entry for fixtures/echo_mcp_server.py. No `type` key (claude-agent-acp
    reads any entry with one as http/sse) and always `args` and `env` (SDK-based agents drop
    entries without them)."""
    return {"name": "crucible", "command": sys.executable,
            "args": [str(ECHO_SERVER), "--log", str(log), "--result", result], "env": []}
