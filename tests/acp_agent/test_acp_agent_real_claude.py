"""`cru acp -a claude`: the real claude-agent-acp behind Crucible, the ACP SDK client in front,
the fake LLM behind claude (offline)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest
from acp.schema import InitializeResponse, McpServerStdio, TextContentBlock
from acp_agent_driver import ECHO_MCP, Editor, RealClaude, drive
from fake_llm import Reply

pytestmark = [pytest.mark.real_agent]


def claude_pids(home: str) -> list[int]:
    """Claude's processes (claude-agent-acp and its CLI, by their program) running with this
    test's private HOME; not `cru acp -a claude` itself nor cru's own helpers, which live as
    long as cru does by design (its watchdog, acp_host.reaper; the kiln's index worker)."""
    import os
    from pathlib import Path

    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            program = b" ".join(cmdline.split(b"\0")[:2])
            if f"HOME={home}".encode() in environ and state != "Z" and b"claude" in program \
                    and b"\0acp\0-a\0claude" not in cmdline:
                found.append(int(entry))
    return found


def run(claude: RealClaude, editor: Editor, body: Any) -> Any:
    with open(claude.acp.stderr_path, "ab") as err:
        result, code = asyncio.run(drive(claude.argv(), claude.env, editor, err.fileno(), body, body_seconds=180))
    assert code == 0, claude.acp.stderr()[-3000:]
    assert claude_pids(claude.env["HOME"]) == [], "claude outlived cru acp"
    return result


def test_claude_streams_asks_the_editor_and_sees_the_editors_mcp_server(real_claude: RealClaude) -> None:
    llm, acp = real_claude.llm, real_claude.acp
    calls = acp.tmp / "echo-calls.jsonl"
    llm.push(Reply.tool_call("semantic_search", {"query": "sourdough"}, server="editor-notes"),
             Reply.tool_call("create_note", {"path": "inbox/from-editor.md", "content": "# From the editor\n"}),
             Reply.text_reply("Done: noted it in your kiln."))
    editor = Editor(answer="allow_once")
    server = McpServerStdio(name="editor-notes", command=sys.executable, args=[str(ECHO_MCP), "--log", str(calls)],
                            env=[])

    async def body(conn: Any, init: InitializeResponse) -> str:
        new = await conn.new_session(cwd=str(acp.work), mcp_servers=[server])
        resp = await conn.prompt(session_id=new.session_id,
                                 prompt=[TextContentBlock(type="text", text="Look it up and note it")])
        assert resp.stop_reason == "end_turn"
        return str(new.session_id)

    sid = run(real_claude, editor, body)
    assert "Done: noted it in your kiln." in editor.text(sid)
    # The editor's own MCP server was in claude's tool list, beside the kiln bridge, and ran.
    offered = llm.main_requests()[0].tool_names()
    assert "mcp__editor-notes__semantic_search" in offered and "mcp__crucible__semantic_search" in offered
    assert json.loads(calls.read_text().splitlines()[0])["query"] == "sourdough"
    # Claude asked for the editor's tool and the mutating kiln tool (Crucible's policy answers
    # only for read-only bridge tools by itself); the editor's person allowed each once.
    assert [(p["session_id"], p["title"]) for p in editor.permissions] == \
        [(sid, "mcp__editor-notes__semantic_search"), (sid, "mcp__crucible__create_note")]
    assert (acp.kiln / "inbox" / "from-editor.md").read_text() == "# From the editor\n"


def test_cancel_and_close_leave_no_claude_behind(real_claude: RealClaude) -> None:
    llm, acp = real_claude.llm, real_claude.acp
    llm.push(Reply.hang("Thinking about it"))
    editor = Editor()

    async def body(conn: Any, init: InitializeResponse) -> tuple[Any, list[int], list[int]]:
        new = await conn.new_session(cwd=str(acp.work), mcp_servers=[])
        turn = asyncio.create_task(conn.prompt(session_id=new.session_id,
                                               prompt=[TextContentBlock(type="text", text="Take your time")]))
        hung = await asyncio.to_thread(llm.wait_until, lambda f: any(r.reply == "hang" for r in f.requests), 90)
        assert hung, acp.stderr()[-2000:]
        running = claude_pids(real_claude.env["HOME"])
        await conn.cancel(session_id=new.session_id)
        resp = await asyncio.wait_for(turn, 60)
        await conn.close_session(session_id=new.session_id)
        return resp, running, claude_pids(real_claude.env["HOME"])

    resp, running, after_close = run(real_claude, editor, body)
    assert resp.stop_reason == "cancelled"
    assert running, "claude was not running during the turn"
    assert after_close == [], "session/close left claude running"
