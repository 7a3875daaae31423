"""`cru mcp` latency, against peers measured in the same run.

1. Startup: spawn -> `initialize` answered -> first `tools/list` answered, over stdio with raw
   JSON-RPC lines, for `cru mcp` and for a minimal mcp-SDK server (MCPServer, one tool) run by
   the same interpreter. Goal: cru mcp <= 1.5x the minimal server (heavy modules load lazily).
2. semantic_search round trip through stdio (the SDK's client; the index already open) vs
   calling the same search function in-process on the same index. Goal: p50 <= 1.3x.

    V=/root/.cache/crucible/venv-dev/bin; $V/python bench/mcp.py [--runs 7] [--queries 40] [--kiln DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

# This file is bench/mcp.py: keep its folder off sys.path so `import mcp` finds the SDK.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import trio  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CRU = str(Path(sys.executable).parent / "cru")
QUERIES = [
    "how do I keep a sourdough starter alive", "memory leak in the collector", "tomato plants with brown spots",
    "restore a database backup", "why did we choose SQLite", "running training schedule", "ssh key setup",
    "what happened at the retro", "books about systems thinking", "fixing a bike chain", "lisbon trip",
    "git rebase conflicts", "compost heap too wet", "quick weeknight dinner with lentils", "flat admin bills",
    "release checklist for lantern", "MQTT instead of polling", "python virtualenv", "knife sharpening angle",
    "ideas for the weekend",
]

MINIMAL_SERVER = textwrap.dedent('''
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("minimal")

    @server.tool()
    def echo(text: str) -> str:
        """Echo the text."""
        return text

    server.run()
''')


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _startup_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Seconds from spawn to the `initialize` reply, and to the first `tools/list` reply."""
    started = time.perf_counter()
    proc = await trio.lowlevel.open_process(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=subprocess.DEVNULL, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    buf = b""

    async def reply(want: int) -> None:
        nonlocal buf
        while True:
            *lines, rest = buf.split(b"\n")
            for i, line in enumerate(lines):
                if line.strip() and json.loads(line).get("id") == want:
                    buf = b"\n".join(lines[i + 1:] + [rest])
                    return
            chunk = await proc.stdout.receive_some(65536)  # type: ignore[union-attr]
            if not chunk:
                raise RuntimeError(f"{argv[0]} exited before answering request {want}")
            buf += chunk

    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}
    try:
        with trio.fail_after(60):
            await proc.stdin.send_all(json.dumps(init).encode() + b"\n")
            await reply(1)
            t_init = time.perf_counter() - started
            await proc.stdin.send_all(
                b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'
                b'{"jsonrpc":"2.0","id":2,"method":"tools/list"}\n')
            await reply(2)
            t_list = time.perf_counter() - started
    finally:
        await proc.stdin.aclose()
        with trio.move_on_after(10):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return t_init, t_list


async def bench_startup(kiln: Path, runs: int, env: dict[str, str], tmp: Path) -> dict[str, Any]:
    minimal = tmp / "minimal_server.py"
    minimal.write_text(MINIMAL_SERVER)
    peers = {"cru mcp": [CRU, "mcp", "--kiln", str(kiln)], "minimal SDK server": [sys.executable, str(minimal)]}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in peers}
    for argv in peers.values():  # one warm-up each (page cache, .pyc)
        await _startup_once(argv, env)
    for _ in range(runs):  # interleaved, so machine load hits both alike
        for name, argv in peers.items():
            times[name].append(await _startup_once(argv, env))
    out: dict[str, Any] = {}
    for name, samples in times.items():
        out[name] = {"initialize_s": statistics.median(s[0] for s in samples),
                     "tools_list_s": statistics.median(s[1] for s in samples)}
    out["ratio"] = out["cru mcp"]["tools_list_s"] / out["minimal SDK server"]["tools_list_s"]
    return out


async def bench_search(kiln: Path, n: int, env: dict[str, str]) -> dict[str, Any]:
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters

    from crucible.config import load_config
    from crucible.kiln.index import KilnIndex
    from crucible.kiln.search import hybrid_search

    queries = [QUERIES[i % len(QUERIES)] for i in range(n)]
    params = StdioServerParameters(command=CRU, args=["mcp", "--kiln", str(kiln)], env=env)
    stdio: list[float] = []
    local: list[float] = []
    # Each side alone on the machine (2 cores: onnxruntime's spinning threads of one process
    # slow the other), each warmed with one pass over the queries, then timed on the same list.
    async with Client(params) as client:
        t = time.perf_counter()
        await client.call_tool("semantic_search", {"query": "warm up", "limit": 5})
        first = time.perf_counter() - t
        # The first search answers while the index builds in the background: time the searches
        # once it is ready, or they measure the build beside them (and the in-process side, run
        # after, would search a whole index).
        with trio.fail_after(600):
            while True:
                stats = await client.call_tool("get_kiln_stats", {})
                if (stats.structured_content or {}).get("index", {}).get("phase") == "ready":
                    break
                await trio.sleep(0.1)
        for q in QUERIES:
            await client.call_tool("semantic_search", {"query": q, "limit": 5})
        for q in queries:
            t = time.perf_counter()
            r = await client.call_tool("semantic_search", {"query": q, "limit": 5})
            stdio.append(time.perf_counter() - t)
            assert not r.is_error, r
        # The fixed cost of one MCP call through stdio: a tool that does almost nothing.
        trivial: list[float] = []
        for _ in queries:
            t = time.perf_counter()
            await client.call_tool("get_kiln_roots", {})
            trivial.append(time.perf_counter() - t)
    index = KilnIndex.open(kiln, load_config(env=env))  # the index the server built
    for q in QUERIES:
        hybrid_search(index, q, 5)
    for q in queries:
        t = time.perf_counter()
        hybrid_search(index, q, 5)
        local.append(time.perf_counter() - t)
    index.close()
    res: dict[str, Any] = {"first_search_s (opens the index)": first,
                           "trivial_call_p50_ms": 1000 * _percentile(trivial, 0.5)}
    for name, vals in (("stdio", stdio), ("in-process", local)):
        res[name] = {"p50_ms": 1000 * _percentile(vals, 0.5), "p95_ms": 1000 * _percentile(vals, 0.95)}
    res["ratio_p50"] = res["stdio"]["p50_ms"] / res["in-process"]["p50_ms"]
    res["ratio_p95"] = res["stdio"]["p95_ms"] / res["in-process"]["p95_ms"]
    return res


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--queries", type=int, default=40)
    ap.add_argument("--kiln", type=Path, default=ROOT / "fixtures" / "kiln")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        kiln = tmp / "kiln"
        shutil.copytree(args.kiln, kiln, ignore=shutil.ignore_patterns(".crucible"))
        env = dict(os.environ, XDG_CONFIG_HOME=str(tmp / "config"), XDG_DATA_HOME=str(tmp / "data"))
        env.pop("CRUCIBLE_CONFIG", None)
        n_notes = sum(1 for _ in kiln.rglob("*.md"))
        print(f"kiln: {args.kiln.name} ({n_notes} notes); {os.cpu_count()} CPUs; "
              f"load average {os.getloadavg()[0]:.1f} (figures are noisy when it exceeds the CPUs)")
        start = await bench_startup(kiln, args.runs, env, tmp)
        print(f"\nstartup, spawn -> replies (median of {args.runs}):")
        for name in ("cru mcp", "minimal SDK server"):
            s = start[name]
            print(f"  {name:20s} initialize {s['initialize_s'] * 1000:7.0f} ms   "
                  f"first tools/list {s['tools_list_s'] * 1000:7.0f} ms")
        print(f"  ratio cru mcp / minimal: {start['ratio']:.2f}x  (goal <= 1.5x)")
        search = await bench_search(kiln, args.queries, env)
        print(f"\nsemantic_search round trip ({args.queries} queries, limit 5):")
        print(f"  first search through stdio (opens/builds the index): "
              f"{search['first_search_s (opens the index)']:.1f} s")
        for name in ("stdio", "in-process"):
            s = search[name]
            print(f"  {name:11s} p50 {s['p50_ms']:7.1f} ms   p95 {s['p95_ms']:7.1f} ms")
        print(f"  (one MCP call through stdio costs p50 {search['trivial_call_p50_ms']:.1f} ms: get_kiln_roots)")
        print(f"  ratio stdio / in-process: p50 {search['ratio_p50']:.2f}x  p95 {search['ratio_p95']:.2f}x"
              "  (goal p50 <= 1.3x)")


if __name__ == "__main__":
    trio.run(main)
