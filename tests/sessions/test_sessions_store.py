import json
import subprocess
from pathlib import Path

from crucible.session_store import SessionMeta, SessionStore, clean_title


def make(store: SessionStore, sid: str = "20261202-120000-abcdef") -> None:
    w = store.create(SessionMeta(id=sid, agent="claude", created=0, updated=0, cwd="/proj", title="notes on X"))
    w.append({"type": "user_message", "text": "what do my notes say?"})
    for piece in ("The notes ", "say ", "hello."):
        w.append({"type": "agent_message", "text": piece})
    w.append({"type": "tool_call", "title": "semantic_search", "kind": "search", "status": "completed"})
    w.append({"type": "turn_end", "stop_reason": "end_turn"})
    w.close()


def test_chunks_are_coalesced_and_transcript_is_markdown(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    make(store)
    events = list(store.events("20261202-120000-abcdef"))
    assert [e["type"] for e in events] == ["user_message", "agent_message", "tool_call", "turn_end"]
    assert events[1]["text"] == "The notes say hello."
    md = store.transcript("abcdef")  # a unique part of the id is enough
    assert "## You\n\nwhat do my notes say?" in md
    assert "## Agent\n\nThe notes say hello." in md
    assert "- tool `semantic_search` (search): completed" in md
    assert store.meta("20261202-120000-abcdef").turns == 1
    assert "User: what do my notes say?" in store.history_as_context("20261202-120000-abcdef")


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    make(store)
    with open(tmp_path / "20261202-120000-abcdef" / "events.jsonl", "a") as fh:
        fh.write('{"type": "agent_mess')
    assert len(list(store.events("20261202-120000-abcdef"))) == 4


def test_cru_session_commands(cru_bin: str, clean_env: dict[str, str], tmp_path: Path) -> None:
    store = SessionStore(Path(clean_env["XDG_DATA_HOME"]) / "crucible" / "sessions")
    make(store)
    out = subprocess.run([cru_bin, "session", "list"], env=clean_env, capture_output=True, text=True, check=True)
    assert "20261202-120000-abcdef" in out.stdout and "notes on X" in out.stdout
    out = subprocess.run([cru_bin, "session", "show", "abcdef"], env=clean_env, capture_output=True, text=True,
                         check=True)
    assert "The notes say hello." in out.stdout
    out = subprocess.run([cru_bin, "session", "export", "abcdef"], env=clean_env, capture_output=True, text=True,
                         check=True)
    assert json.loads(out.stdout)["session"]["agent"] == "claude"
    res = subprocess.run([cru_bin, "session", "show", "nope"], env=clean_env, capture_output=True, text=True)
    assert res.returncode == 1 and "no saved session 'nope'" in res.stderr and "cru session list" in res.stderr


def test_a_conversation_whose_first_turn_was_killed_midway_is_listed(
        cru_bin: str, clean_env: dict[str, str]) -> None:
    # `cru chat` killed (-9, a closed terminal) while the agent answered its first prompt: the
    # person looks for that conversation in `cru session list`, not only in `--all`.
    store = SessionStore(Path(clean_env["XDG_DATA_HOME"]) / "crucible" / "sessions")
    writer = store.create(SessionMeta(id="20261203-100000-cccccc", agent="claude", created=1, updated=1, cwd="/p"))
    writer.append({"type": "user_message", "text": "summarize my garden notes"})
    writer.append({"type": "agent_message", "text": "Working on it"})
    writer.flush()  # and no turn_end, no close: the process is gone
    store.create(SessionMeta(id="20261203-100001-dddddd", agent="claude", created=2, updated=2, cwd="/p")).close()
    out = subprocess.run([cru_bin, "session", "list"], env=clean_env, capture_output=True, text=True,
                         check=True).stdout
    assert out.splitlines() == [line for line in out.splitlines() if "cccccc" in line] != []
    assert "turns=0  summarize my garden notes" in out  # said, though no turn ended
    shown = subprocess.run([cru_bin, "session", "show", "cccccc"], env=clean_env, capture_output=True, text=True,
                           check=True).stdout
    assert "summarize my garden notes" in shown and "Working on it" in shown
    writer.close()


def test_show_marks_a_resume_only_after_something_was_said(
        cru_bin: str, clean_env: dict[str, str], tmp_path: Path) -> None:
    """An editor's client (acpx) creates a session in one `cru acp` and prompts from the next,
    which resumes it: the conversation begins with a resume of nothing, which `cru session show`
    does not draw; a resume after a turn it does."""
    store = SessionStore(Path(clean_env["XDG_DATA_HOME"]) / "crucible" / "sessions")
    store.create(SessionMeta(id="20261203-090000-aaaaaa", agent="claude", created=1, updated=1, cwd="/p")).close()
    for n, agent in enumerate(["claude", "gemini"]):
        writer, in_place = store.continue_conversation("aaaaaa", SessionMeta(
            id=f"20261203-09000{n + 1}-bbbbbb", agent=agent, created=2 + n, updated=2 + n, cwd="/p"))
        assert in_place
        writer.append({"type": "user_message", "text": f"question {n}"})
        writer.append({"type": "agent_message", "text": f"answer {n}"})
        writer.append({"type": "turn_end", "stop_reason": "end_turn"})
        writer.close()
    out = subprocess.run([cru_bin, "session", "show", "aaaaaa"], env=clean_env, capture_output=True, text=True,
                         check=True).stdout
    assert out.count("resumed with") == 1, out
    assert [r["type"] for r in store.events("aaaaaa")][:2] == ["user_message", "agent_message"]  # saved so too
    transcript = (store.root / "20261203-090000-aaaaaa" / "transcript.md").read_text()
    assert transcript.count("resumed with") == 1 and transcript.index("answer 0") < transcript.index("resumed with")
    assert out.index("answer 0") < out.index("resumed with gemini") < out.index("question 1"), out


def test_a_conversation_open_elsewhere_goes_on_in_a_chained_entry_listed_as_one(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    first = store.create(SessionMeta(id="20261203-090000-aaaaaa", agent="claude", created=1, updated=1, cwd="/p"))
    first.append({"type": "user_message", "text": "one"})
    first.append({"type": "turn_end", "stop_reason": "end_turn"})
    first.flush()
    # Still open (another cru holds it): the new part is saved apart, chained to it.
    later = SessionMeta(id="20261203-100000-bbbbbb", agent="opencode", created=2, updated=2, cwd="/q")
    writer, in_place = store.continue_conversation("aaaaaa", later)
    assert not in_place and writer.meta.id == "20261203-100000-bbbbbb"
    assert writer.meta.resumed_from == "20261203-090000-aaaaaa"
    first.close()
    writer.append({"type": "user_message", "text": "two"})
    writer.append({"type": "turn_end", "stop_reason": "end_turn"})
    writer.close()
    [conv] = store.conversations()
    assert conv.id == "20261203-090000-aaaaaa" and conv.turns == 2 and conv.agent == "opencode"
    assert store.conversation("bbbbbb").id == conv.id  # either id finds the whole conversation
    assert "User: one\n\nUser: two" in store.history_as_context("bbbbbb")
    # Closed now: the next resume goes on in the first entry itself.
    writer, in_place = store.continue_conversation("bbbbbb", SessionMeta(
        id="20261203-110000-cccccc", agent="gemini", created=3, updated=3, cwd="/r"))
    assert in_place and writer.meta.id == "20261203-090000-aaaaaa" and writer.meta.agent == "gemini"
    writer.close()
    assert [r["type"] for r in store.events("aaaaaa")][-1] == "resumed"


def test_messages_saved_in_parts_are_read_whole(tmp_path: Path) -> None:
    from crucible.session_store import message_records

    records = [{"type": "agent_message", "text": "Hel"}, {"type": "agent_message", "text": "lo", "cont": True},
               {"type": "user_message", "text": "next"}, {"type": "agent_message", "text": "again"}]
    assert [(r["type"], r["text"]) for r in message_records(records)] == [
        ("agent_message", "Hello"), ("user_message", "next"), ("agent_message", "again")]


def test_a_title_keeps_no_escape_sequence_or_its_remains() -> None:
    """Titles come from the agent (session_info_update) or the prompt and are listed in the
    terminal: an escape sequence goes whole, not just its ESC ("[31m" was left behind)."""
    cases = {
        "Planning the \x1b[31mgarden\nbeds": "Planning the garden beds",  # SGR colour
        "a\x1b]0;window title\x07b": "ab",  # OSC: set the terminal's title
        "see \x1b]8;;http://x.example\x1b\\this link\x1b]8;;\x1b\\ now": "see this link now",  # OSC 8
        "c\x9b2Jd": "cd",  # C1 CSI: clear the screen
        "reset\x1bc here": "reset here",  # RIS
        "\x1bP1;2|data\x1b\\after": "after",  # DCS
        "cut off \x1b[38;5": "cut off",  # a sequence the end of the text cut
        "ok \u202e rtl\ttab": "ok rtl tab",  # bidi control dropped, white space folded
    }
    for raw, shown in cases.items():
        assert clean_title(raw) == shown, raw
    # Hostile lengths stay fast (no backtracking) and the title stays bounded.
    assert clean_title("\x1b[" + "0;" * 200_000 + "m" + "x" * 500) == "x" * 120
    assert clean_title("\x1b]" * 100_000 + "y") == ""  # an unterminated OSC swallows the rest
