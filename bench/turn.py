"""One turn with each real agent: `cru chat -p` vs the ACP SDK's client, same fake LLM, same run.

    python bench/turn.py [--agents claude,opencode,gemini] [--runs 3]

For each agent and run, both drivers do the whole job a person waits for: start the agent,
initialize, session/new, one prompt whose reply is a short text from the fake LLM, and
shut down. The SDK driver gets no MCP server (it has no bridge); `cru chat -p` also starts
its bridge and the agent lists the kiln tools during session/new, which is part of what is
measured. Reported: wall time per turn (median of runs) and the ratio cru / SDK (goal
<= 1.2x), and the time from start to "session ready" for each agent (from the SDK driver).
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


def cru_turn(name: str, llm: FakeLLM, kiln: Path, tmp: Path) -> float:
    _, env = agent_env.agent_launch(name, llm.url, tmp / "home")  # type: ignore[arg-type]
    env["XDG_DATA_HOME"] = str(tmp / "data")
    cru = str(Path(sys.executable).parent / "cru")
    llm.push(Reply.text_reply(REPLY))
    t0 = time.perf_counter()
    res = subprocess.run([cru, "chat", "-a", name, "--kiln", str(kiln), "--cwd", str(tmp), "-p", "hi"], env=env,
                         capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - t0
    if res.returncode != 0 or REPLY not in res.stdout:
        raise RuntimeError(f"cru chat -a {name} failed: {res.stderr[-2000:]}")
    return seconds


def sdk_turn(name: str, llm: FakeLLM, tmp: Path) -> tuple[float, float]:
    from acp import spawn_agent_process, text_block

    argv, env = agent_env.agent_launch(name, llm.url, tmp / "home")  # type: ignore[arg-type]
    llm.push(Reply.text_reply(REPLY))
    text: list[str] = []

    class Client:
        async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
            content = getattr(update, "content", None)
            if getattr(update, "session_update", "") == "agent_message_chunk" and content is not None:
                text.append(getattr(content, "text", ""))

        async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    ready = 0.0

    async def main() -> None:
        nonlocal ready
        async with spawn_agent_process(cast(Any, Client()), argv[0], *argv[1:], env=env, cwd=str(tmp),
                                       transport_kwargs={"limit": 64 * 1024 * 1024}) as (conn, proc):
            await conn.initialize(protocol_version=1)
            session = await conn.new_session(cwd=str(tmp), mcp_servers=[])
            ready = time.perf_counter() - t0
            await conn.prompt(session_id=session.session_id, prompt=[text_block("hi")])
            # The same teardown cru does: close stdin, give the agent ~2 s, then SIGTERM the group.
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
    return seconds, ready


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
    print(f"{'agent':<9} {'cru chat -p':>12} {'SDK client':>11} {'ratio':>6} {'SDK ready':>10}")
    with FakeLLM(loop=False) as llm:
        for name in args.agents.split(","):
            cru_times, sdk_times, ready_times = [], [], []
            for _ in range(args.runs):
                with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
                    sdk_s, ready = sdk_turn(name, llm, Path(a))
                    sdk_times.append(sdk_s)
                    ready_times.append(ready)
                    cru_times.append(cru_turn(name, llm, kiln, Path(b)))
            c, s = statistics.median(cru_times), statistics.median(sdk_times)
            print(f"{name:<9} {c:>11.2f}s {s:>10.2f}s {c / s:>5.2f}x {statistics.median(ready_times):>9.2f}s",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
