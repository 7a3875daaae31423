"""`cru session resume ID` of a real OpenCode session goes on with OpenCode (issue 16, defect 2:
it used to start the default agent, claude), natively, in the same saved conversation."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import RealChat
from fake_llm import Reply

pytestmark = [pytest.mark.real_agent]


def _first_conversation(chat: RealChat, fake_llm) -> dict:
    """One turn ("remember the word pineapple" -> "first answer"): the saved conversation's entry."""
    fake_llm.push(Reply.text_reply("first answer"))
    first = chat.run("remember the word pineapple", timeout=180)
    assert first.returncode == 0, first.stderr
    listed = subprocess.run([chat.cru, "session", "list", "--json"], env=chat.env, capture_output=True, text=True,
                            check=True)
    [conv] = json.loads(listed.stdout)
    return conv


def test_resume_of_an_opencode_session_uses_opencode(npm_ready: None, fake_llm, kiln: Path, tmp_path: Path,
                                                      cru_bin: str) -> None:
    chat = RealChat("opencode", fake_llm, kiln, tmp_path, cru_bin)
    conv = _first_conversation(chat, fake_llm)
    assert conv["agent"] == "opencode"
    fake_llm.push(Reply.text_reply("second answer"))
    # From another folder, without -a: the default agent (claude) must not start.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    argv = [cru_bin, "session", "resume", conv["id"][-6:], "-p", "which word?"]
    res = subprocess.run(argv, env=chat.env, capture_output=True, text=True, timeout=180, cwd=elsewhere)
    assert res.returncode == 0, res.stderr
    assert "second answer" in res.stdout
    assert "could not reopen" not in res.stderr  # opencode reopened its own session
    listed = subprocess.run([cru_bin, "session", "list", "--json"], env=chat.env, capture_output=True, text=True,
                            check=True)
    [again] = json.loads(listed.stdout)
    assert again["id"] == conv["id"] and again["turns"] == 2 and again["agent"] == "opencode"


def _as_if_minutes_ago(home: Path) -> None:
    """Gemini CLI 0.61 names a session's record by the minute it opens it, and session/load
    opens a new one: loaded within the minute it was written, the record is rewritten and the
    conversation lost (its next load finds "No previous sessions"; Crucible then goes on from its
    own saved conversation). A person resumes later: the records are dated back as they would be
    (by minutes: Gemini removes old records)."""
    for path in sorted(home.glob(".gemini/tmp/*/chats/session-*.jsonl")):
        short = path.stem.rsplit("-", 1)[1]
        for back in range(5, 60):  # a name of its own
            when = time.strftime("%Y-%m-%dT%H-%M", time.gmtime(time.time() - 60 * back))
            dated = path.with_name(f"session-{when}-{short}.jsonl")
            if not dated.exists():
                path.rename(dated)
                break


def test_resume_of_a_gemini_session_shows_its_replay_once_and_prints_the_new_answer(
        npm_ready: None, fake_llm, kiln: Path, tmp_path: Path, cru_bin: str) -> None:
    """Gemini CLI reopens a session with session/load, replaying it, and answers before its
    replay is all sent: the printed answer is the new one alone (the replay is history, said on
    stderr); resumed again, the saved conversation still holds each message once."""
    chat = RealChat("gemini", fake_llm, kiln, tmp_path, cru_bin)
    conv = _first_conversation(chat, fake_llm)
    for question, answer in (("which word?", "second answer"), ("and now?", "third answer")):
        _as_if_minutes_ago(Path(chat.env["HOME"]))
        fake_llm.push(Reply.text_reply(answer))
        res = subprocess.run([cru_bin, "session", "resume", conv["id"], "-p", question], env=chat.env,
                             capture_output=True, text=True, timeout=180, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        if question == "which word?":  # reopened by Gemini itself, which replays it
            assert "could not reopen" not in res.stderr and "[history] the agent replayed" in res.stderr, res.stderr
        # Gemini 0.61 does not load a session a second time ("No previous sessions found", however
        # its records are dated): Crucible's saved conversation goes on then, as context.
        assert res.stdout.strip() == answer, res.stdout  # not the replayed conversation before it
    shown = subprocess.run([cru_bin, "session", "show", conv["id"]], env=chat.env, capture_output=True, text=True,
                           check=True).stdout
    for text in ("first answer", "second answer", "third answer", "which word?", "and now?"):
        assert shown.count(text) == 1, (text, shown)
