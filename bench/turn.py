"""One turn with each real agent: `cru chat -p` vs the ACP SDK's client, same fake LLM, same run.

    python bench/turn.py [--agents claude,opencode,gemini] [--runs 3]

For each agent and run, both drivers do the whole job a person waits for: start the agent,
initialize, session/new, one prompt whose reply is a short text from the fake LLM, and
shut down. Reported per agent (median of runs):
- `total`: from start to the agent's process exited (cru: the `cru` process, started by us,
  exited); ratio cru / SDK (goal <= 1.2x);
- `answer`: from start to the reply received (cru: the reply on cru's stdout), which leaves
  out each side's teardown;
- `SDK ready`: from start to session/new answered, in the SDK driver.
What differs, on purpose or not:
- the SDK driver runs in this (already started) Python with `acp` already imported; cru pays
  its interpreter start and imports inside its figures;
- the SDK driver gives the agent no MCP server (it has no bridge); cru gives its bridge, and
  the agent connects to it and lists the kiln tools during session/new;
- teardown: the SDK driver does what `acp.spawn_agent_process` does by default (close stdin,
  wait up to 2 s, then terminate); `cru chat -p` closes stdin and sends SIGTERM to the agent's
  group after 0.5 s (claude-agent-acp never exits on stdin EOF, so it waits the whole grace
  on both sides).
Needs the npm packages (scripts/setup-npm). Not a test: figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fixtures"))

import agent_env  # noqa: E402
from fake_llm import FakeLLM, Reply  # noqa: E402

REPLY = "The notes say hello."


def cru_turn(name: str, llm: FakeLLM, kiln: Path, tmp: Path) -> tuple[float, float]:
    """(seconds to exit, seconds to the reply on stdout) of one `cru chat -p`."""
    _, env = agent_env.agent_launch(name, llm.url, tmp / "home")
    env["XDG_DATA_HOME"] = str(tmp / "data")
    cru = str(Path(sys.executable).parent / "cru")
    llm.push(Reply.text_reply(REPLY))
    out = b""
    answered = 0.0
    with open(tmp / "stderr", "w+b") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([cru, "chat", "-a", name, "--kiln", str(kiln), "--cwd", str(tmp), "-p", "hi"],
                                env=env, stdout=subprocess.PIPE, stderr=err)
        assert proc.stdout is not None
        while chunk := os.read(proc.stdout.fileno(), 65536):
            out += chunk
            if not answered and REPLY.encode() in out:
                answered = time.perf_counter() - t0
        code = proc.wait(timeout=300)
        seconds = time.perf_counter() - t0
        proc.stdout.close()
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    if code != 0 or not answered:
        raise RuntimeError(f"cru chat -a {name} failed ({code}): {stderr[-2000:]}")
    return seconds, answered


def sdk_turn(name: str, llm: FakeLLM, tmp: Path) -> tuple[float, float, float]:
    """(seconds to exit, seconds to the reply, seconds to session ready) with the SDK's client."""
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
    args = ap.parse_args()
    reason = agent_env.ensure_npm()
    if reason:
        print(f"skipped: {reason}")
        return 0
    kiln = ROOT / "fixtures" / "kiln"
    print(f"{'agent':<9} {'cru total':>10} {'SDK total':>10} {'ratio':>6}   {'cru answer':>10} {'SDK answer':>10} "
          f"{'ratio':>6}   {'SDK ready':>9}")
    with FakeLLM(loop=False) as llm:
        for name in args.agents.split(","):
            cru: list[tuple[float, float]] = []
            sdk: list[tuple[float, float, float]] = []
            for _ in range(args.runs):
                with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as a, \
                        tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as b:
                    sdk.append(sdk_turn(name, llm, Path(a)))
                    cru.append(cru_turn(name, llm, kiln, Path(b)))
            ct, ca = (statistics.median(x[i] for x in cru) for i in (0, 1))
            st, sa, ready = (statistics.median(x[i] for x in sdk) for i in (0, 1, 2))
            print(f"{name:<9} {ct:>9.2f}s {st:>9.2f}s {ct / st:>5.2f}x   {ca:>9.2f}s {sa:>9.2f}s {ca / sa:>5.2f}x"
                  f"   {ready:>8.2f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
