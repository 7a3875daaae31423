"""The per-session bridge, seen from a real agent subprocess: the same kiln tools over HTTP
(agents that advertise mcpCapabilities.http) and over the `cru mcp --connect` stdio relay."""

from __future__ import annotations

import json

import pytest
from conftest import ChatRunner

SEARCH_CALL = {"mcp_call": {"server": "crucible", "tool": "text_search",
                            "arguments": {"query": "levain", "limit": 3}}, "as": "search", "echo": True}
CREATE_CALL = {"mcp_call": {"server": "crucible", "tool": "create_note",
                            "arguments": {"path": "inbox/relay.md", "content": "# via the bridge\n"}},
               "as": "create", "echo": True}


def script(http: bool, *steps: dict) -> dict:
    caps = {"mcpCapabilities": {"http": http, "sse": False}}
    return {"initialize": {"result": {"agentCapabilities": caps}},
            "new_session": {"list_mcp_tools": True},
            "prompts": [list(steps) + [{"text": "\nok"}]]}


@pytest.mark.parametrize("http", [True, False], ids=["http", "stdio-relay"])
def test_bridge_tools_reach_the_agent(chat: ChatRunner, http: bool) -> None:
    res = chat.run(script(http, SEARCH_CALL), "find the levain note")
    assert res.returncode == 0, res.stderr
    assert "[warning]" not in res.stderr  # the agent listed the bridge's tools during session/new
    listed = chat.wait_for_log(lambda e: e.get("kind") == "mcp_tools" and e.get("server") == "crucible")
    assert {"semantic_search", "create_note", "read_note"} <= set(listed["tools"])
    new = chat.wait_for_log(lambda e: e.get("kind") == "in" and e["frame"].get("method") == "session/new")
    entry = new["frame"]["params"]["mcpServers"][0]
    if http:
        assert entry["type"] == "http" and entry["url"].startswith("http://127.0.0.1:")
        assert entry["headers"][0]["name"] == "Authorization"
    else:
        assert "type" not in entry and entry["args"][-2] == "--connect" and entry["env"][0]["name"]
    result = chat.wait_for_log(lambda e: e.get("kind") == "result" and e.get("as") == "search")["result"]
    text = json.dumps(result)
    assert "Cooking/Sourdough starter.md" in text
    assert str(chat.kiln) not in text  # kiln-relative paths only


@pytest.mark.parametrize("http", [True, False], ids=["http", "stdio-relay"])
def test_mutating_bridge_tool_asks_the_person(chat: ChatRunner, http: bool) -> None:
    denied = chat.run(script(http, CREATE_CALL), "write it")
    assert denied.returncode == 0, denied.stderr
    assert not (chat.kiln / "inbox" / "relay.md").exists()
    assert "[permission] create_note: reject_once" in denied.stderr
    approved = chat.run(script(http, CREATE_CALL), "write it", "--approve-all")
    assert approved.returncode == 0, approved.stderr
    assert (chat.kiln / "inbox" / "relay.md").read_text() == "# via the bridge\n"


def test_agent_that_never_lists_tools_gets_a_warning(chat: ChatRunner) -> None:
    res = chat.run({}, "hi")
    assert res.returncode == 0
    assert "never listed the kiln tools" in res.stderr


def test_record_writes_both_directions(chat: ChatRunner) -> None:
    rec = chat.tmp / "rec.jsonl"
    res = chat.run({"prompts": [[{"text": "hello"}]]}, "hi", "--record", str(rec))
    assert res.returncode == 0, res.stderr
    lines = [json.loads(line) for line in rec.read_text().splitlines()]
    assert "recording" in lines[0]
    dirs = {line["dir"] for line in lines[1:]}
    assert dirs == {"in", "out"}
    methods = [line["frame"].get("method") for line in lines[1:]]
    assert "session/prompt" in methods and "session/update" in methods
