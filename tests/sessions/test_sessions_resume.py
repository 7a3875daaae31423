"""`cru chat --resume ID -p`: the conversation goes on, natively or from Crucible's transcript."""

from __future__ import annotations

import subprocess
from typing import Any

from conftest import ChatRunner


def _only_session_id(chat: ChatRunner) -> str:
    out = subprocess.run([chat.cru, "session", "list"], env=chat.env, capture_output=True, text=True, check=True)
    ids = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    assert len(ids) == 1, out.stdout
    return ids[0]


def _first_run(chat: ChatRunner) -> str:
    res = chat.run({}, "remember the word pineapple")
    assert res.returncode == 0, res.stderr
    assert "echo: remember the word pineapple" in res.stdout
    return _only_session_id(chat)


def test_resume_uses_the_agents_own_session(chat: ChatRunner) -> None:
    old = _first_run(chat)
    res = chat.run({}, "which word?", "--resume", old)
    assert res.returncode == 0, res.stderr
    methods = [e["frame"].get("method") for e in chat.agent_log() if e.get("kind") == "in"]
    assert methods.count("session/resume") == 1 and methods.count("session/new") == 1  # run 1: new; run 2: resume
    # Resumed natively: the agent keeps its own history, so no transcript is pasted in.
    assert "<previous_conversation>" not in res.stdout
    assert "echo: which word?" in res.stdout
    assert "could not reopen" not in res.stdout + res.stderr


def test_resume_the_agent_lost_falls_back_to_the_saved_conversation(chat: ChatRunner) -> None:
    old = _first_run(chat)
    lost: dict[str, Any] = {"resume_session": {"error": {"code": -32002, "message": "Session not found"}}}
    res = chat.run(lost, "which word?", "--resume", old)
    assert res.returncode == 0, res.stderr
    assert "the agent could not reopen its session (Session not found)" in res.stdout + res.stderr
    # The new agent session was handed the conversation so far, then the new question.
    assert "<previous_conversation>" in res.stdout
    assert "User: remember the word pineapple" in res.stdout
    assert "which word?" in res.stdout
    methods = [e["frame"].get("method") for e in chat.agent_log() if e.get("kind") == "in"]
    assert methods.count("session/resume") == 1 and methods.count("session/new") == 2

    # One conversation, one entry: resumed again, the context holds both turns, in order.
    assert _only_session_id(chat) == old
    res = chat.run(lost, "and now?", "--resume", old)
    assert res.returncode == 0, res.stderr
    context = res.stdout.split("</previous_conversation>")[0]
    assert context.index("User: remember the word pineapple") < context.index("User: which word?")
    assert _only_session_id(chat) == old


def test_a_conversation_the_agent_replays_is_saved_once(chat: ChatRunner) -> None:
    """An agent that replays the conversation when it loads it (session/load), part of it after
    its answer as Gemini CLI does: resumed twice, the saved conversation still holds each message
    once (the replay is the agent's copy of what is saved), and no replayed text is printed as
    the new answer."""
    caps = {"initialize": {"result": {"agentCapabilities": {"loadSession": True, "sessionCapabilities": {}}}}}
    first = chat.run(caps, "remember the word pineapple")
    assert first.returncode == 0, first.stderr
    old = _only_session_id(chat)
    replay = {**caps, "history": [{"user_text": "remember the word pineapple"}],
              "history_after_answer": [{"text": "echo: remember the word pineapple"}]}
    for question in ("which word?", "and now?"):
        res = chat.run(replay, question, "--resume", old)
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip().splitlines()[-1] == f"echo: {question}", res.stdout
    methods = [e["frame"].get("method") for e in chat.agent_log() if e.get("kind") == "in"]
    assert methods.count("session/load") == 2
    shown = subprocess.run([chat.cru, "session", "show", old], env=chat.env, capture_output=True, text=True, check=True)
    body = shown.stdout.split("\n", 1)[1]  # after the title
    assert body.count("remember the word pineapple") == 2, shown.stdout  # the question and its echo
    assert body.count("echo: which word?") == 1 and body.count("echo: and now?") == 1


def test_why_the_agent_could_not_reopen_its_session_is_said(chat: ChatRunner) -> None:
    """Gemini CLI refuses a load with "Internal error" and the reason in `error.data.details`:
    the warning gives the reason, not the bare message."""
    old = _first_run(chat)
    lost: dict[str, Any] = {"resume_session": {"error": {
        "code": -32603, "message": "Internal error",
        "data": {"details": "No previous sessions found for this project.\x1b[2J"}}}}
    res = chat.run(lost, "which word?", "--resume", old)
    assert res.returncode == 0, res.stderr
    said = res.stdout + res.stderr
    assert ("the agent could not reopen its session (Internal error: No previous sessions found for this "
            "project.?[2J); started a new one") in said  # the escape made harmless
    assert "\x1b" not in said
