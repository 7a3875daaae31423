"""The terminal chat under a flood: keystroke latency and flood time vs headless `cru chat -p`.

The scripted agent (fixtures/scripted_agent.py) answers each prompt with "FLOOD-START", N
one-character `agent_message_chunk` updates (its `flood` step) and "FLOOD-END". Same agent,
same N, same run:

  headless  `cru chat -p go`: time from the agent receiving session/prompt (its log) to
            FLOOD-END on cru's stdout (a pipe)
  tui       `cru chat` in a pseudo-terminal (80×24), its screen read with pyte: time from the
            agent receiving session/prompt to FLOOD-END on screen; meanwhile a key is typed, its
            echo in the input line awaited, then the next key: keystroke-to-screen latency

    python bench/tui.py [--n 50000] [--repeat 3] [--cru PATH]   (PATH: another cru, e.g. an older checkout)

Goals (issue 6): tui flood time <= 1.5x headless; keystroke p95 < 100 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pexpect
import pyte

ROOT = Path(__file__).resolve().parent.parent
SCRIPTED = ROOT / "fixtures" / "scripted_agent.py"
CRU = str(Path(sys.executable).parent / "cru")
COLS, ROWS = 80, 24


def flood_turn(n: int, i: int = 0) -> list[dict[str, Any]]:
    return [{"text": f"FLOOD-START-{i}\n"}, {"flood": {"count": n, "text": "x"}}, {"text": f"\nFLOOD-END-{i}\n"}]


class PromptWatch:
    """When the agent received its k-th session/prompt, from its log (JSON lines)."""

    def __init__(self, log: Path) -> None:
        self.log = log

    def count(self) -> int:
        try:
            text = self.log.read_text()
        except FileNotFoundError:
            return 0
        return text.count('"method": "session/prompt"') + text.count('"method":"session/prompt"')


def headless(tmp: Path, env: dict[str, str], kiln: Path, n: int) -> float:
    log = tmp / "headless.log"
    log.unlink(missing_ok=True)
    watch = PromptWatch(log)
    script = tmp / "headless.json"
    script.write_text(json.dumps({"log": str(log), "prompts": [flood_turn(n)]}))
    argv = [CRU, "chat", "--agent-command", f"{sys.executable} {SCRIPTED} {script}", "--kiln", str(kiln), "-p", "go"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=tmp)
    assert proc.stdout is not None
    buf = b""
    start = end = None
    while end is None:
        ready, _, _ = select.select([proc.stdout], [], [], 0.001)
        if start is None and watch.count() >= 1:
            start = time.perf_counter()
        if not ready:
            continue
        data = os.read(proc.stdout.fileno(), 1 << 16)
        if not data:
            break
        buf = buf[-16:] + data
        if b"FLOOD-END" in buf:
            end = time.perf_counter()
    proc.wait(timeout=60)
    if start is None or end is None:
        raise RuntimeError("the headless run never showed the whole flood")
    return end - start


class Tui:
    def __init__(self, tmp: Path, env: dict[str, str], kiln: Path, n: int, repeat: int) -> None:
        script = tmp / "tui.json"
        self.watch = PromptWatch(tmp / "tui.log")
        script.write_text(json.dumps({"log": str(self.watch.log), "prompts": [flood_turn(n, i) for i in range(repeat)]}))
        argv = [CRU, "chat", "--agent-command", f"{sys.executable} {SCRIPTED} {script}", "--kiln", str(kiln)]
        self.screen = pyte.Screen(COLS, ROWS)
        self.stream = pyte.ByteStream(self.screen)
        self.child = pexpect.spawn(argv[0], argv[1:], env=env, cwd=str(tmp), dimensions=(ROWS, COLS))
        self.child.delaybeforesend = None  # pexpect sleeps 50 ms before each send by default

    def pump(self, timeout: float = 0.002) -> None:
        try:
            self.stream.feed(self.child.read_nonblocking(1 << 16, timeout=timeout))
        except pexpect.TIMEOUT:
            pass

    def text(self) -> str:
        return "\n".join(self.screen.display)

    def wait_for(self, needle: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the screen never showed {needle!r}:\n{self.text()}")
            self.pump(0.01)

    def input_line(self) -> str:
        return self.screen.display[ROWS - 2]

    def idle_keys(self, count: int = 20) -> list[float]:
        """Keystroke latency with nothing streaming: the floor of this measurement."""
        out = []
        for typed in range(1, count + 1):
            sent = time.perf_counter()
            self.child.send("k")
            while self.input_line().count("k") < typed:
                self.pump(0.001)
            out.append(time.perf_counter() - sent)
        self.child.send("\x15")
        while "k" in self.input_line():
            self.pump(0.001)
        return out

    def flood(self, i: int) -> tuple[float, list[float]]:
        """One flooded turn: its time on screen and the keystroke latencies during it."""
        self.child.send("\x15go")
        while "go" not in self.input_line():
            self.pump()
        self.child.send("\r")
        while self.watch.count() < i + 1:
            self.pump(0.001)
        start = time.perf_counter()
        latencies: list[float] = []
        typed = 0
        done = None
        while done is None:
            typed += 1
            sent = time.perf_counter()
            self.child.send("k")
            while self.input_line().count("k") < typed:
                self.pump(0.001)
                if done is None and f"FLOOD-END-{i}" in self.text():
                    done = time.perf_counter()
            latencies.append(time.perf_counter() - sent)
            if done is None and f"FLOOD-END-{i}" in self.text():
                done = time.perf_counter()
            if typed >= 60:  # the input line is 80 columns wide
                self.child.send("\x15")
                while "k" in self.input_line():
                    self.pump(0.001)
                typed = 0
        # The screen was redrawn: wait for the status bar to say the turn ended.
        deadline = time.monotonic() + 30
        while "ready" not in self.screen.display[ROWS - 1] and time.monotonic() < deadline:
            self.pump(0.01)
        return done - start, latencies

    def close(self) -> None:
        self.child.send("\x15\x04")
        self.child.expect(pexpect.EOF, timeout=30)
        self.child.close()


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main() -> int:
    global CRU
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=50000, help="chunks per flood")
    parser.add_argument("--repeat", type=int, default=3, help="floods per mode")
    parser.add_argument("--cru", default=CRU, help="the cru executable to measure (default: %(default)s)")
    args = parser.parse_args()
    CRU = args.cru
    with tempfile.TemporaryDirectory(prefix="bench-tui-") as d:
        tmp = Path(d)
        kiln = tmp / "kiln"
        shutil.copytree(ROOT / "fixtures" / "kiln", kiln, ignore=shutil.ignore_patterns(".crucible"))
        env = dict(os.environ, TERM="xterm-256color", XDG_CONFIG_HOME=str(tmp / "config"),
                   XDG_DATA_HOME=str(tmp / "data"))
        env.pop("NO_COLOR", None)
        heads = []
        for _ in range(args.repeat):
            heads.append(headless(tmp, env, kiln, args.n))
        tui = Tui(tmp, env, kiln, args.n, args.repeat)
        tui.wait_for("ready")
        floods: list[float] = []
        keys: list[float] = []
        idle = tui.idle_keys()
        try:
            for i in range(args.repeat):
                seconds, lat = tui.flood(i)
                floods.append(seconds)
                keys.extend(lat)
        finally:
            tui.close()
    head, tui_s = statistics.median(heads), statistics.median(floods)
    print(f"flood of {args.n} chunks, median of {args.repeat} (seconds from the agent receiving the prompt to FLOOD-END shown):")
    print(f"  headless cru chat -p : {head:.3f} s   ({', '.join(f'{h:.3f}' for h in heads)})")
    print(f"  tui (pty, 80x24)     : {tui_s:.3f} s   ({', '.join(f'{f:.3f}' for f in floods)})")
    print(f"  ratio tui/headless   : {tui_s / head:.2f}x   (goal <= 1.5x)")
    ms = [k * 1000 for k in idle]
    print(f"keystroke to screen, idle ({len(ms)} keys): p50 {pct(ms, 50):.1f} ms, p95 {pct(ms, 95):.1f} ms")
    ms = [k * 1000 for k in keys]
    print(f"keystroke to screen during the flood ({len(ms)} keys): p50 {pct(ms, 50):.1f} ms, "
          f"p95 {pct(ms, 95):.1f} ms, max {max(ms):.1f} ms   (goal p95 < 100 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
