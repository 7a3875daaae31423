"""The terminal chat: start-up, keystroke latency and flood time vs headless `cru chat -p`.

The scripted agent (fixtures/scripted_agent.py) answers each prompt with "FLOOD-START", N
one-character `agent_message_chunk` updates (its `flood` step) and "FLOOD-END". Same agent,
same N, same run:

  start-up  `cru chat` in a pseudo-terminal: from the spawn to the status bar saying "ready"
            (the input is ready), vs `cru chat -p hi --format json`: from the spawn to its first
            event on stdout
  headless  `cru chat -p go`: time from the agent receiving session/prompt (its log) to
            FLOOD-END on cru's stdout (a pipe)
  tui       `cru chat` in a pseudo-terminal (80×24), its screen read with pyte: time from the
            agent receiving session/prompt to FLOOD-END on screen; meanwhile a key is typed, its
            echo in the input line awaited, then the next key: keystroke-to-screen latency

    python bench/tui.py [--n 50000] [--repeat 3] [--cru PATH] [--baseline-src DIR]
        (PATH: another cru, e.g. an older checkout's)
    python bench/tui.py --picker 1000
        the /sessions picker over 1,000 saved conversations: list and index times, keystroke
        latency in its search line while it indexes and while each key searches

`--baseline-src DIR` measures the same again with the code in DIR first on PYTHONPATH (the
before of a before/after, in the same run), e.g. the TUI before issue 16:
    git archive a68b3d4 crucible acp_host mcp_bridge | tar -x -C /tmp/tui-before

Goals: tui flood time <= 1.5x headless (issue 6), no slower than before (issue 16); keystroke
p95 during the flood < 50 ms (issue 16).
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
from typing import IO, Any

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


def headless_first_event(tmp: Path, env: dict[str, str], kiln: Path) -> float:
    """`cru chat -p` from its spawn to its first event on stdout (JSON lines)."""
    script = tmp / "echo.json"
    script.write_text(json.dumps({}))
    argv = [CRU, "chat", "--agent-command", f"{sys.executable} {SCRIPTED} {script}", "--kiln", str(kiln), "-p", "hi",
            "--format", "json"]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=tmp)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    first = time.perf_counter() - start
    proc.wait(timeout=60)
    if not line:
        raise RuntimeError("cru chat -p printed no event")
    return first


def tui_ready(tmp: Path, env: dict[str, str], kiln: Path) -> float:
    """`cru chat` from its spawn to the status bar saying "ready" (the input takes a prompt)."""
    script = tmp / "echo.json"
    script.write_text(json.dumps({}))
    argv = [CRU, "chat", "--agent-command", f"{sys.executable} {SCRIPTED} {script}", "--kiln", str(kiln)]
    screen = pyte.Screen(COLS, ROWS)
    stream = pyte.ByteStream(screen)
    start = time.perf_counter()
    child = pexpect.spawn(argv[0], argv[1:], env=env, cwd=str(tmp), dimensions=(ROWS, COLS))
    deadline = time.monotonic() + 60
    while "ready" not in screen.display[ROWS - 1]:
        if time.monotonic() > deadline:
            raise RuntimeError("cru chat never became ready:\n" + "\n".join(screen.display))
        try:
            stream.feed(child.read_nonblocking(1 << 16, timeout=0.002))
        except pexpect.TIMEOUT:
            pass
    ready = time.perf_counter() - start
    child.send("\x04")
    child.expect(pexpect.EOF, timeout=30)
    child.close()
    return ready


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) the process has used so far (Linux /proc): a figure that holds
    on a loaded machine, where wall times swing with the other processes."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Tui:
    def __init__(self, tmp: Path, env: dict[str, str], kiln: Path, n: int, repeat: int) -> None:
        """`cru chat` whose agent answers each prompt with a flood of `n` chunks (`repeat` of them)."""
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

    def flood(self, i: int) -> tuple[float, list[float], float]:
        """One flooded turn: its time on screen, the keystroke latencies during it, and the CPU
        time cru used from the prompt to the turn's end on screen."""
        self.child.send("\x15go")
        while "go" not in self.input_line():
            self.pump()
        self.child.send("\r")
        while self.watch.count() < i + 1:
            self.pump(0.001)
        start = time.perf_counter()
        cpu_start = cpu_seconds(self.child.pid)
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
        return done - start, latencies, cpu_seconds(self.child.pid) - cpu_start

    def close(self) -> None:
        self.child.send("\x15\x04")
        self.child.expect(pexpect.EOF, timeout=30)
        self.child.close()


def picker(tmp: Path, env: dict[str, str], kiln: Path, conversations: int) -> dict[str, Any]:
    """The /sessions picker over N saved conversations (bench/sessions.py's, each a few turns of
    prose with a flood-sized answer): from `/sessions` Enter to the list shown and to the
    transcripts indexed; keystroke-to-screen in its search line while it indexes and after
    (each key then a full-text search, in a thread), beside the idle input box's; and
    `cru session search` over the same conversations, a fresh process (the peer)."""
    import random

    sys.path.insert(0, str(ROOT / "bench"))
    from sessions import make_store  # the same conversations bench/sessions.py measures

    data = tmp / "picker-data"
    env = dict(env, XDG_DATA_HOME=str(data))
    make_store(data / "crucible" / "sessions", conversations, random.Random(7))
    start = time.perf_counter()
    subprocess.run([CRU, "session", "search", "sourdough starter"], env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False)
    cli = time.perf_counter() - start
    tui = Tui(tmp, env, kiln, 1, 1)  # (its agent floods only when asked: nothing is asked here)
    tui.wait_for("ready")
    idle = tui.idle_keys()
    tui.child.send("/sessions")
    while "/sessions" not in tui.input_line():
        tui.pump()
    opened = time.perf_counter()
    tui.child.send("\r")
    tui.wait_for(f"{conversations} of {conversations}")
    listed = time.perf_counter() - opened
    indexed: float | None = None
    during: list[float] = []
    after: list[float] = []
    typed = ""
    words = "sourdough starter lantern harbour glacier meadow telescope orbit violin sonata ".split(" ")

    def search_line() -> str:
        return next((row for row in tui.screen.display if row.startswith(" search: ")), "")

    for word in words * 4:
        for ch in word + " ":
            if len(typed) > 60:  # the search line is 80 columns wide: start again
                tui.child.send("\x15")
                while search_line().strip() != "search:":
                    tui.pump(0.001)
                typed = ""
            typed += ch
            if ch == " ":  # (a trailing space does not show: sent, not timed)
                tui.child.send(ch)
                continue
            still_indexing = "indexing the text" in tui.text()
            sent = time.perf_counter()
            tui.child.send(ch)
            while search_line()[len(" search: "):].rstrip() != typed:
                tui.pump(0.001)
            (during if still_indexing else after).append(time.perf_counter() - sent)
            if indexed is None and "indexing the text" not in tui.text():
                indexed = time.perf_counter() - opened
        if indexed is not None and len(after) >= 40:
            break
    deadline = time.monotonic() + 120
    while indexed is None and time.monotonic() < deadline:
        tui.pump(0.01)
        if "indexing the text" not in tui.text():
            indexed = time.perf_counter() - opened
    tui.child.send("\x1b")
    tui.close()
    return {"n": conversations, "cli": cli, "listed": listed, "indexed": indexed, "idle": idle, "during": during,
            "after": after}


def report_picker(r: dict[str, Any]) -> None:
    print(f"== /sessions picker over {r['n']} saved conversations (bench/sessions.py's)")
    print(f"  list shown after /sessions     : {r['listed']:.3f} s")
    indexed = f"{r['indexed']:.3f} s" if r["indexed"] is not None else "not within the run"
    print(f"  transcripts indexed after it   : {indexed}   (peer: one `cru session search`, a fresh process: "
          f"{r['cli']:.3f} s)")
    for name, keys in (("idle input box", r["idle"]), ("search line, while indexing", r["during"]),
                       ("search line, each key a search", r["after"])):
        if keys:
            ms = [k * 1000 for k in keys]
            print(f"  keystroke to screen, {name:<31}({len(ms):>3} keys): p50 {pct(ms, 50):6.1f} ms, "
                  f"p95 {pct(ms, 95):6.1f} ms, max {max(ms):6.1f} ms")


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def render_cpu(n: int, batch: int = 250) -> float:
    """In this process: N one-character chunks drawn by the chat's feed in batches, a frame
    rendered after each batch (prompt-toolkit's renderer, 80×24, into /dev/null), a turn
    running (spinner and elapsed time shown). CPU seconds: the TUI's own cost, without the
    agent, the pty or the other processes of a loaded machine."""
    # In the child process only: the code base measured is the one its PYTHONPATH picks.
    import asyncio

    from prompt_toolkit.application.current import set_app
    from prompt_toolkit.data_structures import Size
    from prompt_toolkit.output.vt100 import Vt100_Output

    from acp_host.registry import AgentSpec
    from acp_host.session import MessageChunk
    from crucible.config import Config
    from crucible.sessions import SessionOptions
    from crucible.tui.app import ChatUI

    async def run(sink: IO[str]) -> float:  # the chat's parts want an asyncio loop (the pacer)
        here = Path(tempfile.gettempdir())
        ui = ChatUI(SessionOptions(agent=AgentSpec("agent", "agent", []), kiln=here, cwd=here, config=Config()))
        ui.app.output = ui.app.renderer.output = Vt100_Output(sink, lambda: Size(ROWS, COLS), term="xterm-256color")
        ui.status.turn_started()
        block = {"type": "text", "text": "x"}
        events = [MessageChunk("x", block, None) for _ in range(batch)]
        start = time.process_time()
        with set_app(ui.app):
            for _ in range(n // batch):
                ui.feed.render(events)
                ui.app.renderer.render(ui.app, ui.app.layout)
        return time.process_time() - start

    with open(os.devnull, "w") as sink:
        return asyncio.run(run(sink))


def render_cpus(envs: list[dict[str, str]], n: int, repeat: int) -> list[list[float]]:
    """`render_cpu` in a fresh interpreter per run, for each env (its PYTHONPATH picks the code
    base), the code bases taking turns so a change in the machine's load hits them alike."""
    out: list[list[float]] = [[] for _ in envs]
    for _ in range(repeat):
        for env, figures in zip(envs, out, strict=True):
            res = subprocess.run([sys.executable, __file__, "--render-cpu", str(n)], env=env, capture_output=True,
                                 text=True, timeout=300)
            if res.returncode != 0:
                raise RuntimeError(f"the render measurement failed:\n{res.stderr[-2000:]}")
            figures.append(float(res.stdout.strip().splitlines()[-1]))
    return out


def measure(tmp: Path, env: dict[str, str], kiln: Path, n: int, repeat: int) -> dict[str, Any]:
    """Every figure of one code base, in order: start-up, headless floods, TUI floods and keys."""
    firsts = [headless_first_event(tmp, env, kiln) for _ in range(repeat)]
    readies = [tui_ready(tmp, env, kiln) for _ in range(repeat)]
    heads = [headless(tmp, env, kiln, n) for _ in range(repeat)]
    tui = Tui(tmp, env, kiln, n, repeat)
    tui.wait_for("ready")
    floods: list[float] = []
    cpus: list[float] = []
    keys: list[float] = []
    idle = tui.idle_keys()
    try:
        for i in range(repeat):
            seconds, lat, cpu = tui.flood(i)
            floods.append(seconds)
            cpus.append(cpu)
            keys.extend(lat)
    finally:
        tui.close()
    return {"first": firsts, "ready": readies, "heads": heads, "floods": floods, "cpu": cpus, "idle": idle,
            "keys": keys}


def report(name: str, n: int, repeat: int, r: dict[str, Any]) -> None:
    med = statistics.median
    print(f"== {name}")
    first, ready = med(r["first"]), med(r["ready"])
    print(f"start-up, median of {repeat} (seconds from the spawn):")
    print(f"  cru chat -p, first event : {first:.3f} s   ({', '.join(f'{x:.3f}' for x in r['first'])})")
    print(f"  cru chat, input ready    : {ready:.3f} s   ({', '.join(f'{x:.3f}' for x in r['ready'])})")
    print(f"  ratio ready/first event  : {ready / first:.2f}x")
    head, tui_s = med(r["heads"]), med(r["floods"])
    print(f"flood of {n} chunks, median of {repeat} (seconds from the agent receiving the prompt to FLOOD-END shown):")
    print(f"  headless cru chat -p : {head:.3f} s   ({', '.join(f'{h:.3f}' for h in r['heads'])})")
    print(f"  tui (pty, 80x24)     : {tui_s:.3f} s   ({', '.join(f'{f:.3f}' for f in r['floods'])})")
    print(f"  ratio tui/headless   : {tui_s / head:.2f}x   (goal <= 1.5x)")
    print(f"  tui CPU per flood    : {med(r['cpu']):.3f} s   ({', '.join(f'{c:.3f}' for c in r['cpu'])})")
    print(f"  render only, in-process CPU ({n // 250} frames): {med(r['render']):.3f} s   "
          f"({', '.join(f'{c:.3f}' for c in r['render'])})")
    ms = [k * 1000 for k in r["idle"]]
    print(f"keystroke to screen, idle ({len(ms)} keys): p50 {pct(ms, 50):.1f} ms, p95 {pct(ms, 95):.1f} ms")
    ms = [k * 1000 for k in r["keys"]]
    print(f"keystroke to screen during the flood ({len(ms)} keys): p50 {pct(ms, 50):.1f} ms, "
          f"p95 {pct(ms, 95):.1f} ms, max {max(ms):.1f} ms   (goal p95 < 50 ms)")


def main() -> int:
    global CRU
    if sys.argv[1:2] == ["--render-cpu"]:  # the child of render_cpus
        print(f"{render_cpu(int(sys.argv[2])):.4f}")
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=50000, help="chunks per flood")
    parser.add_argument("--repeat", type=int, default=3, help="floods (and start-ups) per mode")
    parser.add_argument("--cru", default=CRU, help="the cru executable to measure (default: %(default)s)")
    parser.add_argument("--baseline-src", type=Path, help="a tree of crucible/, acp_host/, mcp_bridge/ to compare with")
    parser.add_argument("--picker", type=int, metavar="N", help="only the /sessions picker, over N conversations")
    args = parser.parse_args()
    CRU = args.cru
    if args.picker:
        with tempfile.TemporaryDirectory(prefix="bench-tui-") as d:
            tmp = Path(d)
            kiln = tmp / "kiln"
            shutil.copytree(ROOT / "fixtures" / "kiln", kiln, ignore=shutil.ignore_patterns(".crucible"))
            env = dict(os.environ, TERM="xterm-256color", XDG_CONFIG_HOME=str(tmp / "config"))
            env.pop("NO_COLOR", None)
            env.pop("PYTHONPATH", None)
            report_picker(picker(tmp, env, kiln, args.picker))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-tui-") as d:
        tmp = Path(d)
        kiln = tmp / "kiln"
        shutil.copytree(ROOT / "fixtures" / "kiln", kiln, ignore=shutil.ignore_patterns(".crucible"))
        env = dict(os.environ, TERM="xterm-256color", XDG_CONFIG_HOME=str(tmp / "config"),
                   XDG_DATA_HOME=str(tmp / "data"))
        env.pop("NO_COLOR", None)
        env.pop("PYTHONPATH", None)
        envs = {"this tree": env}
        if args.baseline_src is not None:
            envs[f"baseline {args.baseline_src}"] = dict(env, PYTHONPATH=str(args.baseline_src.resolve()))
        results = {name: measure(tmp, e, kiln, args.n, args.repeat) for name, e in envs.items()}
        for name, figures in zip(envs, render_cpus(list(envs.values()), args.n, args.repeat), strict=True):
            results[name]["render"] = figures
    for name, r in results.items():
        report(name, args.n, args.repeat, r)
    if len(results) == 2:
        now, before = results.values()
        med = statistics.median
        print("== this tree / baseline (same run)")
        print(f"  tui flood time     : {med(now['floods']) / med(before['floods']):.2f}x")
        print(f"  tui CPU per flood  : {med(now['cpu']) / med(before['cpu']):.2f}x")
        print(f"  render-only CPU    : {med(now['render']) / med(before['render']):.2f}x")
        print(f"  tui/headless ratio : {(med(now['floods']) / med(now['heads'])) / (med(before['floods']) / med(before['heads'])):.2f}x")
        print(f"  start-up (ready)   : {med(now['ready']) / med(before['ready']):.2f}x")
        now_ms, before_ms = [k * 1000 for k in now["keys"]], [k * 1000 for k in before["keys"]]
        print(f"  keystroke p95      : {pct(now_ms, 95):.1f} ms vs {pct(before_ms, 95):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
