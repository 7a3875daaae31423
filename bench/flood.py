"""Throughput of an ACP host reading a flood of `session/update` notifications.

One agent (fixtures/flood_agent.py) streams N `agent_message_chunk` updates for one prompt.
Each reader runs in its own child process (so its peak memory is its own), same agent,
same N, in the same run:

  host   acp_host.jsonrpc.JsonRpcPeer as the client (trio), counting session/update
  stack  the whole host: connect_agent + AcpSession, consuming the typed event stream
  sdk    the ACP SDK's asyncio client (spawn_agent_process + ClientSideConnection)
  bare   a bare loop doing json.loads per line of the agent's stdout

Events/s is measured from sending session/prompt to its response with all N updates
handled. Memory: peak RSS of the reader process, and its growth during the flood.

    python bench/flood.py [--n 200000] [--repeat 3] [--only host,sdk,...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
AGENT = [sys.executable, str(ROOT / "fixtures" / "flood_agent.py")]
MODES = ("host", "stack", "sdk", "bare")


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def _result(events: int, seconds: float, rss_before: int, **extra: Any) -> dict[str, Any]:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {
        "events": events,
        "seconds": seconds,
        "peak_kib": peak,
        "growth_kib": max(0, peak - rss_before),
        **extra,
    }


# -- readers (each runs in its own process) --------------------------------------------


def run_host(n: int) -> dict[str, Any]:
    import trio

    from acp_host.jsonrpc import JsonRpcPeer
    from acp_host.process import AgentProcess

    out: dict[str, Any] = {}

    async def main() -> None:
        count = 0

        async def on_note(method: str, params: Any) -> None:
            nonlocal count
            if method == "session/update":
                count += 1

        async with trio.open_nursery() as nursery:
            proc = await AgentProcess.start(nursery, [*AGENT, str(n)])
            async with proc:
                peer = JsonRpcPeer(
                    proc.stdin, proc.stdout, name="flood", notification_handler=on_note
                )
                nursery.start_soon(peer.run)
                await peer.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
                session = await peer.request("session/new", {"cwd": str(ROOT), "mcpServers": []})
                before = _rss_kib()
                t0 = time.perf_counter()
                result = await peer.request(
                    "session/prompt",
                    {"sessionId": session["sessionId"], "prompt": [{"type": "text", "text": "go"}]},
                )
                seconds = time.perf_counter() - t0
                assert result == {"stopReason": "end_turn"}, result
                out.update(_result(count, seconds, before))
                await peer.aclose()

    trio.run(main)
    return out


def run_stack(n: int) -> dict[str, Any]:
    import trio

    from acp_host.client import connect_agent
    from acp_host.session import MessageChunk, TurnEnded

    out: dict[str, Any] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            client = await connect_agent(nursery, [*AGENT, str(n)])
            async with client:
                session = await client.new_session(cwd=ROOT)
                count = 0

                async def consume() -> None:
                    # The turn's end comes on the stream after every chunk of the turn.
                    nonlocal count
                    while True:
                        for event in await session.receive_batch():
                            if isinstance(event, MessageChunk):
                                count += 1
                            elif isinstance(event, TurnEnded):
                                return

                ended: Any = None

                async def prompt() -> None:
                    nonlocal ended
                    ended = await session.prompt("go")

                before = _rss_kib()
                t0 = time.perf_counter()
                async with trio.open_nursery() as inner:
                    inner.start_soon(consume)
                    inner.start_soon(prompt)
                seconds = time.perf_counter() - t0
                out.update(_result(count, seconds, before, turn=repr(ended)[:80]))
            nursery.cancel_scope.cancel()

    trio.run(main)
    return out


def run_sdk(n: int) -> dict[str, Any]:
    import asyncio

    from acp import spawn_agent_process, text_block

    out: dict[str, Any] = {}

    class Counter:
        def __init__(self) -> None:
            self.count = 0
            self.all_seen = asyncio.Event()

        async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
            self.count += 1
            if self.count >= n:
                self.all_seen.set()

        async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    async def main() -> None:
        client = Counter()
        # The SDK's default 64 KiB line limit is not what is measured here.
        async with spawn_agent_process(
            cast(Any, client),
            AGENT[0],
            *AGENT[1:],
            str(n),
            transport_kwargs={"limit": 64 * 1024 * 1024},
        ) as (conn, _process):
            await conn.initialize(protocol_version=1)
            session = await conn.new_session(cwd=str(ROOT), mcp_servers=[])
            before = _rss_kib()
            t0 = time.perf_counter()
            response = await conn.prompt(session_id=session.session_id, prompt=[text_block("go")])
            if n:
                await client.all_seen.wait()
            seconds = time.perf_counter() - t0
            assert response.stop_reason == "end_turn", response
            out.update(_result(client.count, seconds, before))

    asyncio.run(main())
    return out


def run_bare(n: int) -> dict[str, Any]:
    proc = subprocess.Popen([*AGENT, str(n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    loads = json.loads

    def call(msg_id: int, method: str, params: dict[str, Any]) -> None:
        line = json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
        proc.stdin.write(line.encode() + b"\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]

    def until_answer(msg_id: int) -> tuple[Any, int]:
        count = 0
        for line in proc.stdout:  # type: ignore[union-attr]
            msg = loads(line)
            if msg.get("method") == "session/update":
                count += 1
            elif msg.get("id") == msg_id:
                return msg["result"], count
        raise RuntimeError("the agent closed its stdout")

    call(1, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    until_answer(1)
    call(2, "session/new", {"cwd": str(ROOT), "mcpServers": []})
    session = until_answer(2)[0]
    before = _rss_kib()
    t0 = time.perf_counter()
    call(
        3,
        "session/prompt",
        {"sessionId": session["sessionId"], "prompt": [{"type": "text", "text": "go"}]},
    )
    result, count = until_answer(3)
    seconds = time.perf_counter() - t0
    assert result == {"stopReason": "end_turn"}
    proc.stdin.close()
    proc.wait()
    return _result(count, seconds, before)


READERS = {"host": run_host, "stack": run_stack, "sdk": run_sdk, "bare": run_bare}


# -- driver ----------------------------------------------------------------------------


def measure(mode: str, n: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", mode, "--n", str(n)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if result["events"] != n:
        raise SystemExit(f"{mode} handled {result['events']} events, expected {n}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--n", type=int, default=200_000, help="session/update notifications per prompt"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per reader (the best is kept)")
    parser.add_argument("--only", default=",".join(MODES), help="comma-separated readers")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(READERS[args.child](args.n)))
        return

    modes = [m for m in args.only.split(",") if m]
    best: dict[str, dict[str, Any]] = {}
    # Interleave the readers so machine noise hits them alike.
    for _ in range(args.repeat):
        for mode in modes:
            r = measure(mode, args.n)
            r["rate"] = r["events"] / r["seconds"]
            if mode not in best or r["rate"] > best[mode]["rate"]:
                best[mode] = r

    print(
        f"flood: {args.n} agent_message_chunk updates, best of {args.repeat}, one process per run"
    )
    print(f"{'reader':<7} {'events/s':>10} {'seconds':>8} {'peak RSS':>10} {'growth':>9}")
    for mode in modes:
        r = best[mode]
        print(
            f"{mode:<7} {r['rate']:>10,.0f} {r['seconds']:>8.3f} "
            f"{r['peak_kib'] / 1024:>8.1f}MB {r['growth_kib'] / 1024:>7.1f}MB"
        )
    if "host" in best:
        host = best["host"]["rate"]
        if "sdk" in best:
            print(f"host / sdk   = {host / best['sdk']['rate']:.2f}x  (goal >= 3x)")
        if "bare" in best:
            print(f"host / bare  = {host / best['bare']['rate']:.0%}  (goal >= 50%)")
    if "stack" in best and "sdk" in best:
        print(f"stack / sdk  = {best['stack']['rate'] / best['sdk']['rate']:.2f}x")
    if "stack" in best and "bare" in best:
        print(f"stack / bare = {best['stack']['rate'] / best['bare']['rate']:.0%}")


if __name__ == "__main__":
    main()
