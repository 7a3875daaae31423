"""The TUI with a real agent (Claude Code's ACP adapter from npm) against the fake LLM, offline:
a mutating bridge tool asks in the dialog, the key answers it, the note lands in the kiln."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, Screen, group_gone

sys.path.insert(0, str(REPO / "fixtures"))

import agent_env  # noqa: E402
import netns  # noqa: E402
from fake_llm import FakeLLM, Reply  # noqa: E402

pytestmark = [pytest.mark.real_agent]


@pytest.fixture
def fake_llm() -> Iterator[FakeLLM]:
    with FakeLLM() as llm:
        yield llm


@pytest.fixture
def claude_screen(fake_llm: FakeLLM, kiln: Path, tmp_path: Path, cru_bin: str) -> Iterator[Screen]:
    reason = agent_env.ensure_npm()
    if reason is not None:
        pytest.skip(reason)
    work = tmp_path / "work"
    work.mkdir()
    _, env = agent_env.agent_launch("claude", fake_llm.url, tmp_path / "home-claude")
    env["TERM"] = "xterm-256color"
    argv = [cru_bin, "chat", "-a", "claude", "--kiln", str(kiln), "--cwd", str(work)]
    if netns.unavailable_reason() is None:
        argv = netns.wrap(argv, [fake_llm.port])
    screen = Screen(argv, env, work)
    yield screen
    screen.close()


@pytest.mark.parametrize("key", ["y", "n"])
def test_claude_asks_for_create_note_in_the_dialog(claude_screen: Screen, fake_llm: FakeLLM, kiln: Path,
                                                   key: str) -> None:
    screen = claude_screen
    fake_llm.push(Reply.tool_call("create_note", {"path": "inbox/from-agent.md", "content": "# From the agent\n"}),
                  Reply.text_reply("Finished."))
    screen.wait_for(lambda s: "ready" in s.splitlines()[-1], timeout=90)
    screen.type_line("Write a note for me")
    shown = screen.wait_all("Permission:", "create_note inbox/from-agent.md", "reject once", timeout=90)
    # Issue 16: a clean title whatever prefix Claude adds, the new note as a diff, not JSON.
    assert "mcp__crucible__" not in shown and "+# From the agent" in shown and "\\n" not in shown
    keys = [row for row in shown.splitlines() if "allow once" in row]
    assert len(keys) == 1 and "reject once" in keys[0]  # the key row on one row
    screen.send(key)
    note = kiln / "inbox" / "from-agent.md"
    if key == "y":
        screen.wait_for("Finished.", timeout=90)
        assert note.read_text() == "# From the agent\n"
    else:
        screen.wait_for(lambda s: "ready" in s.splitlines()[-1] and "Write a note" in s, timeout=90)
        assert not note.exists()
        refusal = "\n".join(fake_llm.tool_result_texts()).lower()
        assert any(word in refusal for word in ("refus", "denied", "reject", "cancel", "not allow")), refusal[:500]
    screen.wait_for(lambda s: "ready" in s.splitlines()[-1], timeout=30)
    assert "Permission:" not in screen.text()  # asked once: no second dialog from the bridge
    screen.send("\x04")
    assert screen.wait_exit(60) == 0
    assert group_gone(screen.child.pid), "cru chat left the agent running"
