"""Plugin tools as agents reach them: a real agent (Claude's ACP adapter, fake LLM) through
`cru chat -p`, and an MCP client through `cru mcp`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import texts
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "fixtures"))

import agent_env  # noqa: E402
import netns  # noqa: E402
from fake_llm import FakeLLM, Reply  # noqa: E402

TASKS = "- [x] Outline [id:: outline]\n- [ ] Draft [id:: draft] [deps:: outline]\n"


@pytest.fixture
def fake_llm() -> Iterator[FakeLLM]:
    with FakeLLM() as llm:
        yield llm


@pytest.mark.real_agent
def test_real_agent_calls_a_plugin_tool(fake_llm: FakeLLM, kiln: Path, tmp_path: Path, cru_bin: str) -> None:
    reason = agent_env.ensure_npm()
    if reason is not None:
        pytest.skip(reason)
    (kiln / "TASKS.md").write_text(TASKS)
    _, env = agent_env.agent_launch("claude", fake_llm.url, tmp_path / "home")
    fake_llm.push(Reply.tool_call("lua_tasks_next_task", {}), Reply.text_reply("Next: the draft."))
    work = tmp_path / "work"
    work.mkdir()
    argv = [cru_bin, "chat", "-a", "claude", "--kiln", str(kiln), "--cwd", str(work), "-p", "what next?"]
    if netns.unavailable_reason() is None:
        argv = netns.wrap(argv, [fake_llm.port])
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180, cwd=work)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Next: the draft." in res.stdout
    offered = fake_llm.main_requests()[0].tool_names()
    assert any(n.endswith("lua_tasks_next_task") for n in offered) and any(n.endswith("read_note") for n in offered)
    results = "\n".join(fake_llm.tool_result_texts())
    assert '"id":"draft"' in results.replace(" ", "") or "'id': 'draft'" in results, results[:2000]


async def test_cru_mcp_serves_plugin_tools(cru_bin: str, clean_env: dict[str, str], kiln: Path,
                                           tmp_path: Path) -> None:
    (kiln / "TASKS.md").write_text(TASKS)
    broken = tmp_path / "plugins"
    broken.mkdir()
    (broken / "broken.lua").write_text("error('no')\n")
    env = {**clean_env, "CRUCIBLE_PLUGIN_PATH": str(broken)}
    params = StdioServerParameters(command=cru_bin, args=["mcp", "--kiln", str(kiln)], env=env)
    async with Client(params, mode="legacy") as c:
        names = {t.name for t in (await c.list_tools()).tools}
        assert {"lua_tasks_next_task", "lua_daily_today", "read_note"} <= names
        r = await c.call_tool("lua_tasks_next_task", {})
        assert json.loads(texts(r))["task"]["id"] == "draft"
