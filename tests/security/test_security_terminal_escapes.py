"""17.6: no agent-, note-, card- or session-derived string reaches the person's terminal with
its control characters live: logs ("skipped a line"), start errors, `-p` output (text and
JSON), the commands that print notes, cards and sessions, and the full-screen chat (every
place an agent's string is drawn, and the scrollback written when it ends)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from conftest import RawAcp, Screen, script_file, scripted_command

# OSC 0 (window title), OSC 52 (clipboard write), clear screen, RLO, and an 8-bit CSI.
HOSTILE = "\x1b]0;pwned\x07 \x1b]52;c;cm0gLXJmIH4=\x07 \x1b[2J \u202e \x9b31m"
LIVE = ("\x1b", "\x07", "\u202e", "\x9b")


def assert_inert(text: str, where: str) -> None:
    live = [repr(c) for c in LIVE if c in text]
    assert not live, f"{where} carries live control characters {live}: {text[-600:]!r}"


def test_chat_p_skipped_line_log_and_text_are_inert(chat: Any) -> None:
    done = chat.run({"startup": [{"garbage": f"not json {HOSTILE}"}],
                     "prompts": [[{"text": f"answer {HOSTILE}"}]]}, "hello")
    assert done.returncode == 0, done.stderr
    assert "skipped a line" in done.stderr and "^[]0;pwned^G" in done.stderr
    assert_inert(done.stderr, "stderr")
    assert "answer ^[]0;pwned^G" in done.stdout
    assert_inert(done.stdout, "stdout")


def test_chat_p_json_output_is_inert_and_keeps_the_text(chat: Any) -> None:
    done = chat.run({"prompts": [[{"text": f"answer {HOSTILE}"}]]}, "hello", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert_inert(done.stdout, "stdout")
    texts = [e.get("text", "") for e in map(json.loads, done.stdout.splitlines()) if e.get("type") == "message_chunk"]
    assert "".join(texts) == f"answer {HOSTILE}"  # the JSON value is unchanged, only escaped


def test_start_error_with_hostile_stderr_is_inert(chat: Any) -> None:
    done = chat.run({"startup": [{"crash": {"code": 3, "stderr": f"boom {HOSTILE}"}}]}, "hello")
    assert done.returncode == 1
    assert "boom ^[]0;pwned^G" in done.stderr and "Traceback" not in done.stderr
    assert_inert(done.stderr, "stderr")


def test_cru_acp_skipped_line_log_is_inert(cru_bin: str, clean_env: dict[str, str], kiln: Path,
                                           tmp_path: Path) -> None:
    script = script_file(tmp_path, {"new_session": {"after": [{"garbage": f"junk {HOSTILE}"}]}})
    editor = RawAcp([cru_bin, "acp", "--agent-command", scripted_command(script), "--kiln", str(kiln)],
                    clean_env, tmp_path, tmp_path / "acp.err")
    try:
        editor.initialize()
        made = editor.request("session/new", {"cwd": str(tmp_path), "mcpServers": []})
        assert "result" in made, made
        ended = editor.request("session/prompt", {"sessionId": made["result"]["sessionId"],
                                                  "prompt": [{"type": "text", "text": "hi"}]})
        assert ended.get("result", {}).get("stopReason") == "end_turn", ended
    finally:
        editor.close()
    err = editor.stderr()
    assert "skipped a line" in err and "junk ^[]0;pwned^G" in err
    assert_inert(err, "cru acp's stderr")


def test_session_list_show_export_are_inert(chat: Any) -> None:
    done = chat.run({"prompts": [[{"text": f"reply {HOSTILE}"}]]}, f"title {HOSTILE}")
    assert done.returncode == 0, done.stderr
    run = {"env": chat.env, "capture_output": True, "text": True, "timeout": 60}
    listed = subprocess.run([chat.cru, "session", "list"], **run)
    assert "title ^[]0;pwned^G" in listed.stdout
    assert_inert(listed.stdout, "session list")
    session_id = listed.stdout.split()[0]
    shown = subprocess.run([chat.cru, "session", "show", session_id], **run)
    assert "reply ^[]0;pwned^G" in shown.stdout
    assert_inert(shown.stdout, "session show")
    exported = subprocess.run([chat.cru, "session", "export", session_id], **run)
    assert_inert(exported.stdout, "session export")
    events = json.loads(exported.stdout)["events"]
    assert any(e.get("text") == f"reply {HOSTILE}" for e in events)  # the JSON value unchanged
    # The files themselves, read with `cat` or `less`: the transcript shows the characters, the
    # events keep the value in JSON escapes.
    folder = next((Path(chat.env["XDG_DATA_HOME"]) / "crucible" / "sessions").iterdir())
    transcript = (folder / "transcript.md").read_text()
    assert "reply ^[]0;pwned^G" in transcript and "title ^[]0;pwned^G" in transcript
    assert_inert(transcript, "transcript.md")
    assert_inert((folder / "events.jsonl").read_text(), "events.jsonl")


def test_a_lone_surrogate_from_the_agent_is_shown_as_a_replacement_and_nothing_is_lost(chat: Any) -> None:
    # Valid JSON that decodes to a string no UTF-8 file or terminal can hold: it once failed the
    # transcript's write and lost the turn.
    lone = ('{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"sess-1","update":'
            '{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"lone \\ud800 one\\n"}}}}')
    done = chat.run({"prompts": [[{"text": "before\n"}, {"raw": lone}, {"text": "after\n"}]]}, "hello")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "before\nlone \ufffd one\nafter\n"
    assert "Traceback" not in done.stderr
    listed = subprocess.run([chat.cru, "session", "list"], env=chat.env, capture_output=True, text=True, timeout=60)
    shown = subprocess.run([chat.cru, "session", "show", listed.stdout.split()[0]], env=chat.env,
                           capture_output=True, text=True, timeout=60)
    assert "before\nlone \ufffd one\nafter" in shown.stdout and "turns=1" in listed.stdout


def test_cards_and_kiln_search_are_inert(cru_bin: str, clean_env: dict[str, str], kiln: Path,
                                         tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / ".crucible" / "agents").mkdir(parents=True)
    (project / ".crucible" / "agents" / "evil.md").write_text(
        f"---\ndescription: {json.dumps('evil ' + HOSTILE)}\n---\nbody {HOSTILE}\n")  # YAML escapes
    (kiln / "Evil.md").write_text(f"# Evil {HOSTILE}\nzanzibar quokka {HOSTILE}\n")
    run = {"env": clean_env, "capture_output": True, "text": True, "timeout": 300, "cwd": project}
    listed = subprocess.run([cru_bin, "cards", "list", "--kiln", str(kiln)], **run)
    assert listed.returncode == 0 and "evil ^[]0;pwned^G" in listed.stdout, listed.stderr
    assert_inert(listed.stdout, "cards list")
    shown = subprocess.run([cru_bin, "cards", "show", "evil", "--kiln", str(kiln)], **run)
    assert shown.returncode == 0 and "body ^[]0;pwned^G" in shown.stdout, shown.stderr
    assert_inert(shown.stdout, "cards show")
    found = subprocess.run([cru_bin, "kiln", "search", "zanzibar quokka", "--mode", "text", "--kiln", str(kiln)],
                           **run)
    assert found.returncode == 0 and "Evil" in found.stdout, found.stderr
    assert_inert(found.stdout + found.stderr, "kiln search")


# What a live sequence of HOSTILE looks like in the bytes a terminal receives (the TUI's own
# drawing uses escapes too, so the check is for these payloads, not for ESC as such).
LIVE_BYTES = {b"\x1b]0;pwned": "OSC 0 (window title)", b"\x1b]52;c;": "OSC 52 (clipboard write)",
              "\u202e".encode(): "RLO", "\x9b".encode(): "8-bit CSI"}


def test_the_full_screen_chat_draws_every_agent_string_inert(cru_bin: str, clean_env: dict[str, str], kiln: Path,
                                                             tmp_path: Path) -> None:
    """Mode and command names, the session title, a thought, a plan, a tool call (title, path,
    output), a permission dialog, a skipped line, the stderr of a crash and the message text,
    all hostile: the pty receives none of it live — while the chat runs and in the scrollback
    it writes on leaving."""
    h = HOSTILE
    script = {
        "new_session": {
            "result": {"modes": {"currentModeId": "m1", "availableModes": [{"id": "m1", "name": f"mode {h}"}]}},
            "after": [{"commands": [{"name": "evil", "description": f"cmd {h}"}]}, {"title": f"title {h}"}]},
        "prompts": [
            [{"thought": f"thinking {h}"},
             {"plan": [{"content": f"step {h}", "priority": "high", "status": "in_progress"}]},
             {"garbage": f"junk {h}"},
             {"tool_call": {"toolCallId": "t1", "title": f"tool {h}", "kind": "read", "status": "completed",
                            "locations": [{"path": f"/tmp/loc {h}"}],
                            "content": [{"type": "content", "content": {"type": "text", "text": f"output {h}"}}]}},
             {"permission": {"toolCall": {"toolCallId": "t2", "title": f"ask {h}", "kind": "edit",
                                          "rawInput": {"path": f"p {h}"}},
                             "options": [{"optionId": "ok", "name": f"Allow {h}", "kind": "allow_once"},
                                         {"optionId": "no", "name": "Reject", "kind": "reject_once"}]},
              "as": "perm"},
             {"text": f"answer {h} end-of-one"}],
            [{"text": "partial"}, {"crash": {"code": 3, "stderr": f"fatal {h}"}}]],
    }
    argv = [cru_bin, "chat", "--agent-command", scripted_command(script_file(tmp_path, script)), "--kiln", str(kiln)]
    screen = Screen(argv, {**clean_env, "TERM": "xterm-256color"}, tmp_path, cols=120, rows=40)
    try:
        screen.wait_for("ready", timeout=60)
        screen.type_line("/help")
        screen.wait_for("cmd ^[]0;pwned^G")
        screen.type_line("/mode")
        screen.wait_for("mode ^[]0;pwned^G")
        screen.type_line("one")
        screen.wait_for("Permission:")
        screen.send("y")  # the allow-once key
        screen.wait_for("end-of-one", timeout=60)
        screen.type_line("two")
        screen.wait_for("fatal ^[]0;pwned^G", timeout=60)
        screen.send("\x04")  # Ctrl-D: leave, writing the conversation to the scrollback
        assert screen.wait_exit() == 0
    finally:
        screen.close()
    raw = bytes(screen.raw)
    live = [what for pattern, what in LIVE_BYTES.items() if pattern in raw]
    assert not live, f"the chat sent live {live} to the terminal"
    # Every string was drawn (inert): the test saw what it checks.
    for shown in ("thinking", "step", "tool", "output", "ask", "answer", "fatal", "mode"):
        assert f"{shown} ^[]0;pwned^G".encode() in raw, f"{shown!r} was never drawn"


def test_a_tool_title_cannot_print_a_line_of_its_own_in_chat_p(chat: Any) -> None:
    forged = "ls\n[permission] rm -rf ~: reject_once (--deny-all)"
    done = chat.run({"prompts": [[{"tool_call": {"toolCallId": "t1", "title": forged, "kind": "execute",
                                                 "status": "completed"}}, {"text": "ok"}]]}, "hello")
    assert done.returncode == 0, done.stderr
    assert "[tool] ls^J[permission] rm -rf ~: reject_once (--deny-all) (execute): completed" in done.stderr
    assert not any(line.startswith("[permission]") for line in done.stderr.splitlines()), done.stderr
