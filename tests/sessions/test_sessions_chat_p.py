"""`cru chat -p` end to end with the scripted agent (a real subprocess over real pipes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from conftest import ChatRunner, group_gone

CLAUDE_OPTIONS = [
    {"optionId": "allow_always", "name": "Always allow", "kind": "allow_always"},
    {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
    {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
]


def permission_turn(kind: str = "execute", title: str = "`rm -rf build`") -> dict:
    return {"prompts": [[
        {"tool_call": {"toolCallId": "t1", "title": title, "kind": kind, "status": "pending",
                       "rawInput": {"command": "rm -rf build"}}},
        {"permission": {"toolCall": {"toolCallId": "t1"}, "options": CLAUDE_OPTIONS}, "as": "perm", "echo": True},
        {"text": "\ndone"},
    ]]}


def test_text_streams_to_stdout_and_exit_zero(chat: ChatRunner) -> None:
    res = chat.run({"prompts": [[{"text": "Hello "}, {"thought": "hmm"}, {"text": "world"}]]}, "hi")
    assert res.returncode == 0, res.stderr
    assert res.stdout == "Hello world\n"
    assert "Traceback" not in res.stderr


def test_json_format_prints_one_object_per_event(chat: ChatRunner) -> None:
    res = chat.run({"prompts": [[{"text": "a"}, {"plan": [{"content": "step", "priority": "high",
                                                          "status": "pending"}]}]]}, "hi", "--format", "json")
    assert res.returncode == 0, res.stderr
    events = [json.loads(line) for line in res.stdout.splitlines()]
    types = [e["type"] for e in events]
    assert "message_chunk" in types and "plan_changed" in types
    assert types[-1] == "turn_ended" and events[-1]["stop_reason"] == "end_turn"


def test_crucibles_own_tools_get_their_clean_title_whatever_the_agent_calls_them(chat: ChatRunner) -> None:
    """As in the chat: `semantic_search "sourdough"`, not `mcp__crucible__semantic_search`."""
    calls = []
    for i, name in enumerate(("mcp__crucible__semantic_search", "crucible_semantic_search")):
        calls += [{"tool_call": {"toolCallId": f"s{i}", "title": name, "kind": "search", "status": "pending",
                                 "rawInput": {"query": "sourdough starter", "limit": 3}}},
                  {"tool_call_update": {"toolCallId": f"s{i}", "status": "completed"}}]
    res = chat.run({"prompts": [[*calls, {"tool_call": {
        "toolCallId": "b1", "title": "ls notes", "kind": "execute", "status": "completed"}}, {"text": "found"}]]},
        "find bread")
    assert res.returncode == 0, res.stderr
    assert res.stderr.count('[tool] semantic_search "sourdough starter" (search): completed') == 2, res.stderr
    assert "mcp__crucible__" not in res.stderr and "crucible_semantic_search" not in res.stderr
    assert "[tool] ls notes (execute): completed" in res.stderr  # another tool: its own title


def test_approve_all_answers_with_the_allow_option(chat: ChatRunner) -> None:
    res = chat.run(permission_turn(), "go", "--approve-all")
    assert res.returncode == 0, res.stderr
    assert 'permission: {"result": {"outcome": {"optionId": "allow", "outcome": "selected"}}}' in res.stdout
    assert "[permission] `rm -rf build`: allow_once (--approve-all)" in res.stderr


def test_deny_all_and_default_deny_reject(chat: ChatRunner) -> None:
    for extra in (("--deny-all",), ()):
        res = chat.run(permission_turn(), "go", *extra)
        assert res.returncode == 0, res.stderr
        assert '"optionId": "reject"' in res.stdout
        assert "reject_once" in res.stderr


def test_card_policy_decides_before_the_flags(chat: ChatRunner, tmp_path: Path) -> None:
    cards = chat.kiln / ".crucible" / "agents"
    cards.mkdir(parents=True)
    (cards / "careful.md").write_text("---\ndescription: no shell\ntools:\n  execute: deny\n---\nBe careful.\n")
    res = chat.run(permission_turn(), "go", "--approve-all", "--card", "careful")
    assert res.returncode == 0, res.stderr
    assert '"optionId": "reject"' in res.stdout
    assert "card careful: execute = deny" in res.stderr
    # The card's body reached the agent first in the first prompt.
    prompt = chat.wait_for_log(lambda e: e.get("kind") == "in" and e["frame"].get("method") == "session/prompt")
    blocks = prompt["frame"]["params"]["prompt"]
    assert "Be careful." in blocks[0]["text"] and blocks[-1]["text"] == "go"


def test_sigint_cancels_the_turn_and_leaves_no_process(chat: ChatRunner) -> None:
    script = {"prompts": [{"steps": [{"text": "working"}, {"stall": None}],
                           "after_cancel": [{"text": " (stopped)"}]}]}
    proc = chat.spawn(script, "long task")
    chat.wait_for_log(lambda e: e.get("kind") == "in" and e["frame"].get("method") == "session/prompt")
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert out.startswith("working (stopped)")
    assert "cancelled" in err
    assert any(e.get("kind") == "turn_end" and e.get("stopReason") == "cancelled" for e in chat.agent_log())
    assert group_gone(proc.pid)


def test_agent_crash_mid_turn_shows_stderr_tail(chat: ChatRunner) -> None:
    res = chat.run({"prompts": [[{"text": "partial"}, {"crash": {"code": 3, "stderr": "boom: out of cheese"}}]]},
                   "hi")
    assert res.returncode == 1
    assert "exit code 3" in res.stderr and "out of cheese" in res.stderr
    assert "Traceback" not in res.stderr


def test_wrong_command_is_one_clear_message(chat: ChatRunner, cru_bin: str, clean_env: dict[str, str]) -> None:
    res = subprocess.run([cru_bin, "chat", "--agent-command", "no-such-agent-xyz --acp", "--kiln", str(chat.kiln),
                          "-p", "hi"], env=clean_env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert "no-such-agent-xyz" in res.stderr and "fix:" in res.stderr
    assert "Traceback" not in res.stderr


def test_agent_printing_non_acp_text_is_a_clear_error(chat: ChatRunner, cru_bin: str,
                                                       clean_env: dict[str, str]) -> None:
    res = subprocess.run([cru_bin, "chat", "--agent-command", f"{sys.executable} -c \"print('hello, I am not ACP')\"",
                          "--kiln", str(chat.kiln), "-p", "hi"], env=clean_env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 1
    assert "initialize" in res.stderr and "fix:" in res.stderr
    assert "Traceback" not in res.stderr


def test_unknown_builtin_missing_agent(chat: ChatRunner, cru_bin: str, clean_env: dict[str, str]) -> None:
    env = {**clean_env, "PATH": "/usr/bin:/bin", "HOME": str(chat.tmp)}
    res = subprocess.run([cru_bin, "chat", "-a", "opencode", "--kiln", str(chat.kiln), "-p", "hi"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert "npm install -g opencode-ai" in res.stderr
    res = subprocess.run([cru_bin, "chat", "-a", "nonesuch", "--kiln", str(chat.kiln), "-p", "hi"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "claude" in res.stderr  # lists the known names


def test_auth_refusal_at_session_new_names_the_fix(chat: ChatRunner, cru_bin: str,
                                                   clean_env: dict[str, str]) -> None:
    """Gemini without a key refuses session/new with -32000: the person gets the fix, not a trace."""
    script_cmd = chat.agent_command({"new_session": {"error": {
        "code": -32000, "message": "Gemini API key is missing or not configured."}}})
    cmd, *args = script_cmd.split()
    config = chat.tmp / "config.toml"
    config.write_text(f"[agents.gemini]\ncommand = {json.dumps(cmd)}\nargs = {json.dumps(args)}\n")
    res = subprocess.run([cru_bin, "--config", str(config), "chat", "-a", "gemini", "--kiln", str(chat.kiln),
                          "-p", "hi"], env=clean_env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert "the agent gemini needs you to log in" in res.stderr
    assert "GEMINI_API_KEY" in res.stderr and "Traceback" not in res.stderr


def test_card_mode_and_model_are_applied_or_warned(chat: ChatRunner) -> None:
    cards = chat.kiln / ".crucible" / "agents"
    cards.mkdir(parents=True)
    (cards / "planner2.md").write_text("---\ndescription: plans\nmode: plan\nmodel: smart\n---\nPlan first.\n")
    (cards / "odd.md").write_text("---\ndescription: odd\nmode: yolo\nmodel: huge\n---\nx\n")
    offers = {"new_session": {"result": {
        "modes": {"currentModeId": "default", "availableModes": [{"id": "default", "name": "Default"},
                                                                 {"id": "plan", "name": "Plan"}]},
        "configOptions": [{"id": "model", "name": "Model", "category": "model", "type": "select",
                           "currentValue": "fast", "options": [{"value": "fast", "name": "Fast"},
                                                               {"value": "smart", "name": "Smart"}]}]}},
        "prompts": [[{"text": "ok"}]]}
    res = chat.run(offers, "go", "--card", "planner2")
    assert res.returncode == 0, res.stderr
    methods = {e["frame"].get("method"): e["frame"].get("params") for e in chat.agent_log() if e.get("kind") == "in"}
    assert methods["session/set_mode"]["modeId"] == "plan"
    assert methods["session/set_config_option"]["value"] == "smart"
    res = chat.run(offers, "go", "--card", "odd")
    assert res.returncode == 0, res.stderr
    assert "asks for mode 'yolo'; the agent offers: default, plan" in res.stderr
    assert "asks for model 'huge'; the agent offers: fast, smart" in res.stderr


def test_a_note_mentioned_in_p_is_sent_with_the_prompt_as_in_the_chat(chat: ChatRunner) -> None:
    # `cru completion` completes `@notes` in -p: the note named goes with the prompt, as in the chat.
    res = chat.run(None, 'compare @"Projects/Lantern/Overview.md" with @nowhere.md, please')
    assert res.returncode == 0, res.stderr
    (blocks,) = [e["frame"]["params"]["prompt"] for e in chat.agent_log()
                 if e.get("kind") == "in" and e["frame"].get("method") == "session/prompt"]
    assert blocks[0] == {"type": "text", "text": 'compare @"Projects/Lantern/Overview.md" with @nowhere.md, please'}
    assert blocks[1:] == [{"type": "resource", "resource": {
        "uri": "kiln://notes/Projects/Lantern/Overview.md", "mimeType": "text/markdown",
        "text": (chat.kiln / "Projects/Lantern/Overview.md").read_text()}}]
    size = len((chat.kiln / "Projects/Lantern/Overview.md").read_text())
    assert f"attached Projects/Lantern/Overview.md ({size} characters)" in res.stderr
    assert "@nowhere.md: no such note in the kiln; sent as plain text" in res.stderr
