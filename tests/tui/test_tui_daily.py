"""`cru chat` as a daily driver (issue 16's screen items), in a real pseudo-terminal with the
scripted agent: what stays in the terminal after the chat, wheel scrolling, word wrap, /copy,
kiln tool calls as a person reads them, the permission dialog, Ctrl-C and the prompt queue,
/steer, a turn that shows it is alive, the plan, a mode that bypasses permissions, highlighted
code and tables, images."""

from __future__ import annotations

import base64
import json
import re
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import pyte
from conftest import Screen, TuiRunner, group_gone

CTRL_C, CTRL_D, SHIFT_TAB, ALT_UP, CTRL_E = "\x03", "\x04", "\x1b[Z", "\x1b\x1b[A", "\x05"
STALL = {"steps": [{"text": "thinking..."}, {"stall": None}], "after_cancel": [{"text": "stopped."}]}


def leave(screen: Screen) -> None:
    screen.send("\x15" + CTRL_D)  # Ctrl-U first: Ctrl-D leaves only from an empty line
    assert screen.wait_exit() == 0
    assert group_gone(screen.child.pid), "cru chat left processes behind"


def status_row(shown: str) -> str:
    return shown.splitlines()[-1]


def agent_frames(runner: TuiRunner, method: str) -> list[dict[str, Any]]:
    return [e["frame"] for e in runner.agent_log() if e.get("kind") == "in" and e["frame"].get("method") == method]


def prompt_texts(runner: TuiRunner) -> list[str]:
    return [" ".join(b.get("text", "") for b in f["params"]["prompt"]) for f in agent_frames(runner, "session/prompt")]


def normal_screen(screen: Screen, cols: int = 80, rows: int = 200) -> str:
    """What the chat wrote to the terminal's normal screen after it left the full screen (the
    alternate screen, which pyte does not keep apart): what stays in the terminal's scrollback."""
    raw = bytes(screen.raw)
    cut = raw.rfind(b"\x1b[?1049l")
    assert cut >= 0, "the chat never left the alternate screen"
    after = pyte.Screen(cols, rows)
    pyte.ByteStream(after).feed(raw[cut:])
    return "\n".join(line.rstrip() for line in after.display).strip()


def osc52_copies(screen: Screen) -> list[str]:
    """The texts the chat put on the clipboard through the terminal (OSC 52)."""
    return [base64.b64decode(m).decode("utf-8") for m in re.findall(rb"\x1b\]52;c;([A-Za-z0-9+/=]*)\x07",
                                                                     bytes(screen.raw))]


# -- 4: the conversation outlives the full screen; the session's ID and resume command ----------


def test_on_exit_the_conversation_stays_on_the_normal_screen_with_the_resume_command(tui: TuiRunner) -> None:
    from crucible.session_store import SessionStore, sessions_root

    screen = tui.open(None)
    screen.wait_for("ready")
    screen.type_line("hello there")
    screen.wait_for("echo: hello there")
    leave(screen)
    after = normal_screen(screen)
    metas = SessionStore(sessions_root(tui.env)).list()
    assert len(metas) == 1
    assert "› hello there" in after and "echo: hello there" in after
    assert after.index("› hello there") < after.index("echo: hello there")
    assert metas[0].id in after and f"cru session resume {metas[0].id}" in after


def test_the_mouse_wheel_scrolls_the_transcript(tui: TuiRunner) -> None:
    script = {"prompts": [[{"text": "".join(f"line {i}\n" for i in range(100)) + "the end"}]]}
    screen = tui.open(script)
    screen.wait_for("ready")
    screen.type_line("many lines")
    shown = screen.wait_for("the end")
    assert "line 70" not in shown
    assert b"\x1b[?1000h" in bytes(screen.raw)  # mouse reporting on: the terminal sends the wheel
    for _ in range(10):
        screen.send("\x1b[<64;10;5M")  # SGR mouse report: wheel up over the transcript
    shown = screen.wait_for("line 70")
    assert "the end" not in shown
    assert "scrolled up: PageDown for newer" in status_row(screen.wait_for("scrolled up"))
    for _ in range(10):
        screen.send("\x1b[<65;10;5M")  # wheel down, back to the newest line
    screen.wait_for(lambda s: "the end" in s and "scrolled up" not in status_row(s))
    leave(screen)


# -- 5: words stay whole; a message or a code block can be copied whole --------------------------


def test_text_wraps_at_word_boundaries(tui: TuiRunner) -> None:
    words = ("The transcript wraps between words so that markdown and paths like "
             "notes/projects/lantern-overview.md stay whole when a person selects them on the screen.")
    screen = tui.open({"prompts": [[{"text": words}]]}, cols=40)
    screen.wait_for("ready")
    screen.type_line("wrap")
    screen.wait_for("the screen.")
    rows = [row for row in screen.text().splitlines() if row.strip()]
    start = next(i for i, row in enumerate(rows) if row.startswith("The transcript"))
    end = next(i for i, row in enumerate(rows) if row.endswith("screen."))
    mine = rows[start:end + 1]
    assert " ".join(mine) == words  # every row breaks where a space was
    assert any("markdown" in row.split() for row in mine)
    assert any("notes/projects/lantern-overview.md" in row.split() for row in mine)
    leave(screen)


def test_copy_puts_the_answer_and_its_code_block_on_the_clipboard(tui: TuiRunner) -> None:
    answer = "Here it is:\n\n```python\ndef hello():\n    return 'hi'\n```\n\nThat is all."
    screen = tui.open({"prompts": [[{"text": "first answer"}], [{"text": answer}]]})
    screen.wait_for("ready")
    screen.type_line("one")
    screen.wait_for("first answer")
    screen.type_line("two")
    screen.wait_for("That is all.")
    screen.type_line("/copy")
    screen.wait_for("copied the last answer")
    screen.type_line("/copy code")
    screen.wait_for("copied the code block")
    screen.type_line("/copy 2")
    screen.wait_for("copied answer 2 from the end")
    assert osc52_copies(screen) == [answer, "def hello():\n    return 'hi'", "first answer"]
    screen.type_line("/copy 5")
    screen.wait_for("there are 2 answers to copy")
    leave(screen)


# -- 6: kiln tool calls as a person reads them -----------------------------------------------------


def search_call(prefix: str) -> list[dict[str, Any]]:
    results = {"results": [{"path": f"notes/bread-{i}.md", "title": f"Bread {i}", "score": 1 - i / 10,
                            "heading": None, "snippet": "flour and water " * 5} for i in range(8)]}
    call_id = f"{prefix}s1"
    return [{"tool_call": {"toolCallId": call_id, "title": f"{prefix}semantic_search", "kind": "other",
                           "status": "pending", "rawInput": {"query": "sourdough starter", "limit": 8}}},
            {"tool_call_update": {"toolCallId": call_id, "status": "completed", "content": [
                {"type": "content", "content": {"type": "text", "text": json.dumps(results)}}]}}]


def test_a_search_shows_its_query_and_top_hits_whatever_the_agents_prefix(tui: TuiRunner) -> None:
    script = {"prompts": [[*search_call("mcp__crucible__"), {"text": "found them"}],
                          [*search_call("crucible_"), {"text": "second search done"}]]}
    screen = tui.open(script, cols=100, rows=30)
    screen.wait_for("ready")
    screen.type_line("find bread")
    shown = screen.wait_for("found them")
    assert 'semantic_search "sourdough starter"' in shown
    assert "mcp__crucible__" not in shown and "[other]" not in shown
    assert "notes/bread-0.md — Bread 0" in shown and "notes/bread-4.md — Bread 4" in shown
    assert "notes/bread-5.md" not in shown and "… 3 more" in shown
    assert '"results"' not in shown and "flour and water" not in shown  # not its JSON
    screen.type_line("again")
    shown = screen.wait_for("second search done")
    assert "crucible_semantic_search" not in shown and shown.count('semantic_search "sourdough starter"') == 2
    leave(screen)


def test_a_tools_long_output_line_wraps_under_itself_not_under_the_title(tui: TuiRunner) -> None:
    """The search's line on the index, longer than the screen, went on at the screen's left
    edge, under the tool's title; its rows now all start under its first."""
    notice = ("Index: 34% of the kiln's 10000 notes are embedded so far; the others were matched by "
              "their words only (the index builds in the background).")
    calls = search_call("mcp__crucible__")
    calls[1]["tool_call_update"]["content"][0]["content"]["text"] = json.dumps(
        {"results": [{"path": "notes/bread.md", "title": "Bread", "score": 1.0, "heading": None,
                      "snippet": "flour"}], "notice": notice})
    screen = tui.open({"prompts": [[*calls, {"text": "found it"}]]}, cols=60, rows=30)
    screen.wait_for("ready")
    screen.type_line("find bread")
    rows = screen.wait_for("found it").splitlines()
    start = next(i for i, row in enumerate(rows) if row.startswith("  Index: 34%"))
    end = next(i for i, row in enumerate(rows) if row.endswith("background)."))
    assert end - start >= 2, rows  # wrapped: three rows at least
    assert all(row.startswith("  ") and row[2] != " " for row in rows[start:end + 1]), rows[start:end + 1]
    assert " ".join(row.strip() for row in rows[start:end + 1]) == notice
    leave(screen)


def test_a_note_write_shows_as_a_diff_against_the_note(tui: TuiRunner, kiln: Path) -> None:
    note = kiln / "inbox" / "plan.md"
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text("# Plan\n\nkeep this line\nold step\n")
    update = {"tool_call": {"toolCallId": "u1", "title": "mcp__crucible__update_note", "kind": "other",
                            "status": "pending",
                            "rawInput": {"path": "inbox/plan.md", "body": "# Plan\n\nkeep this line\nnew step\n"}}}
    script = {"prompts": [[update, {"text": "updating"}, {"stall": None}]]}
    screen = tui.open(script)
    screen.wait_for("ready")
    screen.type_line("change the plan")
    shown = screen.wait_all("update_note inbox/plan.md", "-old step")  # once the note is read: a diff
    assert "+new step" in shown and "   keep this line" in shown
    assert "\\n" not in shown and '"body"' not in shown
    screen.send(CTRL_C)
    screen.wait_for("the turn was cancelled")
    leave(screen)


def test_the_focused_tool_call_expands_past_the_cut(tui: TuiRunner) -> None:
    output = "\n".join(f"output line {i}" for i in range(1, 61))
    call = {"tool_call": {"toolCallId": "t1", "title": "Run a long command", "kind": "execute", "status": "completed",
                          "content": [{"type": "content", "content": {"type": "text", "text": output}}]}}
    screen = tui.open({"prompts": [[call, {"text": "ran it"}]]})
    screen.wait_for("ready")
    screen.type_line("run")
    shown = screen.wait_all("… 20 more lines", "ran it")
    assert "output line 41" not in shown
    screen.send(ALT_UP)  # focus the tool call: marked, scrolled to its top
    shown = screen.wait_for("▶ ✓ Run a long command")
    screen.send(CTRL_E)
    screen.wait_for(lambda s: "more lines" not in s and "output line 1" in s)
    screen.send("\x1b[6~\x1b[6~\x1b[6~")  # PageDown to the end of the call
    shown = screen.wait_all("output line 60", "ran it")
    assert "more lines" not in shown
    leave(screen)


# -- 8: the permission dialog ----------------------------------------------------------------------

ALL_KINDS = [{"optionId": "once", "name": "Allow", "kind": "allow_once"},
             {"optionId": "always", "name": "Always", "kind": "allow_always"},
             {"optionId": "no", "name": "Reject", "kind": "reject_once"},
             {"optionId": "never", "name": "Never", "kind": "reject_always"}]


def test_the_dialog_shows_update_note_as_a_diff_and_its_keys_on_one_row(tui: TuiRunner, kiln: Path) -> None:
    note = kiln / "inbox" / "todo.md"
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text("---\ntags: [home]\n---\n# Todo\n\n- milk\n- eggs\n")
    call = {"toolCallId": "u1", "title": "mcp__crucible__update_note", "kind": "other", "status": "pending",
            "rawInput": {"path": "inbox/todo.md", "body": "# Todo\n\n- milk\n- bread\n"}}
    script = {"prompts": [[{"tool_call": call}, {"permission": {"toolCall": call, "options": ALL_KINDS}},
                           {"text": "asked"}]]}
    screen = tui.open(script, cols=120, rows=30)
    screen.wait_for("ready")
    screen.type_line("edit my todo")
    shown = screen.wait_all("Permission:", "update_note inbox/todo.md", "+- bread")
    dialog = shown[shown.index("Permission:"):]
    assert "-- eggs" in dialog and "  - milk" in dialog
    assert "\\n" not in dialog and '"body"' not in dialog
    keys = [row for row in dialog.splitlines() if "allow once" in row]
    assert len(keys) == 1 and "reject always" in keys[0] and "save: always reject" in keys[0]
    # The diff is shown once: the dialog has it; the call in the transcript says where it is.
    assert shown.count("+- bread") == 1 and "its diff is in the permission dialog" in shown
    # Keys that are not answers do nothing: nothing reaches the input box.
    screen.send("q")
    screen.send("\r")
    screen.send("z")
    screen.send("y")
    shown = screen.wait_for("asked")
    assert "Permission:" not in shown
    assert shown.splitlines()[-2].strip() == "›"  # the input box: empty, one line
    entry = tui.wait_for_log(lambda e: e.get("kind") == "result" and e.get("step") == "permission")
    assert entry["result"]["result"]["outcome"] == {"outcome": "selected", "optionId": "once"}
    leave(screen)


def test_claudes_write_shows_its_diff_once_with_clean_paths(tui: TuiRunner) -> None:
    path = str(tui.tmp / "src" / "hello.py")  # Claude's Write: an absolute path, oldText null
    call = {"toolCallId": "w1", "title": "Write src/hello.py", "kind": "edit", "status": "pending",
            "locations": [{"path": path}],
            "content": [{"type": "diff", "path": path, "oldText": None, "newText": "print('hello')\n"}]}
    options = [{"optionId": "allow_always", "name": "Always Allow", "kind": "allow_always"},
               {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
               {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]
    script = {"prompts": [[{"tool_call": call}, {"permission": {"toolCall": {**call, "rawInput": {
        "file_path": path, "content": "print('hello')\n"}}, "options": options}}, {"text": "written"}]]}
    screen = tui.open(script, cols=100, rows=30)
    screen.wait_for("ready")
    screen.type_line("write it")
    shown = screen.wait_all("Permission:", "+print('hello')")
    assert shown.count("+print('hello')") == 1
    assert "--- a/src/hello.py" in shown and "+++ b/src/hello.py" in shown
    assert "a//" not in shown and "b//" not in shown
    screen.send("y")
    shown = screen.wait_for("written")
    assert shown.count("+print('hello')") == 1  # answered: the call in the transcript shows it
    leave(screen)


# -- 9: Ctrl-C and the queue; /restart keeps what was typed ---------------------------------------


def test_ctrl_c_holds_the_queued_prompt_and_asks_whether_to_drop_it(tui: TuiRunner) -> None:
    screen = tui.open({"prompts": [STALL, STALL]})
    screen.wait_for("ready")
    screen.type_line("take your time")
    screen.wait_for("thinking...")
    screen.type_line("and then this")
    screen.wait_all("queued (1)", "1. and then this")
    screen.send(CTRL_C)
    screen.wait_all("the turn was cancelled", "1 prompt is queued", "drop them")
    assert tui.wait_for_log(lambda e: e.get("kind") == "turn_end")["stopReason"] == "cancelled"
    assert prompt_texts(tui) == ["take your time"]  # held: not sent while the person decides
    screen.send("\r")  # not an answer: nothing happens
    screen.send("d")
    screen.wait_for("dropped 1 queued prompt")
    assert "queued (" not in screen.text()
    # A Ctrl-C now (the turn has ended) does not leave: it says how to.
    screen.send(CTRL_C)
    screen.wait_for("Ctrl-C again or Ctrl-D to leave")
    screen.type_line("a new question")
    tui.wait_for_log(lambda e: e.get("kind") == "in" and "a new question" in json.dumps(e["frame"]))
    assert prompt_texts(tui) == ["take your time", "a new question"]
    screen.type_line("keep me")
    screen.wait_for("queued (1)")
    screen.send(CTRL_C)
    screen.wait_for("1 prompt is queued")
    screen.send("k")  # keep: sent after the cancelled turn
    screen.wait_for("echo: keep me")
    assert prompt_texts(tui)[-1] == "keep me"
    leave(screen)


def test_the_ctrl_c_hint_goes_when_the_turn_ends(tui: TuiRunner) -> None:
    # The agent holds the cancelled turn open until the test has seen the hint: on a loaded
    # machine a turn that ends at once can take the hint away before the screen is read.
    gate = tui.tmp / "hint-seen"
    turn = {**STALL, "after_cancel": [{"wait_file": str(gate)}, *STALL["after_cancel"]]}
    screen = tui.open({"prompts": [turn]})
    screen.wait_for("ready")
    screen.type_line("take your time")
    screen.wait_for("thinking...")
    screen.send(CTRL_C)
    screen.wait_for(lambda s: "Ctrl-C again to leave" in status_row(s))
    gate.touch()
    shown = screen.wait_for(lambda s: "ready" in status_row(s) and "the turn was cancelled" in s)
    assert "Ctrl-C again" not in status_row(shown)
    # And what it said no longer holds: one Ctrl-C now does not leave.
    screen.send(CTRL_C)
    screen.wait_for("Ctrl-C again or Ctrl-D to leave")
    screen.type_line("still here?")
    screen.wait_for("echo: still here?")
    leave(screen)


def test_a_prompt_typed_while_the_agent_is_down_is_sent_after_restart(tui: TuiRunner) -> None:
    # Each agent process answers its first prompt "fine" and crashes on its second.
    script = {"prompts": [[{"text": "fine"}], [{"crash": {"code": 3, "stderr": "fatal: gone"}}]]}
    screen = tui.open(script)
    screen.wait_for("ready")
    screen.type_line("one")
    screen.wait_for("fine")
    screen.type_line("two")
    screen.wait_for(lambda s: "agent stopped" in status_row(s))
    screen.type_line("remember this")
    screen.wait_all("the agent is not running", "queued (1)", "1. remember this")
    screen.type_line("/restart")
    shown = screen.wait_for(lambda s: "fine" in s.split("› remember this")[-1] and "› remember this" in s)
    assert "queued (" not in shown
    assert prompt_texts(tui) == ["one", "two", "remember this"]
    leave(screen)


# -- 10: a turn shows it is alive; the plan stays with its turn --------------------------------------


def test_a_running_turn_shows_a_spinner_and_the_time(tui: TuiRunner) -> None:
    screen = tui.open({"prompts": [STALL]})
    screen.wait_for("ready")
    screen.type_line("slow search")
    screen.wait_for("thinking...")
    seen: set[str] = set()
    pattern = re.compile(r"([⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏]) running (\d+\.\d) s")

    def ticking(shown: str) -> bool:
        m = pattern.search(status_row(shown))
        if m:
            seen.add(m.group(0))
        return len(seen) >= 3

    screen.wait_for(ticking, timeout=10)  # the time moves while nothing else happens
    screen.send(CTRL_C)
    shown = screen.wait_for(lambda s: "ready" in status_row(s))
    assert pattern.search(status_row(shown)) is None
    leave(screen)


def test_the_plan_is_not_pinned_into_the_next_turn(tui: TuiRunner) -> None:
    plan = {"plan": [{"content": "Read the notes", "priority": "high", "status": "completed"},
                     {"content": "Write the summary", "priority": "medium", "status": "in_progress"}]}
    screen = tui.open({"prompts": [[plan, {"text": "first turn done"}], [{"text": "second turn done"}]]})
    screen.wait_for("ready")
    screen.type_line("plan it")
    screen.wait_all("first turn done", "[>] Write the summary")
    screen.type_line("next")
    shown = screen.wait_for("second turn done")
    below = shown.split("› next")[-1]
    assert "Write the summary" not in below  # not pinned under the new turn
    assert "[>] Write the summary" in shown.split("› next")[0]  # kept in the transcript, as it ended
    leave(screen)


# -- beyond: the queue, /steer, a bypass mode, code and tables, images ------------------------------


def test_the_queue_is_visible_and_editable(tui: TuiRunner) -> None:
    screen = tui.open({"prompts": [STALL]})
    screen.wait_for("ready")
    screen.type_line("work on it")
    screen.wait_for("thinking...")
    screen.type_line("first follow-up")
    screen.type_line("second follow-up")
    screen.type_line("third follow-up")
    screen.wait_all("queued (3)", "1. first follow-up", "2. second follow-up", "3. third follow-up")
    screen.send("\x1b[A")  # ↑ on an empty input: the last queued prompt back into the input
    screen.wait_for(lambda s: "queued (2)" in s and "› third follow-up" in s)
    screen.send(" (edited)")
    screen.send("\r")
    screen.wait_for("3. third follow-up (edited)")
    screen.type_line("/queue drop 1")
    screen.wait_for("dropped: first follow-up")
    screen.type_line("/queue")
    screen.wait_all("Queued prompts (2)", "1. second follow-up", "2. third follow-up (edited)")
    screen.type_line("/cancel")
    screen.wait_for("echo: second follow-up")
    screen.wait_for("echo: third follow-up (edited)")
    assert prompt_texts(tui) == ["work on it", "second follow-up", "third follow-up (edited)"]
    leave(screen)


def test_steer_cancels_the_turn_and_sends_its_text_as_one_step(tui: TuiRunner) -> None:
    screen = tui.open({"prompts": [STALL]})
    screen.wait_for("ready")
    screen.type_line("write a long essay")
    screen.wait_for("thinking...")
    screen.type_line("/steer make it a haiku instead")
    screen.wait_for("echo: make it a haiku instead")
    frames = [e["frame"] for e in tui.agent_log() if e.get("kind") == "in"]
    methods = [f.get("method") for f in frames if f.get("method") in ("session/prompt", "session/cancel")]
    assert methods == ["session/prompt", "session/cancel", "session/prompt"]
    blocks = agent_frames(tui, "session/prompt")[-1]["params"]["prompt"]
    assert blocks[0]["text"] == "make it a haiku instead"
    assert any("interrupts your previous turn" in b.get("text", "") for b in blocks[1:])
    assert tui.wait_for_log(lambda e: e.get("kind") == "turn_end")["stopReason"] == "cancelled"
    leave(screen)


# A question where each of y, a and n answers (and `a draft`, `say yes` hold them all).
DELETE_EVERYTHING = {"permission": {"toolCall": {"toolCallId": "c1", "title": "Delete everything", "kind": "delete"},
                                    "options": [{"optionId": "always", "name": "Always", "kind": "allow_always"},
                                                {"optionId": "yes", "name": "Yes", "kind": "allow_once"},
                                                {"optionId": "no", "name": "No", "kind": "reject_once"}]}}


def test_a_question_that_opens_while_the_person_types_does_not_take_their_letters_as_answers(
        tui: TuiRunner) -> None:
    ask = DELETE_EVERYTHING
    gate = tui.tmp / "open-the-question"
    screen = tui.open({"prompts": [[{"text": "working on it\n"}, {"wait_file": str(gate)}, ask,
                                    {"text": "done"}]]})
    screen.wait_for("ready")
    screen.type_line("go")
    screen.wait_for("working on it")
    screen.send("next I will ")  # a follow-up, typed while the turn runs
    screen.wait_for("next I will")
    gate.touch()  # the question opens as the person goes on typing
    screen.wait_for("Permission:")
    for letter in "say yes and add more":  # each of s, y, a, n is an answer key
        screen.send(letter)
        time.sleep(0.05)
    screen.wait_for("you were typing when this was asked")
    assert not [e for e in tui.agent_log() if e.get("kind") == "result" and e.get("step") == "permission"]
    assert "Permission:" in screen.text()
    # What they typed went on into the input box, whole.
    screen.wait_for(lambda s: "next I will say yes and add more" in s)
    time.sleep(1.0)  # a pause: now a key answers
    screen.send("n")
    entry = tui.wait_for_log(lambda e: e.get("kind") == "result" and e.get("step") == "permission")
    assert entry["result"]["result"]["outcome"] == {"outcome": "selected", "optionId": "no"}
    screen.wait_for("done")
    leave(screen)


def test_a_sentence_typed_over_an_open_question_does_not_answer_it_with_its_first_letter(
        tui: TuiRunner) -> None:
    # The dialog was up a while, unnoticed; the person typed a follow-up: "a draft…" answered
    # "allow always" with its first letter (seen by hand with OpenCode). A choice's key acts only
    # when no other key follows it at once; typed on, the keys go into the input box.
    ask = DELETE_EVERYTHING
    screen = tui.open({"prompts": [[ask, {"text": "done"}]]})
    screen.wait_for("ready")
    screen.type_line("go")
    screen.wait_for("Permission:")
    time.sleep(1.5)  # up a while: not a question that opened while they typed
    screen.send("a draft of it")
    screen.wait_for(lambda s: "a draft of it" in s)
    screen.wait_for("you were typing when this was asked")
    time.sleep(0.5)
    assert not [e for e in tui.agent_log() if e.get("kind") == "result" and e.get("step") == "permission"]
    assert "Permission:" in screen.text()
    time.sleep(1.0)  # a pause: now a key answers, on its own
    screen.send("n")
    entry = tui.wait_for_log(lambda e: e.get("kind") == "result" and e.get("step") == "permission")
    assert entry["result"]["result"]["outcome"] == {"outcome": "selected", "optionId": "no"}
    screen.wait_for("done")
    assert "a draft of it" in screen.text().splitlines()[-2]  # their sentence waits in the input box
    screen.send("\x15")
    leave(screen)


def test_shift_tab_asks_before_a_mode_that_bypasses_permissions(tui: TuiRunner) -> None:
    modes = {"currentModeId": "default", "availableModes": [
        {"id": "default", "name": "Default"}, {"id": "acceptEdits", "name": "Accept Edits"},
        {"id": "bypassPermissions", "name": "Bypass Permissions"}]}
    screen = tui.open({"new_session": {"result": {"modes": modes}}})
    screen.wait_for("ready")
    screen.send(SHIFT_TAB)
    screen.wait_for(lambda s: "mode: acceptEdits" in status_row(s))
    screen.send(SHIFT_TAB)
    screen.wait_all("Bypass Permissions lets the agent run tools without asking", "switch to bypassPermissions")
    screen.send("n")
    screen.wait_for("mode unchanged")
    assert [f["params"]["modeId"] for f in agent_frames(tui, "session/set_mode")] == ["acceptEdits"]
    screen.send(SHIFT_TAB)
    screen.wait_for("without asking")
    screen.send("y")
    screen.wait_for(lambda s: "mode: bypassPermissions" in status_row(s))
    assert [f["params"]["modeId"] for f in agent_frames(tui, "session/set_mode")] == ["acceptEdits",
                                                                                      "bypassPermissions"]
    leave(screen)


# OpenCode 1.x offers its modes only as a config option of category "mode", no `modes`.
MODE_OPTION: dict[str, Any] = {"new_session": {"result": {"configOptions": [
    {"id": "model", "name": "Model", "category": "model", "type": "select", "currentValue": "fake/fast",
     "options": [{"value": "fake/fast", "name": "Fast"}]},
    {"id": "mode", "name": "Session Mode", "category": "mode", "type": "select", "currentValue": "build",
     "options": [{"value": "build", "name": "build", "description": "The default agent."},
                 {"value": "plan", "name": "plan", "description": "Plan mode. Disallows all edit tools."}]}]}}}


def test_modes_offered_as_a_config_option_are_shown_listed_and_cycled(tui: TuiRunner) -> None:
    screen = tui.open(MODE_OPTION)
    screen.wait_for(lambda s: "ready" in status_row(s) and "mode: build" in status_row(s))
    screen.send(SHIFT_TAB)
    screen.wait_for(lambda s: "mode: plan" in status_row(s))
    sets = agent_frames(tui, "session/set_config_option")
    assert [(f["params"]["configId"], f["params"]["value"]) for f in sets] == [("mode", "plan")]
    assert agent_frames(tui, "session/set_mode") == []
    screen.type_line("/mode")
    screen.wait_all("Modes (/mode ID, Shift-Tab cycles):", "* plan", "Disallows all edit tools")
    screen.type_line("/mode build")
    screen.wait_for(lambda s: "mode: build" in status_row(s))
    leave(screen)
    # --mode picks from the same offer
    screen = tui.open(MODE_OPTION, "--mode", "plan")
    screen.wait_for(lambda s: "ready" in status_row(s) and "mode: plan" in status_row(s))
    leave(screen)


# Gemini CLI 0.61 offers its models in the older `models` state and serves session/set_model.
LEGACY_MODELS: dict[str, Any] = {"new_session": {"result": {
    "modes": {"currentModeId": "default", "availableModes": [{"id": "default", "name": "Default"}]},
    "models": {"currentModelId": "auto", "availableModels": [
        {"modelId": "auto", "name": "Auto", "description": "Let Gemini CLI decide"},
        {"modelId": "gemini-2.5-pro", "name": "gemini-2.5-pro"},
        {"modelId": "gemini-3.8-flash", "name": "gemini-3.8-flash"}]}}}}


def test_models_offered_in_the_older_models_state_are_shown_listed_and_switched(tui: TuiRunner) -> None:
    screen = tui.open(LEGACY_MODELS)
    screen.wait_for(lambda s: "ready" in status_row(s) and "model: auto" in status_row(s))
    screen.type_line("/model")
    screen.wait_all("Models (/model VALUE):", "* auto  Auto", "gemini-3.8-flash")
    screen.type_line("/model gemini-2.5-pro")
    screen.wait_for(lambda s: "model: gemini-2.5-pro" in status_row(s))
    assert [f["params"]["modelId"] for f in agent_frames(tui, "session/set_model")] == ["gemini-2.5-pro"]
    assert agent_frames(tui, "session/set_config_option") == []
    leave(screen)
    screen = tui.open(LEGACY_MODELS, "--model", "gemini-3.8-flash")
    screen.wait_for(lambda s: "ready" in status_row(s) and "model: gemini-3.8-flash" in status_row(s))
    leave(screen)
    screen = tui.open(LEGACY_MODELS, "--model", "huge")
    screen.wait_all("huge", "the agent offers: auto, gemini-2.5-pro, gemini-3.8-flash")
    leave(screen)


OFFERS: dict[str, Any] = {"new_session": {"result": {
    "modes": {"currentModeId": "default", "availableModes": [{"id": "default", "name": "Default"},
                                                             {"id": "plan", "name": "Plan"}]},
    "configOptions": [{"id": "model", "name": "Model", "category": "model", "type": "select",
                       "currentValue": "fake/fast", "options": [{"value": "fake/fast", "name": "Fast"},
                                                                {"value": "fake/smart", "name": "Smart"}]}]}}}


def test_model_and_mode_flags_are_set_in_the_chat_or_refused_with_the_offers(tui: TuiRunner) -> None:
    screen = tui.open(OFFERS, "--model", "smart", "--mode", "plan")  # a short form of fake/smart
    screen.wait_for(lambda s: "ready" in status_row(s) and "mode: plan" in status_row(s)
                    and "fake/smart" in status_row(s))
    assert [f["params"]["modeId"] for f in agent_frames(tui, "session/set_mode")] == ["plan"]
    assert [f["params"]["value"] for f in agent_frames(tui, "session/set_config_option")] == ["fake/smart"]
    leave(screen)
    screen = tui.open(OFFERS, "--model", "huge")
    screen.wait_all("huge", "the agent offers: fake/fast, fake/smart")
    leave(screen)


def fg_at(screen: Screen, needle: str, offset: int = 0) -> str:
    for y, line in enumerate(screen.screen.display):
        x = line.find(needle)
        if x >= 0:
            return str(screen.screen.buffer[y][x + offset].fg)
    raise AssertionError(f"{needle!r} not on screen:\n{screen.text()}")


def test_code_is_highlighted_and_tables_are_drawn(tui: TuiRunner) -> None:
    answer = ("```python\ndef greet(name):\n    return name\n```\n\n"
              "| note | words |\n|------|------:|\n| a.md | 12 |\n| longer-name.md | 3 |\n\ndone")
    screen = tui.open({"prompts": [[{"text": answer}]]})
    screen.wait_for("ready")
    screen.type_line("show me")
    shown = screen.wait_for("done")
    assert fg_at(screen, "def greet") != fg_at(screen, "def greet", 4)  # keyword vs name
    assert "| note |" not in shown and "|------|" not in shown
    assert re.search(r"│ note\s+│ words │", shown) and re.search(r"│ a\.md\s+│\s+12 │", shown)
    assert "┌" in shown and "└" in shown
    leave(screen)


def png_bytes() -> bytes:
    """A 1×1 PNG."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + chunk(b"IEND", b""))


def test_an_image_is_sent_when_the_agent_takes_images(tui: TuiRunner) -> None:
    image = png_bytes()
    (tui.tmp / "shot.png").write_bytes(image)
    pasted = tui.tmp / "my shots" / "drop.png"
    pasted.parent.mkdir()
    pasted.write_bytes(image)
    caps = {"loadSession": True, "promptCapabilities": {"image": True, "embeddedContext": True},
            "mcpCapabilities": {"http": True}, "sessionCapabilities": {"resume": {}}}
    screen = tui.open({"initialize": {"result": {"agentCapabilities": caps}}})
    screen.wait_for("ready")
    screen.type_line(f"what is in @shot.png and '{pasted}'")
    screen.wait_all("attached image shot.png", "echo: what is in")
    blocks = agent_frames(tui, "session/prompt")[0]["params"]["prompt"]
    images = [b for b in blocks if b.get("type") == "image"]
    assert [(b["mimeType"], base64.b64decode(b["data"])) for b in images] == [("image/png", image)] * 2
    leave(screen)


def test_an_image_for_an_agent_without_images_gets_a_clear_note(tui: TuiRunner) -> None:
    (tui.tmp / "shot.png").write_bytes(png_bytes())
    screen = tui.open(None)  # the scripted agent's default: promptCapabilities.image false
    screen.wait_for("ready")
    screen.type_line("what is in @shot.png")
    screen.wait_all("image shot.png not sent: this agent does not take images", "echo: what is in @shot.png")
    blocks = agent_frames(tui, "session/prompt")[0]["params"]["prompt"]
    assert [b["type"] for b in blocks] == ["text"]
    leave(screen)
