"""One turn with each real agent: `cru chat -p` vs the ACP SDK's client, same fake LLM, same run.

    python bench/turn.py [--agents claude,opencode,gemini] [--runs 3]

For each agent and run, every driver does the whole job a person waits for: start the agent,
initialize, session/new, one prompt whose reply is a short text from the fake LLM, and shut
down. Drivers:
- `cru chat -p`, a process;
- `SDK program`: a minimal client program on the ACP SDK (`acp.spawn_agent_process`), run as a
  process by the same interpreter: it prints the reply as it streams and exits. This is the
  peer of the goal: both sides from process start to the answer printed and the process exited;
- `SDK in-process`: the same client called inside this (already started) Python, `acp` already
  imported, so it pays no interpreter start and no import: shown for reference.
Reported per agent (median of runs): `total` (start -> process exited; ratio cru / SDK program,
goal <= 1.2x), `answer` (start -> the reply printed: leaves out each side's teardown),
`ready` (the SDK program's session/new answered), and the in-process total with its ratio.
What differs, on purpose:
- the SDK drivers give the agent no MCP server (they have no bridge); cru gives its bridge,
  and the agent connects to it and lists the kiln tools during session/new;
- teardown: the SDK drivers do what `spawn_agent_process` does (close stdin, wait up to 2 s,
  then terminate); `cru chat -p` closes stdin and sends SIGTERM to the agent's group after
  0.5 s. claude-agent-acp never exits on stdin EOF, so it costs the whole grace on both sides.
Needs the npm packages (scripts/setup-npm). Not a test: figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fixtures"))

import agent_env  # noqa: E402
from fake_llm import FakeLLM, Reply  # noqa: E402

REPLY = "The notes say hello."
READY = b"[session ready]\n"

# The SDK peer as a program: argv[1] = the agent's argv as JSON, argv[2] = the cwd.
SDK_PROGRAM = textwrap.dedent('''
    import asyncio, json, os, sys

    from acp import spawn_agent_process, text_block


    class Client:
        async def session_update(self, session_id, update, **kwargs):
            content = getattr(update, "content", None)
            if getattr(update, "session_update", "") == "agent_message_chunk" and content is not None:
                sys.stdout.write(getattr(content, "text", ""))
                sys.stdout.flush()

        async def request_permission(self, *args, **kwargs):
            raise NotImplementedError


    async def main():
        argv, cwd = json.loads(sys.argv[1]), sys.argv[2]
        async with spawn_agent_process(Client(), argv[0], *argv[1:], env=dict(os.environ), cwd=cwd,
                                       transport_kwargs={"limit": 64 * 1024 * 1024}) as (conn, _):
            await conn.initialize(protocol_version=1)
            session = await conn.new_session(cwd=cwd, mcp_servers=[])
            sys.stdout.write("[session ready]\\n")
            sys.stdout.flush()
            await conn.prompt(session_id=session.session_id, prompt=[text_block("hi")])
            sys.stdout.write("\\n")
            sys.stdout.flush()


    asyncio.run(main())
''')


def _timed_process(argv: list[str], env: dict[str, str], tmp: Path, marks: dict[str, bytes],
                   ) -> tuple[float, dict[str, float], int, str]:
    """Run argv; seconds to its exit, seconds to each mark first seen on its stdout, exit code, stderr."""
    out = b""
    seen: dict[str, float] = {}
    with open(tmp / "stderr", "w+b") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=err)
        assert proc.stdout is not None
        while chunk := os.read(proc.stdout.fileno(), 65536):
            out += chunk
            for key, mark in marks.items():
                if key not in seen and mark in out:
                    seen[key] = time.perf_counter() - t0
        code = proc.wait(timeout=300)
        seconds = time.perf_counter() - t0
        proc.stdout.close()
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    return seconds, seen, code, stderr


def cru_turn(name: str, llm: FakeLLM, kiln: Path, tmp: Path, cru: list[str] | None = None) -> tuple[float, float]:
    """(seconds to exit, seconds to the reply on stdout) of one `cru chat -p`."""
    _, env = agent_env.agent_launch(name, llm.url, tmp / "home")
    env["XDG_DATA_HOME"] = str(tmp / "data")
    cru = cru or [str(Path(sys.executable).parent / "cru")]
    llm.push(Reply.text_reply(REPLY))
    seconds, seen, code, stderr = _timed_process(
        [*cru, "chat", "-a", name, "--kiln", str(kiln), "--cwd", str(tmp), "-p", "hi"], env, tmp,
        {"answer": REPLY.encode()})
    if code != 0 or "answer" not in seen:
        raise RuntimeError(f"cru chat -a {name} failed ({code}): {stderr[-2000:]}")
    return seconds, seen["answer"]


def sdk_program_turn(name: str, llm: FakeLLM, tmp: Path) -> tuple[float, float, float]:
    """(seconds to exit, to the reply printed, to session ready) of the SDK client program."""
    argv, env = agent_env.agent_launch(name, llm.url, tmp / "home")
    program = tmp / "sdk_client.py"
    program.write_text(SDK_PROGRAM)
    llm.push(Reply.text_reply(REPLY))
    seconds, seen, code, stderr = _timed_process(
        [sys.executable, str(program), json.dumps(argv), str(tmp)], env, tmp,
        {"ready": READY, "answer": REPLY.encode()})
    if code != 0 or "answer" not in seen or "ready" not in seen:
        raise RuntimeError(f"the SDK client program with {name} failed ({code}): {stderr[-2000:]}")
    return seconds, seen["answer"], seen["ready"]


def sdk_turn(name: str, llm: FakeLLM, tmp: Path) -> tuple[float, float, float]:
    """(seconds to exit, to the reply, to session ready) with the SDK's client in this process."""
    from acp import spawn_agent_process, text_block

    argv, env = agent_env.agent_launch(name, llm.url, tmp / "home")
    llm.push(Reply.text_reply(REPLY))
    text: list[str] = []

    class Client:
        async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
            content = getattr(update, "content", None)
            if getattr(update, "session_update", "") == "agent_message_chunk" and content is not None:
                text.append(getattr(content, "text", ""))

        async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    ready = answered = 0.0

    async def main() -> None:
        nonlocal ready, answered
        async with spawn_agent_process(cast(Any, Client()), argv[0], *argv[1:], env=env, cwd=str(tmp),
                                       transport_kwargs={"limit": 64 * 1024 * 1024}) as (conn, proc):
            await conn.initialize(protocol_version=1)
            session = await conn.new_session(cwd=str(tmp), mcp_servers=[])
            ready = time.perf_counter() - t0
            await conn.prompt(session_id=session.session_id, prompt=[text_block("hi")])
            answered = time.perf_counter() - t0
            # spawn_agent_process's own teardown (shutdown_timeout=2.0): close stdin, 2 s, terminate.
            if proc.stdin is not None:
                proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), 2)
            except TimeoutError:
                os.killpg(proc.pid, 15) if _own_group(proc.pid) else proc.terminate()
                await proc.wait()

    t0 = time.perf_counter()
    asyncio.run(main())
    seconds = time.perf_counter() - t0
    if REPLY not in "".join(text):
        raise RuntimeError(f"the SDK turn with {name} did not stream the reply: {''.join(text)!r}")
    return seconds, answered, ready


def _own_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--agents", default="claude,opencode,gemini")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cru", metavar="CMD", help="the cru command to time, e.g. another checkout's "
                    "'env PYTHONPATH=DIR python -m crucible.cli' (default: this venv's cru)")
    args = ap.parse_args()
    reason = agent_env.ensure_npm()
    if reason:
        print(f"skipped: {reason}")
        return 0
    kiln = ROOT / "fixtures" / "kiln"
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (figures are noisy above the CPUs)")
    print(f"{'':9} {'---------- total ----------':>28}   {'---------- answer ---------':>28}   {'SDK':>6}   "
          f"{'SDK in-process':>16}")
    print(f"{'agent':<9} {'cru':>8} {'SDK':>8} {'ratio':>8}   {'cru':>8} {'SDK':>8} {'ratio':>8}   {'ready':>6}   "
          f"{'total':>7} {'ratio':>8}")
    with FakeLLM(loop=False) as llm:
        for name in args.agents.split(","):
            cru: list[tuple[float, float]] = []
            prog: list[tuple[float, float, float]] = []
            inproc: list[tuple[float, float, float]] = []
            for _ in range(args.runs):  # interleaved, so machine load hits every driver alike
                with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as a, \
                        tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as b, \
                        tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as c:
                    prog.append(sdk_program_turn(name, llm, Path(a)))
                    cru.append(cru_turn(name, llm, kiln, Path(b), shlex.split(args.cru) if args.cru else None))
                    inproc.append(sdk_turn(name, llm, Path(c)))
            ct, ca = (statistics.median(x[i] for x in cru) for i in (0, 1))
            st, sa, ready = (statistics.median(x[i] for x in prog) for i in (0, 1, 2))
            it = statistics.median(x[0] for x in inproc)
            print(f"{name:<9} {ct:>7.2f}s {st:>7.2f}s {ct / st:>7.2f}x   {ca:>7.2f}s {sa:>7.2f}s {ca / sa:>7.2f}x   "
                  f"{ready:>5.2f}s   {it:>6.2f}s {ct / it:>7.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
