"""`cru acp` driven by acpx (npm), the headless ACP client: `acpx --agent "cru acp ..." exec "..."`."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from acp_agent_driver import ECHO_MCP, AcpSetup, RealClaude, pids_with

PERMISSION_SCRIPT: dict[str, Any] = {
    "new_session": {"list_mcp_tools": True},
    "prompts": [[
        {"text": "Hello from "}, {"text": "the backend"},
        {"tool_call": {"toolCallId": "t1", "title": "Edit notes.txt", "kind": "edit", "status": "pending"}},
        {"permission": {"toolCall": {"toolCallId": "t1", "title": "Edit notes.txt", "kind": "edit"}, "options": [
            {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
            {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]}, "as": "perm"},
        {"read": {"path": "NOTES"}, "as": "read"},
        {"mcp_call": {"server": "editor-notes", "tool": "semantic_search", "arguments": {"query": "bread"}},
         "as": "call"},
    ]],
}


def acpx(acpx_bin: str, agent_argv: list[str], cwd: Path, env: dict[str, str], prompt: str, *flags: str,
         timeout: float = 180) -> subprocess.CompletedProcess[str]:
    argv = [acpx_bin, "--agent", shlex.join(agent_argv), "--cwd", str(cwd), "--format", "json", *flags,
            "exec", prompt]
    # cru must be on PATH for acpx's agent command as an editor would find it.
    env = {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def frames(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def message_text(fs: list[dict[str, Any]]) -> str:
    return "".join(f["params"]["update"]["content"].get("text", "") for f in fs
                   if f.get("method") == "session/update"
                   and f["params"]["update"].get("sessionUpdate") == "agent_message_chunk")


@pytest.mark.parametrize("flag,option", [("--approve-all", "allow"), ("--deny-all", "reject")])
def test_acpx_drives_cru_acp_with_the_scripted_agent(acp: AcpSetup, acpx_bin: str, flag: str, option: str) -> None:
    notes = acp.work / "notes.txt"
    notes.write_text("on disk\n")
    script = json.loads(json.dumps(PERMISSION_SCRIPT).replace("NOTES", str(notes)))
    acp.script(script)
    calls = acp.tmp / "echo-calls.jsonl"
    mcp_config = acp.tmp / "mcp.json"
    mcp_config.write_text(json.dumps({"mcpServers": [{
        "name": "editor-notes", "command": sys.executable, "args": [str(ECHO_MCP), "--log", str(calls)], "env": []}]}))
    res = acpx(acpx_bin, acp.argv(), acp.work, acp.env, "hi there", flag, "--mcp-config", str(mcp_config))
    fs = frames(res.stdout)
    assert fs, (res.stdout[-2000:], res.stderr[-2000:])
    # The prompt streamed through to acpx.
    assert message_text(fs) == "Hello from the backend"
    # The backend's permission request reached acpx, and acpx's answer reached the backend.
    asked = [f for f in fs if f.get("method") == "session/request_permission"]
    assert [a["params"]["toolCall"]["title"] for a in asked] == ["Edit notes.txt"]
    assert acp.results("perm") == [{"outcome": {"outcome": "selected", "optionId": option}}]
    # fs went to acpx (it advertises fs): it answered the read itself.
    reads = [f for f in fs if f.get("method") == "fs/read_text_file"]
    assert [r["params"]["path"] for r in reads] == [str(notes)]
    if flag == "--approve-all":
        assert res.returncode == 0, res.stderr[-3000:]
        assert acp.results("read") == [{"content": "on disk\n"}]
    else:
        # acpx refuses reads under --deny-all: its own error reaches the backend unchanged.
        assert "deny-all" in json.dumps(acp.results("read"))
    # acpx's MCP server (its --mcp-config) reached the backend's tool list beside the kiln bridge.
    listed = {e["server"]: e.get("tools") for e in acp.log() if e.get("kind") == "mcp_tools"}
    assert listed.get("editor-notes") == ["semantic_search"], listed
    assert "semantic_search" in (listed.get("crucible") or []), listed
    assert json.loads(calls.read_text().splitlines()[0])["query"] == "bread"
    assert not pids_with(str(acp.script_path)), "a backend outlived acpx's run"


def test_kiln_search_slash_command_answers_from_the_kiln(acp: AcpSetup, acpx_bin: str) -> None:
    acp.script({})
    res = acpx(acpx_bin, acp.argv(), acp.work, acp.env, "/kiln-search sourdough starter", "--approve-all")
    assert res.returncode == 0, res.stderr[-3000:]
    text = message_text(frames(res.stdout))
    assert "Cooking/Sourdough starter.md" in text, text
    assert str(acp.kiln) not in text  # kiln-relative paths only
    assert acp.inbound("session/prompt") == []  # Crucible answered; the backend never saw it
    # The command is offered to the editor beside the backend's own.
    commands = [f["params"]["update"]["availableCommands"] for f in frames(res.stdout)
                if f.get("method") == "session/update"
                and f["params"]["update"].get("sessionUpdate") == "available_commands_update"]
    assert commands and {"card", "kiln-search"} <= {c["name"] for c in commands[-1]}


def test_acpx_sees_the_fix_when_the_backend_cannot_start(acp: AcpSetup, acpx_bin: str) -> None:
    acp.script({"startup": [{"crash": {"code": 3, "stderr": "boom: no model configured"}}]})
    res = acpx(acpx_bin, acp.argv(), acp.work, acp.env, "hi", "--approve-all")
    assert res.returncode != 0
    combined = res.stdout + res.stderr
    assert "boom: no model configured" in combined, combined[-3000:]
    assert "cru doctor" in combined, combined[-3000:]


@pytest.mark.real_agent
def test_acpx_drives_cru_acp_with_real_claude(real_claude: RealClaude, acpx_bin: str) -> None:
    from fake_llm import Reply

    llm, acp = real_claude.llm, real_claude.acp
    llm.push(Reply.tool_call("create_note", {"path": "inbox/from-acpx.md", "content": "# From acpx\n"}),
             Reply.text_reply("Saved it to your kiln."))
    res = acpx(acpx_bin, real_claude.argv(), acp.work, real_claude.env, "Save a note for me", "--approve-all")
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    fs = frames(res.stdout)
    assert "Saved it to your kiln." in message_text(fs)
    # Claude asked for the kiln's mutating tool; Crucible's policy left it to the person in acpx.
    asked = [f["params"]["toolCall"].get("title", "") for f in fs if f.get("method") == "session/request_permission"]
    assert len(asked) == 1 and "create_note" in json.dumps(fs), asked
    assert (acp.kiln / "inbox" / "from-acpx.md").read_text() == "# From acpx\n"
