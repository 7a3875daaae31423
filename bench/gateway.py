"""The MCP gateway, against peers measured in the same run.

1. Call latency, p50/p95, of server-everything's `echo` (stdio, from npm):
   a. direct: the mcp SDK's client talking to the upstream itself (the peer);
   b. dispatcher: `BridgeServer.call_tool` in this process (the dispatcher, policy, redaction,
      the gateway's own SDK client to the upstream), no MCP hop in front;
   c. bridge: the same client talking to that `BridgeServer` over the SDK's in-memory transport
      (b plus one more MCP server hop, as an agent's call has);
   d. cru mcp: the same client talking to `cru mcp` (a subprocess) whose gateway talks to the
      upstream — the real command, end to end.
   Goal: bridge p50 <= 1.3x direct.
2. tools/list through `cru mcp` with 5 upstreams vs none: the first list (it starts the
   upstreams) and a later one, and the size of the listing in bytes (what an agent's context
   pays for the schemas).
3. Memory: `cru mcp`'s RSS with 5 upstreams vs none, and each upstream process's own RSS.

    $V/python bench/gateway.py [--calls 300]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

# This file is bench/gateway.py: keep its folder off sys.path so `import mcp` finds the SDK.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import trio  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CRU = str(Path(sys.executable).parent / "cru")
sys.path.insert(0, str(ROOT / "fixtures"))


def _everything() -> list[str]:
    import agent_env

    reason = agent_env.ensure_npm()
    if reason is not None:
        raise SystemExit(f"bench/gateway.py needs server-everything from npm: {reason}")
    modules = agent_env.npm_modules_dir()
    assert modules is not None
    return ["node", str(modules / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"), "stdio"]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _timed_calls(call: Callable[[], Awaitable[Any]], n: int) -> list[float]:
    for _ in range(20):  # warm up: imports, JIT of the node side, first connections
        await call()
    times = []
    for _ in range(n):
        started = time.perf_counter()
        await call()
        times.append((time.perf_counter() - started) * 1000)
    return times


def _toml(argv: list[str], names: list[str]) -> str:
    args = ", ".join(json.dumps(a) for a in argv[1:])
    return "".join(f'[[mcp.servers]]\nname = "{n}"\n[mcp.servers.transport]\ntype = "stdio"\n'
                   f'command = "{argv[0]}"\nargs = [{args}]\n' for n in names)


def _env(config_home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["XDG_CONFIG_HOME"] = str(config_home)
    env.pop("CRUCIBLE_CONFIG", None)
    return env


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


async def bench_calls(everything: list[str], kiln: Path, n: int) -> dict[str, list[float]]:
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters

    from crucible.kiln_mcp import CrucibleKilnBackend
    from mcp_bridge.gateway import Gateway, UpstreamSpec
    from mcp_bridge.server import BridgeServer

    out: dict[str, list[float]] = {}
    params = StdioServerParameters(command=everything[0], args=everything[1:])
    async with Client(params, mode="legacy") as direct:
        out["direct"] = await _timed_calls(lambda: direct.call_tool("echo", {"message": "hi"}), n)

    spec = UpstreamSpec(name="everything", prefix="everything_", transport="stdio", command=everything[0],
                        args=tuple(everything[1:]))
    gateway = Gateway([spec])
    async with gateway.running():
        bridge = BridgeServer(CrucibleKilnBackend(kiln), gateway=gateway)
        async with Client(bridge.server, mode="legacy") as via:
            await via.list_tools()
            out["dispatch"] = await _timed_calls(lambda: bridge.call_tool("everything_echo", {"message": "hi"}), n)
            out["bridge"] = await _timed_calls(lambda: via.call_tool("everything_echo", {"message": "hi"}), n)

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        (home / "crucible").mkdir()
        (home / "crucible" / "config.toml").write_text(_toml(everything, ["everything"]))
        cru = StdioServerParameters(command=CRU, args=["mcp", "--kiln", str(kiln)], env=_env(home))
        async with Client(cru, mode="legacy") as through:
            await through.list_tools()
            out["cru mcp"] = await _timed_calls(lambda: through.call_tool("everything_echo", {"message": "hi"}), n)
    return out


async def bench_list(everything: list[str], kiln: Path, upstreams: int) -> dict[str, float]:
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        (home / "crucible").mkdir()
        (home / "crucible" / "config.toml").write_text(_toml(everything, [f"up{i}" for i in range(upstreams)]))
        params = StdioServerParameters(command=CRU, args=["mcp", "--kiln", str(kiln)], env=_env(home))
        async with Client(params, mode="legacy", cache=None) as client:
            started = time.perf_counter()
            first = await client.list_tools()
            first_ms = (time.perf_counter() - started) * 1000
            later = []
            for _ in range(20):
                started = time.perf_counter()
                await client.list_tools()
                later.append((time.perf_counter() - started) * 1000)
            size = len(json.dumps(first.model_dump(by_alias=True, mode="json", exclude_none=True)))
            cru_pid = _find_cru_mcp(str(kiln))
            rss = _rss_kib(cru_pid) if cru_pid else 0
            kids = [_rss_kib(p) for p in _children(cru_pid)] if cru_pid else []
    return {"tools": len(first.tools), "first_ms": first_ms, "later_p50_ms": statistics.median(later),
            "bytes": size, "cru_rss_kib": rss, "upstream_rss_kib": statistics.mean(kids) if kids else 0.0}


def _find_cru_mcp(kiln: str) -> int | None:
    me = os.getpid()
    for pid in _children(me):
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        if " mcp --kiln " in cmd and kiln in cmd:
            return pid
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--kiln", default=str(ROOT / "fixtures" / "kiln"))
    args = parser.parse_args()
    everything = _everything()
    kiln = Path(args.kiln).resolve()

    calls = trio.run(bench_calls, everything, kiln, args.calls)
    print(f"1. echo round trip over stdio, {args.calls} calls each (ms)")
    base = statistics.median(calls["direct"])
    for name, times in calls.items():
        p50, p95 = statistics.median(times), _pct(times, 0.95)
        print(f"   {name:<9} p50 {p50:6.3f}  p95 {p95:6.3f}  ratio p50 {p50 / base:4.2f}x")
    ratio = statistics.median(calls["bridge"]) / base
    print(f"   goal: bridge p50 <= 1.3x direct -> {ratio:.2f}x {'ok' if ratio <= 1.3 else 'MISSED'}")

    none = trio.run(bench_list, everything, kiln, 0)
    five = trio.run(bench_list, everything, kiln, 5)
    print("2. tools/list through cru mcp")
    for label, r in (("no upstreams", none), ("5 upstreams", five)):
        print(f"   {label:<13} {int(r['tools']):4d} tools  first {r['first_ms']:7.1f} ms  later p50 "
              f"{r['later_p50_ms']:6.2f} ms  listing {int(r['bytes']):7d} bytes")
    print(f"   5 upstreams vs none: first list {five['first_ms'] / none['first_ms']:.1f}x (starts them), "
          f"later lists {five['later_p50_ms'] / none['later_p50_ms']:.1f}x, "
          f"listing {five['bytes'] / none['bytes']:.1f}x the bytes")
    print("3. memory")
    per = (five["cru_rss_kib"] - none["cru_rss_kib"]) / 5
    print(f"   cru mcp RSS: none {none['cru_rss_kib'] / 1024:.1f} MiB, 5 upstreams {five['cru_rss_kib'] / 1024:.1f} MiB "
          f"-> {per / 1024:.2f} MiB per upstream in the gateway")
    print(f"   each upstream process (node server-everything): {five['upstream_rss_kib'] / 1024:.1f} MiB RSS")


if __name__ == "__main__":
    main()
