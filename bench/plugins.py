"""Lua plugin tools, against peers measured in the same run.

1. Call latency, p50/p95, through the same bridge (the mcp SDK's client -> `BridgeServer` in this
   process, and -> `cru mcp` over stdio): a trivial plugin tool (`ping`, returns a string) vs a
   trivial kiln tool (`get_kiln_roots`). Both run in a worker thread. Goal: plugin p50 <= 1.2x.
2. Plugin load time at startup: 20 plugins (each a file with three tools and a setup()) vs the
   two built-in ones alone.

    $V/python bench/plugins.py [--calls 400]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

# This file is bench/plugins.py: keep its folder off sys.path so `import mcp` finds the SDK.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import trio  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CRU = str(Path(sys.executable).parent / "cru")

PING = """
local greeting = "pong"
return { name = "%(name)s", setup = function(cfg) if cfg.greeting then greeting = cfg.greeting end end,
  tools = {
    ping = { desc = "answers at once", read_only = true, params = {}, fn = function() return greeting end },
    add = { desc = "adds", read_only = true, params = {{ name = "a", type = "number" }, { name = "b", type = "number" }},
      fn = function(args) return { sum = args.a + args.b } end },
    words = { desc = "counts words", read_only = true, params = {{ name = "text", type = "string" }},
      fn = function(args) local n = 0 for _ in args.text:gmatch("%%S+") do n = n + 1 end return n end },
  } }
"""


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _timed(call: Callable[[], Awaitable[Any]], n: int) -> list[float]:
    for _ in range(30):
        await call()
    out = []
    for _ in range(n):
        started = time.perf_counter()
        await call()
        out.append((time.perf_counter() - started) * 1000)
    return out


def _env(plugins: Path, home: Path) -> dict[str, str]:
    return {**os.environ, "CRUCIBLE_PLUGIN_PATH": str(plugins), "XDG_CONFIG_HOME": str(home)}


async def bench_calls(kiln: Path, plugins: Path, home: Path, n: int) -> dict[str, list[float]]:
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters

    from crucible.kiln_mcp import CrucibleKilnBackend
    from crucible.plugins.host import load_all
    from mcp_bridge.server import BridgeServer

    host = load_all(None, _env(plugins, home))
    bridge = BridgeServer(CrucibleKilnBackend(kiln), tool_sources=[host])
    out: dict[str, list[float]] = {}
    async with Client(bridge.server, mode="legacy") as c:
        for _ in range(3):  # alternate, so a slow patch of the machine hits both alike
            out.setdefault("bridge kiln", []).extend(await _timed(lambda: c.call_tool("get_kiln_roots", {}), n // 3))
            out.setdefault("bridge plugin", []).extend(
                await _timed(lambda: c.call_tool("lua_p00_ping", {}), n // 3))
    params = StdioServerParameters(command=CRU, args=["mcp", "--kiln", str(kiln)], env=_env(plugins, home))
    async with Client(params, mode="legacy") as c:
        for _ in range(3):
            out.setdefault("cru mcp kiln", []).extend(await _timed(lambda: c.call_tool("get_kiln_roots", {}), n // 3))
            out.setdefault("cru mcp plugin", []).extend(
                await _timed(lambda: c.call_tool("lua_p00_ping", {}), n // 3))
    return out


def bench_load(plugins: Path, home: Path, empty: Path, runs: int = 5) -> tuple[float, float, int]:
    from crucible.plugins.host import load_all

    many, builtin = [], []
    count = 0
    for _ in range(runs):
        started = time.perf_counter()
        host = load_all(None, _env(plugins, home))
        many.append((time.perf_counter() - started) * 1000)
        count = sum(1 for p in host.plugins if p.state == "loaded")
        started = time.perf_counter()
        load_all(None, _env(empty, home))
        builtin.append((time.perf_counter() - started) * 1000)
    return statistics.median(many), statistics.median(builtin), count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=450)
    parser.add_argument("--kiln", default=str(ROOT / "fixtures" / "kiln"))
    args = parser.parse_args()
    kiln = Path(args.kiln).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        plugins, home, empty = Path(tmp) / "plugins", Path(tmp) / "home", Path(tmp) / "empty"
        for folder in (plugins, home, empty):
            folder.mkdir()
        for i in range(20):
            (plugins / f"p{i:02}.lua").write_text(PING % {"name": f"p{i:02}"})
        times = trio.run(bench_calls, kiln, plugins, home, args.calls)
        print(f"1. trivial tool round trip, {args.calls} calls each (ms)")
        for where in ("bridge", "cru mcp"):
            kiln_p50 = statistics.median(times[f"{where} kiln"])
            for what in ("kiln", "plugin"):
                t = times[f"{where} {what}"]
                p50 = statistics.median(t)
                print(f"   {where:<8} {what:<7} p50 {p50:6.3f}  p95 {_pct(t, 0.95):6.3f}  ratio p50 {p50 / kiln_p50:4.2f}x")
        ratio = statistics.median(times["bridge plugin"]) / statistics.median(times["bridge kiln"])
        print(f"   goal: plugin p50 <= 1.2x kiln tool through the bridge -> {ratio:.2f}x {'ok' if ratio <= 1.2 else 'MISSED'}")
        many, builtin, loaded = bench_load(plugins, home, empty)
        print("2. plugin load at startup (median of 5)")
        print(f"   {loaded} plugins (20 + the 2 built-in): {many:6.1f} ms   the 2 built-in alone: {builtin:5.1f} ms"
              f"   -> {(many - builtin) / 20:.2f} ms per plugin")


if __name__ == "__main__":
    main()
