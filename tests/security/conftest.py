"""Fixtures for the hostile-input and hard-stop tests: real `cru` subprocesses against the
scripted agent, and process-tree checks. The chat runner is the sessions tests' own."""

from __future__ import annotations

import importlib.util
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTED = REPO / "fixtures" / "scripted_agent.py"


def _area_conftest(area: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"{area}_conftest", REPO / "tests" / area / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ChatRunner = _area_conftest("sessions").ChatRunner  # `cru chat -p` with the scripted agent
Screen = _area_conftest("tui").Screen  # `cru chat` on a pty, its screen read by pyte

# A billion-laughs YAML (nine levels of nine aliases: 387 million values once expanded, 383 bytes).
BOMB_YAML = "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9) if prev else ', '.join(['lol'] * 9)}]\n"
    for prev, name in zip(["", *"abcdefgh"], "abcdefghi", strict=True)
)
# Six levels (531,441 values): costs today's code ~1 s, so tests can show it is not refused.
SMALL_BOMB_YAML = "".join(BOMB_YAML.splitlines(keepends=True)[:6])


@pytest.fixture
def chat(cru_bin: str, clean_env: dict[str, str], kiln: Path, tmp_path: Path) -> Iterator[Any]:
    yield ChatRunner(cru_bin, clean_env, kiln, tmp_path)


def memory_capped(limit_bytes: int = 2 << 30) -> Callable[[], None]:
    """preexec_fn: cap the child's address space, so a regression fails the test instead of
    eating the machine's memory."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    return cap


def wait_until(pred: Callable[[], Any], timeout: float = 10, what: str = "condition") -> Any:
    """Poll a condition another process makes true (no other channel), with a bound."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (children, grandchildren, …), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out: set[int] = set()
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in out:
                out.add(child)
                stack.append(child)
    return out


sys.path.insert(0, str(REPO / "fixtures"))

from proc_state import pid_alive  # noqa: E402, F401  (re-exported: fixtures/, shared with the gateway tests)


class RawAcp:
    """An editor speaking raw NDJSON to `cru acp` (a real subprocess in its own session): every
    frame it sends is exactly what the test wrote, every frame it gets is kept in order."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, stderr_path: Path) -> None:
        import queue
        import subprocess
        import threading

        self.stderr_path = stderr_path
        self._stderr = stderr_path.open("wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                     env=env, cwd=cwd, start_new_session=True)
        self.frames: list[Any] = []
        self._queue: queue.Queue[Any] = queue.Queue()
        self._ids = iter(range(1, 1 << 30))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        import json

        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                frame = json.loads(line)
            except ValueError:
                frame = {"not_json": line.decode("utf-8", "replace")}
            self._queue.put(frame)
        self._queue.put(None)

    def send(self, frame: Any) -> None:
        import json

        assert self.proc.stdin is not None
        data = frame if isinstance(frame, bytes) else json.dumps(frame).encode()
        self.proc.stdin.write(data + b"\n")
        self.proc.stdin.flush()

    def next_frame(self, timeout: float = 30) -> Any:
        import queue

        try:
            frame = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no frame from cru acp within {timeout} s; stderr: {self.stderr()[-2000:]}") from None
        if frame is None:
            raise AssertionError(f"cru acp closed its output; stderr: {self.stderr()[-2000:]}")
        self.frames.append(frame)
        return frame

    def wait_for(self, pred: Callable[[Any], bool], timeout: float = 30) -> Any:
        deadline = time.monotonic() + timeout
        for frame in self.frames:
            if pred(frame):
                return frame
        while True:
            frame = self.next_frame(max(0.01, deadline - time.monotonic()))
            if pred(frame):
                return frame

    def request(self, method: str, params: Any = None, timeout: float = 60) -> Any:
        """Send a request, answer the agent's own requests meanwhile (permission: reject), and
        return the response (result or error) to ours."""
        req_id = next(self._ids)
        frame: dict[str, Any] = {"jsonrpc": "2.0", "id": req_id, "method": method}
        if params is not None:
            frame["params"] = params
        self.send(frame)
        return self.wait_for(lambda f: isinstance(f, dict) and f.get("id") == req_id and "method" not in f, timeout)

    def initialize(self) -> Any:
        return self.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})

    def stderr(self) -> str:
        if not self._stderr.closed:
            self._stderr.flush()
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def close(self, timeout: float = 20) -> int:
        import signal
        import subprocess

        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait()
        finally:
            self._stderr.close()


def script_file(tmp: Path, data: dict[str, Any], name: str = "script.json") -> Path:
    import json

    path = tmp / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def scripted_command(script: Path) -> str:
    import shlex

    return shlex.join([sys.executable, str(SCRIPTED), str(script)])
