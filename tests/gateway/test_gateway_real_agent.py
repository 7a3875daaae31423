"""A real agent from npm (driven by the fake LLM) calls a prefixed upstream tool through
`cru chat -p`: the gateway's tools reach the model beside the kiln tools, the call reaches
server-everything and its answer reaches the model."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import agent_env
import netns
import pytest
from conftest import SECRET, everything_toml, write_config
from fake_llm import FakeLLM, Reply

pytestmark = [pytest.mark.real_agent]


@pytest.fixture
def fake_llm() -> Iterator[FakeLLM]:
    with FakeLLM() as llm:
        yield llm


@pytest.mark.parametrize("agent", ["claude", "opencode"])
def test_real_agent_calls_a_prefixed_upstream_tool(agent: str, fake_llm: FakeLLM, everything: list[str],
                                                   kiln: Path, tmp_path: Path, cru_bin: str) -> None:
    _, env = agent_env.agent_launch(agent, fake_llm.url, tmp_path / "home")  # type: ignore[arg-type]
    env["GATEWAY_TOKEN"] = SECRET
    write_config(Path(env["XDG_CONFIG_HOME"]) / "crucible", everything_toml(everything))
    fake_llm.push(Reply.tool_call("everything_get-sum", {"a": 19, "b": 23}),
                  Reply.text_reply("The upstream says 42."))
    work = tmp_path / "work"
    work.mkdir()
    argv = [cru_bin, "chat", "-a", agent, "--kiln", str(kiln), "--cwd", str(work), "-p", "add 19 and 23"]
    if netns.unavailable_reason() is None:
        argv = netns.wrap(argv, [fake_llm.port])
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180, cwd=work)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "The upstream says 42." in res.stdout
    offered = fake_llm.main_requests()[0].tool_names()
    assert any(n.endswith("everything_get-sum") for n in offered), offered
    assert any(n.endswith("semantic_search") for n in offered), offered
    results = "\n".join(fake_llm.tool_result_texts())
    assert "42" in results, results[:2000]  # the upstream computed it
    assert "[warning]" not in res.stderr
