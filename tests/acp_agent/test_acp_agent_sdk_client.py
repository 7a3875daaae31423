"""`cru acp` with the scripted agent as backend, driven by the ACP SDK's client side."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from typing import Any

import pytest
from acp import RequestError
from acp.schema import ImageContentBlock, InitializeResponse, McpServerStdio, TextContentBlock
from acp_agent_driver import ECHO_MCP, AcpSetup, Editor, drive, pids_with


def run(acp: AcpSetup, editor: Editor, body: Any, *extra: str, agent_command: str | None = None) -> Any:
    with open(acp.stderr_path, "ab") as err:
        result, code = asyncio.run(drive(acp.argv(*extra, agent_command=agent_command), acp.env, editor,
                                         err.fileno(), body))
    assert code == 0, acp.stderr()[-3000:]  # cru acp ended on its own when the editor closed stdin
    assert not pids_with(str(acp.script_path)), "a backend agent outlived cru acp"
    return result


def text(prompt: str) -> list[TextContentBlock]:
    return [TextContentBlock(type="text", text=prompt)]


def test_initialize_is_answered_without_starting_a_backend(acp: AcpSetup) -> None:
    acp.script({})
    editor = Editor()

    async def body(conn: Any, init: InitializeResponse) -> InitializeResponse:
        return init

    init = run(acp, editor, body)
    caps = init.agent_capabilities
    assert init.protocol_version == 1
    assert caps is not None and caps.load_session is True
    assert caps.mcp_capabilities is not None and caps.mcp_capabilities.http and caps.mcp_capabilities.sse
    assert caps.session_capabilities is not None and caps.session_capabilities.list is not None
    assert caps.session_capabilities.close is not None and caps.session_capabilities.resume is not None
    assert init.agent_info is not None and init.agent_info.name == "crucible"
    assert not acp.log_path.exists(), "the backend was started for initialize"


@pytest.mark.parametrize("case", ["missing", "crashes"])
def test_a_backend_that_cannot_start_fails_session_new_with_the_fix(acp: AcpSetup, case: str) -> None:
    acp.script({"startup": [{"crash": {"code": 3, "stderr": "boom: no model configured"}}]})
    command = "/nonexistent/agent-xyz --acp" if case == "missing" else acp.agent_command
    editor = Editor()

    async def body(conn: Any, init: InitializeResponse) -> RequestError:
        with pytest.raises(RequestError) as info:
            await conn.new_session(cwd=str(acp.work), mcp_servers=[])
        # The connection is still up: initialize again works.
        again = await conn.initialize(protocol_version=1)
        assert again.protocol_version == 1
        return info.value

    err = run(acp, editor, body, agent_command=command)
    message = str(err)
    assert message.strip(), "empty error message"
    assert "fix:" in message, message
    if case == "missing":
        assert "/nonexistent/agent-xyz` does not exist" in message, message
    else:
        assert "exit code 3" in message and "boom: no model configured" in message, message
        assert "cru doctor" in message, message


def test_a_prompt_streams_and_every_update_passes_through(acp: AcpSetup) -> None:
    acp.script({
        "new_session": {"list_mcp_tools": True,
                        "after": [{"commands": [{"name": "compact", "description": "Compact the context"}]}]},
        "prompts": [[
            {"text": "Hello "}, {"thought": "thinking"}, {"text": "world"},
            {"update": {"sessionUpdate": "future_widget", "payload": {"x": 1}}},
            {"plan": [{"content": "read the notes", "priority": "high", "status": "pending"}]},
            {"usage": {"used": 10, "size": 1000}},
        ]],
    })
    editor = Editor()

    async def body(conn: Any, init: InitializeResponse) -> tuple[str, Any]:
        new = await conn.new_session(cwd=str(acp.work), mcp_servers=[])
        resp = await conn.prompt(session_id=new.session_id, prompt=text("hi"))
        return new.session_id, (new, resp)

    sid, (new, resp) = run(acp, editor, body)
    assert resp.stop_reason == "end_turn"
    assert editor.text(sid) == "Hello world"
    updates = editor.update_frames()
    assert updates and all(u["sessionId"] == sid for u in updates)  # ours, never the backend's
    assert sid != "sess-1"
    # A variant nobody knows reaches the editor exactly as the backend sent it.
    widget = editor.update_frames("future_widget")
    assert [w["update"] for w in widget] == [{"sessionUpdate": "future_widget", "payload": {"x": 1}}]
    assert editor.update_frames("plan")[0]["update"]["entries"][0]["content"] == "read the notes"
    assert editor.update_frames("usage_update")[0]["update"]["used"] == 10
    # Streamed: the chunks came before the prompt's answer.
    positions = [i for i, f in enumerate(editor.frames) if f.get("method") == "session/update"
                 and f["params"]["update"].get("sessionUpdate") == "agent_message_chunk"]
    answer = next(i for i, f in enumerate(editor.frames) if "result" in f and "stopReason" in (f["result"] or {}))
    assert positions and max(positions) < answer
    # The backend's commands plus Crucible's; the card selector among the config options.
    commands = editor.update_frames("available_commands_update")[-1]["update"]["availableCommands"]
    assert {"compact", "card", "kiln-search"} <= {c["name"] for c in commands}
    card_option = next(o for o in new.config_options if o.id == "crucible_card")
    assert card_option.current_value == "none"
    values = {o.value for o in card_option.options}
    assert {"none", "reviewer", "librarian", "planner"} <= values


@pytest.mark.parametrize("answer,option", [("allow_once", "allow"), ("reject_once", "reject")])
def test_a_backend_permission_request_is_decided_in_the_editor(acp: AcpSetup, answer: str, option: str) -> None:
    options = [{"optionId": "allow_always", "name": "Always Allow", "kind": "allow_always"},
               {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
               {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]
    acp.script({"prompts": [[
        {"tool_call": {"toolCallId": "t1", "title": "Edit src/app.py", "kind": "edit", "status": "pending"}},
        {"permission": {"toolCall": {"toolCallId": "t1", "title": "Edit src/app.py", "kind": "edit"},
                        "options": options}, "as": "edit"},
        # Crucible's own read-only bridge tool: its policy answers, the editor is not asked.
        {"permission": {"toolCall": {"toolCallId": "t2", "title": "mcp__crucible__semantic_search",
                                     "kind": "other"}, "options": options}, "as": "bridge"},
    ]]})
    editor = Editor(answer=answer)

    async def body(conn: Any, init: InitializeResponse) -> str:
        new = await conn.new_session(cwd=str(acp.work), mcp_servers=[])
        resp = await conn.prompt(session_id=new.session_id, prompt=text("edit it"))
        assert resp.stop_reason == "end_turn"
        return str(new.session_id)

    sid = run(acp, editor, body)
    assert [(p["session_id"], p["title"], p["tool_call_id"]) for p in editor.permissions] == \
        [(sid, "Edit src/app.py", "t1")]
    assert editor.permissions[0]["kinds"] == ["allow_always", "allow_once", "reject_once"]
    assert acp.results("edit") == [{"outcome": {"outcome": "selected", "optionId": option}}]
    assert acp.results("bridge") == [{"outcome": {"outcome": "selected", "optionId": "allow"}}]


@pytest.mark.parametrize("editor_fs", [True, False])
def test_fs_goes_to_the_editor_when_it_serves_fs(acp: AcpSetup, editor_fs: bool) -> None:
    path = acp.work / "notes.txt"
    path.write_text("saved on disk\n")
    out = acp.work / "out.txt"
    acp.script({"prompts": [[{"read": {"path": str(path)}, "as": "read"},
                             {"write": {"path": str(out), "content": "written by the agent\n"}, "as": "write"}]]})
    editor = Editor(fs=editor_fs, buffers={str(path): "unsaved in the editor\n"})

    async def body(conn: Any, init: InitializeResponse) -> None:
        new = await conn.new_session(cwd=str(acp.work), mcp_servers=[])
        resp = await conn.prompt(session_id=new.session_id, prompt=text("read it"))
        assert resp.stop_reason == "end_turn"

    run(acp, editor, body)
    if editor_fs:
        assert acp.results("read") == [{"content": "unsaved in the editor\n"}]
        assert editor.fs_calls == [("read", str(path)), ("write", str(out))]
        assert editor.buffers[str(out)] == "written by the agent\n"
        assert not out.exists()
    else:
        assert acp.results("read") == [{"content": "saved on disk\n"}]
        assert editor.fs_calls == []
        assert out.read_text() == "written by the agent\n"


@pytest.mark.parametrize("editor_terminal", [True, False])
def test_terminals_go_to_the_editor_when_it_offers_them(acp: AcpSetup, editor_terminal: bool) -> None:
    acp.script({"prompts": [[{"terminal": {"command": "echo", "args": ["from", "our", "shell"],
                                           "then": ["wait_for_exit", "output", "release"]}, "as": "term"}]]})
    editor = Editor(terminal=editor_terminal)

    async def body(conn: Any, init: InitializeResponse) -> None:
        new = await conn.new_session(cwd=str(acp.work), mcp_servers=[])
        resp = await conn.prompt(session_id=new.session_id, prompt=text("run it"))
        assert resp.stop_reason == "end_turn"

    run(acp, editor, body)
    created, _, output, _ = acp.results("term")
    if editor_terminal:
        assert created == {"terminalId": "editor-term-1"}
        assert output["output"] == "from the editor's terminal\n"
        assert [c[0] for c in editor.terminal_calls] == ["create", "wait_for_exit", "output", "release"]
        assert editor.terminal_calls[0][1] == "echo from our shell"
    else:
        assert output["output"] == "from our shell\n"  # Crucible ran it, in the session's cwd
        assert editor.terminal_calls == []


def test_modes_and_images_as_the_backend_takes_them(acp: AcpSetup) -> None:
    modes = {"currentModeId": "ask", "availableModes": [{"id": "ask", "name": "Ask"}, {"id": "code", "name": "Code"}]}
    acp.script({"new_session": {"result": {"modes": modes}}})
    editor = Editor()

    async def body(conn: Any, init: InitializeResponse) -> Any:
        new = await conn.new_session(cwd=str(acp.work), mcp_servers=[])
        await conn.set_session_mode(session_id=new.session_id, mode_id="code")
        image = ImageContentBlock(type="image", data="iVBORw0KGgo=", mime_type="image/png")
        await conn.prompt(session_id=new.session_id, prompt=[*text("what is this?"), image])
        return new

    new = run(acp, editor, body)
    assert new.modes is not None and [m.id for m in new.modes.available_modes] == ["ask", "code"]
    # The backend has modes of its own: the card selector is not a second "mode" picker.
    card_option = next(o for o in new.config_options if o.id == "crucible_card")
    assert card_option.category is None
    assert [f["params"]["modeId"] for f in acp.inbound("session/set_mode")] == ["code"]
    assert editor.update_frames("current_mode_update")[0]["update"]["currentModeId"] == "code"
    # The scripted backend takes no images: it gets a note instead of a block it cannot read.
    blocks = acp.inbound("session/prompt")[0]["params"]["prompt"]
    assert [b["type"] for b in blocks] == ["text", "text"]
    assert "image omitted" in blocks[1]["text"]


def test_a_backends_older_models_state_reaches_the_editor_and_its_choice_the_backend(acp: AcpSetup) -> None:
    # Gemini CLI offers its models as `models` and serves session/set_model (unstable ACP, gone
    # from the SDK's schema, still read by editors' model pickers).
    models = {"currentModelId": "auto", "availableModels": [{"modelId": "auto", "name": "Auto"},
                                                            {"modelId": "gemini-2.5-pro", "name": "Pro"}]}
    acp.script({"new_session": {"result": {"models": models}}})
    editor = Editor()

    async def body(conn: Any, init: InitializeResponse) -> Any:
        raw = await conn._conn.send_request("session/new", {"cwd": str(acp.work), "mcpServers": []})
        # (the SDK has no set_session_model any more: the frame an editor such as Zed sends)
        await conn._conn.send_request("session/set_model", {"sessionId": raw["sessionId"],
                                                            "modelId": "gemini-2.5-pro"})
        return raw

    new = run(acp, editor, body)
    assert new["models"] == models
    sent = acp.inbound("session/set_model")
    assert [f["params"]["modelId"] for f in sent] == ["gemini-2.5-pro"]
    assert sent[0]["params"]["sessionId"] != new["sessionId"]  # the backend's own session id


def test_the_editors_mcp_server_reaches_the_backend(acp: AcpSetup) -> None:
    calls = acp.tmp / "echo-calls.jsonl"
    acp.script({"new_session": {"list_mcp_tools": True},
                "prompts": [[{"mcp_call": {"server": "editor-notes", "tool": "semantic_search",
                                           "arguments": {"query": "sourdough"}}, "as": "call"}]]})
    editor = Editor()
    server = McpServerStdio(name="editor-notes", command=sys.executable, args=[str(ECHO_MCP), "--log", str(calls)],
                            env=[])

    async def body(conn: Any, init: InitializeResponse) -> None:
        new = await conn.new_session(cwd=str(acp.work), mcp_servers=[server])
        resp = await conn.prompt(session_id=new.session_id, prompt=text("search"))
        assert resp.stop_reason == "end_turn"

    run(acp, editor, body)
    listed = {e["server"]: e.get("tools") for e in acp.log() if e.get("kind") == "mcp_tools"}
    assert listed.get("editor-notes") == ["semantic_search"], listed
    assert "semantic_search" in (listed.get("crucible") or []), listed  # the kiln bridge beside it
    result = acp.results("call")[0]
    assert "Best match" in json.dumps(result), result
    assert json.loads(calls.read_text().splitlines()[0])["query"] == "sourdough"


def test_an_editor_server_named_like_the_bridge_is_left_out_and_the_editor_is_told(acp: AcpSetup) -> None:
    # A person who added `cru mcp` to the editor as "crucible" and then uses `cru acp`: the
    # agent gets one "crucible" (the session's bridge), and the first turn says why.
    calls = acp.tmp / "echo-calls.jsonl"
    acp.script({"new_session": {"list_mcp_tools": True}, "prompts": [[{"text": "ok"}], [{"text": "again"}]]})
    editor = Editor()
    clash = McpServerStdio(name="crucible", command=sys.executable, args=[str(ECHO_MCP), "--log", str(calls)], env=[])

    async def body(conn: Any, init: InitializeResponse) -> str:
        new = await conn.new_session(cwd=str(acp.work), mcp_servers=[clash])
        for words in ("hi", "more"):
            resp = await conn.prompt(session_id=new.session_id, prompt=text(words))
            assert resp.stop_reason == "end_turn"
        return str(new.session_id)

    sid = run(acp, editor, body)
    new = next(e["frame"] for e in acp.log() if e.get("kind") == "in" and e["frame"].get("method") == "session/new")
    assert [s["name"] for s in new["params"]["mcpServers"]] == ["crucible"]
    assert "url" in new["params"]["mcpServers"][0]  # the bridge, not the editor's stdio server
    warning = ("⚠ Crucible: left out the editor's MCP server 'crucible': Crucible's kiln bridge has that name "
               "(rename it in the editor's settings to give the agent both)\n\n")
    assert editor.text(sid) == warning + "ok" + "again"  # told once, before the first turn's answer


def test_an_agent_that_never_lists_the_kiln_tools_is_named_in_the_first_turn(acp: AcpSetup) -> None:
    acp.script({"prompts": [[{"text": "ok"}]]})  # never connects to its MCP servers
    editor = Editor()

    async def body(conn: Any, init: InitializeResponse) -> str:
        new = await conn.new_session(cwd=str(acp.work), mcp_servers=[])
        await conn.prompt(session_id=new.session_id, prompt=text("hi"))
        return str(new.session_id)

    sid = run(acp, editor, body)
    assert editor.text(sid) == ("⚠ Crucible: the agent never listed the kiln tools on the crucible bridge (http); "
                                "it will run without them\n\nok")


def test_cancel_answers_the_pending_permission_cancelled_on_both_sides(acp: AcpSetup) -> None:
    acp.script({"prompts": [{"steps": [
        {"tool_call": {"toolCallId": "t1", "title": "Run rm -rf build", "kind": "execute", "status": "pending"}},
        {"permission": {"toolCall": {"toolCallId": "t1"}, "options": [
            {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
            {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]}, "as": "perm"},
        {"stall": None}]}]})
    editor = Editor(answer=None)

    async def body(conn: Any, init: InitializeResponse) -> Any:
        new = await conn.new_session(cwd=str(acp.work), mcp_servers=[])
        turn = asyncio.create_task(conn.prompt(session_id=new.session_id, prompt=text("clean up")))
        await asyncio.wait_for(editor.asked.wait(), 30)
        await conn.cancel(session_id=new.session_id)
        editor.cancelled.set()
        resp = await asyncio.wait_for(turn, 30)
        await conn.close_session(session_id=new.session_id)
        alive = pids_with(str(acp.script_path))
        return resp, alive

    resp, alive_after_close = run(acp, editor, body)
    assert resp.stop_reason == "cancelled"
    assert acp.results("perm") == [{"outcome": {"outcome": "cancelled"}}]
    assert len(acp.inbound("session/cancel")) == 1
    assert alive_after_close == []


@pytest.mark.parametrize("agent_name", ["@zed-industries/claude-agent-acp", "scripted-agent"])
def test_a_backend_known_to_lag_after_a_cancel_is_named_to_the_editor_once(acp: AcpSetup, agent_name: str) -> None:
    """The old claude-agent-acp package answers one prompt late after a cancelled turn (upstream
    #551): the editor is told at the prompt after the first cancel, with the update, once; a
    backend not known for it is told nothing."""
    stall = {"steps": [{"text": "working"}, {"stall": None}], "after_cancel": [{"text": " stopped"}]}
    acp.script({"prompts": [stall, {"steps": [{"text": "next"}]}, stall, {"steps": [{"text": "last"}]}],
                "initialize": {"result": {"agentInfo": {"name": agent_name, "version": "0.23.1"}}}})
    editor = Editor()

    async def body(conn: Any, init: InitializeResponse) -> tuple[list[str], str]:
        new = await conn.new_session(cwd=str(acp.work), mcp_servers=[])
        ends: list[str] = []
        for words in ("take your time", "and now?", "again, slowly", "and now?"):
            turn = asyncio.create_task(conn.prompt(session_id=new.session_id, prompt=text(words)))
            if "time" in words or "slowly" in words:
                await asyncio.sleep(0.5)
                await conn.cancel(session_id=new.session_id)
            ends.append((await asyncio.wait_for(turn, 30)).stop_reason)
        return ends, str(new.session_id)

    ends, sid = run(acp, editor, body)
    assert ends == ["cancelled", "end_turn", "cancelled", "end_turn"]
    said = editor.text(sid)
    if agent_name == "scripted-agent":
        assert "one prompt late" not in said
        return
    assert said.count("one prompt late") == 1 and "npm install -g @agentclientprotocol/claude-agent-acp" in said
    assert said.index("stopped") < said.index("one prompt late") < said.index("next")  # before the next answer


def test_close_ends_the_backend_and_eof_ends_everything(acp: AcpSetup) -> None:
    acp.script({})
    editor = Editor()

    async def body(conn: Any, init: InitializeResponse) -> tuple[list[int], list[int], list[int]]:
        first = await conn.new_session(cwd=str(acp.work), mcp_servers=[])
        running = pids_with(str(acp.script_path))
        await conn.close_session(session_id=first.session_id)
        after_close = pids_with(str(acp.script_path))
        await conn.new_session(cwd=str(acp.work), mcp_servers=[])
        await conn.new_session(cwd=str(acp.work), mcp_servers=[])
        return running, after_close, pids_with(str(acp.script_path))

    running, after_close, two_open = run(acp, editor, body)  # run() checks none is left after EOF
    assert len(running) == 1 and after_close == [] and len(two_open) == 2


def test_cards_are_a_config_option_and_a_slash_command(acp: AcpSetup) -> None:
    acp.script({})
    editor = Editor()

    async def body(conn: Any, init: InitializeResponse) -> tuple[Any, Any]:
        new = await conn.new_session(cwd=str(acp.work), mcp_servers=[])
        sid = new.session_id
        changed = await conn.set_config_option(session_id=sid, config_id="crucible_card", value="reviewer")
        await conn.prompt(session_id=sid, prompt=text("review my change"))
        await conn.prompt(session_id=sid, prompt=text("/card librarian"))
        await conn.prompt(session_id=sid, prompt=text("tidy my notes"))
        with pytest.raises(RequestError) as bad:
            await conn.set_config_option(session_id=sid, config_id="crucible_card", value="nosuchcard")
        return changed, bad.value

    changed, bad = run(acp, editor, body)
    option = next(o for o in changed.config_options if o.id == "crucible_card")
    assert option.current_value == "reviewer"
    prompts = [f["params"]["prompt"] for f in acp.inbound("session/prompt")]
    assert len(prompts) == 2  # the slash command never reached the backend
    assert prompts[0][0]["text"].startswith('<instructions card="reviewer">')
    assert prompts[1][0]["text"].startswith('<instructions card="librarian">')
    assert "Card: librarian" in editor.text()
    assert "nosuchcard" in str(bad) and "reviewer" in str(bad)


def test_sessions_are_listed_and_loaded_from_crucibles_transcripts(acp: AcpSetup) -> None:
    acp.script({})
    editor = Editor()

    async def body(conn: Any, init: InitializeResponse) -> tuple[str, Any]:
        new = await conn.new_session(cwd=str(acp.work), mcp_servers=[])
        await conn.prompt(session_id=new.session_id, prompt=text("remember the word apple"))
        await conn.close_session(session_id=new.session_id)
        listed = await conn.list_sessions(cwd=str(acp.work))
        editor.updates.clear()
        await conn.load_session(cwd=str(acp.work), session_id=new.session_id, mcp_servers=[])
        replayed = list(editor.updates)
        resp = await conn.prompt(session_id=new.session_id, prompt=text("and now?"))
        assert resp.stop_reason == "end_turn"
        return new.session_id, (listed, replayed)

    sid, (listed, replayed) = run(acp, editor, body)
    assert [s.session_id for s in listed.sessions] == [sid]
    assert listed.sessions[0].cwd == str(acp.work) and listed.sessions[0].title == "remember the word apple"
    kinds = [(type(u).__name__, u.content.text) for s, u in replayed if s == sid and hasattr(u, "content")]
    assert ("UserMessageChunk", "remember the word apple") in kinds
    assert ("AgentMessageChunk", "echo: remember the word apple") in kinds
    # The backend resumed its own session (it advertises session/resume).
    assert [f["params"]["sessionId"] for f in acp.inbound("session/resume")] == ["sess-1"]
    assert "echo: and now?" in editor.text(sid)


def test_a_session_with_nothing_said_yet_resumes_without_a_warning(acp: AcpSetup) -> None:
    """acpx's `sessions new`, then its first prompt from another `cru acp`: the session is resumed
    before anything was said, and the backend (Claude Code keeps no session of no turn) cannot
    reopen its own. A new backend session serves it: nothing was lost, so the editor is not
    told "started a new one with the saved conversation as context" (there is none)."""
    acp.script({"resume_session": {"error": {"code": -32002, "message": "Resource not found"}}})
    editor = Editor()

    async def body(conn: Any, init: InitializeResponse) -> str:
        new = await conn.new_session(cwd=str(acp.work), mcp_servers=[])
        await conn.close_session(session_id=new.session_id)
        await conn.resume_session(session_id=new.session_id, cwd=str(acp.work), mcp_servers=[])
        resp = await conn.prompt(session_id=new.session_id, prompt=text("hello there"))
        assert resp.stop_reason == "end_turn"
        return str(new.session_id)

    sid = run(acp, editor, body)
    assert "echo: hello there" in editor.text(sid)
    assert "could not reopen" not in editor.text(sid) + acp.stderr()
    assert [f["params"]["sessionId"] for f in acp.inbound("session/resume")] == ["sess-1"]
    prompts = [f["params"]["prompt"] for f in acp.inbound("session/prompt")]
    assert [b["text"] for b in prompts[-1]] == ["hello there"]  # no empty <previous_conversation>


def test_a_resumed_session_gets_no_replay_from_a_backend_that_can_only_load(acp: AcpSetup) -> None:
    """acpx resumes its session (session/resume) from a new `cru acp` each time the last one is
    gone. Gemini CLI can only load a session, and replays its conversation when it does (part of
    it after its answer): the editor asked for no replay, and printed the replayed messages glued
    before the next answer (seen by hand). It gets none; a session/load still gets the history."""
    caps = {"initialize": {"result": {"agentCapabilities": {"loadSession": True, "sessionCapabilities": {}}}}}
    acp.script({**caps, "history": [{"user_text": "remember the word apple"}],
                "history_after_answer": [{"text": "echo: remember the word apple"}]})
    editor = Editor()

    async def body(conn: Any, init: InitializeResponse) -> tuple[str, list[Any], list[Any]]:
        new = await conn.new_session(cwd=str(acp.work), mcp_servers=[])
        await conn.prompt(session_id=new.session_id, prompt=text("remember the word apple"))
        await conn.close_session(session_id=new.session_id)
        editor.updates.clear()
        await conn.resume_session(session_id=new.session_id, cwd=str(acp.work), mcp_servers=[])
        await conn.prompt(session_id=new.session_id, prompt=text("which word?"))
        resumed = list(editor.updates)
        await conn.close_session(session_id=new.session_id)
        editor.updates.clear()
        await conn.load_session(cwd=str(acp.work), session_id=new.session_id, mcp_servers=[])
        loaded = list(editor.updates)
        return str(new.session_id), resumed, loaded

    sid, resumed, loaded = run(acp, editor, body)
    assert len(acp.inbound("session/load")) == 2  # both reopened natively: the backend replayed twice

    def said(updates: list[Any]) -> list[tuple[str, str]]:
        return [(type(u).__name__, u.content.text) for s, u in updates
                if s == sid and hasattr(u, "content") and hasattr(u.content, "text")]

    assert [t for t in said(resumed) if not t[1].startswith("⚠ Crucible:")] == [("AgentMessageChunk", "echo: which word?")]
    assert ("AgentMessageChunk", "echo: remember the word apple") in said(loaded)


class RawEditor:
    """Frames by hand, for what no SDK client sends (malformed frames, $/cancel_request)."""

    def __init__(self, acp: AcpSetup) -> None:
        self.acp = acp
        with open(acp.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(acp.argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                         env=acp.env)

    def send(self, line: bytes | dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        data = line if isinstance(line, bytes) else json.dumps(line).encode()
        self.proc.stdin.write(data + b"\n")
        self.proc.stdin.flush()

    def receive(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, self.acp.stderr()[-2000:]
        frame: dict[str, Any] = json.loads(line)
        return frame

    def answer(self, request_id: int | str) -> dict[str, Any]:
        while True:
            frame = self.receive()
            if frame.get("id") == request_id and "method" not in frame:
                return frame

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=30)


def test_a_cancel_request_for_the_prompt_cancels_the_backends_turn(acp: AcpSetup) -> None:
    acp.script({"prompts": [{"steps": [{"text": "working"}, {"stall": None}], "after_cancel": [{"text": " stopped"}]}]})
    ed = RawEditor(acp)
    try:
        ed.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}})
        ed.answer(1)
        ed.send({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": str(acp.work), "mcpServers": []}})
        sid = ed.answer(2)["result"]["sessionId"]
        ed.send({"jsonrpc": "2.0", "id": 3, "method": "session/prompt",
                 "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]}})
        while True:
            frame = ed.receive()
            if frame.get("method") == "session/update" and frame["params"]["update"].get("content", {}).get("text") \
                    == "working":
                break
        ed.send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 3}})
        reply = ed.answer(3)
        assert reply["error"]["code"] == -32800, reply
        assert [f["params"]["sessionId"] for f in acp.inbound("session/cancel")] == ["sess-1"]
        assert [e.get("stopReason") for e in acp.log() if e.get("kind") == "turn_end"] == ["cancelled"]
    finally:
        code = ed.close()
    assert code == 0


def test_sigterm_ends_cru_acp_and_its_backends(acp: AcpSetup) -> None:
    acp.script({})
    ed = RawEditor(acp)
    ed.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}})
    ed.answer(1)
    ed.send({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": str(acp.work), "mcpServers": []}})
    assert "result" in ed.answer(2), acp.stderr()[-2000:]
    assert len(pids_with(str(acp.script_path))) == 1
    ed.proc.send_signal(signal.SIGTERM)
    assert ed.proc.wait(timeout=30) == 0, acp.stderr()[-2000:]
    assert pids_with(str(acp.script_path)) == []
    assert ed.proc.stdin is not None
    ed.proc.stdin.close()


def test_a_malformed_frame_gets_an_error_and_the_connection_stays_up(acp: AcpSetup) -> None:
    acp.script({})
    ed = RawEditor(acp)
    send, receive = ed.send, ed.receive
    try:
        send(b"this is not json")
        assert receive() == {"jsonrpc": "2.0", "id": None,
                             "error": {"code": -32700, "message": "parse error: not JSON (JSONDecodeError)"}}
        send(b'{"jsonrpc": "2.0", "id": 7, "method": 42}')
        reply = receive()
        assert reply["id"] == 7 and reply["error"]["code"] == -32600
        send(b'{"jsonrpc": "2.0", "id": "x", "method": "no/such_method", "params": {}}')
        reply = receive()
        assert reply["id"] == "x" and reply["error"]["code"] == -32601
        send(json.dumps({"jsonrpc": "2.0", "id": 8, "method": "initialize",
                         "params": {"protocolVersion": 1, "clientCapabilities": {}}}).encode())
        reply = receive()
        assert reply["id"] == 8 and reply["result"]["protocolVersion"] == 1
    finally:
        code = ed.close()
    assert code == 0
