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

End to end (`--e2e`): the commands a person runs, each timed from its start to its exit
(process start, imports, the agent's start, initialize, session/new, the flood, teardown),
stdout to /dev/null, on the same flood agent, interleaved, in the same run:

  cru        cru chat --agent-command "FLOOD N" -p go             (text on stdout)
  cru-json   the same with --format json                           (one JSON object per event)
  acpx       acpx --agent "FLOOD N" exec go                        (npm acpx, text)
  acpx-json  acpx --agent "FLOOD N" --format json exec go          (acpx prints every frame)
  sdk        a client program on the ACP SDK printing the chunks  (text)
  sdk-json   the same printing each update as JSON

Events/s = N / wall seconds; peak RSS is the command's own (`wait4`), which takes in the
flood agent it waited for (a ~10 MB stdlib Python, small beside any client). Each command's
output is checked once on a small flood first (the last chunk must be in it). Every command
gets a terminal as its stdin, as when typed by a person.

    python bench/flood.py --e2e [--n 200000] [--repeat 3] [--only cru,acpx,...] [--cru PATH]
                          [--before PATH]   (another cru, e.g. an older checkout, in the same run)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
AGENT = [sys.executable, str(ROOT / "fixtures" / "flood_agent.py")]
MODES = ("host", "stack", "sdk", "bare")
E2E_MODES = ("cru", "cru-json", "acpx", "acpx-json", "sdk", "sdk-json")
CRU = str(Path(sys.executable).parent / "cru")


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


# -- end to end: the commands a person runs --------------------------------------------

# The SDK peer as a program: argv[1] = the agent's argv as JSON, argv[2] = "text" or "json".
SDK_PROGRAM = """
import asyncio, json, os, sys

from acp import spawn_agent_process, text_block

JSON = sys.argv[2] == "json"
write = sys.stdout.write


class Client:
    async def session_update(self, session_id, update, **kwargs):
        if JSON:
            write(update.model_dump_json(by_alias=True, exclude_none=True) + "\\n")
            return
        content = getattr(update, "content", None)
        if getattr(update, "session_update", "") == "agent_message_chunk" and content is not None:
            write(getattr(content, "text", ""))

    async def request_permission(self, *args, **kwargs):
        raise NotImplementedError


async def main():
    argv = json.loads(sys.argv[1])
    async with spawn_agent_process(Client(), argv[0], *argv[1:], env=dict(os.environ), cwd=os.getcwd(),
                                   transport_kwargs={"limit": 64 * 1024 * 1024}) as (conn, _):
        await conn.initialize(protocol_version=1)
        session = await conn.new_session(cwd=os.getcwd(), mcp_servers=[])
        await conn.prompt(session_id=session.session_id, prompt=[text_block("go")])
        write("\\n")


asyncio.run(main())
"""


def _acpx_bin() -> str | None:
    sys.path.insert(0, str(ROOT / "fixtures"))
    import agent_env

    bin_dir = agent_env.npm_bin_dir()
    acpx = bin_dir / "acpx" if bin_dir is not None else None
    return str(acpx) if acpx is not None and acpx.exists() else None


def e2e_argv(mode: str, n: int, tmp: Path, cru: str, acpx: str | None, before: str | None = None) -> list[str]:
    flood = shlex.join([*AGENT, str(n)])
    if mode.startswith(("cru", "before")):
        fmt = ["--format", "json"] if mode.endswith("-json") else []
        program = before if mode.startswith("before") and before else cru
        return [program, "chat", "--agent-command", flood, "--kiln", str(tmp / "kiln"), "-p", "go", *fmt]
    if mode.startswith("acpx"):
        if acpx is None:
            raise SystemExit("acpx is not installed (scripts/setup-npm installs it); leave it out with --only")
        fmt = ["--format", "json"] if mode == "acpx-json" else []
        return [acpx, "--agent", flood, "--cwd", str(tmp), "--approve-all", *fmt, "exec", "go"]
    program = tmp / "sdk_client.py"
    program.write_text(SDK_PROGRAM)
    return [sys.executable, str(program), json.dumps([*AGENT, str(n)]), "json" if mode == "sdk-json" else "text"]


def e2e_env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp / "config"), XDG_DATA_HOME=str(tmp / "data"),
               HOME=str(tmp / "home"))
    env.pop("CRUCIBLE_CONFIG", None)
    env.pop("CRUCIBLE_KILN", None)
    return env


def e2e_run(argv: list[str], env: dict[str, str], tmp: Path, stdout: Any = subprocess.DEVNULL
            ) -> tuple[float, int, float]:
    """Seconds from start to exit, the command's peak RSS in KiB and its CPU seconds (its own and
    its waited-for children's, the flood agent's included). Its stdin is a terminal,
    as when a person types the command (a program that is not started from one may act
    differently: `cru` then asks the login shell for PATH)."""
    terminal, stdin = os.openpty()
    try:
        with open(tmp / "stderr.txt", "wb") as err:
            t0 = time.perf_counter()
            proc = subprocess.Popen(argv, env=env, cwd=tmp, stdin=stdin, stdout=stdout, stderr=err)
            _, status, usage = os.wait4(proc.pid, 0)
            seconds = time.perf_counter() - t0
            proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        os.close(stdin)
        os.close(terminal)
    if proc.returncode != 0:
        tail = (tmp / "stderr.txt").read_text(errors="replace")[-3000:]
        raise SystemExit(f"{shlex.join(argv)} exited with {proc.returncode}:\n{tail}")
    return seconds, usage.ru_maxrss, usage.ru_utime + usage.ru_stime


def e2e_check(mode: str, tmp: Path, env: dict[str, str], cru: str, acpx: str | None, before: str | None) -> None:
    """The command really shows the flood: its output ends with the last chunk."""
    n = 1000
    with open(tmp / "stdout.txt", "wb") as out:
        e2e_run(e2e_argv(mode, n, tmp, cru, acpx, before), env, tmp, stdout=out)
    text = (tmp / "stdout.txt").read_text(errors="replace")
    if f"word{n - 1} " not in text or f"word{n - 2} " not in text:
        raise SystemExit(f"{mode}: the output does not show the flood's chunks:\n{text[-2000:]}")


def e2e_main(args: argparse.Namespace) -> None:
    import statistics
    import tempfile

    modes = [m for m in args.only.split(",") if m] if args.only != ",".join(MODES) else list(E2E_MODES)
    if args.before:
        modes += [m for m in ("before", "before-json") if m not in modes]  # (--only may name them)
    unknown = set(modes) - set(E2E_MODES) - {"before", "before-json"}
    if unknown:
        raise SystemExit(f"unknown e2e modes {sorted(unknown)}; choose from {', '.join(E2E_MODES)}")
    acpx = _acpx_bin()
    with tempfile.TemporaryDirectory(prefix="bench-flood-e2e-") as d:
        tmp = Path(d)
        (tmp / "kiln").mkdir()
        (tmp / "home").mkdir()
        env = e2e_env(tmp)
        for mode in modes:
            e2e_check(mode, tmp, env, args.cru, acpx, args.before)
        runs: dict[str, list[tuple[float, int, float]]] = {m: [] for m in modes}
        for _ in range(args.repeat):  # interleaved: machine noise hits every command alike
            for mode in modes:
                runs[mode].append(e2e_run(e2e_argv(mode, args.n, tmp, args.cru, acpx, args.before), env, tmp))
    print(f"end to end: {args.n} agent_message_chunk updates, {args.repeat} runs each, interleaved; "
          "stdout to /dev/null")
    print(f"{'command':<11} {'events/s':>10} {'best s':>8} {'median s':>9} {'peak RSS':>10} {'CPU s':>7}")
    rate: dict[str, float] = {}
    peak: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for mode in modes:
        best = min(s for s, _, _ in runs[mode])
        rate[mode] = args.n / best
        peak[mode] = max(k for _, k, _ in runs[mode]) / 1024
        cpu[mode] = statistics.median(c for _, _, c in runs[mode])
        median = statistics.median(s for s, _, _ in runs[mode])
        print(f"{mode:<11} {rate[mode]:>10,.0f} {best:>8.3f} {median:>9.3f} {peak[mode]:>8.1f}MB {cpu[mode]:>7.2f}")
    print("(CPU s, the median, hardly depends on what else the machine runs: the steadier figure on a "
          "busy machine)")
    for ours, peer, goal in (("cru", "acpx", ">= 1.0x, stretch 1.5x"), ("cru", "sdk", ">= 3x"),
                             ("cru-json", "acpx-json", ">= 1.0x, stretch 1.5x"), ("cru-json", "sdk-json", ">= 3x"),
                             ("before", "acpx", "(before)"), ("before-json", "acpx-json", "(before)"),
                             ("cru", "before", "(after / before)"), ("cru-json", "before-json", "(after / before)")):
        if ours in rate and peer in rate:
            memory = (f"; peak RSS {peak[ours] / peak[peer]:.2f}x (goal <= 1.0x)" if peer.startswith("acpx")
                      else "")
            goal = f"goal {goal}" if goal.startswith(">") else goal.strip("()")
            print(f"{ours + ' / ' + peer:<23} = {rate[ours] / rate[peer]:.2f}x events/s  ({goal}){memory}; "
                  f"CPU {cpu[ours] / cpu[peer]:.2f}x")


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
    parser.add_argument("--e2e", action="store_true", help="time the commands a person runs (see above)")
    parser.add_argument("--cru", default=CRU, help="--e2e: the cru executable to time (default: %(default)s)")
    parser.add_argument("--before", metavar="CRU", help="--e2e: another cru (an older checkout) timed in the same run")
    args = parser.parse_args()
    if args.e2e:
        e2e_main(args)
        return
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
