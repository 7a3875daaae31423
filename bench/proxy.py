"""What `cru acp` costs an editor, against the same work without it, in the same run.

1. `initialize` latency: spawn the agent, send initialize, wait for the answer (process start,
   imports and the answer). `cru acp` (backend: fixtures/flood_agent.py, never started for
   initialize) vs a bare agent on the official SDK (fixtures/sdk_agent.py). Goal: <= 1.5x.
2. Flood throughput: fixtures/flood_agent.py streams N `agent_message_chunk` updates for one
   prompt; events/s from sending session/prompt to its answer with all N updates read, through
   `cru acp --agent-command flood_agent` vs the flood agent driven directly. Goal: >= 70%.

Each flood is read by two clients, the same one on both sides of each ratio:
  raw  a minimal blocking client (json.loads per line): the proxy's own ceiling, since this
       client costs almost nothing per event. Per update the proxy reads and decodes the
       backend's frame once, writes the frame on as the backend wrote it (only the sessionId
       replaced, in the bytes), coalesced with its neighbours into one pipe write, and turns
       the update into the session's typed event for its transcript (chunks joined per batch).
       With this client the CPU time of the `cru acp` process per update is printed too
       (Linux /proc): unlike the rates it hardly depends on what else the machine runs;
  sdk  the official ACP SDK's client (asyncio, pydantic models per update), as an editor
       built on it would read the stream: the goal's comparison.

    python bench/proxy.py [--runs 15] [--n 100000] [--repeat 3] [--cru PATH] [--one-cpu]

`--cru` measures another `cru` (say, a checkout of an older commit) against the same direct
figures. Through cru acp three processes share the CPU (agent, proxy, client) where the direct
path has two, so on a small or busy machine the sdk share is bounded by the proxy's own ceiling
(the raw-client figure), not only by its cost per event: compare figures of one run, and repeat.
On two cores the sdk share is bimodal (about 100% when the client has a core to itself, less
when the proxy shares the client's core); `--one-cpu` runs everything on one CPU, the busy
machine's case, where the share is about client cost / (client cost + proxy cost).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
CRU = str(Path(PY).parent / "cru")
FLOOD = [PY, str(ROOT / "fixtures" / "flood_agent.py")]
SDK_AGENT = [PY, str(ROOT / "fixtures" / "sdk_agent.py")]
KILN = ROOT / "fixtures" / "kiln"
INIT = {"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": False, "writeTextFile": False},
                                                     "terminal": False}}


class RawClient:
    """A minimal blocking ACP client over the process's pipes."""

    def __init__(self, argv: list[str], env: dict[str, str], stderr: IO[bytes]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env,
                                     bufsize=0)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self._reader = open(self.stdout.fileno(), "rb", buffering=1 << 20, closefd=False)  # noqa: SIM115
        self._ids = 0

    def send(self, method: str, params: Any) -> int:
        self._ids += 1
        frame = {"jsonrpc": "2.0", "id": self._ids, "method": method, "params": params}
        self.stdin.write(json.dumps(frame).encode() + b"\n")
        return self._ids

    def wait(self, request_id: int) -> tuple[Any, int]:
        """The answer to `request_id`, and how many message chunks came before it."""
        updates = 0
        loads = json.loads
        for line in self._reader:
            msg = loads(line)
            if msg.get("method") == "session/update":
                if msg["params"]["update"].get("sessionUpdate") == "agent_message_chunk":
                    updates += 1
            elif msg.get("id") == request_id and "method" not in msg:
                if "error" in msg:
                    raise RuntimeError(f"error answer: {msg['error']}")
                return msg.get("result"), updates
        raise RuntimeError("the agent closed its output")

    def close(self) -> None:
        self.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.close()
        self.stdout.close()


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["XDG_CONFIG_HOME"] = str(tmp / "config")
    env["XDG_DATA_HOME"] = str(tmp / "data")
    env.pop("CRUCIBLE_CONFIG", None)
    return env


def cru_acp(backend: list[str], cru: str = CRU) -> list[str]:
    return [cru, "acp", "--agent-command", shlex.join(backend), "--kiln", str(KILN)]


def init_latency(argv: list[str], env: dict[str, str], stderr: IO[bytes]) -> float:
    start = time.perf_counter()
    client = RawClient(argv, env, stderr)
    client.wait(client.send("initialize", INIT))
    took = time.perf_counter() - start
    client.close()
    return took


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of one process (not its children), or None off Linux."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


CPU: dict[str, list[float]] = {}  # per argv[0]: CPU microseconds per update of the process driven


def flood_rate(argv: list[str], env: dict[str, str], n: int, stderr: IO[bytes], cwd: str) -> float:
    client = RawClient(argv, env, stderr)
    try:
        client.wait(client.send("initialize", INIT))
        new, _ = client.wait(client.send("session/new", {"cwd": cwd, "mcpServers": []}))
        cpu = _cpu_seconds(client.proc.pid)
        start = time.perf_counter()
        result, updates = client.wait(client.send("session/prompt", {
            "sessionId": new["sessionId"], "prompt": [{"type": "text", "text": "flood"}]}))
        took = time.perf_counter() - start
        cpu_after = _cpu_seconds(client.proc.pid)
        if cpu is not None and cpu_after is not None:
            CPU.setdefault(argv[0], []).append((cpu_after - cpu) / n * 1e6)
    finally:
        client.close()
    if updates != n or result.get("stopReason") != "end_turn":
        raise RuntimeError(f"expected {n} updates and end_turn, got {updates} and {result}")
    return n / took


def flood_rate_sdk(argv: list[str], env: dict[str, str], n: int, stderr: IO[bytes], cwd: str) -> float:
    """The same measurement with the ACP SDK's client reading the flood (in a child process,
    so its asyncio loop and memory are its own)."""
    code = (
        "import asyncio, json, os, sys, time\n"
        "from acp import spawn_agent_process, text_block\n"
        "argv, n, cwd = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]\n"
        "class C:\n"
        "    count = 0\n"
        "    async def session_update(self, session_id, update, **kw):\n"
        "        if getattr(update, 'session_update', '') == 'agent_message_chunk': C.count += 1\n"
        "    async def request_permission(self, *a, **kw): raise RuntimeError('no')\n"
        "async def main():\n"
        "    async with spawn_agent_process(C(), argv[0], *argv[1:], env=dict(os.environ),"
        " transport_kwargs={'limit': 1 << 26})"
        " as (conn, proc):\n"
        "        await conn.initialize(protocol_version=1)\n"
        "        s = await conn.new_session(cwd=cwd, mcp_servers=[])\n"
        "        t = time.perf_counter()\n"
        "        r = await conn.prompt(session_id=s.session_id, prompt=[text_block('flood')])\n"
        "        took = time.perf_counter() - t\n"
        "        await asyncio.sleep(0)\n"
        "        print(json.dumps({'took': took, 'count': C.count, 'stop': r.stop_reason}))\n"
        "asyncio.run(main())\n"
    )
    out = subprocess.run([PY, "-c", code, json.dumps(argv), str(n), cwd], env=env, stderr=stderr,
                         stdout=subprocess.PIPE, text=True, timeout=600, check=True).stdout
    res = json.loads(out.strip().splitlines()[-1])
    # The SDK hands each notification to its own task; all of them are counted by the answer.
    if res["count"] != n or res["stop"] != "end_turn":
        raise RuntimeError(f"expected {n} updates and end_turn, got {res}")
    return n / float(res["took"])


def _ms(values: list[float]) -> str:
    s = sorted(values)
    p90 = s[min(len(s) - 1, int(round(0.9 * (len(s) - 1))))]
    return f"median {statistics.median(s) * 1000:7.1f} ms   p90 {p90 * 1000:7.1f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15, help="initialize measurements per agent")
    ap.add_argument("--n", type=int, default=100_000, help="updates in the flood")
    ap.add_argument("--repeat", type=int, default=3, help="flood measurements per path (best is kept)")
    ap.add_argument("--cru", default=CRU, help="the cru executable to measure (default: %(default)s)")
    ap.add_argument("--one-cpu", action="store_true", help="run this and every process it starts on one CPU")
    args = ap.parse_args()
    cru = args.cru
    if args.one_cpu:
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})  # inherited by every process started from here
        print(f"all processes on CPU {cpu}")
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as d:
        tmp = Path(d)
        env = _env(tmp)
        stderr = open(tmp / "stderr.txt", "wb")  # noqa: SIM115
        try:
            # Warm the OS caches once for both, then interleave so drift hits both alike.
            init_latency(cru_acp(FLOOD, cru), env, stderr)
            init_latency(SDK_AGENT, env, stderr)
            ours: list[float] = []
            sdk: list[float] = []
            for _ in range(args.runs):
                ours.append(init_latency(cru_acp(FLOOD, cru), env, stderr))
                sdk.append(init_latency(SDK_AGENT, env, stderr))
            ratio = statistics.median(ours) / statistics.median(sdk)
            print(f"initialize, {args.runs} runs each (spawn + answer)")
            print(f"  cru acp           {_ms(ours)}")
            print(f"  bare SDK agent    {_ms(sdk)}")
            print(f"  ratio (median)    {ratio:.2f}x   goal <= 1.5x   {'ok' if ratio <= 1.5 else 'MISSED'}")

            flood_env = env
            flood = [*FLOOD, str(args.n)]
            print(f"flood of {args.n} agent_message_chunk updates, best of {args.repeat}")
            for label, measure in (("sdk client", flood_rate_sdk), ("raw client", flood_rate)):
                direct: list[float] = []
                proxied: list[float] = []
                for _ in range(args.repeat):
                    direct.append(measure(flood, flood_env, args.n, stderr, str(tmp)))
                    proxied.append(measure(cru_acp(flood, cru), flood_env, args.n, stderr, str(tmp)))
                share = max(proxied) / max(direct)
                print(f"  {label}: direct           {max(direct):10,.0f} events/s   (all: "
                      + ", ".join(f"{r:,.0f}" for r in direct) + ")")
                print(f"  {label}: through cru acp  {max(proxied):10,.0f} events/s   (all: "
                      + ", ".join(f"{r:,.0f}" for r in proxied) + ")")
                goal = f"   goal >= 70%   {'ok' if share >= 0.7 else 'MISSED'}" if label == "sdk client" else \
                    "   (the proxy's own ceiling)"
                print(f"  {label}: share            {share:.0%}{goal}")
            if CPU.get(cru):
                print(f"  CPU per update (raw client): cru acp {min(CPU[cru]):.1f} us (all: "
                      + ", ".join(f"{c:.1f}" for c in CPU[cru]) + f"); the flood agent alone {min(CPU[PY]):.1f} us")
        finally:
            stderr.close()
            tail = (tmp / "stderr.txt").read_text(errors="replace").strip()
            if tail:
                print("stderr of the agents (last lines):\n" + "\n".join(tail.splitlines()[-10:]), file=sys.stderr)


if __name__ == "__main__":
    main()
