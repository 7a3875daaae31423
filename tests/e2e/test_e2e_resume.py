"""`cru session resume ID` of a real OpenCode session goes on with OpenCode (issue 16, defect 2:
it used to start the default agent, claude), natively, in the same saved conversation."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import RealChat
from fake_llm import Reply

pytestmark = [pytest.mark.real_agent]


def test_resume_of_an_opencode_session_uses_opencode(npm_ready: None, fake_llm, kiln: Path, tmp_path: Path,
                                                      cru_bin: str) -> None:
    chat = RealChat("opencode", fake_llm, kiln, tmp_path, cru_bin)
    fake_llm.push(Reply.text_reply("first answer"))
    first = chat.run("remember the word pineapple", timeout=180)
    assert first.returncode == 0, first.stderr
    listed = subprocess.run([cru_bin, "session", "list", "--json"], env=chat.env, capture_output=True, text=True,
                            check=True)
    [conv] = json.loads(listed.stdout)
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
