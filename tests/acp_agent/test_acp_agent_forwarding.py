"""`cru acp` forwards the backend's updates as the backend wrote them (only the sessionId
replaced), which is the flood's fast path: what the editor receives, under a flood and for
frames written in every way a backend may write them."""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
from typing import Any

from acp.schema import InitializeResponse, TextContentBlock
from acp_agent_driver import REPO, AcpSetup, Editor, drive, pids_with

from crucible.session_store import SessionStore, sessions_root

FLOOD = REPO / "fixtures" / "flood_agent.py"
BACKEND_ID = "backend-7"


def run(acp: AcpSetup, editor: Editor, body: Any, agent_command: str, marker: str) -> Any:
    with open(acp.stderr_path, "ab") as err:
        result, code = asyncio.run(drive(acp.argv(agent_command=agent_command), acp.env, editor,
                                         err.fileno(), body))
    assert code == 0, acp.stderr()[-3000:]  # cru acp ended on its own when the editor closed stdin
    assert not pids_with(marker), "a backend agent outlived cru acp"
    return result


def prompt_once(acp: AcpSetup) -> Any:
    async def body(conn: Any, init: InitializeResponse) -> tuple[str, str]:
        new = await conn.new_session(cwd=str(acp.work), mcp_servers=[])
        resp = await conn.prompt(session_id=new.session_id,
                                 prompt=[TextContentBlock(type="text", text="go")])
        return new.session_id, resp.stop_reason

    return body


def saved_events(acp: AcpSetup, sid: str) -> list[dict[str, Any]]:
    return list(SessionStore(sessions_root(acp.env)).events(sid))


def test_a_flood_reaches_the_editor_whole_in_order_and_before_the_prompt_result(acp: AcpSetup) -> None:
    n = 20_000
    editor = Editor()
    sid, stop = run(acp, editor, prompt_once(acp), shlex.join([sys.executable, str(FLOOD), str(n)]), str(FLOOD))
    assert stop == "end_turn"
    chunks = [(i, f["params"]) for i, f in enumerate(editor.frames) if f.get("method") == "session/update"
              and f["params"]["update"].get("sessionUpdate") == "agent_message_chunk"]
    # Every chunk, in the backend's order, each under the editor's session id.
    assert [p["update"]["content"]["text"] for _, p in chunks] == [f"word{i} " for i in range(n)]
    assert {p["sessionId"] for _, p in chunks} == {sid}
    assert sid != "flood-1"
    answer = next(i for i, f in enumerate(editor.frames) if isinstance(f.get("result"), dict)
                  and "stopReason" in f["result"])
    assert chunks[-1][0] < answer, "the prompt's result overtook streamed updates"
    # Crucible's own transcript has the whole message, once (written as it streams: a part
    # flushed after a second is followed by events marked "cont", the rest of the same message).
    messages: list[str] = []
    for e in saved_events(acp, sid):
        if e.get("type") == "agent_message":
            if e.get("cont") and messages:
                messages[-1] += e["text"]
            else:
                messages.append(e["text"])
    assert messages == ["".join(f"word{i} " for i in range(n))]


def _frame(params: dict[str, Any], *, compact: bool = True) -> str:
    frame = {"jsonrpc": "2.0", "method": "session/update", "params": params}
    return json.dumps(frame, separators=(",", ":")) if compact else json.dumps(frame)


def _chunk(text: str) -> dict[str, Any]:
    return {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}


def test_the_session_id_is_replaced_however_the_backend_writes_its_frames(acp: AcpSetup) -> None:
    own = {"sessionId": BACKEND_ID}  # a nested sessionId is the backend's data: left alone
    widget = {"sessionUpdate": "future_widget", "meta": own, "list": [own]}
    tool = {"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "look", "kind": "read",
            "status": "pending", "rawInput": {"sessionId": BACKEND_ID, "q": "x"}}
    expected = [
        _chunk("compact "),
        _chunk("python-style "),
        _chunk("sessionId last "),
        _chunk('text that says "sessionId":"backend-7" '),
        _chunk("caf\u00e9 \U0001f600 "),
        _chunk("jsonrpc not first "),
        widget,
        tool,
        _chunk("done"),
    ]
    lines = [
        _frame({"sessionId": BACKEND_ID, "update": expected[0]}),
        _frame({"sessionId": BACKEND_ID, "update": expected[1]}, compact=False),  # ", " and ": "
        _frame({"update": expected[2], "sessionId": BACKEND_ID}),
        _frame({"sessionId": BACKEND_ID, "update": expected[3]}),
        _frame({"sessionId": BACKEND_ID, "update": expected[4]}),  # \u escapes (ensure_ascii)
        json.dumps({"method": "session/update", "params": {"sessionId": BACKEND_ID, "update": expected[5]},
                    "jsonrpc": "2.0"}, separators=(",", ":")),
        _frame({"sessionId": BACKEND_ID, "update": widget}),
        _frame({"sessionId": BACKEND_ID, "update": tool}),
        _frame({"sessionId": BACKEND_ID, "update": expected[8]}) + "\r",  # CRLF line ends
    ]
    acp.script({"new_session": {"sessionId": BACKEND_ID, "list_mcp_tools": True},
                "prompts": [[{"raw": line} for line in lines]]})
    editor = Editor()
    sid, stop = run(acp, editor, prompt_once(acp), acp.agent_command, str(acp.script_path))
    assert stop == "end_turn"
    got = [p for p in editor.update_frames() if p["update"].get("sessionUpdate") != "available_commands_update"]
    assert [p["update"] for p in got] == expected
    assert {p["sessionId"] for p in got} == {sid}
    assert editor.text(sid) == ('compact python-style sessionId last text that says "sessionId":"backend-7" '
                                "caf\u00e9 \U0001f600 jsonrpc not first done")
    # Crucible's transcript: the chunks on either side of the tool call are two messages.
    saved = [(e["type"], e.get("text")) for e in saved_events(acp, sid)
             if e.get("type") in ("agent_message", "tool_call")]
    assert saved == [("agent_message", "".join(u["content"]["text"] for u in expected[:6])),
                     ("tool_call", None), ("agent_message", "done")]


def test_chunks_thoughts_and_tool_calls_keep_their_order_in_the_transcript(acp: AcpSetup) -> None:
    steps: list[dict[str, Any]] = []
    for turn in range(3):
        steps += [{"thought": f"think {turn}a "}, {"thought": f"think {turn}b "}]
        steps += [{"text": f"say {turn}.{i} "} for i in range(300)]
        steps += [{"tool_call": {"toolCallId": f"c{turn}", "title": f"tool {turn}", "kind": "read",
                                 "status": "completed"}}]
    acp.script({"prompts": [steps]})
    editor = Editor()
    sid, stop = run(acp, editor, prompt_once(acp), acp.agent_command, str(acp.script_path))
    assert stop == "end_turn"
    saved = [(e["type"], e.get("text") or e.get("title")) for e in saved_events(acp, sid)
             if e.get("type") in ("agent_message", "agent_thought", "tool_call")]
    want: list[tuple[str, str]] = []
    for turn in range(3):
        want += [("agent_thought", f"think {turn}a think {turn}b "),
                 ("agent_message", "".join(f"say {turn}.{i} " for i in range(300))),
                 ("tool_call", f"tool {turn}")]
    assert saved == want


def loaded_after_a_turn(acp: AcpSetup, editor: Editor) -> str:
    """A session the editor opens, prompts once, closes and loads again: what the editor got is
    the load's alone (its replay). Returns the session's id."""

    async def body(conn: Any, init: InitializeResponse) -> str:
        new = await conn.new_session(cwd=str(acp.work), mcp_servers=[])
        await conn.prompt(session_id=new.session_id, prompt=[TextContentBlock(type="text", text="hi")])
        await conn.close_session(session_id=new.session_id)
        editor.updates.clear()
        editor.frames.clear()
        await conn.load_session(cwd=str(acp.work), session_id=new.session_id, mcp_servers=[])
        return str(new.session_id)

    return str(run(acp, editor, body, acp.agent_command, str(acp.script_path)))


def test_a_replayed_message_reaches_the_editor_as_the_chat_shows_it(acp: AcpSetup) -> None:
    """Gemini CLI replays its own session context (the date, the OS, the folder's tree) as a part
    of the person's first message, and a tool's result as "[Function Response: NAME]" in a
    message of theirs, alone or run on after their next prompt: the editor that loads the
    session gets one line for the context and the person's words alone, as `cru chat` shows."""
    context = "<session_context>\nThis is the Gemini CLI.\nsecret-folder-tree/\n</session_context>"
    placeholder = "[Function Response: mcp_crucible_semantic_search]"
    call = {"toolCallId": "c1", "title": "semantic_search", "kind": "search", "status": "completed"}
    acp.script({
        "initialize": {"result": {"agentCapabilities": {"loadSession": True, "sessionCapabilities": {}}}},
        "history": [{"user_text": context}, {"user_text": "what is sourdough?"}, {"tool_call": call},
                    {"user_text": placeholder}, {"text": "A slow bread."},
                    {"user_text": "and rye?" + placeholder}, {"text": "A sour one."}],
    })
    editor = Editor()
    loaded_after_a_turn(acp, editor)
    said = [u["update"]["content"]["text"] for u in editor.update_frames("user_message_chunk")]
    assert said == ["(the agent's session context, 4 lines, not shown)\n", "what is sourdough?", "and rye?"]
    assert [u["update"]["title"] for u in editor.update_frames("tool_call")] == ["semantic_search"]
    assert "".join(u["update"]["content"]["text"] for u in editor.update_frames("agent_message_chunk")) \
        == "A slow bread.A sour one."


def test_a_long_history_replayed_by_the_backend_reaches_the_editor_whole(acp: AcpSetup) -> None:
    n = 3000  # more than a backend may send before the session is live in the editor
    acp.script({
        "initialize": {"result": {"agentCapabilities": {"loadSession": True, "sessionCapabilities": {}}}},
        "history": [{"text": f"old {i} "} for i in range(n)],
    })
    editor = Editor()
    sid = loaded_after_a_turn(acp, editor)
    assert [f["params"]["sessionId"] for f in acp.inbound("session/load")] == ["sess-1"]  # natively
    assert editor.text(sid) == "".join(f"old {i} " for i in range(n))
