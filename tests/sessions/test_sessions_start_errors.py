"""Start-up errors point the right way (issue 16, defect 7): each known failure of the real
agents, played by the scripted agent under the real agent's profile name, gets its cause and
its fix — in `cru chat -p`, in `cru acp` and in the chat. (tests/e2e runs the real Claude adapter.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pexpect
import pyte
from conftest import SCRIPTED, ChatRunner, RawEditor

ROOT = os.geteuid() == 0

# What the real agents answer (FIELD-NOTES, and runs of the adapters here).
CLAUDE_ROOT = {"new_session": {"error": {"code": -32603, "message": "Internal error",
                                         "data": {"details": "Query closed before response received"}}}}
CLAUDE_NO_KEY = {"prompts": [[{"error": {"code": -32000, "message": "Authentication required"}}]]}
OPENCODE_NO_MODEL = {
    "new_session": {"result": {"configOptions": [
        {"id": "model", "name": "Model", "category": "model", "type": "select",
         "currentValue": "anthropic/claude-sonnet-4-5", "options": []}]}},
    "prompts": [[{"error": {"code": -32603, "message": "Internal error: OpenCode service failure",
                            "data": {"service": "session"}}}]],
}


def _as(chat: ChatRunner, name: str, script: dict[str, Any], env: dict[str, str] | None = None) -> Path:
    """A config whose profile `name` (a real agent's name) runs the scripted agent with `script`."""
    path = chat.tmp / f"{name}.json"
    path.write_text(json.dumps({"log": str(chat.log), **script}))
    config = chat.tmp / "config.toml"
    env_line = "env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in (env or {}).items()) + " }\n"
    config.write_text(f"[agents.{name}]\ncommand = {json.dumps(sys.executable)}\n"
                      f"args = [{json.dumps(str(SCRIPTED))}, {json.dumps(str(path))}]\n"
                      + (env_line if env else ""))
    return config


def _chat_p(chat: ChatRunner, config: Path, name: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([chat.cru, "--config", str(config), "chat", "-a", name, "--kiln", str(chat.kiln),
                           "-p", "hello", *extra], env=chat.env, capture_output=True, text=True, timeout=60,
                          cwd=chat.tmp)


def test_claude_as_root_with_the_wrong_is_sandbox_names_it(chat: ChatRunner) -> None:
    res = _chat_p(chat, _as(chat, "claude", CLAUDE_ROOT, {"IS_SANDBOX": "yes"}), "claude")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    if ROOT:
        assert "Claude Code refuses to start as root with IS_SANDBOX=yes" in res.stderr, res.stderr
        assert "fix: set IS_SANDBOX=1" in res.stderr
    else:
        assert "Claude Code exited while the session started" in res.stderr, res.stderr
    assert "cru doctor" not in res.stderr  # it says what to do, not where to look


def test_a_missing_key_at_the_first_prompt_gets_the_login_fix(chat: ChatRunner) -> None:
    res = _chat_p(chat, _as(chat, "claude", CLAUDE_NO_KEY), "claude")
    assert res.returncode == 1
    assert "cru: the agent claude needs you to log in (Authentication required, code -32000)" in res.stderr
    assert "fix: run `claude /login`" in res.stderr and "ANTHROPIC_API_KEY" in res.stderr


def test_opencode_without_a_usable_model_says_so(chat: ChatRunner) -> None:
    res = _chat_p(chat, _as(chat, "opencode", OPENCODE_NO_MODEL), "opencode")
    assert res.returncode == 1
    assert "the agent opencode has no model it can use" in res.stderr, res.stderr
    assert "opencode auth login" in res.stderr


def test_an_unknown_refusal_shows_the_error_data_and_the_stderr_tail(chat: ChatRunner) -> None:
    script = {"startup": [{"stderr": "fatal: cannot open the cache folder"}],
              "new_session": {"error": {"code": -32603, "message": "Internal error",
                                        "data": {"details": "disk full"}}}}
    res = chat.run(script, "hello")
    assert res.returncode == 1
    assert "could not start a session: Internal error (code -32603)" in res.stderr
    assert "disk full" in res.stderr  # error.data
    assert "its stderr ends: fatal: cannot open the cache folder" in res.stderr


def test_cru_acp_gives_the_editor_the_cause_and_the_fix(chat: ChatRunner) -> None:
    for name, script, expected, fix in (
            ("claude", CLAUDE_NO_KEY, "the agent claude needs you to log in", "ANTHROPIC_API_KEY"),
            ("opencode", OPENCODE_NO_MODEL, "has no model it can use", "opencode auth login")):
        config = _as(chat, name, script)
        editor = RawEditor([chat.cru, "--config", str(config), "acp", "-a", name, "--kiln", str(chat.kiln)],
                           chat.env, chat.tmp)
        try:
            assert "result" in editor.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
            started = editor.request("session/new", {"cwd": str(chat.tmp), "mcpServers": []})
            sid = started["result"]["sessionId"]
            answer = editor.request("session/prompt", {"sessionId": sid,
                                                       "prompt": [{"type": "text", "text": "hello"}]})
        finally:
            editor.close()
        error = answer["error"]
        assert expected in error["message"] and fix in error["message"], error
        assert expected in error["data"]["message"] and fix in error["data"]["fix"], error
    # A refusal at session/new, too.
    config = _as(chat, "claude", CLAUDE_ROOT, {"IS_SANDBOX": "yes"})
    editor = RawEditor([chat.cru, "--config", str(config), "acp", "-a", "claude", "--kiln", str(chat.kiln)],
                       chat.env, chat.tmp)
    try:
        editor.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        error = editor.request("session/new", {"cwd": str(chat.tmp), "mcpServers": []})["error"]
    finally:
        editor.close()
    assert ("IS_SANDBOX=1" if ROOT else "Claude Code exited") in error["message"], error


def test_the_chat_shows_the_cause_and_the_fix_of_a_failed_turn(chat: ChatRunner) -> None:
    config = _as(chat, "claude", CLAUDE_NO_KEY)
    child = pexpect.spawn(chat.cru, ["--config", str(config), "chat", "-a", "claude", "--kiln", str(chat.kiln)],
                          env={**chat.env, "TERM": "xterm-256color"}, cwd=str(chat.tmp), dimensions=(30, 200),
                          timeout=30)
    screen = pyte.Screen(200, 30)
    stream = pyte.ByteStream(screen)

    def shows(text: str) -> bool:
        return text in "".join(screen.display)  # rows of the full width: a wrapped line reads whole

    try:
        _pump_until(child, stream, lambda: "ready" in screen.display[-1])
        child.send("hello\r")
        _pump_until(child, stream, lambda: shows("needs you to log in") and shows("ANTHROPIC_API_KEY"))
        assert shows("Authentication required, code -32000")
        child.send("/exit\r")
        child.expect(pexpect.EOF, timeout=30)
    finally:
        child.close(force=True)


def _pump_until(child: pexpect.spawn, stream: pyte.ByteStream, pred: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("the chat never showed it:\n" + "\n".join(stream.listener.display))
        try:
            stream.feed(child.read_nonblocking(65536, timeout=0.05))
        except pexpect.TIMEOUT:
            pass
