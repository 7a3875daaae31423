"""Unit tests of the parts behind issue 16's screen items: word wrap, tables and code, copying
an entry's text, kiln tool calls (titles, hits, note diffs), the dialog's key row, the prompt
queue, the status bar's spinner."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import trio
import trio.testing
from prompt_toolkit.utils import get_cwidth

from acp_host.session import ToolCall
from crucible.delegation import Delegation
from crucible.kiln_calls import (
    DELEGATION_TOOL_NAMES,
    KILN_TOOL_NAMES,
    BridgeCall,
    bridge_call,
    proposed_write,
    search_result,
)
from crucible.tui.markdown import MarkdownState, render_line, table_rows, wrap, wrap_indented
from crucible.tui.permissions import KEYS, ROW_LABELS, SHORT_LABELS, key_rows
from crucible.tui.prompts import PromptQueue, Queued
from crucible.tui.status import StatusBar
from crucible.tui.tool_calls import diff_lines, tool_call_lines
from crucible.tui.transcript import TextEntry
from mcp_bridge.tools import KILN_TOOLS


def texts(rows: list[list[tuple[str, str]]]) -> list[str]:
    return ["".join(t for _, t in row) for row in rows]


def plain(lines: list[list[tuple[str, str]]]) -> str:
    return "\n".join("".join(t for _, t in line) for line in lines)


# -- wrapping, tables, code --------------------------------------------------------------------


def test_wrap_breaks_at_spaces_and_cuts_only_words_longer_than_a_row() -> None:
    assert texts(wrap([("", "the transcript wraps mid-word markdown at eighty")], 20)) == [
        "the transcript wraps", "mid-word markdown at", "eighty"]
    # A word longer than a row is cut; the words after it still break at spaces.
    assert texts(wrap([("", "aaaaaaaaaaaaaaaaaaaaaaaaa bb cc")], 10)) == ["aaaaaaaaaa", "aaaaaaaaaa", "aaaaa bb", "cc"]
    # Styles survive the breaks.
    rows = wrap([("a", "one two "), ("b", "three four")], 9)
    assert rows == [[("a", "one two")], [("b", "three")], [("b", "four")]]
    # Wide characters: cells, not characters, and a break at a space when there is one.
    assert texts(wrap([("", "日本語 のノート ok")], 8)) == ["日本語", "のノート", "ok"]


def test_an_indented_line_wraps_under_its_first_row() -> None:
    rows = wrap_indented([("dim", "  "), ("path", "notes/a.md"), ("dim", " — a title that goes on and on")], 20)
    assert texts(rows) == ["  notes/a.md — a", "  title that goes on", "  and on"]
    assert rows[1][0] == ("dim", "  ")  # the indent in the line's first style
    assert texts(wrap_indented([("", "    code that is long")], 20)) == ["    code that is", "    long"]
    # Fits, or not indented, or an indent of half the row or more: as `wrap` does.
    assert wrap_indented([("", "  short")], 20) == wrap([("", "  short")], 20)
    assert wrap_indented([("", "no indent at all here")], 10) == wrap([("", "no indent at all here")], 10)
    assert wrap_indented([("", " " * 10 + "deep text here")], 20) == wrap([("", " " * 10 + "deep text here")], 20)


def test_a_table_streams_as_rows_then_is_drawn_when_it_ends() -> None:
    entry = TextEntry("agent")
    entry.append("| note | words |\n|:-----|------:|\n| a.md | 12 |\n")
    shown = plain([line for line in entry.lines if not isinstance(line, str)])
    assert "| a.md | 12 |" in shown  # still coming: as it came
    entry.append("| b.md | 3 |\nafter the table\n")
    drawn = texts(list(entry.rows_reversed(200)))[::-1]
    assert drawn == ["┌──────┬───────┐", "│ note │ words │", "├──────┼───────┤", "│ a.md │    12 │",
                     "│ b.md │     3 │", "└──────┴───────┘", "after the table"]
    assert table_rows(["| just | pipes |", "| no | rule |"]) is None


def test_a_table_wider_than_the_screen_wraps_its_widest_cells_inside_their_column() -> None:
    entry = TextEntry("agent")
    entry.append("| name | 値 | note |\n|---|---|:-:|\n| alpha | 一二三 | a very long cell that goes on and on |\n"
                 "| β | 🎉 | short |\nafter\n")
    rows = texts(list(entry.rows_reversed(30)))[::-1]
    assert rows == ["┌───────┬────────┬───────────┐",
                    "│ name  │ 値     │   note    │",
                    "├───────┼────────┼───────────┤",
                    "│ alpha │ 一二三 │  a very   │",
                    "│       │        │ long cell │",
                    "│       │        │ that goes │",
                    "│       │        │ on and on │",
                    "│ β     │ 🎉     │   short   │",
                    "└───────┴────────┴───────────┘",
                    "after"]
    assert {sum(get_cwidth(ch) for ch in row) for row in rows[:-1]} == {30}
    # Wide enough: as it came; too narrow for columns of 4 cells: drawn whole, the screen wraps it.
    assert texts(list(entry.rows_reversed(200)))[::-1][3] == "│ alpha │ 一二三 │ a very long cell that goes on and on │"
    assert texts(list(entry.rows_reversed(12)))[-1].startswith("┌──")  # its first row, cut by the screen


def test_fenced_code_is_highlighted_by_its_language() -> None:
    state = MarkdownState()
    render_line("```python", state)
    styles = {text: style for style, text in render_line("def greet(name):", state)}
    assert "pygments.keyword" in styles["def"] and "pygments.name.function" in styles["greet"]
    render_line("```", state)
    render_line("```nosuchlanguage", state)
    assert render_line("def x", state) == [(" class:md.code", "def x")]


def test_an_entry_gives_its_text_and_code_blocks_as_they_came() -> None:
    entry = TextEntry("agent")
    answer = "Intro **bold**\n```sh\nls -la\n```\nthen\n~~~\nsecond\nblock\n~~~\nstill stream"
    for piece in (answer[:7], answer[7:30], answer[30:]):
        entry.append(piece)
    assert entry.text() == answer
    assert entry.code_blocks() == ["ls -la", "second\nblock"]


# -- kiln tool calls -----------------------------------------------------------------------------


def call(title: str, call_id: str = "c1", **fields: Any) -> ToolCall:
    return ToolCall(call_id, title=title, kind="other", **fields)


def test_bridge_tools_get_a_clean_title_whatever_the_agent_calls_them() -> None:
    args = {"path": "notes/x.md", "content": "hi"}
    for title, call_id in (("mcp__crucible__create_note", "toolu_1"),  # Claude
                           ("crucible_create_note", "call_1"),  # OpenCode
                           ("create_note (crucible MCP Server)", "mcp_crucible_create_note__1")):  # Gemini
        found = bridge_call(call(title, call_id, raw_input=args))
        assert found is not None and found.title == "create_note notes/x.md"
        head = texts(wrap(tool_call_lines(call(title, call_id, raw_input=args))[0], 200))[0]
        assert head.startswith("• create_note notes/x.md  [kiln]"), head
    assert bridge_call(call("Read file.md")) is None
    assert BridgeCall("semantic_search", {"query": "sourdough"}).title == 'semantic_search "sourdough"'


def test_a_bridge_tool_is_labelled_by_where_it_comes_from() -> None:
    # A person's GitHub server or Lua plugin on the bridge is not "[kiln]".
    for name, label in (("semantic_search", "kiln"), ("lua_wordcount_count", "plugin"),
                        ("gh_search_issues", "mcp"), ("delegate_session", "delegation")):
        head = texts(wrap(tool_call_lines(call(f"mcp__crucible__{name}", "toolu_1"))[0], 200))[0]
        assert head.startswith(f"• {name}  [{label}]"), head
    assert KILN_TOOL_NAMES == {spec.name for spec in KILN_TOOLS}
    unbound = SimpleNamespace(config=SimpleNamespace(timeout_secs=1.0))  # the specs read only the timeout
    assert DELEGATION_TOOL_NAMES == {spec.name for spec in Delegation.tool_specs(unbound)}  # type: ignore[arg-type]


def test_search_hits_are_found_wherever_the_agent_puts_the_result() -> None:
    payload = {"results": [{"path": f"n{i}.md", "title": f"T{i}", "score": 1.0} for i in range(7)]}
    text = json.dumps(payload)
    shapes: list[dict[str, Any]] = [
        {"content": ({"type": "content", "content": {"type": "text", "text": text}},)},  # Claude
        {"raw_output": {"output": text}},  # OpenCode
        {"raw_output": payload},
        {"raw_output": {"content": [{"type": "text", "text": text}], "structuredContent": payload}},
    ]
    for shape in shapes:
        found = search_result(call("semantic_search", status="completed", **shape))
        assert found == ([(f"n{i}.md", f"T{i}") for i in range(5)], 7, None), shape
    assert search_result(call("semantic_search", status="in_progress")) is None


def test_a_search_joined_with_its_index_line_shows_its_hits_and_the_line() -> None:
    """OpenCode joins an MCP result's text blocks: semantic_search's JSON, then its line on the
    index while it builds. The chat showed the whole JSON text; it shows the hits and the line."""
    line = "Index: 52% of the kiln's 122 notes are embedded so far; the others were matched by their words only."
    payload = {"results": [{"path": "Help/CLI/lua.md", "title": "Lua Eval Command", "score": 1.0}],
               "index": {"embedded": 0.52, "notes": 122}, "notice": line}
    done = call("crucible_semantic_search", status="completed",
                raw_output={"output": json.dumps(payload) + "\n\n" + line})
    shown = plain(tool_call_lines(done, args={"query": "lua"})).split("\n")
    assert shown[1:] == ["  Help/CLI/lua.md — Lua Eval Command", "  " + line], shown


def test_a_note_write_is_diffed_against_the_note(tmp_path: Path) -> None:
    (tmp_path / "inbox").mkdir()
    (tmp_path / "inbox" / "a.md").write_text("---\ntags: [x]  # mine\n---\n# A\n\nold\n")
    update = proposed_write(tmp_path, BridgeCall("update_note", {"path": "inbox/a.md", "body": "# A\n\nnew\n"}))
    assert update is not None and update.old.endswith("old\n") and update.new == "---\ntags: [x]  # mine\n---\n# A\n\nnew\n"
    fm = proposed_write(tmp_path, BridgeCall("update_note", {"path": "inbox/a", "frontmatter": {"status": "done"}}))
    assert fm is not None and "status: done" in fm.new and fm.new.endswith("old\n")
    new = proposed_write(tmp_path, BridgeCall("create_note", {"path": "inbox/b.md", "content": "# B\n"}))
    assert new is not None and (new.old, new.new) == ("", "# B\n")
    assert proposed_write(tmp_path, BridgeCall("create_note", {"path": "../escape.md", "content": "x"})) is None
    assert proposed_write(tmp_path, BridgeCall("read_note", {"path": "inbox/a.md"})) is None


def test_a_diff_path_is_relative_to_the_session_folder_without_doubled_slashes(tmp_path: Path) -> None:
    block = {"type": "diff", "path": str(tmp_path / "src" / "a.py"), "oldText": None, "newText": "x = 1\n"}
    shown = plain(diff_lines(block, cwd=tmp_path))
    assert "--- a/src/a.py" in shown and "+++ b/src/a.py" in shown
    outside = plain(diff_lines({**block, "path": "/elsewhere/b.py"}, cwd=tmp_path))
    assert "--- /elsewhere/b.py" in outside and "a//" not in outside
    # The same diff twice in a call's content is shown once.
    twice = call("Write src/a.py", content=(block, block))
    assert plain(tool_call_lines(twice, cwd=tmp_path)).count("+x = 1") == 1


def test_a_long_result_is_cut_unless_expanded() -> None:
    output = "\n".join(f"line {i}" for i in range(100))
    done = ToolCall("t", title="Run", kind="execute", status="completed",
                    content=({"type": "content", "content": {"type": "text", "text": output}},))
    cut = plain(tool_call_lines(done))
    assert "line 39" in cut and "line 40" not in cut and "… 60 more lines (Ctrl-E shows all)" in cut
    assert "line 99" in plain(tool_call_lines(done, limit=None))


# -- the dialog's key row, the queue, the spinner -----------------------------------------------


def test_the_key_row_fits_and_never_splits_a_choice() -> None:
    choices = [(key, ROW_LABELS[key], SHORT_LABELS[key]) for key in KEYS]
    assert len(key_rows(choices, 120)) == 1
    for width in (80, 60, 40):
        rows = texts(key_rows(choices, width, "(+2 waiting)"))
        assert all(len(row.rstrip()) <= width for row in rows)
        joined = " ".join(rows)
        assert all(label in joined for label in ROW_LABELS.values())
    assert "save: always allow" not in " ".join(texts(key_rows(choices, 20)))  # short labels


async def test_the_queue_holds_takes_back_and_puts_a_steer_first() -> None:
    queue = PromptQueue(lambda: None)
    got: list[str] = []

    async def turns() -> None:
        while True:
            got.append((await queue.get()).text)

    async with trio.open_nursery() as nursery:
        queue.hold()
        nursery.start_soon(turns)
        queue.put(Queued("one"))
        queue.put(Queued("two"))
        queue.put(Queued("three"))
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # held: nothing sent
        taken = queue.take()
        assert taken is not None and taken.text == "three"
        assert queue.take(5) is None
        queue.put(Queued("steer", steer=True), first=True)
        assert [item.text for item in queue.items] == ["steer", "one", "two"]
        queue.release()
        await trio.testing.wait_all_tasks_blocked()
        assert got == ["steer", "one", "two"]
        assert queue.clear() == 0
        nursery.cancel_scope.cancel()


def test_the_status_bar_shows_a_spinner_and_the_time_while_a_turn_runs() -> None:
    bar = StatusBar("agent")
    bar.state = "ready"
    assert bar.text(None, waiting=False)[0][1].startswith(" ready")
    bar.turn_started()
    assert bar.turn_started_at is not None
    bar.turn_started_at -= 3.6
    text = bar.text(None, waiting=False)[0][1]
    assert "running 3.6 s" in text and text.strip()[0] in "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
    bar.turn_stopped()
    assert "s │" not in bar.text(None, waiting=False)[0][1]


def test_the_share_embedded_reads_the_same_in_the_bar_the_chat_and_the_agents_line() -> None:
    """One figure wherever the person or the agent reads how far indexing got: cut, not rounded
    (6.9% embedded was `6%` in the bar and `7%` in the search's line; 99.7% is not done)."""
    from crucible.kiln.builder import IndexState
    from mcp_bridge.kiln_api import IndexShare, RankedResults

    for share, shown in ((0.069, "6%"), (0.997, "99%"), (0.5, "50%"), (0.29, "29%"), (0.57, "57%")):
        building, stopped = IndexState("embedding", share, 10000), IndexState("failed", share, 10000, "why")
        bar = StatusBar("agent")
        backend = SimpleNamespace(index_state=lambda s=building: s, on_index_state=lambda fn: None,
                                  redact=lambda text: text)
        bar.follow_index(backend, lambda: None)
        assert bar.index_text() == f"indexing {shown}"
        backend.index_state = lambda s=stopped: s
        assert bar.index_text() == f"indexing stopped at {shown}: why"
        assert bar.index_failure_notice() == stopped.failure_text("why")
        assert bar.index_failure_notice() is None  # once
        assert stopped.failure_text("why").endswith("the others by words only. `cru kiln index` embeds the rest")
        again = IndexState("failed", share, 10000, "why", retry_in=60.0).failure_text("why")
        assert again.startswith(f"indexing the kiln stopped at {shown} (why)")
        assert again.endswith("words only. It is tried again in 1 minute, or `cru kiln index` embeds the rest")
        never = IndexState("failed", 0.0, 10000, "why", retry_in=120.0).failure_text("why")
        assert never.startswith("the kiln's index cannot be used (why); searching the kiln matches words only. It is "
                                "tried again in 2 minutes; `cru kiln index` says how to mend it"), never
        line = RankedResults(results=[], index=IndexShare(embedded=share, notes=10000)).summary_line()
        assert line is not None and line.startswith(f"Index: {shown} of the kiln's 10000 notes")
        line = RankedResults(results=[], index=IndexShare(embedded=share, notes=10000, stopped="why")).summary_line()
        assert line is not None and line.startswith(f"Index: {shown} of the kiln's 10000 notes")


def test_the_bar_and_the_chat_show_a_failed_index_with_the_same_paths_hidden() -> None:
    """The chat's notice went through the backend's `redact` (the kiln as `<kiln>`, the home as
    `~`) and the bar did not: the same reason showed the person's whole path in the bar."""
    from crucible.kiln.builder import IndexState
    from crucible.kiln_mcp import CrucibleKilnBackend

    kiln = Path.home() / "notes-of-someone"
    backend = CrucibleKilnBackend(kiln)
    failed = IndexState("failed", 0.0, 3, f"cannot open {kiln}/.crucible/chroma: disk I/O error")
    backend.index_state = lambda: failed  # type: ignore[method-assign]  # (no build: the state alone)
    backend.on_index_state = lambda fn: None  # type: ignore[method-assign]
    bar = StatusBar("agent")
    bar.follow_index(backend, lambda: None)
    assert bar.index_text() == "index failed: cannot open <kiln>/.crucible/chroma: disk I/O error"
    notice = bar.index_failure_notice()
    assert notice is not None and "(cannot open <kiln>/.crucible/chroma: disk I/O error)" in notice, notice
    assert str(Path.home()) not in notice


def test_a_bar_too_wide_leaves_out_the_index_reason_then_the_usage_not_the_index() -> None:
    """At 120 columns with the usage shown, a stopped build's bar was cut mid-reason, and at 100
    the index part was gone (`… │ 0.0000 USD │ ind`): the reason is said whole in the chat and
    the usage in /usage, so they go first, whole parts, and what is left fits."""
    from crucible.kiln.builder import IndexState

    bar = StatusBar("opencode")
    bar.state, bar.context, bar.session_tokens, bar.cost = "ready", (10, 100000), 15, (0.0, "USD")
    stopped = IndexState("failed", 0.104, 10000, "the indexing worker was killed by SIGKILL, as when memory runs out")
    woken: list[int] = []
    bar.follow_index(SimpleNamespace(index_state=lambda: stopped, on_index_state=lambda fn: None,
                                     redact=lambda text: text), lambda: woken.append(1))
    assert woken == [1]  # failed before the bar followed it (no change is sent again): looked at once
    acp = SimpleNamespace(state=SimpleNamespace(mode_now="build", model_now="fake/fake-model"))

    def shown(width: int | None) -> str:
        return "".join(t for _, t in bar.text(acp, waiting=False, width=width))

    whole = shown(None)
    assert whole.endswith("│ 0.0000 USD │ indexing stopped at 10%: the indexing worker was killed by SIGKILL, as "
                          "when memory r…"), whole  # (the reason's first 60 characters)
    assert shown(400) == whole  # room enough: all of it
    at_120 = shown(120)
    assert at_120 == " ready │ opencode │ mode: build │ model: fake/fake-model │ ctx 10/100.0k │ 15 tok │ 0.0000 USD │ " \
                     "indexing stopped at 10%", at_120
    at_100 = shown(100)
    assert at_100 == " ready │ opencode │ mode: build │ model: fake/fake-model │ ctx 10/100.0k │ indexing stopped at 10%"
    assert get_cwidth(at_100) <= 100
    # Narrower than the session's own state: that stays (cut by the screen), the index still last.
    assert shown(30).startswith(" ready │ opencode │ mode: build") and shown(30).endswith("indexing stopped at 10%")
    bar.set_flash("copied", 5)
    flashed = bar.text(acp, waiting=False, width=100)
    assert flashed[0][1] == " copied " and get_cwidth("".join(t for _, t in flashed)) <= 100, flashed


def test_the_dialog_fits_a_big_note_write_in_its_rows_and_is_made_once() -> None:
    from crucible.kiln_calls import ProposedWrite
    from crucible.permissions import ToolKey
    from crucible.sessions import PermissionAsk
    from crucible.tui.permissions import Pending, PermissionQueue, dialog_lines

    queue = PermissionQueue(lambda: None)
    old = "".join(f"line {i}\n" for i in range(5000))
    pending = Pending(PermissionAsk("claude", ToolKey("update_note", bridge=True, read_only=False), "update_note",
                                    None, {"path": "big.md", "body": "x"}),
                      write=ProposedWrite("big.md", old, old.replace("line", "LINE")))  # 10,000 diff lines
    queue.items.append(pending)
    rows = dialog_lines(queue, width=80, max_rows=12)
    shown = texts(rows)
    assert len(rows) <= 12 and shown[0].startswith("Permission: claude wants to run update_note big.md")
    assert "-line 0" in "\n".join(shown)
    assert any(re.match(r"\s+… \d+ more lines", row) for row in shown) and "reject once" in " ".join(shown[-2:])
    assert dialog_lines(queue, width=80, max_rows=12) is rows  # the same frame size: not made again


def test_a_tool_result_of_deeply_nested_json_from_the_agent_is_shown_not_parsed() -> None:
    """An agent's tool result text of 200,000 nested brackets: the chat looks for search hits
    and arguments in it at each redraw; json's RecursionError escaped that before."""
    deep = "[" * 200_000
    result = call("semantic_search", status="completed",
                  content=({"type": "content", "content": {"type": "text", "text": deep}},))
    assert search_result(result) is None
    pending = call("mcp__crucible__semantic_search", status="pending",
                   content=({"type": "content", "content": {"type": "text", "text": "{" + deep}},))
    assert bridge_call(pending) is not None and bridge_call(pending).title == "semantic_search"
