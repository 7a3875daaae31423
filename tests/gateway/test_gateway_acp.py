"""`cru acp`: an upstream's elicitation is asked in the editor (ACP `elicitation/create`), and
declined when the editor cannot ask. The editor is the ACP SDK's client side (asyncio)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from acp import spawn_agent_process
from acp.schema import (
    AcceptElicitationResponse,
    AllowedOutcome,
    ClientCapabilities,
    ElicitationCapabilities,
    ElicitationFormCapabilities,
    PermissionOption,
    RequestPermissionResponse,
    TextContentBlock,
)
from conftest import REPO, UPSTREAM, write_config

SCRIPTED = REPO / "fixtures" / "scripted_agent.py"


class Editor:
    def __init__(self) -> None:
        self.questions: list[tuple[str, Any]] = []
        self.said: list[str] = []  # the text of each message chunk shown in the thread

    async def request_permission(self, options: list[PermissionOption], session_id: str, tool_call: Any,
                                 **kwargs: Any) -> RequestPermissionResponse:
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=options[0].option_id))

    async def create_elicitation(self, message: str, mode: Any, **kwargs: Any) -> AcceptElicitationResponse:
        self.questions.append((message, mode))
        return AcceptElicitationResponse(action="accept", content={"name": "Editor Person"})

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        if getattr(update, "session_update", None) == "agent_message_chunk":
            self.said.append(getattr(update.content, "text", ""))

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return {}

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        return None


async def one_prompt(argv: list[str], env: dict[str, str], editor: Editor, cwd: Path, elicitation: bool) -> None:
    caps = ClientCapabilities(elicitation=ElicitationCapabilities(form=ElicitationFormCapabilities())
                              if elicitation else None)
    async with spawn_agent_process(editor, argv[0], *argv[1:], env=env,  # type: ignore[arg-type]
                                   transport_kwargs={"stderr": None}, use_unstable_protocol=True) as (conn, _proc):
        await asyncio.wait_for(conn.initialize(protocol_version=1, client_capabilities=caps), 30)
        session = await asyncio.wait_for(conn.new_session(cwd=str(cwd), mcp_servers=[]), 60)
        await asyncio.wait_for(conn.prompt(session_id=session.session_id,
                                           prompt=[TextContentBlock(type="text", text="ask")]), 60)


@pytest.mark.parametrize("elicitation", [True, False], ids=["editor-asks", "editor-cannot"])
def test_elicitation_goes_to_the_editor(cru_bin: str, clean_env: dict[str, str], kiln: Path, tmp_path: Path,
                                        elicitation: bool) -> None:
    write_config(Path(clean_env["XDG_CONFIG_HOME"]) / "crucible",
                 f'[[mcp.servers]]\nname = "up"\n[mcp.servers.transport]\ntype = "stdio"\n'
                 f'command = "{sys.executable}"\nargs = ["{UPSTREAM}", "stdio"]\n[permissions]\n"up_*" = "allow"\n')
    log = tmp_path / "agent-log.jsonl"
    script = tmp_path / "script.json"
    script.write_text(json.dumps({
        "log": str(log),
        "initialize": {"result": {"agentCapabilities": {"mcpCapabilities": {"http": True, "sse": False}}}},
        "new_session": {"list_mcp_tools": True},
        "prompts": [[{"mcp_call": {"server": "crucible", "tool": "up_elicit_name", "arguments": {}}, "as": "ask"},
                     {"mcp_call": {"server": "crucible", "tool": "up_elicit_name", "arguments": {}}, "as": "again"},
                     {"text": "done"}]]}))
    argv = [cru_bin, "acp", "--agent-command", f"{sys.executable} {SCRIPTED} {script}", "--kiln", str(kiln)]
    editor = Editor()
    asyncio.run(one_prompt(argv, clean_env, editor, tmp_path, elicitation))
    entries = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    texts = [e["result"]["result"]["content"][0]["text"] for e in entries if e.get("kind") == "result"]
    told = [t for t in editor.said if "Crucible" in t]
    if elicitation:
        assert texts == ["action=accept content={'name': 'Editor Person'}"] * 2
        assert [m for m, _ in editor.questions] == ["[up] What is your name?"] * 2
        assert editor.questions[0][1].requested_schema.properties["name"] is not None
        assert told == []
    else:
        assert texts == ["action=decline content=None"] * 2
        assert editor.questions == []
        # The person is told once (not at each question) what was asked and why it went unanswered.
        assert told == ["⚠ Crucible: the MCP server up asked you something (\u201cWhat is your name?\u201d); "
                        "this editor cannot show such questions (form elicitation), so Crucible declined it. "
                        "`cru chat` can answer them (`cru session resume` goes on with this conversation "
                        "there).\n\n"], editor.said
