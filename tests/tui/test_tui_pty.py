"""`cru chat` (the TUI) in a real pseudo-terminal with the scripted agent, reading the screen."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
from conftest import SCRIPTED, Screen, TuiRunner, group_gone
from proc_state import pid_alive  # fixtures/ (on the path from conftest)

REPO = Path(__file__).resolve().parents[2]
CTRL_C, CTRL_D, SHIFT_TAB, ESC_ENTER = "\x03", "\x04", "\x1b[Z", "\x1b\r"


def load_script(name: str) -> dict[str, Any]:
    return dict(json.loads((REPO / "fixtures" / "scripts" / name).read_text()))


def fg_of(screen: Screen, needle: str) -> str:
    """The foreground colour of the first character of `needle` on screen."""
    for y, line in enumerate(screen.screen.display):
        x = line.find(needle)
        if x >= 0:
            return str(screen.screen.buffer[y][x].fg)
    raise AssertionError(f"{needle!r} not on screen:\n{screen.text()}")


def prompts_sent(runner: TuiRunner) -> list[list[dict[str, Any]]]:
    return [e["frame"]["params"]["prompt"] for e in runner.agent_log()
            if e.get("kind") == "in" and e["frame"].get("method") == "session/prompt"]


def leave(screen: Screen) -> None:
    screen.send(CTRL_D)
    assert screen.wait_exit() == 0
    assert group_gone(screen.child.pid), "cru chat left processes behind"


def test_stream_shows_markdown_thought_plan_diff_and_status(tui: TuiRunner) -> None:
    screen = tui.open(load_script("stream.json"))
    screen.wait_for("ready")
    screen.type_line("summarize my kiln")
    shown = screen.wait_all("Done.", "5.3k/200.0k", "[>] Read the notes")
    # Markdown rendered: heading without its hashes, bold without asterisks, bullets.
    assert "Summary" in shown and "# Summary" not in shown
    assert "three themes" in shown and "**" not in shown
    assert "• tools" in shown and "• search" in shown
    # The thought is shown (dimmed), the plan pane, the tool call with its diff in colour.
    assert "I will read the notes first" in shown
    assert "[>] Read the notes" in shown and "[ ] Write the summary" in shown
    assert "Edit summary.md" in shown and "[edit]" in shown and "completed" in shown
    assert "-old" in shown and "+new" in shown
    assert fg_of(screen, "+new") != fg_of(screen, "-old") != "default"
    # Status bar: mode, model, context tokens from the usage update.
    status = shown.splitlines()[-1]
    assert "mode: default" in status and "model: fast" in status and "5.3k/200.0k" in status
    screen.send("\x14")  # Ctrl-T collapses the thoughts
    screen.wait_for("▸ thought")
    leave(screen)


def test_a_new_chat_says_where_it_is_and_how_to_find_the_rest_a_resumed_one_does_not(tui: TuiRunner) -> None:
    screen = tui.open({"prompts": [[{"text": "hello back"}]]}, cols=120)
    shown = screen.wait_for(lambda s: "ready" in s.splitlines()[-1])
    flat = " ".join(shown.split())  # the line wraps on a long kiln path
    assert f"scripted_agent · kiln {tui.kiln} · /help: commands and keys · @: attach a note · Ctrl-D: leave" \
        in flat, shown
    screen.type_line("hi")
    screen.wait_for("hello back")
    leave(screen)
    sid = _saved_session(tui.env)
    screen = tui.open(None, "--resume", sid, cols=120)
    shown = screen.wait_all("end of history", "hello back")
    assert "/help: commands and keys" not in shown  # the history says where it is
    leave(screen)


@pytest.mark.parametrize("cols", [52, 64, 78, 90])
def test_a_new_chats_first_line_breaks_between_its_parts_on_a_narrow_screen(tui: TuiRunner, cols: int) -> None:
    """At 90 columns the line read "... · Ctrl-D:" and "leave" on the next row: each part stays
    on one row, the line breaking between them."""
    screen = tui.open({"prompts": []}, cols=cols)
    shown = screen.wait_for(lambda s: "ready" in s.splitlines()[-1])
    rows = [" ".join(row.split()) for row in shown.splitlines()]  # (its spaces are non-breaking)
    for part in ["/help: commands and keys", "@: attach a note", "Ctrl-D: leave"]:
        assert any(part in row for row in rows), (part, shown)
    leave(screen)


def test_no_color_keeps_the_diff_readable_without_colour(tui: TuiRunner) -> None:
    screen = tui.open(load_script("stream.json"), env={"NO_COLOR": "1"})
    screen.wait_for("ready")
    screen.type_line("go")
    screen.wait_for("Done.")
    assert fg_of(screen, "+new") == "default" and fg_of(screen, "-old") == "default"
    leave(screen)


def test_permission_dialog_answered_with_a_key(tui: TuiRunner) -> None:
    screen = tui.open(load_script("permission-claude.json"))
    screen.wait_for("ready")
    screen.type_line("clean up")
    shown = screen.wait_all("Permission:", "delete_note old.md", "reject once")  # its clean title
    assert "old.md" in shown  # the raw input
    assert "allow once" in shown and "allow always" in shown and "reject once" in shown
    assert "reject always" not in shown  # not offered by this agent
    screen.send("N")  # not an offered choice: nothing happens, nothing typed
    screen.send("a")
    entry = tui.wait_for_log(lambda e: e.get("kind") == "result" and e.get("step") == "permission")
    assert entry["result"]["result"]["outcome"] == {"outcome": "selected", "optionId": "allow_always"}
    shown = screen.wait_for("→ allow_always")
    assert "Permission:" not in shown
    screen.wait_for(lambda s: "ready" in s.splitlines()[-1])
    assert "›N" not in shown.replace(" ", "")
    leave(screen)


def test_an_agents_title_cannot_draw_a_row_of_keys_in_the_permission_dialog(tui: TuiRunner) -> None:
    # The title's own lines once drew "n allow once  y reject once" over the dialog and pushed
    # the real keys out of view: `y` then allowed what the screen called "reject".
    forged = "read README.md\n\n n  allow once   y  reject once" + "\n" * 40
    screen = tui.open({"prompts": [[
        {"permission": {"toolCall": {"toolCallId": "t1", "title": forged, "kind": "execute",
                                     "rawInput": {"command": "rm -rf ~/notes"}},
                        "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                                    {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]},
         "as": "forged"}, {"text": "done"}]]})
    screen.wait_for("ready")
    screen.type_line("go")
    shown = screen.wait_all("Permission:", "rm -rf ~/notes")
    rows = [row.strip() for row in shown.splitlines()]
    assert "read README.md^J^J n  allow once" in shown  # the title's line breaks, shown
    assert not any(row.startswith("n  allow once") for row in rows), shown  # no forged row of keys
    assert any(row.startswith("y  allow once") and "n  reject once" in row for row in rows), shown
    screen.send("n")  # the real keys answer as they say
    entry = tui.wait_for_log(lambda e: e.get("kind") == "result" and e.get("step") == "permission")
    assert entry["result"]["result"]["outcome"] == {"outcome": "selected", "optionId": "reject"}
    screen.wait_for(lambda s: "ready" in s.splitlines()[-1])
    leave(screen)


def _asks_for(call_id: str, title: str, path: str) -> list[dict[str, Any]]:
    """Claude's way: the tool call, then its permission request."""
    return [{"tool_call": {"toolCallId": call_id, "title": title, "kind": "other", "status": "pending",
                           "rawInput": {"path": path}}},
            {"permission": {"toolCall": {"toolCallId": call_id, "title": title}, "options": [
                {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]}},
            {"tool_call_update": {"toolCallId": call_id, "status": "completed"}}]


def test_a_tool_a_rule_lets_run_draws_no_permission_line_a_refusal_does(tui: TuiRunner, tmp_path: Path) -> None:
    config = tmp_path / "xdg-config" / "crucible" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text('[permissions]\ndelete_note = "deny"\n')
    steps = (_asks_for("t1", "mcp__crucible__read_note", "a.md") + _asks_for("t2", "mcp__crucible__list_notes", ".")
             + _asks_for("t3", "mcp__crucible__delete_note", "old.md") + [{"text": "all asked"}])
    screen = tui.open({"prompts": [steps]}, cols=120)
    screen.wait_for("ready")
    screen.type_line("go")
    shown = screen.wait_for("all asked")
    # The reads ran by the default rule (the agent got allow), with no line each; the refusal is said.
    answers = [e["result"]["result"]["outcome"] for e in tui.agent_log()
               if e.get("kind") == "result" and e.get("step") == "permission"]
    assert answers == [{"outcome": "selected", "optionId": "allow"}, {"outcome": "selected", "optionId": "allow"},
                       {"outcome": "selected", "optionId": "reject"}]
    assert "read_note a.md" in shown and "list_notes" in shown
    assert "permission: delete_note old.md → reject_once (config [permissions]: delete_note = deny)" in shown, shown
    assert shown.count("permission:") == 1, shown
    leave(screen)


def test_a_tools_image_link_and_resource_are_named_not_dropped(tui: TuiRunner) -> None:
    # An MCP server's image (Claude passes it on as an ACP image block), a link and an embedded
    # resource in a tool's result: the chat said nothing of them; each is one line saying what it is,
    # in the chat and in `cru session show`.
    png = base64.b64encode(b"\x89PNG" + b"\0" * 64).decode()
    blocks = [{"type": "content", "content": {"type": "text", "text": "Here's the image you requested:"}},
              {"type": "content", "content": {"type": "image", "data": png, "mimeType": "image/png"}},
              {"type": "content", "content": {"type": "resource_link", "name": "guide", "title": "The guide",
                                              "uri": "demo://resource/1"}},
              {"type": "content", "content": {"type": "resource", "resource": {
                  "uri": "demo://resource/2", "mimeType": "text/plain", "text": "resource body line"}}},
              {"type": "content", "content": {"type": "audio", "data": "\x1b[2J", "mimeType": "audio/wav"}}]
    turn = [{"tool_call": {"toolCallId": "c1", "title": "ev_get-tiny-image", "kind": "other", "status": "pending"}},
            {"tool_call_update": {"toolCallId": "c1", "status": "completed", "content": blocks}},
            {"text": "Shown."}]
    screen = tui.open({"prompts": [turn]})
    screen.wait_for("ready")
    screen.type_line("show me")
    shown = screen.wait_all("Shown.", "[image: image/png, 68 bytes]", "[link: The guide demo://resource/1]",
                            "[resource demo://resource/2]", "resource body line", "[audio: audio/wav")
    assert "Here's the image you requested:" in shown
    leave(screen)
    sid = _saved_session(tui.env)
    show = subprocess.run([tui.cru, "session", "show", sid], env=tui.env, capture_output=True, text=True,
                          timeout=60)
    assert "[image: image/png, 68 bytes]" in show.stdout and "[link: The guide demo://resource/1]" in show.stdout
    assert "\x1b" not in show.stdout


def test_always_allow_with_save_writes_a_config_rule_and_permissions_forgets_it(tui: TuiRunner,
                                                                              tmp_path: Path) -> None:
    config = tmp_path / "xdg-config" / "crucible" / "config.toml"
    config.parent.mkdir(parents=True)
    mine = '# mine\ndefault_agent = "claude"\n\n[permissions]\nread_note = "allow"\n'
    config.write_text(mine)
    screen = tui.open(load_script("permission-claude.json"))
    screen.wait_for("ready")
    screen.type_line("clean up")
    screen.wait_for("Permission:")
    screen.send("s")
    screen.wait_for("saved [permissions] delete_note")
    entry = tui.wait_for_log(lambda e: e.get("kind") == "result" and e.get("step") == "permission")
    assert entry["result"]["result"]["outcome"]["optionId"] == "allow_always"
    saved = tomllib.loads(config.read_text())
    assert saved == {"default_agent": "claude", "permissions": {"read_note": "allow", "delete_note": "allow"}}
    # One key saved that rule: /permissions shows where each decision comes from, and `forget`
    # undoes it (in the session and in the file, its comments kept) without leaving the chat.
    screen.type_line("/permissions")
    screen.wait_all("config [permissions]: read_note = allow", "config [permissions]: delete_note = allow",
                    "remembered this session: delete_note = allow", "otherwise: read-only tools run")
    screen.type_line("/permissions forget delete_note")
    screen.wait_all("forgot the remembered answer delete_note = allow and the config rule delete_note",
                    "(removed from config.toml): delete_note follows the other rules now")
    assert config.read_text() == mine
    screen.type_line("/permissions")
    screen.wait_for(lambda s: s.count("otherwise: read-only tools run") == 2)
    assert screen.text().count("remembered this session") == 1  # only in the first listing
    screen.type_line("/permissions forget nothing_here")
    screen.wait_for("no remembered answer or saved rule named nothing_here")
    leave(screen)


def test_an_agent_build_known_to_lag_after_a_cancel_says_so_once_with_the_update(tui: TuiRunner) -> None:
    """The old claude-agent-acp package answers one prompt late after a cancelled turn (upstream
    #551; seen by hand here): the chat says so at the first cancel, with the update, and once."""
    stall = load_script("stall.json")["prompts"][0]
    script = {"prompts": [stall, stall],
              "initialize": {"result": {"agentInfo": {"name": "@zed-industries/claude-agent-acp", "version": "0.23.1"}}}}
    screen = tui.open(script)
    screen.wait_for("ready")
    for turn in (1, 2):
        screen.type_line("take your time")
        screen.wait_for(lambda s: "running" in s.splitlines()[-1])
        screen.send(CTRL_C)
        screen.wait_for(lambda s, n=turn: s.count("the turn was cancelled") == n and s.count("stopped.") == n
                        and "running" not in s.splitlines()[-1])
    text = " ".join(screen.text().split())  # the note wraps at the screen's width
    assert text.count("one prompt late") == 1 and "npm install -g @agentclientprotocol/claude-agent-acp" in text
    leave(screen)


def test_ctrl_c_cancels_the_turn_then_twice_leaves(tui: TuiRunner) -> None:
    script = {"prompts": [load_script("stall.json")["prompts"][0]]}
    screen = tui.open(script)
    screen.wait_for("ready")
    screen.type_line("take your time")
    screen.wait_for("thinking...")
    screen.wait_for(lambda s: "running" in s.splitlines()[-1])
    screen.send(CTRL_C)
    screen.wait_for("the turn was cancelled")
    assert tui.wait_for_log(lambda e: e.get("kind") == "turn_end")["stopReason"] == "cancelled"
    screen.wait_for("stopped.")  # updates after the cancel still show
    assert "one prompt late" not in screen.text()  # said only of a build known for it (above)
    # Still usable: the next prompt is answered (the echo turn).
    screen.type_line("still there?")
    screen.wait_for("echo: still there?")
    screen.send(CTRL_C)
    screen.send(CTRL_C)
    assert screen.wait_exit() == 0
    assert group_gone(screen.child.pid)


def test_ctrl_c_answers_a_pending_permission_cancelled(tui: TuiRunner) -> None:
    screen = tui.open(load_script("permission-claude.json"))
    screen.wait_for("ready")
    screen.type_line("clean up")
    screen.wait_for("Permission:")
    screen.send(CTRL_C)
    entry = tui.wait_for_log(lambda e: e.get("kind") == "result" and e.get("step") == "permission")
    assert entry["result"]["result"]["outcome"] == {"outcome": "cancelled"}
    shown = screen.wait_for("the turn was cancelled")
    assert "Permission:" not in shown
    leave(screen)


def test_agent_crash_shows_stderr_and_restart_brings_it_back(tui: TuiRunner) -> None:
    script = {"prompts": [[{"text": "first answer"}],
                          [{"text": "partial"}, {"crash": {"code": 3, "stderr": "fatal: the model exploded"}}]]}
    screen = tui.open(script)
    screen.wait_for("ready")
    screen.type_line("one")
    screen.wait_for("first answer")
    screen.type_line("two")
    screen.wait_all("fatal: the model exploded", "exit code 3")
    screen.wait_for("/restart")
    screen.wait_for(lambda s: "agent stopped" in s.splitlines()[-1])
    screen.type_line("three")
    screen.wait_for("the agent is not running")
    screen.type_line("/queue drop all")  # kept for after /restart unless dropped (see test_tui_daily)
    screen.wait_for("dropped 1 queued prompt")
    screen.type_line("/restart")
    screen.wait_for(lambda s: "ready" in s.splitlines()[-1])
    screen.type_line("four")
    screen.wait_for(lambda s: "first answer" in s.split("› four")[-1])  # the new agent's first turn
    # The conversation goes on: the new agent process was asked to reopen the old session.
    frames = [e["frame"] for e in tui.agent_log() if e.get("kind") == "in"]
    first_id = next(f for f in frames if f.get("method") == "session/prompt")["params"]["sessionId"]
    reopened = [f for f in frames if f.get("method") == "session/resume"]
    assert len(reopened) == 1 and reopened[0]["params"]["sessionId"] == first_id
    leave(screen)


def test_restart_hands_over_the_conversation_when_the_agent_lost_it(tui: TuiRunner) -> None:
    script = {"resume_session": {"error": {"code": -32002, "message": "Session not found"}},
              "prompts": [[{"text": "noted"}], [{"crash": {"code": 3, "stderr": "fatal: gone"}}]]}
    screen = tui.open(script)
    screen.wait_for("ready")
    screen.type_line("my word is pineapple")
    screen.wait_for("noted")
    screen.type_line("two")
    screen.wait_for("fatal: gone")
    screen.wait_for(lambda s: "agent stopped" in s.splitlines()[-1])
    screen.type_line("/restart")
    screen.wait_for("could not reopen its session")
    screen.wait_for(lambda s: "ready" in s.splitlines()[-1])
    screen.type_line("which word?")
    entry = tui.wait_for_log(lambda e: e.get("kind") == "in" and e["frame"].get("method") == "session/prompt"
                             and "which word?" in json.dumps(e["frame"]))
    sent = " ".join(b.get("text", "") for b in entry["frame"]["params"]["prompt"])
    assert "User: my word is pineapple" in sent and sent.rstrip().endswith("which word?")
    assert "my word is pineapple" in screen.text()  # the old conversation is still on the screen
    leave(screen)


def _saved_session(env: dict[str, str]) -> str:
    from crucible.session_store import SessionStore, sessions_root

    metas = SessionStore(sessions_root(env)).list()
    assert len(metas) == 1, metas
    return metas[0].id


@pytest.mark.parametrize("filler", [0, 3000])
def test_resume_shows_the_agents_replay_as_history(tui: TuiRunner, filler: int) -> None:
    caps = {"loadSession": True, "promptCapabilities": {"embeddedContext": True},
            "mcpCapabilities": {"http": True}, "sessionCapabilities": {}}  # load, not resume
    # A long history (more updates than the session's event buffer) must not stall the load.
    script = {"initialize": {"result": {"agentCapabilities": caps}},
              "history": [{"text": f"old line {i}\n"} for i in range(filler)]
              + [{"user_text": "what is sourdough?"}, {"text": "A slow bread."}]}
    cmd = tui.agent_command(script)
    first = subprocess.run([tui.cru, "chat", "--agent-command", cmd, "--kiln", str(tui.kiln), "-p", "hello"],
                           env=tui.env, capture_output=True, text=True, timeout=60, cwd=tui.tmp)
    assert first.returncode == 0, first.stderr
    sid = _saved_session(tui.env)
    screen = tui.open(script, "--resume", sid)
    screen.wait_all("what is sourdough?", "A slow bread.", "end of history")
    if not filler:
        assert "history (replayed by the agent)" in screen.text()
    assert fg_of(screen, "A slow bread.") != "default"  # dimmed as history
    assert any(e.get("kind") == "in" and e["frame"].get("method") == "session/load" for e in tui.agent_log())
    screen.type_line("and now?")
    shown = screen.wait_for("echo: and now?")
    lines = shown.splitlines()
    end = max(i for i, line in enumerate(lines) if "end of history" in line)
    assert any("echo: and now?" in line for line in lines[end:])  # new output comes after the history
    leave(screen)


def test_the_agents_own_context_in_a_replayed_message_is_one_line(tui: TuiRunner) -> None:
    """Gemini CLI replays the first message with its session context (date, OS, the folder's
    tree) as a part of its own: one line says so; the person's words are shown. It replays a
    tool's result as "[Function Response: NAME]" in a message of the person's, alone or run on
    after their next prompt (seen with Gemini CLI 0.61): left out, the tool call is shown."""
    caps = {"loadSession": True, "promptCapabilities": {"embeddedContext": True},
            "mcpCapabilities": {"http": True}, "sessionCapabilities": {}}
    context = "<session_context>\nThis is the Gemini CLI.\nsecret-folder-tree/\n</session_context>"
    placeholder = "[Function Response: mcp_crucible_semantic_search]"
    call = {"toolCallId": "c1", "title": "semantic_search", "kind": "search", "status": "completed"}
    script = {"initialize": {"result": {"agentCapabilities": caps}},
              "history": [{"user_text": context}, {"user_text": "what is sourdough?"}, {"tool_call": call},
                          {"user_text": placeholder}, {"text": "A slow bread."},
                          {"user_text": "and rye?" + placeholder}, {"text": "A sour one."}]}
    cmd = tui.agent_command(script)
    first = subprocess.run([tui.cru, "chat", "--agent-command", cmd, "--kiln", str(tui.kiln), "-p", "hello"],
                           env=tui.env, capture_output=True, text=True, timeout=60, cwd=tui.tmp)
    assert first.returncode == 0, first.stderr
    screen = tui.open(script, "--resume", _saved_session(tui.env))
    shown = screen.wait_all("(the agent's session context, 4 lines, not shown)", "what is sourdough?",
                            "A slow bread.", "A sour one.", "end of history")
    assert "secret-folder-tree" not in shown and "This is the Gemini CLI" not in shown
    assert "Function Response" not in shown and "semantic_search" in shown
    assert [line.strip() for line in shown.splitlines() if "and rye?" in line] == ["› and rye?"]
    assert sum(line.strip() == "›" for line in shown.splitlines()) == 1  # the prompt's own, no empty message
    leave(screen)


def test_resume_without_replay_shows_the_saved_transcript(tui: TuiRunner) -> None:
    cmd = tui.agent_command(None)
    first = subprocess.run([tui.cru, "chat", "--agent-command", cmd, "--kiln", str(tui.kiln), "-p", "hello"],
                           env=tui.env, capture_output=True, text=True, timeout=60, cwd=tui.tmp)
    assert first.returncode == 0, first.stderr
    sid = _saved_session(tui.env)
    screen = tui.open(None, "--resume", sid)
    screen.wait_all(f"history (saved session {sid})", "echo: hello", "end of history")
    assert any(e.get("kind") == "in" and e["frame"].get("method") == "session/resume" for e in tui.agent_log())
    leave(screen)


def test_slash_commands_modes_models_and_agent_commands(tui: TuiRunner) -> None:
    screen = tui.open(load_script("stream.json"))
    screen.wait_for("ready")
    screen.type_line("/help")
    screen.wait_all("/usage", "The agent's commands:", "/summarize")
    screen.send("/su")
    screen.wait_for(re.compile(r"/summarize\s+Summarize the kiln"))  # the completion menu
    screen.send("\x15")  # Ctrl-U clears the line
    screen.send(SHIFT_TAB)
    screen.wait_for(lambda s: "mode: plan" in s.splitlines()[-1])
    assert tui.wait_for_log(lambda e: e.get("kind") == "in" and e["frame"].get("method") == "session/set_mode")
    screen.type_line("/model")
    screen.wait_for("Models (/model VALUE)")
    screen.type_line("/model smart")
    screen.wait_for(lambda s: "model: smart" in s.splitlines()[-1])
    screen.type_line("/summarize briefly")
    tui.wait_for_log(lambda e: e.get("kind") == "in" and e["frame"].get("method") == "session/prompt")
    assert prompts_sent(tui)[0][0]["text"] == "/summarize briefly"
    screen.wait_for("Done.")
    screen.type_line("/usage")
    screen.wait_for("context: 5321 of 200000 tokens")
    screen.type_line("/nonsense")
    screen.wait_for("unknown command /nonsense")
    screen.type_line("/card")
    screen.wait_for("no agent card in this session")
    screen.type_line("/sessions")
    # The picker (tests/tui/test_tui_picker.py): this conversation, titled by the agent, marked as this chat.
    screen.wait_all("Sessions: type to search", "Kiln summary  (this chat)")
    screen.send("\r")  # Enter on the conversation the chat is in: it stays
    screen.wait_for("that is the conversation you are in")
    leave(screen)
    # The choices are saved with the conversation: a resume sets them again.
    from crucible.session_store import SessionStore, sessions_root

    meta = SessionStore(sessions_root(tui.env)).meta(_saved_session(tui.env))
    assert (meta.mode, meta.model) == ("plan", "smart")


def test_kiln_search_shows_the_notes_without_a_model_turn(tui: TuiRunner) -> None:
    screen = tui.open(None)
    screen.wait_for("ready")
    screen.type_line("/kiln-search")
    screen.wait_for("Usage: /kiln-search WHAT TO LOOK FOR")
    screen.type_line("/kiln-search feeding the sourdough starter")
    screen.wait_all("Notes for 'feeding the sourdough starter':", "(Cooking/Sourdough starter.md)")
    assert str(tui.kiln) not in screen.text()  # kiln-relative paths only
    assert prompts_sent(tui) == []  # answered by Crucible: the agent never saw it
    leave(screen)


def test_note_mention_is_completed_and_embedded(tui: TuiRunner) -> None:
    screen = tui.open(None)
    screen.wait_for("ready")
    screen.send("read @Overv")
    screen.wait_for("Projects/Lantern/Overview.md")  # the completion menu
    screen.send("\t")  # select the first completion, Enter takes it (and does not send)
    screen.send("\r")
    screen.wait_for("@Projects/Lantern/Overview.md")
    screen.send(ESC_ENTER)
    screen.send("and tell me")
    screen.wait_for("and tell me")
    screen.send("\r")
    screen.wait_for("echo: read @Projects/Lantern/Overview.md")
    blocks = prompts_sent(tui)[0]
    resource = [b for b in blocks if b.get("type") == "resource"]
    assert len(resource) == 1
    assert resource[0]["resource"]["uri"] == "kiln://notes/Projects/Lantern/Overview.md"
    assert resource[0]["resource"]["text"] == (tui.kiln / "Projects/Lantern/Overview.md").read_text()
    assert blocks[0]["text"] == "read @Projects/Lantern/Overview.md\nand tell me"  # multi-line input
    leave(screen)


def test_note_completion_puts_the_note_named_so_first_and_finds_letters_in_order(tui: TuiRunner) -> None:
    # `@in` offered `Cooking/Knife sharpening.md` first (every path holding "in", in alphabetical
    # order); a file finder offers the notes whose name starts so, and takes letters in order.
    screen = tui.open(None)
    screen.wait_for("ready")
    screen.send("read @in")
    screen.wait_for("Cooking/Knife sharpening.md")  # the menu is up
    screen.send("\t")
    screen.send("\r")
    screen.wait_for("read @Inbox.md")
    screen.send(" and @rbw")
    screen.wait_for("How-to/Git rebase workflow.md")
    screen.send("\t")
    screen.send("\r")
    screen.wait_for('read @Inbox.md and @"How-to/Git rebase workflow.md"')
    screen.send("\x15")  # Ctrl-U empties the line: Ctrl-D leaves only from an empty one
    leave(screen)


def test_big_message_and_flood_keep_the_screen_responsive(tui: TuiRunner) -> None:
    script = {"prompts": [[{"big_text_mib": 5}, {"text": "\nBIG-END"}],
                          [{"flood": {"count": 10000, "text": "y"}}, {"text": "\nFLOOD-END"}],
                          [{"flood": {"count": 10000, "text": "z" * 500}}, {"text": "\nCHUNKED-END"}]]}
    screen = tui.open(script)
    screen.wait_for("ready")
    screen.type_line("big")
    screen.send("typed while busy")
    screen.wait_for("typed while busy")
    screen.wait_for("BIG-END", timeout=60)
    screen.send("\x15")
    screen.type_line("flood")
    screen.send("more keys")
    screen.wait_for("more keys")
    shown = screen.wait_for("FLOOD-END", timeout=60)
    assert "yyyyyyyy" in shown
    screen.send("\x15")
    screen.type_line("5 MB in 10,000 chunks")
    screen.send("still typing")
    screen.wait_for("still typing")
    screen.wait_for("CHUNKED-END", timeout=60)
    screen.send("\x15")  # Ctrl-U: Ctrl-D leaves only from an empty line
    leave(screen)


def test_resize_and_small_terminal(tui: TuiRunner) -> None:
    screen = tui.open(load_script("stream.json"), cols=80, rows=24)
    screen.wait_for("ready")
    screen.type_line("go")
    screen.wait_for("Done.")
    screen.resize(50, 16)
    shown = screen.wait_for(lambda s: "Done." in s and "ready" in s.splitlines()[-1])
    assert all(len(line) <= 50 for line in shown.splitlines())
    screen.resize(100, 30)
    screen.wait_for(lambda s: "Done." in s and "ready" in s.splitlines()[-1] and "+new" in s)
    leave(screen)


def test_agent_text_cannot_drive_the_terminal(tui: TuiRunner) -> None:
    script = {"prompts": [[{"text": "evil \x1b[2J\x1b]0;pwned\x07 \u202egnp.exe done"}]]}
    screen = tui.open(script)
    screen.wait_for("ready")
    screen.type_line("hi")
    screen.wait_all("done", "^[[2J", "<U+202E>")
    assert b"pwned\x07" not in bytes(screen.raw)
    leave(screen)


def test_no_terminal_is_a_clear_error(tui: TuiRunner) -> None:
    res = subprocess.run([tui.cru, "chat", "--agent-command", f"{sys.executable} {SCRIPTED}", "--kiln",
                          str(tui.kiln)], env=tui.env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert res.returncode != 0
    assert "needs a terminal" in res.stderr and "-p" in res.stderr


def test_dialog_shows_the_diff_and_an_always_answer_is_remembered(tui: TuiRunner) -> None:
    permission = {"permission": {
        "toolCall": {"toolCallId": "e1", "title": "Edit plan.md", "kind": "edit",
                     "content": [{"type": "diff", "path": "plan.md", "oldText": "keep\nold line\n",
                                  "newText": "keep\nnew line\n"}]},
        "options": [{"optionId": "yes", "name": "Allow", "kind": "allow_once"},
                    {"optionId": "no", "name": "Reject", "kind": "reject_once"},
                    {"optionId": "never", "name": "Never", "kind": "reject_always"}]}}
    cost = {"used": 1200, "size": 100000, "cost": {"amount": 0.75, "currency": "USD"}}
    script = {"prompts": [[permission, {"usage": cost}, {"text": "first done"}],
                          [dict(permission, **{"as": "again"}), {"text": "second done"}]]}
    screen = tui.open(script)
    screen.wait_for("ready")
    screen.type_line("edit it")
    shown = screen.wait_all("Permission:", "Edit plan.md", "[edit]", "+new line", "reject always")
    assert "-old line" in shown and "+new line" in shown  # the diff, not the raw input
    assert fg_of(screen, "+new line") != "default"
    assert "reject always" in shown and "allow always" not in shown
    screen.send("N")
    first = tui.wait_for_log(lambda e: e.get("kind") == "result" and e.get("step") == "permission")
    assert first["result"]["result"]["outcome"] == {"outcome": "selected", "optionId": "never"}
    screen.wait_for("first done")
    screen.wait_for(lambda s: "0.7500 USD" in s.splitlines()[-1])
    screen.type_line("/usage")
    screen.wait_for("0.7500 USD last turn, 0.7500 USD this session")
    # The same tool again in this session: no dialog, the remembered answer rejects it.
    screen.type_line("edit it again")
    screen.wait_for("second done")
    again = tui.wait_for_log(lambda e: e.get("kind") == "result" and e.get("as") == "again")
    assert again["result"]["result"]["outcome"]["optionId"] in ("no", "never")
    assert "Permission:" not in screen.text()
    screen.wait_for("remembered answer")
    leave(screen)


def test_shift_enter_and_esc_enter_make_a_multi_line_message(tui: TuiRunner) -> None:
    screen = tui.open(None)
    screen.wait_for("ready")
    screen.send("one")
    screen.send("\x1b[13;2u")  # Shift-Enter as kitty / CSI-u terminals send it
    screen.send("two")
    screen.send("\x1b[27;2;13~")  # Shift-Enter as xterm's modifyOtherKeys sends it
    screen.send("three")
    screen.send(ESC_ENTER)
    screen.send("four")
    screen.wait_for("four")
    screen.send("\r")
    screen.wait_for("echo: one")
    assert prompts_sent(tui)[0][0]["text"] == "one\ntwo\nthree\nfour"
    leave(screen)


def test_a_bridge_side_ask_goes_through_the_same_dialog(tui: TuiRunner, kiln: Path) -> None:
    """An agent that calls a mutating kiln tool without asking over ACP (as OpenCode does):
    the bridge asks the person in the dialog; the answer decides whether the note is written."""
    call = {"mcp_call": {"server": "crucible", "tool": "create_note",
                         "arguments": {"path": "inbox/bridge.md", "content": "# Via the bridge\n"}},
            "as": "create", "echo": True}
    refused = {"mcp_call": {"server": "crucible", "tool": "create_note",
                            "arguments": {"path": "inbox/refused.md", "content": "# No\n"}}, "as": "refused"}
    script = {"new_session": {"list_mcp_tools": True}, "prompts": [[call, refused, {"text": "all done"}]]}
    screen = tui.open(script)
    screen.wait_for("ready")
    assert "never listed the kiln tools" not in screen.text()
    screen.type_line("write it")
    screen.wait_all("Permission:", "create_note", "inbox/bridge.md", "reject once")
    screen.send("y")
    screen.wait_for(lambda s: "Permission:" in s and "inbox/refused.md" in s)
    screen.send("n")
    screen.wait_for("all done")
    assert (kiln / "inbox" / "bridge.md").read_text() == "# Via the bridge\n"
    assert not (kiln / "inbox" / "refused.md").exists()
    # Drawn as a decision on an agent's own ask is (not a "[permission]" line of -p's stderr).
    shown = screen.wait_for("permission: create_note → reject_once")
    assert screen.shows("permission: create_note → allow_once (the person chose allow once; asked by the bridge)",
                        shown)
    assert "[permission]" not in shown
    leave(screen)


def test_a_bridge_side_ask_draws_its_diff_once(tui: TuiRunner, kiln: Path) -> None:
    # OpenCode shows its call of a kiln tool as running, then the bridge asks: the note's diff was
    # drawn twice, in the call and in the dialog. As for an agent's own ask, the dialog has it.
    args = {"path": "inbox/once.md", "content": "# Drawn once\n"}
    turn = [{"tool_call": {"toolCallId": "oc1", "title": "crucible_create_note", "kind": "other",
                           "status": "in_progress", "rawInput": args}},
            {"mcp_call": {"server": "crucible", "tool": "create_note", "arguments": args}, "as": "create"},
            {"tool_call_update": {"toolCallId": "oc1", "status": "completed"}}, {"text": "written"}]
    screen = tui.open({"new_session": {"list_mcp_tools": True}, "prompts": [turn]})
    screen.wait_for("ready")
    screen.type_line("write it")
    shown = screen.wait_all("Permission:", "reject once", "(its diff is in the permission dialog below)")
    assert shown.count("+# Drawn once") == 1, shown
    screen.send("y")
    screen.wait_for("written")
    assert (kiln / "inbox" / "once.md").read_text() == "# Drawn once\n"
    leave(screen)


def test_an_agent_that_cannot_start_leaves_the_chat_usable(tui: TuiRunner) -> None:
    # rows: the whole /help (commands and keys) fits, "Commands:" included
    screen = tui.open({"initialize": {"error": {"code": -32000, "message": "model backend unavailable"}}},
                      cols=200, rows=32)
    screen.wait_all("model backend unavailable", "/restart tries again")
    screen.type_line("/help")
    screen.wait_for("Commands:")
    leave(screen)


def _agents_of(cru_pid: int) -> list[int]:
    """The scripted agents `cru chat` runs now (its children whose command is the agent's)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not pid_alive(int(entry.name)):
            continue
        try:
            stat = (entry / "stat").read_bytes()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(b")") + 2:].split()[1])
        if ppid == cru_pid and SCRIPTED.name.encode() in cmdline:
            out.append(int(entry.name))
    return out


def test_restart_while_the_agent_is_starting_starts_it_again(tui: TuiRunner) -> None:
    """An agent stuck starting (its initialize never answered): /restart stops that start,
    its process with it, and starts the agent again (before: /restart did nothing until the
    start ended, which could be never)."""
    screen = tui.open({"initialize": {"respond": False}})
    screen.wait_for(lambda s: "starting agent" in s.splitlines()[-1])
    tui.wait_for_log(lambda e: e.get("frame", {}).get("method") == "initialize")
    first = _agents_of(screen.child.pid)
    assert len(first) == 1, first
    screen.type_line("/restart")
    screen.wait_for("restarting the agent")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        started = [e for e in tui.agent_log() if e.get("frame", {}).get("method") == "initialize"]
        if len(started) == 2 and not pid_alive(first[0]):
            break
        time.sleep(0.05)
    assert len(started) == 2, "the agent was not started again"
    assert not pid_alive(first[0]), "the stuck start's process was left running"
    second = _agents_of(screen.child.pid)
    assert len(second) == 1 and second != first, second
    assert "starting agent" in screen.text().splitlines()[-1]
    leave(screen)


def test_a_terminal_tool_call_shows_its_output(tui: TuiRunner) -> None:
    script = {"prompts": [[
        {"terminal": {"command": "echo", "args": ["hello-from-terminal"], "then": ["wait_for_exit"]}},
        {"tool_call": {"toolCallId": "t1", "title": "Run echo", "kind": "execute", "status": "completed",
                       "content": [{"type": "terminal", "terminalId": "term-1"}]}},
        {"text": "ran it"}]]}
    screen = tui.open(script)
    screen.wait_for("ready")
    screen.type_line("run")
    # The agent runs the command without asking first: Crucible asks the person (issue 17.3).
    screen.wait_all("Permission:", "run echo hello-from-terminal")
    screen.send("y")
    screen.wait_all("Run echo", "[execute]", "$ terminal term-1", "hello-from-terminal", "ran it")
    leave(screen)
