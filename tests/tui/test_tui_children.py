"""Delegated child sessions in `cru chat`: a nested, collapsible section per child, drawn in a
real pty (pexpect + pyte). The parent and its children are real scripted-agent subprocesses;
the parent calls `delegate_session` on its bridge, as a real agent does."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from conftest import SCRIPTED, Screen, TuiRunner, group_gone

from acp_host.session import MessageChunk, ToolCall, ToolCallEvent, TurnEnded
from crucible.delegation import ChildStatus
from crucible.tui.children import ChildSection, child_status_word
from crucible.tui.feed import Feed
from crucible.tui.transcript import BlockEntry, TranscriptControl

CTRL_D, CTRL_O = "\x04", "\x0f"
HTTP_CAPS = {"agentCapabilities": {"mcpCapabilities": {"http": True, "sse": False}}}
EDIT = {"toolCallId": "c2", "title": "Edit notes.txt", "kind": "edit", "rawInput": {"path": "notes.txt"}}
OPTIONS = [{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
           {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]


def script(*turn: dict[str, Any]) -> dict[str, Any]:
    return {"initialize": {"result": HTTP_CAPS}, "new_session": {"list_mcp_tools": True}, "prompts": [list(turn)]}


def bridge_call(tool: str, as_: str, announce: bool = True, **arguments: Any) -> dict[str, Any]:
    return {"mcp_call": {"server": "crucible", "tool": tool, "arguments": arguments}, "as": as_, "announce": announce}


class Family:
    """Agent profiles `[agents.NAME]` running the scripted agent, cards in the kiln, and the
    chat opened on the `parent` profile."""

    def __init__(self, tui: TuiRunner) -> None:
        self.tui = tui
        self.scripts: dict[str, dict[str, Any]] = {}
        self.delegation: dict[str, Any] = {}
        self.cards_dir = tui.kiln / ".crucible" / "agents"
        self.cards_dir.mkdir(parents=True, exist_ok=True)

    def card(self, name: str, agent: str, **front: Any) -> None:
        extra = "".join(f"{key}: {json.dumps(value)}\n" for key, value in front.items())  # JSON is YAML
        (self.cards_dir / f"{name}.md").write_text(
            f"---\ndescription: {name} for tests\nagent: {agent}\n{extra}---\nYou are {name}.\n", encoding="utf-8")

    def log(self, name: str) -> Path:
        return self.tui.tmp / f"{name}-log.jsonl"

    def open(self, cols: int = 90, rows: int = 40) -> Screen:
        lines = []
        for name, body in self.scripts.items():
            path = self.tui.tmp / f"{name}.json"
            path.write_text(json.dumps({"log": str(self.log(name)), **body}))
            lines += [f"[agents.{name}]", f"command = {json.dumps(sys.executable)}",
                      f"args = [{json.dumps(str(SCRIPTED))}, {json.dumps(str(path))}]", ""]
        lines += ["[permissions]", 'delegate_session = "allow"', 'get_job_result = "allow"']
        if self.delegation:
            lines += ["", "[delegation]"] + [f"{k} = {json.dumps(v)}" for k, v in self.delegation.items()]
        config = self.tui.tmp / "xdg-config" / "crucible" / "config.toml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text("\n".join(lines) + "\n", encoding="utf-8")
        argv = [self.tui.cru, "chat", "-a", "parent", "--kiln", str(self.tui.kiln)]
        screen = Screen(argv, dict(self.tui.env), self.tui.tmp, cols, rows)
        self.tui.screens.append(screen)
        return screen


def rows(screen: Screen) -> list[str]:
    return screen.text().splitlines()


def row_of(lines: list[str], needle: str) -> int:
    for i, line in enumerate(lines):
        if needle in line:
            return i
    raise AssertionError(f"{needle!r} not on screen:\n" + "\n".join(lines))


def nested_row(lines: list[str], text: str) -> int | None:
    """The first row showing `text` inside a child section (the section's bar starts it)."""
    for i, line in enumerate(lines):
        if text in line and re.match(r"^\s+│", line):
            return i
    return None


def nested(lines: list[str], text: str) -> bool:
    return nested_row(lines, text) is not None


def in_section(lines: list[str], text: str) -> int:
    row = nested_row(lines, text)
    assert row is not None, f"{text!r} is not in a child section:\n" + "\n".join(lines)
    return row


def wait_gone(marker: Path, timeout: float = 15) -> bool:
    """No process runs with `marker` in its command line (polls /proc: another process's state)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1]
            except (OSError, IndexError):
                continue
            if str(marker) in cmdline and state != "Z":
                alive.append(pid)
        if not alive:
            return True
        time.sleep(0.05)
    return False


def leave(screen: Screen) -> None:
    screen.send(CTRL_D)
    assert screen.wait_exit() == 0
    assert group_gone(screen.child.pid), "cru chat left processes behind"


# -- in the terminal -------------------------------------------------------------------------


def test_a_child_section_streams_asks_finishes_and_collapses(tui: TuiRunner) -> None:
    fam = Family(tui)
    fam.card("helper", agent="child")
    fam.scripts["parent"] = script(bridge_call("delegate_session", "delegate", target="helper",
                                               prompt="feed the starter"),
                                   {"text": "parent done"})
    fam.scripts["child"] = script(
        {"text": "child: reading the note\n"},
        {"tool_call": {"toolCallId": "c1", "title": "Read starter.md", "kind": "read", "status": "completed"}},
        {"terminal": {"command": "echo", "args": ["hello-from-the-child"], "then": ["wait_for_exit"]}},
        {"tool_call": {"toolCallId": "c3", "title": "Run echo", "kind": "execute", "status": "completed",
                       "content": [{"type": "terminal", "terminalId": "term-1"}]}},
        {"permission": {"toolCall": EDIT, "options": OPTIONS}, "as": "edit"},
        {"text": "twice a day"})
    screen = fam.open()
    screen.wait_for("ready")
    screen.type_line("delegate it")
    # The child runs a command without asking first: Crucible asks the person (issue 17.3).
    screen.wait_all("Permission: parent › helper wants to run", "run echo hello-from-the-child")
    screen.send("y")
    # While the child waits for the person: its section is open under the parent's call, its
    # text and tool call indented in it, and the dialog (labelled with the chain) is visible too.
    # (The first question, still on screen until the next frame, holds all but the edit: wait for it.)
    shown = screen.wait_for(lambda s: all(t in s for t in ("▾ parent › helper — running", "Read starter.md",
                                                            "hello-from-the-child"))
                            and any("Permission: parent › helper wants to run" in row and "Edit notes.txt" in row
                                    for row in s.splitlines()))
    lines = shown.splitlines()
    assert row_of(lines, "delegate_session helper") < row_of(lines, "▾ parent › helper")  # its clean title
    text, tool = in_section(lines, "child: reading the note"), in_section(lines, "✓ Read starter.md")
    assert row_of(lines, "▾ parent › helper") < text < tool < in_section(lines, "hello-from-the-child")
    assert not nested(lines, "delegate_session")
    screen.send("y")
    # Done: collapsed to its header and a summary; the parent goes on.
    shown = screen.wait_all("▸ parent › helper — done", "parent done")
    assert json.loads(fam.log("child").read_text().splitlines()[-2])["result"]["result"]["outcome"] == {
        "outcome": "selected", "optionId": "allow"}
    lines = shown.splitlines()
    # (The parent's tool call shows the reply in its result, not nested.)
    assert not nested(lines, "child: reading the note") and not nested(lines, "twice a day")
    summary = lines[row_of(lines, "▸ parent › helper") + 1]
    assert re.search(r"└ 2 messages, 3 tool calls · done in [\d.]+ s", summary), summary
    # Ctrl-O expands it again, the whole child in order; again collapses it.
    screen.send(CTRL_O)
    # ("twice a day" is also in the parent's tool result: wait for it inside the section.)
    shown = screen.wait_for(lambda s: "▾ parent › helper — done" in s and nested(s.splitlines(), "twice a day"))
    lines = shown.splitlines()
    order = [in_section(lines, t) for t in ("child: reading the note", "Read starter.md", "hello-from-the-child",
                                            "Edit notes.txt",
                                            "permission: Edit notes.txt → allow_once", "twice a day")]
    assert order == sorted(order), shown
    assert row_of(lines, "▾ parent › helper") < min(order) and max(order) < row_of(lines, "parent done")
    assert nested(lines, "twice a day") and nested(lines, "permission: Edit notes.txt → allow_once")
    assert not nested(lines, "parent done")
    screen.send(CTRL_O)
    screen.wait_for(lambda s: "▸ parent › helper — done" in s and not nested(s.splitlines(), "twice a day"))
    # /children opens every section, /children close closes them.
    screen.type_line("/children")
    screen.wait_all("▾ parent › helper — done", "twice a day")
    screen.type_line("/children close")
    screen.wait_for(lambda s: "▸ parent › helper — done" in s and not nested(s.splitlines(), "twice a day"))
    leave(screen)


def test_a_permission_the_bridge_asks_for_a_child_reads_in_its_section_as_the_agents_own(tui: TuiRunner) -> None:
    # The child calls create_note on its bridge without asking over ACP (as OpenCode does):
    # Crucible asks the person itself, and the section shows the answer as it shows an agent's.
    fam = Family(tui)
    fam.card("helper", agent="child")
    fam.scripts["parent"] = script(bridge_call("delegate_session", "delegate", target="helper",
                                               prompt="write it down"),
                                   {"text": "parent done"})
    fam.scripts["child"] = script(bridge_call("create_note", "write", path="Inbox/child.md", content="# From the child"),
                                  {"text": "child wrote it"})
    screen = fam.open()
    screen.wait_for("ready")
    screen.type_line("delegate it")
    screen.wait_all("Permission: parent › helper", "create_note")
    screen.send("y")
    screen.wait_all("▸ parent › helper — done", "parent done")
    screen.send(CTRL_O)
    shown = screen.wait_for(lambda s: nested(s.splitlines(), "child wrote it"))
    lines = shown.splitlines()
    row = in_section(lines, "permission: create_note → allow_once")
    wrapped = " ".join(line.split("│", 1)[-1].strip() for line in lines[row:row + 2])
    assert "(the person chose allow once; asked by the bridge)" in wrapped, shown
    assert "[permission]" not in shown, shown
    assert (tui.kiln / "Inbox" / "child.md").read_text(encoding="utf-8").startswith("# From the child")
    leave(screen)


def test_concurrent_background_children_each_get_their_own_section(tui: TuiRunner) -> None:
    fam = Family(tui)
    fam.card("helper", agent="child")
    fam.scripts["parent"] = script(
        bridge_call("delegate_session", "bg1", target="helper", prompt="one", background=True),
        bridge_call("delegate_session", "bg2", target="other", prompt="two", background=True),
        bridge_call("get_job_result", "r1", announce=False, job_id="job-1", wait=True),
        bridge_call("get_job_result", "r2", announce=False, job_id="job-2", wait=True),
        {"text": "both back"})
    fam.scripts["child"] = script({"text": "alpha from helper\n"}, {"text": "alpha again"})
    fam.scripts["other"] = script({"text": "beta from other"})
    screen = fam.open(cols=100, rows=50)
    screen.wait_for("ready")
    screen.type_line("two at once")
    shown = screen.wait_all("▸ parent › helper — done", "▸ parent › other — done", "both back")
    assert not nested(shown.splitlines(), "alpha from helper") and not nested(shown.splitlines(), "beta from other")
    lines = shown.splitlines()
    assert re.search(r"1 message, 0 tool calls · done", lines[row_of(lines, "▸ parent › helper") + 1])
    assert re.search(r"1 message, 0 tool calls · done", lines[row_of(lines, "▸ parent › other") + 1])
    screen.type_line("/children open")
    shown = screen.wait_all("▾ parent › helper — done", "▾ parent › other — done", "alpha again",
                            "beta from other")
    lines = shown.splitlines()
    helper, other = row_of(lines, "▾ parent › helper"), row_of(lines, "▾ parent › other")
    # Each child's text sits in its own section: after its header, before the next one.
    first, second = sorted([(helper, "helper"), (other, "other")])
    texts = {"helper": ["alpha from helper", "alpha again"], "other": ["beta from other"]}
    for text in texts[first[1]]:
        assert first[0] < in_section(lines, text) < second[0], shown
    for text in texts[second[1]]:
        assert second[0] < in_section(lines, text) < row_of(lines, "both back"), shown
    leave(screen)


def test_a_failed_child_stays_open_with_its_error_and_its_text_is_sanitized(tui: TuiRunner) -> None:
    fam = Family(tui)
    fam.scripts["parent"] = script(bridge_call("delegate_session", "delegate", target="other", prompt="do it"),
                                   {"text": "parent after"})
    fam.scripts["other"] = script({"text": "partial \x1b[2J\x1b]0;pwned\x07 answer\u202e\n"},
                                  {"crash": {"code": 3, "stderr": "fatal: the model exploded"}})
    screen = fam.open()
    screen.wait_for("ready")
    screen.type_line("go")
    shown = screen.wait_all("▾ parent › other — failed", "parent after", "fatal: the model exploded")
    lines = shown.splitlines()
    # Control sequences from the child are shown, not obeyed (the screen was not cleared).
    assert nested(lines, "partial ^[[2J^[]0;pwned^G answer<U+202E>")
    assert nested(lines, "fatal: the model exploded")
    assert "go" in lines[row_of(lines, "› go")]
    leave(screen)


def test_a_grandchild_is_nested_in_its_parents_section(tui: TuiRunner) -> None:
    fam = Family(tui)
    fam.delegation = {"max_depth": 2}
    fam.card("helper", agent="child", delegation={"enabled": True})
    fam.card("leaf", agent="other")
    fam.scripts["parent"] = script(bridge_call("delegate_session", "delegate", target="helper", prompt="ask the leaf"),
                                   {"text": "parent done"})
    fam.scripts["child"] = script({"text": "asking the leaf\n"},
                                  bridge_call("delegate_session", "to-leaf", target="leaf", prompt="say hi"),
                                  {"text": "child done"})
    fam.scripts["other"] = script({"text": "leaf says hi"})
    screen = fam.open(cols=100, rows=60)
    screen.wait_for("ready")
    screen.type_line("go")
    screen.wait_all("▸ parent › helper — done", "parent done")
    screen.type_line("/children open")
    shown = screen.wait_all("▾ parent › helper — done", "▾ parent › helper › leaf — done", "  │   │ leaf says hi")
    lines = shown.splitlines()
    head, inner = row_of(lines, "▾ parent › helper — done"), row_of(lines, "▾ parent › helper › leaf — done")
    assert lines[inner].startswith("  │ ▾ parent › helper › leaf")
    assert head < in_section(lines, "asking the leaf") < inner < row_of(lines, "  │   │ leaf says hi")
    assert row_of(lines, "  │   │ leaf says hi") < in_section(lines, "child done") < row_of(lines, "parent done")
    leave(screen)


def test_cancelling_the_turn_cancels_the_child_and_its_section_says_so(tui: TuiRunner) -> None:
    fam = Family(tui)
    fam.card("helper", agent="child")
    fam.scripts["parent"] = script(bridge_call("delegate_session", "delegate", target="helper", prompt="work"),
                                   {"text": "parent after"})
    fam.scripts["child"] = script({"text": "child working\n"}, {"stall": None})
    screen = fam.open()
    screen.wait_for("ready")
    screen.type_line("go")
    shown = screen.wait_all("▾ parent › helper — running", "child working")
    assert nested(shown.splitlines(), "child working")
    screen.send("\x03")
    shown = screen.wait_all("▾ parent › helper — cancelled", "the turn was cancelled")
    lines = shown.splitlines()
    assert nested(lines, "child working") and nested(lines, "was cancelled")
    assert wait_gone(fam.tui.tmp / "child.json")
    leave(screen)


def test_help_lists_the_children_command_and_key(tui: TuiRunner) -> None:
    screen = tui.open(None)
    screen.wait_for("ready")
    screen.type_line("/help")
    shown = screen.wait_all("/children", "Ctrl-O")
    assert "expand/collapse the newest child section" in shown
    screen.type_line("/children")
    screen.wait_for("no child sessions yet")
    leave(screen)


# -- the section itself (pure rendering) -----------------------------------------------------


def chunk(text: str) -> MessageChunk:
    return MessageChunk(text, {"type": "text", "text": text})


def drawn(control: TranscriptControl, width: int = 50, height: int = 20) -> list[str]:
    content = control.create_content(width, height)
    return ["".join(frag[1] for frag in content.get_line(i)).rstrip() for i in range(content.line_count)]


def test_child_status_words() -> None:
    assert child_status_word("queued") == "queued"
    assert child_status_word("started", "claude") == "running"
    assert child_status_word("notice", "asked by the bridge") == "running"
    assert child_status_word("finished", "completed") == "done"
    assert child_status_word("finished", "failed: the child session failed: boom") == "failed"
    assert child_status_word("finished", "cancelled: the parent turn ended") == "cancelled"
    assert child_status_word("finished", "timed_out: did not finish") == "timed out"


def test_section_is_placed_after_its_anchor_and_nested_rows_are_indented() -> None:
    control = TranscriptControl()
    call = control.add(BlockEntry([[("", "the delegate call")]]))
    control.add(BlockEntry([[("", "later text")]]))
    section = ChildSection("claude › reviewer", "job-1")
    control.insert_after(call, section)
    section.show(ChildStatus("queued"))
    section.show(ChildStatus("started", "claude"))
    section.show(chunk("hello **there**\nsecond"))
    section.show(ToolCallEvent(ToolCall("t1", title="Read a.md", kind="read", status="completed"), True))
    lines = [line for line in drawn(control) if line]
    assert lines == ["the delegate call", "▾ claude › reviewer — running", "  │ hello there", "  │ second",
                     "  │", "  │ ✓ Read a.md  [read] completed", "later text"]


def test_section_collapses_when_done_unless_the_person_chose() -> None:
    control = TranscriptControl()
    done = control.add(ChildSection("a › b", "job-1"))
    assert isinstance(done, ChildSection)
    done.show(chunk("one"))
    done.show(TurnEnded("end_turn"))
    done.show(ChildStatus("finished", "completed"))
    assert done.collapsed and done.feed.messages == 1
    lines = [line for line in drawn(control) if line]
    assert lines[0] == "▸ a › b — done" and re.fullmatch(r"  └ 1 message, 0 tool calls · done in [\d.]+ s", lines[1])
    assert len(lines) == 2
    kept = ChildSection("a › c", "job-2")
    kept.set_collapsed(False)  # the person opened it while it ran
    kept.show(ChildStatus("finished", "completed"))
    assert not kept.collapsed
    failed = ChildSection("a › d", "job-3")
    failed.show(ChildStatus("finished", "failed: the child session a › d failed: boom"))
    assert not failed.collapsed and failed.status == "failed"
    only = TranscriptControl()
    only.add(failed)
    assert [line for line in drawn(only) if line] == ["▾ a › d — failed",
                                                      "  │ the child session a › d failed: boom"]


def test_grandchild_nests_inside_its_parents_section_and_labels_are_sanitized() -> None:
    control = TranscriptControl()
    child = ChildSection("claude › helper\x1b[31m", "job-1")
    control.add(child)
    child.show(chunk("from the child\n"))
    grandchild = ChildSection("claude › helper › leaf", "job-1")
    child.add_child(grandchild)
    grandchild.show(chunk("from the leaf"))
    lines = [line for line in drawn(control, width=60) if line]
    assert lines == ["▾ claude › helper^[[31m — queued", "  │ from the child", "  │",
                     "  │ ▾ claude › helper › leaf — queued", "  │   │ from the leaf"]


def test_a_childs_events_are_drawn_exactly_as_the_sessions_own_only_indented() -> None:
    events: list[Any] = [
        chunk("# Plan\n- read **notes**\n"),
        ToolCallEvent(ToolCall("t1", title="Edit a.md", kind="edit", status="completed",
                               content=({"type": "diff", "path": "a.md", "oldText": "old", "newText": "new"},)), True),
        chunk("done \x1b[31mred"),
    ]
    top = TranscriptControl()
    feed = Feed(top.add)
    for event in events:
        feed.show(event)
    nested_control = TranscriptControl()
    section = ChildSection("a › b", "job-1")
    nested_control.add(section)
    for event in events:
        section.show(event)
    own = drawn(top, width=40, height=30)
    child = drawn(nested_control, width=44, height=30)
    own_rows = own[next(i for i, line in enumerate(own) if line):]
    child_rows = child[next(i for i, line in enumerate(child) if line) + 1:]  # below the header
    assert child_rows == [("  │ " + row).rstrip() for row in own_rows]
    assert "  │ done ^[[31mred" in child_rows
