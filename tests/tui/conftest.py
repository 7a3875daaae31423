"""`cru chat` in a real pseudo-terminal (pexpect), its screen read with pyte (a VT emulator)."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pexpect
import pyte
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTED = REPO / "fixtures" / "scripted_agent.py"
sys.path.insert(0, str(REPO / "fixtures"))  # proc_state (shared with the security and gateway tests)


class Screen:
    """A `cru chat` process on a pty of `cols`×`rows`, and what its screen shows."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, cols: int = 80, rows: int = 24) -> None:
        self.cols, self.rows = cols, rows
        self.screen = pyte.Screen(cols, rows)
        self.stream = pyte.ByteStream(self.screen)
        self.child = pexpect.spawn(argv[0], argv[1:], env=env, cwd=str(cwd), dimensions=(rows, cols),
                                   timeout=30)
        self.child.delaybeforesend = None  # pexpect sleeps 50 ms before each send by default
        self.raw = bytearray()

    def pump(self, timeout: float = 0.05) -> bool:
        """Feed what the program wrote so far into the emulator; False once it exited. Once
        something arrived, what follows within 10 ms is read too: one frame can reach the pty in
        several reads, and a half-drawn frame (new rows above, the last frame's below) can pass
        a check that the whole frame fails."""
        wait, until = timeout, time.monotonic() + timeout + 0.2  # a steady stream still returns
        while time.monotonic() < until:
            try:
                data = self.child.read_nonblocking(65536, timeout=wait)
            except pexpect.TIMEOUT:
                return True
            except pexpect.EOF:
                return False
            self.raw += data
            self.stream.feed(data)
            wait = 0.01
        return True

    def text(self) -> str:
        return "\n".join(line.rstrip() for line in self.screen.display)

    def wait_for(self, what: str | re.Pattern[str] | Callable[[str], bool], timeout: float = 30) -> str:
        """Wait until the screen shows `what` (text, regex or predicate); returns the screen."""
        deadline = time.monotonic() + timeout
        while True:
            alive = self.pump()
            shown = self.text()
            ok = what(shown) if callable(what) and not isinstance(what, re.Pattern) else self.shows(what, shown)
            if ok:
                return shown
            if not alive or time.monotonic() > deadline:
                raise AssertionError(f"the screen never showed {what!r} (alive={alive}); it shows:\n{shown}")

    def unwrapped(self) -> str:
        """The screen read as one paragraph, so a text the chat wrapped (a long path pushes
        words to the next row) is found whole: a row cut mid-word (it fills the width) joins
        the next as is, a row broken at a space joins it with one space; a row's indent (a
        tool's output wraps under itself) is left out."""
        rows = [line.rstrip() for line in self.screen.display]
        return "".join(row.lstrip() + ("" if len(row) >= self.screen.columns else " ") for row in rows)

    def shows(self, what: str | re.Pattern[str], shown: str) -> bool:
        """`what` is in `shown` (the screen's rows), on one row or wrapped over several."""
        if isinstance(what, re.Pattern):
            return any(what.search(s) is not None for s in (shown, self.unwrapped()))
        return what in shown or what in self.unwrapped()

    def wait_all(self, *texts: str, timeout: float = 30) -> str:
        """Wait until every text is on screen (a frame may arrive in several reads)."""
        return self.wait_for(lambda s: all(self.shows(t, s) for t in texts), timeout=timeout)

    def send(self, keys: str | bytes) -> None:
        self.child.send(keys)

    def type_line(self, text: str) -> None:
        self.child.send(text)
        self.wait_for(lambda s: text[-20:] in s, timeout=10)
        self.child.send("\r")

    def resize(self, cols: int, rows: int) -> None:
        self.cols, self.rows = cols, rows
        self.screen.resize(rows, cols)
        self.child.setwinsize(rows, cols)

    def wait_exit(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while self.child.isalive() and time.monotonic() < deadline:
            self.pump(0.1)
        if self.child.isalive():
            raise AssertionError(f"cru chat did not exit within {timeout} s; the screen shows:\n{self.text()}")
        while self.pump(0.05):  # the rest of its output (EOF ends it)
            pass
        self.child.close()
        return self.child.exitstatus if self.child.exitstatus is not None else -(self.child.signalstatus or 0)

    def close_window(self, timeout: float = 30) -> float:
        """Close the pty as a closing terminal window does (the kernel sends SIGHUP to the
        program) and nothing else: seconds until the program exited (`timeout` if it did not).
        pexpect's `close` would follow with SIGCONT and SIGINT, and raise if the program took
        more than its 0.4 s to exit."""
        started = time.monotonic()
        self.child.ptyproc.fileobj.close()
        while self.child.isalive() and time.monotonic() - started < timeout:
            time.sleep(0.02)
        return time.monotonic() - started

    def close(self) -> None:
        if self.child.isalive():
            self.child.kill(signal.SIGKILL)
        self.child.close(force=True)


class TuiRunner:
    def __init__(self, cru: str, env: dict[str, str], kiln: Path, tmp: Path) -> None:
        self.cru, self.env, self.kiln, self.tmp = cru, env, kiln, tmp
        self.log = tmp / "agent-log.jsonl"
        self.screens: list[Screen] = []
        self.env["TERM"] = "xterm-256color"
        self.env.pop("NO_COLOR", None)

    def agent_command(self, script: dict[str, Any] | None, name: str = "script.json") -> str:
        path = self.tmp / name
        path.write_text(json.dumps({"log": str(self.log), **(script or {})}))
        return f"{sys.executable} {SCRIPTED} {path}"

    def open(self, script: dict[str, Any] | None, *extra: str, cols: int = 80, rows: int = 24,
             env: dict[str, str] | None = None) -> Screen:
        argv = [self.cru, "chat", "--agent-command", self.agent_command(script), "--kiln", str(self.kiln), *extra]
        screen = Screen(argv, {**self.env, **(env or {})}, self.tmp, cols, rows)
        self.screens.append(screen)
        return screen

    def agent_log(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def wait_for_log(self, pred: Callable[[dict[str, Any]], bool], timeout: float = 30) -> dict[str, Any]:
        """Poll the agent's log file, written by another process (no other channel exists)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for entry in self.agent_log():
                if pred(entry):
                    return entry
            time.sleep(0.05)
        raise AssertionError(f"agent log never matched; log tail: {self.agent_log()[-5:]}")


@pytest.fixture
def tui(cru_bin: str, clean_env: dict[str, str], kiln: Path, tmp_path: Path) -> Iterator[TuiRunner]:
    runner = TuiRunner(cru_bin, clean_env, kiln, tmp_path)
    yield runner
    for screen in runner.screens:
        screen.close()


def group_gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False
