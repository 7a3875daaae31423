"""The three real agents from npm, driven over raw ACP against the fake LLM, offline.

For each agent: a text reply streams back as agent_message_chunk updates; and a scripted
tool call makes the agent run our stdio MCP server's tool (its log proves it ran) and send
the tool's result to the LLM in its next request; and a refused permission keeps the tool
from running.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from agents_raw_driver import RawAgent, echo_mcp_entry
from fake_llm import FakeLLM, Reply

AGENTS = ["claude", "opencode", "gemini"]
pytestmark = [pytest.mark.real_agent, pytest.mark.slow]


def _open_session(agent: RawAgent, cwd: Path, mcp_servers: list[dict[str, Any]]) -> str:
    init = agent.request("initialize", {
        "protocolVersion": 1,
        "clientCapabilities": {"fs": {"readTextFile": True, "writeTextFile": True}, "terminal": False},
        "clientInfo": {"name": "crucible-tests", "version": "0"},
    })
    assert init["protocolVersion"] == 1
    return str(agent.request("session/new", {"cwd": str(cwd), "mcpServers": mcp_servers})["sessionId"])


def _prompt(agent: RawAgent, session_id: str, text: str) -> dict[str, Any]:
    return agent.request("session/prompt", {"sessionId": session_id,
                                            "prompt": [{"type": "text", "text": text}]})


@pytest.mark.parametrize("name", AGENTS)
def test_text_reply_streams_as_message_chunks(
    name: str, start_agent: Callable[..., RawAgent], fake_llm: FakeLLM, tmp_path: Path
) -> None:
    fake_llm.push(Reply.text_reply("The kiln keeps notes linked with wikilinks."))
    agent = start_agent(name)
    sid = _open_session(agent, tmp_path / "work", [])

    result = _prompt(agent, sid, "How are my notes linked?")

    assert result["stopReason"] == "end_turn"
    assert agent.message_text() == "The kiln keeps notes linked with wikilinks."
    assert len(agent.updates("agent_message_chunk")) >= 1
    # The prompt reached the LLM: the fake saw it in the one scripted (main) request.
    mains = fake_llm.main_requests()
    assert len(mains) == 1
    assert "How are my notes linked?" in json.dumps(mains[0].body)


@pytest.mark.parametrize("name", AGENTS)
def test_mcp_tool_call_runs_and_its_result_reaches_the_llm(
    name: str, start_agent: Callable[..., RawAgent], fake_llm: FakeLLM, tmp_path: Path
) -> None:
    log = tmp_path / "mcp-calls.jsonl"
    fake_llm.push(
        Reply.tool_call("semantic_search", {"query": "linking notes"}),
        Reply.text_reply("Your note on linking is notes/linking-basics.md."),
    )
    agent = start_agent(name)
    sid = _open_session(agent, tmp_path / "work", [echo_mcp_entry(log, "notes/linking-basics.md")])

    result = _prompt(agent, sid, "Find my note about linking.")

    assert result["stopReason"] == "end_turn"
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls == [{"tool": "semantic_search", "query": "linking notes", "at": calls[0]["at"]}]
    # The request right after the call carries the tool's result, naming the note.
    with_results = fake_llm.requests_with_tool_results()
    assert with_results, f"no request carried a tool result: {[r.path for r in fake_llm.requests]}"
    assert any("notes/linking-basics.md" in t for t in with_results[0].tool_results())
    assert agent.message_text().endswith("Your note on linking is notes/linking-basics.md.")
    # The agent told the client about the call (claude/opencode with tool_call, gemini only
    # through its permission request).
    mentioned = json.dumps(agent.updates()) + json.dumps(agent.agent_requests)
    assert "semantic_search" in mentioned


@pytest.mark.parametrize("name", AGENTS)
def test_a_refused_permission_keeps_the_tool_from_running(
    name: str, start_agent: Callable[..., RawAgent], fake_llm: FakeLLM, tmp_path: Path
) -> None:
    log = tmp_path / "mcp-calls.jsonl"
    fake_llm.push(Reply.tool_call("semantic_search", {"query": "secret"}), Reply.text_reply("I could not search."))
    # OpenCode runs MCP tools without asking unless its config says "ask".
    agent = start_agent(name, **({"opencode_permission": {"crucible_*": "ask"}} if name == "opencode" else {}))
    agent.allow = False
    sid = _open_session(agent, tmp_path / "work", [echo_mcp_entry(log, "notes/secret.md")])

    result = _prompt(agent, sid, "Search my notes.")

    assert result["stopReason"] == "end_turn"
    asked = [r for r in agent.agent_requests if r["method"] == "session/request_permission"]
    assert len(asked) == 1
    assert "semantic_search" in json.dumps(asked[0]["params"]["toolCall"])
    assert not log.exists(), "the tool ran although its permission was refused"
    if name == "opencode":
        # OpenCode reports the call failed and ends the turn without asking the LLM again.
        assert [u["status"] for u in agent.updates("tool_call_update") if "status" in u][-1] == "failed"
        assert len(fake_llm.main_requests()) == 1
    else:
        # Claude and Gemini tell the LLM the call was refused.
        refusal = " ".join(fake_llm.tool_result_texts()).lower()
        assert "refused" in refusal or "cancel" in refusal, refusal
        assert agent.message_text().endswith("I could not search.")
