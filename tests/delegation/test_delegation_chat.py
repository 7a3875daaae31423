"""delegate_session end to end through `cru chat -p`: the parent and the child are real
scripted-agent subprocesses, each with its own bridge; the parent calls the tool over MCP."""

from __future__ import annotations

from delegation_helpers import (
    Setup,
    agent_script,
    delegate_step,
    pids_running,
    tool_json,
    tool_step,
    tool_text,
)

HELPER_BODY = "You are the helper. Answer in one line."


def test_the_parent_gets_the_childs_reply_and_a_curated_handoff(setup: Setup) -> None:
    setup.card("helper", "A helper for tests", HELPER_BODY, agent="child")
    setup.scripts["parent"] = agent_script(
        delegate_step("helper", "Summarise the sourdough note",
                      context={"summary": "The person bakes on weekends.",
                               "notes": ["Cooking/Sourdough starter.md"]}),
        {"text": "\nparent done"})
    setup.scripts["child"] = agent_script({"text": "child: the starter needs feeding\n"}, {"text": "twice a day"})
    setup.write()
    res = setup.run("parent", "SECRET-PARENT-PROMPT please delegate")
    assert res.returncode == 0, res.stderr
    [result] = setup.results("parent", "delegate")
    data = tool_json(result)
    assert data["status"] == "completed" and data["target"] == "helper"
    assert data["reply"] == "child: the starter needs feeding\ntwice a day"
    assert data["truncated"] is False and data["child_session"]
    # The child got the card's instructions first, then the handoff and the task — never the
    # parent's own conversation.
    [child_prompt] = setup.prompts("child")
    assert child_prompt.index(HELPER_BODY) < child_prompt.index("The person bakes on weekends.")
    assert "Cooking/Sourdough starter.md" in child_prompt and "Summarise the sourdough note" in child_prompt
    assert "SECRET-PARENT-PROMPT" not in child_prompt
    # The child's events show on stderr, labelled with the chain.
    assert "[child parent › helper] child: the starter needs feeding" in res.stderr
    assert "[child parent › helper] twice a day" in res.stderr
    assert "[child parent › helper] finished: completed" in res.stderr
    assert "parent done" in res.stdout
    assert not pids_running(str(setup.script_path("child")))


def test_a_plain_agent_name_is_a_target_too_and_bad_targets_are_clear(setup: Setup) -> None:
    setup.scripts["parent"] = agent_script(
        delegate_step("other", "hello other", as_="agent"),
        delegate_step("nosuch", "hello", as_="unknown"),
        delegate_step("other", "   ", as_="empty"),
        delegate_step("other", "x", as_="badnote", context={"notes": ["../etc/passwd"]}))
    setup.scripts["other"] = agent_script({"text": "other here"})
    setup.write()
    res = setup.run("parent", "go")
    assert res.returncode == 0, res.stderr
    assert tool_json(setup.results("parent", "agent")[0])["reply"] == "other here"
    unknown = setup.results("parent", "unknown")[0]
    assert unknown["result"]["isError"]
    assert "unknown delegation target 'nosuch'" in tool_text(unknown) and "librarian" in tool_text(unknown)
    assert "prompt is empty" in tool_text(setup.results("parent", "empty")[0])
    assert "'..' is not allowed" in tool_text(setup.results("parent", "badnote")[0])
    assert "[child parent › other] other here" in res.stderr


def test_depth_limit_is_refused_with_a_clear_message(setup: Setup) -> None:
    # The child's card allows delegation, but max_depth = 1 (the default) stops its own call.
    setup.card("helper", "A helper", "Help.", agent="child", delegation={"enabled": True})
    setup.scripts["parent"] = agent_script(delegate_step("helper", "try to go deeper"))
    setup.scripts["child"] = agent_script(delegate_step("helper", "deeper", as_="deeper"), {"text": "\nchild ok"})
    setup.write()
    res = setup.run("parent", "go")
    assert res.returncode == 0, res.stderr
    [deeper] = setup.results("child", "deeper")
    assert deeper["result"]["isError"]
    text = tool_text(deeper)
    assert "depth limit" in text and "parent › helper" in text and "depth 1" in text
    # The parent still gets its child's reply, which reports the refusal.
    reply = tool_json(setup.results("parent", "delegate")[0])["reply"]
    assert "depth limit" in reply and "child ok" in reply
    assert len(setup.prompts("child")) == 1  # no grandchild ever started


def test_max_depth_zero_refuses_at_the_root(setup: Setup) -> None:
    setup.delegation = {"max_depth": 0}
    setup.scripts["parent"] = agent_script(delegate_step("other", "hi"))
    setup.scripts["other"] = agent_script({"text": "never"})
    setup.write()
    res = setup.run("parent", "go")
    assert res.returncode == 0, res.stderr
    text = tool_text(setup.results("parent", "delegate")[0])
    assert "depth limit" in text and "depth 0" in text
    assert setup.prompts("other") == []


def test_allowed_targets_and_disabled_delegation(setup: Setup) -> None:
    setup.delegation = {"allowed_targets": ["helper"]}
    setup.scripts["parent"] = agent_script(delegate_step("other", "hi"))
    setup.scripts["other"] = agent_script({"text": "never"})
    setup.write()
    setup.run("parent", "go")
    assert "[delegation] allowed_targets is helper" in tool_text(setup.results("parent", "delegate")[0])
    setup.delegation = {"enabled": False}
    setup.scripts["parent"] = agent_script(tool_step("list_jobs", {}, "jobs"))
    setup.write()
    setup.run("parent", "go")
    listed = [e for e in setup.entries("parent") if e.get("kind") == "mcp_tools"][-1]["tools"]
    assert "delegate_session" not in listed and "read_note" in listed
    assert "Unknown tool 'list_jobs'" in tool_text(setup.results("parent", "jobs")[-1])


def test_delegation_asks_the_person_like_any_mutating_tool(setup: Setup) -> None:
    # Without a [permissions] rule, delegate_session asks; `-p` without flags has nobody to ask.
    setup.permissions = {}
    setup.scripts["parent"] = agent_script(delegate_step("other", "hi"))
    setup.scripts["other"] = agent_script({"text": "never"})
    setup.write()
    res = setup.run("parent", "go")
    assert "[permission] delegate_session: reject_once" in res.stderr
    assert "did not allow tool 'delegate_session'" in tool_text(setup.results("parent", "delegate")[0])
    assert setup.prompts("other") == []


def test_a_crashed_child_is_an_error_result_not_a_hang(setup: Setup) -> None:
    setup.scripts["parent"] = agent_script(delegate_step("other", "do it"), {"text": "\nafter"})
    setup.scripts["other"] = agent_script({"text": "partial answer"},
                                          {"crash": {"code": 3, "stderr": "fatal: the model exploded"}})
    setup.write()
    res = setup.run("parent", "go", timeout=60)
    assert res.returncode == 0, res.stderr
    result = setup.results("parent", "delegate")[0]
    assert result["result"]["isError"]
    text = tool_text(result)
    assert "failed" in text and "fatal: the model exploded" in text and "partial answer" in text
    assert str(setup.tmp) not in text  # no absolute path reaches the agent
    assert "after" in res.stdout


def test_a_child_over_its_time_is_stopped(setup: Setup) -> None:
    setup.delegation = {"timeout_secs": 2}
    setup.scripts["parent"] = agent_script(delegate_step("other", "take forever"))
    setup.scripts["other"] = agent_script({"text": "thinking"}, {"stall": None})
    setup.write()
    res = setup.run("parent", "go", timeout=60)
    assert res.returncode == 0, res.stderr
    text = tool_text(setup.results("parent", "delegate")[0])
    assert "did not finish within 2 s" in text and "thinking" in text
    assert not pids_running(str(setup.script_path("other")))


def test_long_replies_are_truncated_and_marked(setup: Setup) -> None:
    setup.delegation = {"result_max_bytes": 1000}
    setup.scripts["parent"] = agent_script(delegate_step("other", "say a lot"))
    setup.scripts["other"] = agent_script({"text": "é" * 3000})
    setup.write()
    res = setup.run("parent", "go")
    assert res.returncode == 0, res.stderr
    data = tool_json(setup.results("parent", "delegate")[0])
    assert data["truncated"] is True
    assert data["reply"].startswith("é" * 500) and "é" * 501 not in data["reply"]
    assert "[truncated: the child's reply was 6000 bytes; the first 1000 are shown" in data["reply"]


EDIT = {"toolCallId": "t2", "title": "Edit notes.txt", "kind": "edit", "rawInput": {"path": "notes.txt"}}
OPTIONS = [{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
           {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]


def test_a_childs_ask_follows_the_parents_flags(setup: Setup) -> None:
    setup.card("helper", "A helper", "Help.", agent="child")
    setup.scripts["parent"] = agent_script(delegate_step("helper", "edit it"))
    setup.scripts["child"] = agent_script({"permission": {"toolCall": EDIT, "options": OPTIONS}, "as": "edit"})
    setup.write()
    # `-p` without flags: nobody to ask, so the child's `ask` is denied.
    res = setup.run("parent", "go")
    assert res.returncode == 0, res.stderr
    assert setup.results("child", "edit")[-1]["result"]["outcome"]["optionId"] == "reject"
    assert "[child parent › helper] [permission] Edit notes.txt: reject_once (nobody to ask" in res.stderr
    res = setup.run("parent", "go", "--approve-all")
    assert res.returncode == 0, res.stderr
    assert setup.results("child", "edit")[-1]["result"]["outcome"]["optionId"] == "allow"
    assert "[child parent › helper] [permission] Edit notes.txt: allow_once (--approve-all)" in res.stderr


def test_two_levels_with_max_depth_two(setup: Setup) -> None:
    setup.delegation = {"max_depth": 2}
    setup.card("helper", "A helper", "Help.", agent="child", delegation={"enabled": True, "targets": ["leaf"]})
    setup.card("leaf", "The last one", "Leaf.", agent="other", delegation={"enabled": True})
    setup.scripts["parent"] = agent_script(delegate_step("helper", "ask the leaf"))
    setup.scripts["child"] = agent_script(delegate_step("leaf", "say it", as_="to-leaf"),
                                          delegate_step("other", "off the list", as_="not-allowed"))
    setup.scripts["other"] = agent_script(delegate_step("leaf", "deeper", as_="too-deep"), {"text": "\nleaf says hi"})
    setup.write()
    res = setup.run("parent", "go")
    assert res.returncode == 0, res.stderr
    assert "depth 2" in tool_text(setup.results("other", "too-deep")[0])
    assert "not allowed by this session's card: its delegation.targets are leaf" in tool_text(
        setup.results("child", "not-allowed")[0])
    assert "leaf says hi" in tool_json(setup.results("child", "to-leaf")[0])["reply"]
    assert "leaf says hi" in tool_json(setup.results("parent", "delegate")[0])["reply"]
    # Grandchild events reach the top session with their own chain.
    assert "[child parent › helper › leaf] leaf says hi" in res.stderr


def test_delegation_through_the_stdio_relay(setup: Setup) -> None:
    # A parent without MCP over HTTP reaches its bridge through `cru mcp --connect`.
    setup.scripts["parent"] = agent_script(delegate_step("other", "via the relay"), http=False)
    setup.scripts["other"] = agent_script({"text": "relayed reply"}, http=False)
    setup.write()
    res = setup.run("parent", "go")
    assert res.returncode == 0, res.stderr
    assert "[warning]" not in res.stderr
    assert tool_json(setup.results("parent", "delegate")[0])["reply"] == "relayed reply"
