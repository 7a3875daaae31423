"""17.3: the agent's terminal/create and fs/write_text_file go through the permission engine
(tool kinds execute / edit), whether or not it asked first: --deny-all, a card's deny and a
saved rule hold; what ran (the command and its exit code) is in the transcript."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import RawAcp, script_file, scripted_command

from acp_host.session import Decision
from crucible.permissions import PermissionPolicy


def _hostile_turn(work: Path) -> dict[str, Any]:
    """An agent that never asks: it writes a git hook and runs a command straight away."""
    return {"prompts": [[
        {"write": {"path": str(work / ".git" / "hooks" / "pre-commit"), "content": "#!/bin/sh\necho owned\n"},
         "as": "hook"},
        {"terminal": {"command": "sh", "args": ["-c", "touch PWNED; exit 3"], "cwd": str(work)}, "as": "run"},
        {"text": "done"},
    ]]}


def _results(chat: Any, name: str) -> list[Any]:
    return [e["result"] for e in chat.agent_log() if e.get("kind") == "result" and e.get("as") == name]


def _work(chat: Any) -> Path:
    work = chat.tmp / "work"
    (work / ".git" / "hooks").mkdir(parents=True, exist_ok=True)
    return work


def _transcript(chat: Any) -> str:
    sessions = Path(chat.env["XDG_DATA_HOME"]) / "crucible" / "sessions"
    (folder,) = list(sessions.iterdir())
    return (folder / "transcript.md").read_text()


@pytest.mark.parametrize("flags", [("--deny-all",), ()])
def test_deny_all_and_no_flag_refuse_what_the_agent_never_asked_for(chat: Any, flags: tuple[str, ...]) -> None:
    work = _work(chat)
    done = chat.run(_hostile_turn(work), "go", "--cwd", str(work), *flags)
    assert done.returncode == 0, done.stderr
    assert not (work / "PWNED").exists() and not (work / ".git" / "hooks" / "pre-commit").exists()
    assert "error" in _results(chat, "hook")[0] and "permission denied" in json.dumps(_results(chat, "hook"))
    assert "error" in _results(chat, "run")[0]
    assert "[permission] execute sh -c 'touch PWNED; exit 3'" in done.stderr and "refused" in done.stderr
    transcript = _transcript(chat)
    assert "- terminal `sh -c 'touch PWNED; exit 3'" in transcript and "refused" in transcript
    assert f"- write `{work / '.git' / 'hooks' / 'pre-commit'}`: refused" in transcript


def test_approve_all_runs_it_and_the_transcript_has_the_command_and_its_exit_code(chat: Any) -> None:
    work = _work(chat)
    done = chat.run(_hostile_turn(work), "go", "--cwd", str(work), "--approve-all")
    assert done.returncode == 0, done.stderr
    assert (work / "PWNED").exists() and (work / ".git" / "hooks" / "pre-commit").exists()
    transcript = _transcript(chat)
    assert "- terminal `sh -c 'touch PWNED; exit 3'" in transcript and ": exit 3" in transcript


def test_a_cards_deny_holds_over_approve_all(chat: Any) -> None:
    work = _work(chat)
    (chat.kiln / ".crucible" / "agents").mkdir(parents=True, exist_ok=True)
    (chat.kiln / ".crucible" / "agents" / "safe.md").write_text(
        "---\ndescription: no shell, no writes\ntools:\n  execute: deny\n  edit: deny\n---\nBe careful.\n")
    done = chat.run(_hostile_turn(work), "go", "--cwd", str(work), "--approve-all", "--card", "safe")
    assert done.returncode == 0, done.stderr
    assert not (work / "PWNED").exists() and not (work / ".git" / "hooks" / "pre-commit").exists()
    assert "card safe: execute = deny" in json.dumps(_results(chat, "run"))


def test_a_saved_rule_holds_over_approve_all(chat: Any) -> None:
    work = _work(chat)
    config = chat.tmp / "config.toml"
    config.write_text('[permissions]\nexecute = "deny"\n')
    chat.env["CRUCIBLE_CONFIG"] = str(config)
    done = chat.run(_hostile_turn(work), "go", "--cwd", str(work), "--approve-all")
    assert done.returncode == 0, done.stderr
    assert not (work / "PWNED").exists()
    assert (work / ".git" / "hooks" / "pre-commit").exists()  # edit was not denied by the rule
    assert "config [permissions]: execute = deny" in json.dumps(_results(chat, "run"))


def test_cru_acp_never_forwards_a_refused_terminal_to_the_editor(cru_bin: str, clean_env: dict[str, str],
                                                                 kiln: Path, tmp_path: Path) -> None:
    (kiln / ".crucible" / "agents").mkdir(parents=True, exist_ok=True)
    (kiln / ".crucible" / "agents" / "safe.md").write_text(
        "---\ndescription: no shell\ntools:\n  execute: deny\n---\n")
    log = tmp_path / "agent.jsonl"
    script = script_file(tmp_path, {"log": str(log), **_hostile_turn(tmp_path)})
    editor = RawAcp([cru_bin, "acp", "--agent-command", scripted_command(script), "--kiln", str(kiln),
                     "--card", "safe"], clean_env, tmp_path, tmp_path / "acp.err")
    try:
        editor.request("initialize", {"protocolVersion": 1, "clientCapabilities": {
            "terminal": True, "fs": {"readTextFile": True, "writeTextFile": True}}})
        sid = editor.request("session/new", {"cwd": str(tmp_path), "mcpServers": []})["result"]["sessionId"]
        editor.send({"jsonrpc": "2.0", "id": 99, "method": "session/prompt",
                     "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]}})
        # The hook write is the editor's to allow: it is asked (kind edit); it says no.
        ask = editor.wait_for(lambda f: f.get("method") == "session/request_permission")
        assert ask["params"]["toolCall"]["kind"] == "edit"
        editor.send({"jsonrpc": "2.0", "id": ask["id"], "result": {"outcome": {"outcome": "cancelled"}}})
        ended = editor.wait_for(lambda f: f.get("id") == 99)
        assert ended["result"]["stopReason"] == "end_turn"
    finally:
        editor.close()
    methods = [f.get("method") for f in editor.frames if isinstance(f, dict)]
    assert "terminal/create" not in methods and "fs/write_text_file" not in methods
    results = [json.loads(line) for line in log.read_text().splitlines()]
    run = [e["result"] for e in results if e.get("as") == "run"]
    assert "card safe: execute = deny" in json.dumps(run)
    assert not (tmp_path / "PWNED").exists()


async def test_an_approval_the_agent_asked_for_covers_one_request_in_its_turn(tmp_path: Path) -> None:
    """Unit: an agent that asks first (ACP permission, kind execute, approved) is not asked
    about again for the terminal/create that follows; a second one asks again."""
    from acp_host.session import PermissionRequest, ToolCall
    from crucible.session_store import SessionMeta, SessionStore
    from crucible.sessions import CrucibleSession, PermissionAsk, SessionOptions

    asked: list[PermissionAsk] = []
    answers = iter(["allow_once", "reject_once"])

    async def asker(ask: PermissionAsk) -> Decision:
        asked.append(ask)
        return Decision(next(answers), "the person")

    opts = SessionOptions(agent=None, kiln=tmp_path, cwd=tmp_path, config=None, asker=asker)  # type: ignore[arg-type]
    writer = SessionStore(tmp_path / "s").create(SessionMeta(id="x", agent="a", created=0, updated=0, cwd="/"))
    session = CrucibleSession(opts, PermissionPolicy(label="a"), writer)
    request = PermissionRequest(1, "s", ToolCall("c1", title="Run ls", kind="execute"), (), False, raw={})
    assert (await session.on_acp_permission(request)).kind == "allow_once"
    assert await session.gate_service("terminal/create", "execute", "ls", {}) is None
    assert len(asked) == 1  # the first terminal/create rode on the approval
    assert await session.gate_service("terminal/create", "execute", "rm -rf x", {}) == "the person"
    assert len(asked) == 2 and asked[1].title == "run rm -rf x"
    writer.close()
    await trio.lowlevel.checkpoint()
