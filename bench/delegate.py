"""Delegation cost, against a bare session of the same agent measured in the same run.

1. Round trip: a parent session calls `delegate_session` on its own bridge (in process:
   policy, job, child session with its own agent process and bridge, the child's turn; the
   result is returned before the child's process has exited) vs a bare `open_session` + one
   turn of the same agent (start -> result; start -> closed is shown too). The difference
   is what delegation adds.
2. Concurrency: 3 background children at once (then `get_job_result(wait)` on each) vs one
   child, on this machine's cores (the ratio says how well 3 children share them).

The child agent is the scripted agent (stdlib, fast: the figures are Crucible's own cost), or
with `--agent claude|opencode|gemini` a real agent against the fake LLM (what a person waits).

    V=/root/.cache/crucible/venv-dev/bin; $V/python bench/delegate.py [--runs 7] [--agent claude]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# This file lives in bench/: keep that folder off sys.path so `import mcp` finds the SDK.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import trio  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fixtures"))
SCRIPTED = ROOT / "fixtures" / "scripted_agent.py"


def child_profile(agent: str, tmp: Path, llm_url: str | None) -> dict[str, Any]:
    if agent == "scripted":
        script = tmp / "child.json"
        # Lists the bridge's tools during session/new, as every real agent does.
        script.write_text(json.dumps({
            "initialize": {"result": {"agentCapabilities": {"mcpCapabilities": {"http": True}}}},
            "new_session": {"list_mcp_tools": True},
            "default_turn": [{"text": "child reply"}]}))
        return {"command": sys.executable, "args": [str(SCRIPTED), str(script)]}
    import agent_env

    assert llm_url is not None
    argv, env = agent_env.agent_launch(agent, llm_url, tmp / "home-child")
    return {"command": argv[0], "args": argv[1:], "env": env}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from acp_host.registry import resolve_agent
    from acp_host.session import MessageChunk, TurnEnded
    from crucible.config import AgentProfile, Config, DelegationConfig
    from crucible.session_store import SessionStore
    from crucible.sessions import (
        BridgeHost,
        CrucibleSession,
        SessionOptions,
        approve_all_asker,
        open_session,
    )

    tmp = Path(tempfile.mkdtemp(prefix="bench-delegate-"))
    kiln = tmp / "kiln"
    kiln.mkdir()
    (kiln / "a.md").write_text("# a\n")
    llm = None
    if args.agent != "scripted":
        from fake_llm import FakeLLM, Reply

        llm = FakeLLM()
        llm.__enter__()
        llm.push(*[Reply.text_reply("child reply") for _ in range(args.runs * 8 + 20)])
    profile = child_profile(args.agent, tmp, llm.url if llm else None)
    config = Config(agents={"child": AgentProfile(**profile),
                            "parent": AgentProfile(**child_profile("scripted", tmp, None))},
                    permissions={"delegate_session": "allow", "get_job_result": "allow"},
                    delegation=DelegationConfig(max_concurrent=3))
    store = SessionStore(tmp / "sessions")

    def options(name: str) -> SessionOptions:
        return SessionOptions(agent=resolve_agent(name, profiles=config.agents), kiln=kiln, cwd=tmp,
                              config=config, asker=approve_all_asker(), store=store)

    async def turn(session: CrucibleSession) -> str:
        parts: list[str] = []

        async def drain() -> None:
            async for event in session.events():
                if isinstance(event, MessageChunk):
                    parts.append(event.text)
                if isinstance(event, TurnEnded):
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain)
            await session.prompt("say something")
        return "".join(parts)

    bare_result: list[float] = []
    bare_closed: list[float] = []
    one: list[float] = []
    three: list[float] = []
    async with BridgeHost().running() as host:
        async with open_session(options("parent"), host) as parent:
            assert parent.bridge is not None
            bridge = parent.bridge

            async def settle_down() -> None:
                # The result comes before the child's process is gone: let the teardown finish
                # so it does not eat into the next measurement.
                assert parent.delegation is not None
                for job in parent.delegation.jobs.values():
                    await job.done.wait()

            async def delegate(background: bool = False) -> dict[str, Any]:
                res = await bridge.call_tool("delegate_session", {"target": "child", "prompt": "say something",
                                                                  "background": background})
                if res.is_error:
                    raise SystemExit(f"delegation failed: {res.content[0].text}")  # type: ignore[union-attr]
                data: dict[str, Any] = res.structured_content or {}
                return data

            for i in range(args.runs + 1):  # the first round of each warms caches and is dropped
                t0 = time.perf_counter()
                async with open_session(options("child"), host) as bare:
                    text = await turn(bare)
                    t_result = time.perf_counter() - t0
                t_closed = time.perf_counter() - t0
                assert "child reply" in text, text

                t0 = time.perf_counter()
                data = await delegate()
                t_delegate = time.perf_counter() - t0
                assert "child reply" in data["reply"], data
                await settle_down()

                t0 = time.perf_counter()
                jobs = [(await delegate(background=True))["job_id"] for _ in range(3)]
                for job in jobs:
                    res = await bridge.call_tool("get_job_result", {"job_id": job, "wait": True})
                    assert (res.structured_content or {}).get("status") == "completed", res
                t_three = time.perf_counter() - t0
                await settle_down()
                if i == 0:
                    continue
                bare_result.append(t_result)
                bare_closed.append(t_closed)
                one.append(t_delegate)
                three.append(t_three)
    if llm is not None:
        llm.__exit__(None, None, None)

    def ms(values: list[float]) -> float:
        return round(statistics.median(values) * 1000, 1)

    return {
        "agent": args.agent, "runs": args.runs, "cores": os.cpu_count(),
        "bare_start_to_result_ms": ms(bare_result), "bare_start_to_closed_ms": ms(bare_closed),
        "delegation_round_trip_ms": ms(one),
        "delegation_overhead_ms": round(ms(one) - ms(bare_result), 1),
        "delegation_vs_bare_result": round(statistics.median(one) / statistics.median(bare_result), 2),
        "three_concurrent_children_ms": ms(three),
        "three_vs_one_child": round(statistics.median(three) / statistics.median(one), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--agent", default="scripted", choices=["scripted", "claude", "opencode", "gemini"])
    args = parser.parse_args()
    figures = trio.run(run, args)
    width = max(len(k) for k in figures)
    for key, value in figures.items():
        print(f"{key:<{width}}  {value}")


if __name__ == "__main__":
    main()
