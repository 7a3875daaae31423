"""Unit tests of the TUI's parts: permission queue, config rule writer, markdown, transcript
rows, slash commands and mentions."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import trio
import trio.testing
from prompt_toolkit.completion import CompleteEvent
from prompt_toolkit.document import Document

from acp_host.session import Decision, PermissionOption, PermissionRequest, ToolCall
from crucible.attachments import mentions
from crucible.errors import CrucibleError
from crucible.permissions import ToolKey
from crucible.sessions import PermissionAsk
from crucible.tui.commands import parse_slash
from crucible.tui.input import ChatCompleter
from crucible.tui.markdown import MarkdownState, render_line, wrap
from crucible.tui.permissions import PermissionQueue, save_permission_rule
from crucible.tui.tool_calls import diff_lines
from crucible.tui.transcript import TextEntry, TranscriptControl


def ask(name: str, kinds: tuple[str, ...] | None = ("allow_once", "reject_once")) -> PermissionAsk:
    request = None
    if kinds is not None:
        options = tuple(PermissionOption(k, k, k) for k in kinds)
        request = PermissionRequest(1, "s", ToolCall(name, title=name), options, True)
    return PermissionAsk("agent", ToolKey(name, bridge=True, read_only=False), name, request)


async def test_queued_asks_are_answered_in_order_exactly_once() -> None:
    queue = PermissionQueue(lambda: None)
    results: dict[str, Decision] = {}

    async def one(name: str) -> None:
        results[name] = await queue(ask(name))

    async with trio.open_nursery() as nursery:
        for name in ("first", "second", "third"):
            nursery.start_soon(one, name)
            await trio.testing.wait_all_tasks_blocked()
        assert [p.ask.title for p in queue.items] == ["first", "second", "third"]
        assert queue.answer("y") == ("allow once", None)
        assert queue.answer("a") is None  # allow_always was not offered
        assert queue.answer("n") == ("reject once", None)
        assert queue.current is not None and queue.current.ask.title == "third"
        assert queue.answer("y") is not None
        assert queue.answer("y") is None  # nothing left to answer
    assert {k: v.kind for k, v in results.items()} == {"first": "allow_once", "second": "reject_once",
                                                         "third": "allow_once"}


async def test_a_cancelled_ask_leaves_the_queue_unanswered() -> None:
    queue = PermissionQueue(lambda: None)
    got: list[Decision] = []

    async def keep(name: str) -> None:
        got.append(await queue(ask(name)))

    scope = trio.CancelScope()

    async def withdrawn() -> None:
        with scope:
            await queue(ask("withdrawn"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(keep, "kept")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(withdrawn)
        await trio.testing.wait_all_tasks_blocked()
        assert len(queue.items) == 2
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert [p.ask.title for p in queue.items] == ["kept"]
        queue.answer("y")
    assert [d.kind for d in got] == ["allow_once"]


def test_offered_keys_follow_the_agents_options() -> None:
    queue = PermissionQueue(lambda: None)
    from crucible.tui.permissions import Pending

    assert queue.offered_keys(Pending(ask("t", ("allow_always", "allow_once", "reject_once")))) == ["y", "a", "s", "n"]
    assert queue.offered_keys(Pending(ask("t", None))) == ["y", "a", "s", "n", "N", "x"]  # the bridge asks
    assert queue.offered_keys(Pending(ask("t", ("weird",)))) == ["y", "n"]


async def test_save_and_remember_key_returns_the_rule() -> None:
    queue = PermissionQueue(lambda: None)
    got: list[Decision] = []

    async def one() -> None:
        got.append(await queue(ask("create_note", None)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one)
        await trio.testing.wait_all_tasks_blocked()
        assert queue.answer("x") == ("reject always + save rule", ("create_note", "deny"))
    assert got[0].kind == "reject_always"


def test_save_permission_rule_keeps_the_rest_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('# my settings\nkiln = "~/notes"  # where my notes live\n[agents.mine]\ncommand = "x"\n'
                    '[permissions]\n# reads are fine\nread_note = "allow"\n')
    save_permission_rule(path, "create_note", "allow")
    save_permission_rule(path, "delete_*", "deny")
    text = path.read_text()
    assert "# my settings" in text and "# where my notes live" in text and "# reads are fine" in text
    data = tomllib.loads(path.read_text())
    assert data == {"kiln": "~/notes", "agents": {"mine": {"command": "x"}},
                    "permissions": {"read_note": "allow", "create_note": "allow", "delete_*": "deny"}}
    fresh = tmp_path / "new" / "config.toml"
    save_permission_rule(fresh, "create_note", "allow")
    assert tomllib.loads(fresh.read_text()) == {"permissions": {"create_note": "allow"}}
    bad = tmp_path / "bad.toml"
    bad.write_text("this is [ not toml")
    with pytest.raises(CrucibleError, match="not valid TOML"):
        save_permission_rule(bad, "x", "allow")
    assert bad.read_text() == "this is [ not toml"


def test_markdown_lines() -> None:
    state = MarkdownState()
    assert render_line("# Title", state) == [(" class:md.heading", "Title")]
    assert render_line("a **b** and *c* and `d`", state) == [
        ("", "a "), (" class:md.bold", "b"), ("", " and "), (" class:md.italic", "c"), ("", " and "),
        (" class:md.code", "d")]
    assert render_line("- item", state)[1:] == [(" class:md.bullet", "• "), ("", "item")]
    render_line("```python", state)
    assert state.in_code
    # Code, not a heading (a python comment, highlighted as one).
    assert render_line("# not a heading", state) == [(" class:md.code class:pygments.comment.single",
                                                      "# not a heading")]
    render_line("```", state)
    assert not state.in_code
    assert render_line("snake_case_name", state) == [("", "snake_case_name")]


def test_wrap_splits_rows_at_width() -> None:
    assert wrap([("a", "12345"), ("b", "678")], 3) == [[("a", "123")], [("a", "45"), ("b", "6")], [("b", "78")]]
    assert wrap([], 10) == [[]]


def test_transcript_shows_the_newest_rows_and_scrolls() -> None:
    control = TranscriptControl()
    entry = TextEntry("agent")
    control.add(entry)
    entry.append("".join(f"line {i}\n" for i in range(100)))
    content = control.create_content(20, 5)
    rows = ["".join(f[1] for f in content.get_line(i)) for i in range(content.line_count)]
    assert rows == ["line 95", "line 96", "line 97", "line 98", "line 99"]
    control.page(1)
    content = control.create_content(20, 5)
    assert "line 99" not in "".join(f[1] for i in range(5) for f in content.get_line(i))


def _shown(control: TranscriptControl, width: int = 20, height: int = 5) -> list[str]:
    content = control.create_content(width, height)
    return ["".join(f[1] for f in content.get_line(i)) for i in range(content.line_count)]


def test_scrolled_up_the_view_stays_on_what_it_shows_while_the_answer_streams_below() -> None:
    control = TranscriptControl()
    older = control.add(TextEntry("agent"))
    assert isinstance(older, TextEntry)
    older.append("".join(f"old {i}\n" for i in range(50)))
    streaming = control.add(TextEntry("agent"))
    assert isinstance(streaming, TextEntry)
    streaming.append("new 0\n")
    control.page(1)
    control.page(1)
    before = _shown(control)
    assert all(row.startswith("old") for row in before), before
    for i in range(1, 30):  # the answer goes on below the view: the person keeps reading
        streaming.append(f"new {i}\n")
        assert _shown(control) == before
    older.append("old 50\n")  # a row added inside the view's own entry, below it: still in place
    assert _shown(control) == before
    control.scroll = 0  # back to the bottom (typing, End): the newest rows again
    assert _shown(control)[-1] == "new 29"
    control.page(1)  # and from there it follows the person's scrolling as before
    assert "new 29" not in _shown(control)


def test_wrap_counts_terminal_cells_for_wide_characters() -> None:
    from prompt_toolkit.utils import get_cwidth

    rows = wrap([("a", "日本語のノート"), ("b", "ok")], 6)  # 7 wide characters = 14 cells, then 2
    assert ["".join(t for _, t in row) for row in rows] == ["日本語", "のノー", "トok"]
    assert all(sum(get_cwidth(t) for _, t in row) <= 6 for row in rows)
    # A wide character never straddles the edge: an odd width leaves a cell free.
    assert ["".join(t for _, t in row) for row in wrap([("a", "x日本")], 2)] == ["x", "日", "本"]
    # Combining marks take no cell: "é" as e + U+0301 is one cell.
    assert wrap([("a", "cafe\u0301s")], 5) == [[("a", "cafe\u0301s")]]
    # Width 1 still makes progress on a wide character.
    assert len(wrap([("a", "日本")], 1)) == 2


def test_a_huge_streaming_line_is_wrapped_by_slicing() -> None:
    control = TranscriptControl()
    entry = TextEntry("agent")
    control.add(entry)
    for _ in range(1000):
        entry.append("x" * 5000)  # 5 MB in one line, in chunks
    entry.append("END")
    content = control.create_content(80, 24)
    last = "".join(f[1] for f in content.get_line(23))
    assert last.endswith("END") and len(last) <= 80


def test_agent_text_is_sanitized_in_the_transcript() -> None:
    entry = TextEntry("agent")
    entry.append("a\x1b[31mred\u202e\n")
    text = "".join(t for row in entry.rows_reversed(80) for _, t in row)
    assert "\x1b" not in text and "^[" in text and "<U+202E>" in text


def test_a_secret_arriving_in_pieces_never_shows_its_first_characters() -> None:
    from crucible.redaction import forget_all, remember_secret

    remember_secret("card-secret-5d1e9a")
    try:
        entry = TextEntry("agent")

        def shown() -> str:
            return "".join(t for row in entry.rows_reversed(80) for _, t in row)

        entry.append("the key is card-se")
        assert shown().rstrip() == "the key is" and "card-se" not in entry.text()
        entry.append("cret-5d")
        assert "card" not in shown()
        entry.append("1e9a and")
        assert shown() == "the key is *** and"
        entry.append(" ca")  # could begin it again: waits for the next piece, or the message's end
        assert shown() == "the key is *** and "
        entry.finish()
        assert shown() == "the key is *** and ca"
    finally:
        forget_all()


def test_diff_lines_are_red_and_green() -> None:
    lines = diff_lines({"type": "diff", "path": "a.md", "oldText": "one\ntwo\n", "newText": "one\nthree\n"})
    styled = {text.strip(): style for line in lines for style, text in line}
    assert styled["-two"] == "class:diff.del" and styled["+three"] == "class:diff.add"


def test_slash_commands_and_mentions() -> None:
    own = parse_slash("/help", [])
    assert own is not None and own.own and own.name == "help"
    cmd = parse_slash("/summarize the kiln", ["summarize"])
    assert cmd is not None and not cmd.own and cmd.args == "the kiln"
    assert parse_slash("hello /help", []) is None
    assert parse_slash("//not a command", []) is None
    quit_cmd = parse_slash("/quit", [])
    assert quit_cmd is not None and quit_cmd.name == "exit"
    assert mentions('see @a/b.md and @"My Note.md", mail x@y.z') == ["a/b.md", "My Note.md"]
    # The end of a clause is not the note's: "read @Index.md, then @Ideas." names Index.md and Ideas.
    assert mentions("read @Index.md, then @Ideas. Also @shot.png! And @...") == ["Index.md", "Ideas", "shot.png", "..."]


def test_completer_offers_commands_and_note_paths() -> None:
    completer = ChatCompleter(lambda: {"summarize": "Summarize"}, lambda: ["Projects/Overview.md", "My Note.md"])
    event = CompleteEvent()
    names = [c.text for c in completer.get_completions(Document("/s"), event)]
    assert names == ["/sessions", "/steer", "/summarize"]
    notes = [c.text for c in completer.get_completions(Document("read @over"), event)]
    assert notes == ["@Projects/Overview.md"]
    spaced = [c.text for c in completer.get_completions(Document("@my"), event)]
    assert spaced == ['@"My Note.md"']


def test_the_chat_leaves_its_callers_options_as_they_were(tmp_path: Path) -> None:
    from acp_host.registry import AgentSpec
    from crucible.config import Config
    from crucible.sessions import SessionOptions, deny_asker
    from crucible.tui.app import ChatUI

    opts = SessionOptions(agent=AgentSpec("agent", "agent", []), kiln=tmp_path, cwd=tmp_path, config=Config())
    ui = ChatUI(opts)
    # The chat asks the person through its dialog; whoever made the options keeps theirs.
    assert opts.asker is deny_asker and ui.opts.asker is ui.queue
    assert ui.status.label == "agent" and ui.opts.kiln == tmp_path


def test_note_matches_rank_as_a_file_finder() -> None:
    from crucible.tui.input import note_matches

    paths = ["A/Index notes.md", "Help/CLI/Index.md", "Index.md", "Agents/Index.md", "Big/reindexing.md",
             "Index/other.md", "Cooking/Knife sharpening.md"]
    assert note_matches("index", paths) == ["Index.md", "Agents/Index.md", "Help/CLI/Index.md",  # the name
                                            "A/Index notes.md",  # a name that starts so
                                            "Big/reindexing.md",  # a name that holds it
                                            "Index/other.md"]  # a folder
    assert note_matches("ksh", paths) == ["Cooking/Knife sharpening.md"]  # letters in order
    assert note_matches("", paths)[:2] == ["Index.md", "A/Index notes.md"]  # the shallowest first
    assert len(note_matches("", [f"n{i}.md" for i in range(500)])) == 50
