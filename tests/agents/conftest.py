"""Fixtures for driving the real agents (npm) against the fake LLM offline."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures"))

import agent_env  # noqa: E402
import netns  # noqa: E402
from agents_raw_driver import RawAgent, group_members  # noqa: E402
from fake_llm import FakeLLM  # noqa: E402


@pytest.fixture(scope="session")
def npm_ready() -> None:
    reason = agent_env.ensure_npm()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture
def fake_llm() -> Iterator[FakeLLM]:
    with FakeLLM() as llm:
        yield llm


@pytest.fixture
def start_agent(npm_ready: None, tmp_path: Path, fake_llm: FakeLLM) -> Iterator[Callable[..., RawAgent]]:
    """start_agent(name, **agent_launch_options) -> RawAgent, running in a loopback-only network
    namespace when the machine allows it (with the fake LLM's port forwarded in)."""
    started: list[RawAgent] = []

    def start(name: str, **launch_options: Any) -> RawAgent:
        home = tmp_path / f"home-{name}"
        argv, env = agent_env.agent_launch(name, fake_llm.url, home, **launch_options)  # type: ignore[arg-type]
        if netns.unavailable_reason() is None:
            argv = netns.wrap(argv, [fake_llm.port])
        stderr_path = tmp_path / f"{name}-stderr.log"
        with stderr_path.open("wb") as err:
            proc = subprocess.Popen(argv, env=env, cwd=tmp_path / "work", stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        agent = RawAgent(proc, stderr_path)
        started.append(agent)
        return agent

    (tmp_path / "work").mkdir()
    yield start
    for agent in started:
        agent.close()
        assert group_members(agent.proc.pid) == [], "the agent left processes behind"
