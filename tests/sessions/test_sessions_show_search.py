"""Finding and reading past conversations (issue 16, "Beyond the peers"): `cru session show`
draws each tool call once with its arguments and result, `export --format md|json`,
`cru session search` and the chat's `/sessions WORDS` over titles and full text across agents;
`--model` and `--mode` on `cru chat` and `cru acp`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pexpect
import pyte
from conftest import SCRIPTED, ChatRunner, RawEditor


def _cru(chat: ChatRunner, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([chat.cru, *argv], env=chat.env, capture_output=True, text=True, timeout=90, cwd=chat.tmp)
    if check:
        assert res.returncode == 0, res.stderr
    return res


SEARCH_TURN = [
    # OpenCode's title for a bridge tool: shown by its own name, as in the chat
    {"tool_call": {"toolCallId": "c1", "title": "crucible_semantic_search", "kind": "search", "status": "pending"}},
    {"tool_call_update": {"toolCallId": "c1", "rawInput": {"query": "tomato seedlings"}}},
    {"tool_call_update": {"toolCallId": "c1", "status": "completed", "content": [
        {"type": "content", "content": {"type": "text", "text": "Garden/Tomatoes.md — Tomatoes\nGarden/Beds.md"}}]}},
    {"text": "Your notes say to start tomato seedlings indoors in March."},
]


def test_show_draws_each_tool_call_once_with_its_arguments_and_result(chat: ChatRunner) -> None:
    res = chat.run({"prompts": [SEARCH_TURN]}, "when do I start tomatoes?")
    assert res.returncode == 0, res.stderr
    sid = _cru(chat, "session", "list").stdout.split()[0]
    shown = _cru(chat, "session", "show", sid).stdout
    assert shown.count("semantic_search") == 1, shown
    assert "- tool `semantic_search` (search): completed" in shown
    assert '  - arguments: `{"query": "tomato seedlings"}`' in shown
    assert "Garden/Tomatoes.md — Tomatoes" in shown and "Garden/Beds.md" in shown
    assert shown.index("## You") < shown.index("semantic_search") < shown.index("start tomato seedlings indoors")
    assert _cru(chat, "session", "export", sid, "--format", "md").stdout == shown
    exported = json.loads(_cru(chat, "session", "export", sid, "--format", "json").stdout)
    assert exported["session"]["id"] == sid and [m["id"] for m in exported["entries"]] == [sid]
    calls = [e for e in exported["events"] if e["type"] == "tool_call"]
    assert calls[-1]["input"] == '{"query": "tomato seedlings"}' and "Tomatoes" in calls[-1]["output"]


def test_search_finds_conversations_by_title_and_full_text_across_agents(chat: ChatRunner) -> None:
    for script, prompt in (
            ({"prompts": [SEARCH_TURN]}, "when do I start tomatoes?"),
            ({"prompts": [[{"title": "Trip to Lisbon"}, {"text": "Pack light; the trams are steep."}]]},
             "plan my holiday"),
            ({}, "what is the boiling point of water")):
        assert chat.run(script, prompt).returncode == 0
    # Another agent, as a profile: search goes across agents.
    other = chat.tmp / "other.json"
    other.write_text(json.dumps({"default_turn": [{"text": "Sourdough needs a lively starter."}]}))
    config = chat.tmp / "config.toml"
    config.write_text(f"[agents.baker]\ncommand = {json.dumps(sys.executable)}\n"
                      f"args = [{json.dumps(str(SCRIPTED))}, {json.dumps(str(other))}]\n")
    assert _cru(chat, "--config", str(config), "chat", "-a", "baker", "--kiln", str(chat.kiln),
                "-p", "bread tips").returncode == 0

    found = _cru(chat, "session", "search", "tomato seedlings").stdout.splitlines()
    assert found[0].endswith("when do I start tomatoes?"), found
    assert "start tomato seedlings indoors" in found[1]  # the line that matched
    assert _cru(chat, "session", "search", "Lisbon").stdout.splitlines()[0].endswith("Trip to Lisbon")
    assert "steep" in _cru(chat, "session", "search", "trams").stdout  # the agent's words, not the title
    baker = _cru(chat, "session", "search", "starter", "--json").stdout
    [hit] = json.loads(baker)
    assert hit["agent"] == "baker" and "lively starter" in hit["snippet"]
    res = _cru(chat, "session", "search", "quantum chromodynamics", check=False)
    assert res.returncode == 1 and "no saved session mentions 'quantum chromodynamics'" in res.stderr
    res = _cru(chat, "session", "search", "the of and", check=False)
    assert res.returncode == 1 and "nothing to search for" in res.stderr


def test_the_chat_sessions_command_searches(chat: ChatRunner) -> None:
    assert chat.run({"prompts": [SEARCH_TURN]}, "when do I start tomatoes?").returncode == 0
    assert chat.run({}, "something else entirely").returncode == 0
    script = chat.tmp / "chat.json"
    script.write_text(json.dumps({}))
    child = pexpect.spawn(chat.cru, ["chat", "--agent-command", f"{sys.executable} {SCRIPTED} {script}",
                                     "--kiln", str(chat.kiln)],
                          env={**chat.env, "TERM": "xterm-256color"}, cwd=str(chat.tmp), dimensions=(30, 160),
                          timeout=30)
    screen = pyte.Screen(160, 30)
    stream = pyte.ByteStream(screen)
    try:
        _pump_until(child, stream, lambda: "ready" in screen.display[-1])
        child.send("/sessions seedlings\r")  # the picker, searching (tests/tui/test_tui_picker.py drives it)
        _pump_until(child, stream, lambda: "start tomato seedlings indoors" in "\n".join(screen.display))
        text = "\n".join(screen.display)
        assert "search: seedlings" in text and "1 of 2" in text
        assert "when do I start tomatoes?" in text and "something else entirely" not in text
        child.send("\x1b")
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


OFFERS: dict[str, Any] = {"new_session": {"result": {
    "modes": {"currentModeId": "default", "availableModes": [{"id": "default", "name": "Default"},
                                                             {"id": "plan", "name": "Plan"}]},
    "configOptions": [{"id": "model", "name": "Model", "category": "model", "type": "select",
                       "currentValue": "fake/fast", "options": [{"value": "fake/fast", "name": "Fast"},
                                                                {"value": "fake/smart", "name": "Smart"}]}]}}}
# OpenCode's way: the mode is a config option too, with no `modes`.
OPTION_MODES: dict[str, Any] = {"new_session": {"result": {"configOptions": [
    {"id": "mode", "name": "Session Mode", "category": "mode", "type": "select", "currentValue": "build",
     "options": [{"value": "build", "name": "build"}, {"value": "plan", "name": "plan"}]}]}}}


def _sent(chat: ChatRunner, method: str) -> list[dict[str, Any]]:
    return [e["frame"]["params"] for e in chat.agent_log()
            if e.get("kind") == "in" and e["frame"].get("method") == method]


def test_model_and_mode_are_set_after_session_new(chat: ChatRunner) -> None:
    res = chat.run(OFFERS, "go", "--model", "smart", "--mode", "plan")  # a short form of fake/smart
    assert res.returncode == 0, res.stderr
    assert [p["modeId"] for p in _sent(chat, "session/set_mode")] == ["plan"]
    assert [(p["configId"], p["value"]) for p in _sent(chat, "session/set_config_option")] == [("model", "fake/smart")]
    res = chat.run(OPTION_MODES, "go", "--mode", "plan")
    assert res.returncode == 0, res.stderr
    assert ("mode", "plan") in [(p["configId"], p["value"]) for p in _sent(chat, "session/set_config_option")]


def test_a_value_the_agent_lacks_is_an_error_listing_what_it_offers(chat: ChatRunner) -> None:
    res = chat.run(OFFERS, "go", "--model", "huge")
    assert res.returncode == 1
    assert "has no model 'huge': the agent offers: fake/fast, fake/smart" in res.stderr
    assert "fix: pass one of the values it offers with --model" in res.stderr
    assert not _sent(chat, "session/prompt")  # nothing was asked of the wrong model
    res = chat.run(OFFERS, "go", "--mode", "yolo")
    assert res.returncode == 1 and "has no mode 'yolo': the agent offers: default, plan" in res.stderr
    res = chat.run({}, "go", "--model", "smart")
    assert res.returncode == 1 and "the agent offers: no model choice" in res.stderr


def test_cru_acp_takes_model_and_mode(chat: ChatRunner) -> None:
    for extra, expect_error in ((["--model", "fake/smart", "--mode", "plan"], None),
                                (["--model", "huge"], "the agent offers: fake/fast, fake/smart")):
        editor = RawEditor([chat.cru, "acp", "--agent-command", chat.agent_command(OFFERS), "--kiln", str(chat.kiln),
                            *extra], chat.env, chat.tmp)
        try:
            editor.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
            answer = editor.request("session/new", {"cwd": str(chat.tmp), "mcpServers": []})
        finally:
            editor.close()
        if expect_error is None:
            assert "result" in answer, answer
            assert ("model", "fake/smart") in [(p["configId"], p["value"])
                                               for p in _sent(chat, "session/set_config_option")]
            assert [p["modeId"] for p in _sent(chat, "session/set_mode")][-1] == "plan"
        else:
            assert expect_error in answer["error"]["message"], answer
            assert "--model" in answer["error"]["data"]["fix"]


def test_resume_passes_model_through(chat: ChatRunner, tmp_path: Path) -> None:
    assert chat.run(OFFERS, "first").returncode == 0
    sid = _cru(chat, "session", "list").stdout.split()[0]
    res = _cru(chat, "session", "resume", sid, "-p", "again", "--model", "smart")
    assert "echo: again" in res.stdout
    assert ("model", "fake/smart") in [(p["configId"], p["value"]) for p in _sent(chat, "session/set_config_option")]


def test_resume_goes_on_in_the_mode_and_model_chosen_last(chat: ChatRunner) -> None:
    # A conversation resumed started in the agent's defaults again: the plan mode and the model the
    # person had chosen were lost. They are set again (same agent), and one no longer offered is said.
    assert chat.run(OFFERS, "first", "--model", "smart", "--mode", "plan").returncode == 0
    sid = _cru(chat, "session", "list").stdout.split()[0]
    before = len(_sent(chat, "session/set_mode")), len(_sent(chat, "session/set_config_option"))
    res = _cru(chat, "session", "resume", sid, "-p", "again")
    assert "echo: again" in res.stdout and "no longer" not in res.stderr
    assert [p["modeId"] for p in _sent(chat, "session/set_mode")[before[0]:]] == ["plan"]
    assert [(p["configId"], p["value"]) for p in _sent(chat, "session/set_config_option")[before[1]:]] == [
        ("model", "fake/smart")]
    # The agent dropped its plan mode since: said, and the conversation goes on in its default.
    fewer = {"new_session": {"result": {**OFFERS["new_session"]["result"], "modes": {
        "currentModeId": "default", "availableModes": [{"id": "default", "name": "Default"}]}}}}
    chat.agent_command(fewer)  # (re)writes the script the saved agent command reads
    res = _cru(chat, "session", "resume", sid, "-p", "once more")
    assert "echo: once more" in res.stdout
    assert "this conversation was in mode 'plan', which the agent no longer takes" in res.stderr, res.stderr


def test_show_says_which_turns_did_not_end_as_a_whole_answer(chat: ChatRunner) -> None:
    chat.run({"prompts": [[{"text": "Half an ans"}, {"stop": "max_tokens"}]]}, "first")
    sid = _cru(chat, "session", "list").stdout.split()[0]
    shown = _cru(chat, "session", "show", sid).stdout
    assert shown.count("*the turn ended with stopReason max_tokens*") == 1, shown
    assert shown.index("Half an ans") < shown.index("stopReason max_tokens")
    chat.run({"prompts": [[{"text": "All of it."}]]}, "second")
    sid = _cru(chat, "session", "list").stdout.split()[0]
    shown = _cru(chat, "session", "show", sid).stdout
    assert "All of it." in shown and "stopReason" not in shown and "cancelled" not in shown
