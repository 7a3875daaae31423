"""The chat's /sessions picker (issue 16, "Beyond the peers"), in a real pseudo-terminal with the
scripted agent: find a saved conversation by a word of its text, Enter, and the chat goes on
with it; titles from agents are sanitized; Esc closes it and no key reached the input box."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Screen, TuiRunner, group_gone

from crucible.session_store import Conversation, SessionMeta, SessionStore, sessions_root

CTRL_D, ESC, DOWN, UP = "\x04", "\x1b", "\x1b[B", "\x1b[A"


def leave(screen: Screen) -> None:
    screen.send("\x15" + CTRL_D)  # Ctrl-U first: Ctrl-D leaves only from an empty line
    assert screen.wait_exit() == 0
    assert group_gone(screen.child.pid), "cru chat left processes behind"


def saved_by_p(tui: TuiRunner, script: dict[str, Any], name: str, prompt: str) -> None:
    """One conversation saved by `cru chat -p` with the scripted agent (its own log file)."""
    cmd = tui.agent_command({**script, "log": str(tui.tmp / f"{name}-log.jsonl")}, f"{name}.json")
    res = subprocess.run([tui.cru, "chat", "--agent-command", cmd, "--kiln", str(tui.kiln), "-p", prompt],
                         env=tui.env, capture_output=True, text=True, timeout=60, cwd=tui.tmp)
    assert res.returncode == 0, res.stderr


def frames(log: Path, method: str) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    entries = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [e["frame"] for e in entries if e.get("kind") == "in" and e["frame"].get("method") == method]


def wait_until(pred: Callable[[], bool], timeout: float = 30) -> None:
    """Poll files another process writes (the chat's session store: no other channel)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("the saved sessions never came to that")
        time.sleep(0.05)


def picker_rows(shown: str) -> list[str]:
    """The picker's rows on screen: from its head to its key row."""
    rows = shown.splitlines()
    start = next(i for i, row in enumerate(rows) if row.startswith("Sessions: type to search"))
    end = next(i for i in range(start, len(rows)) if "Esc" in rows[i] and "close" in rows[i])
    return rows[start:end + 1]


def test_sessions_finds_a_conversation_by_its_text_and_the_chat_goes_on_with_it(tui: TuiRunner) -> None:
    # The agent titles the first conversation, with escapes in it.
    saved_by_p(tui, {"prompts": [[{"title": "Garden \x1b[31mbeds\x1b[0m plan"}, {"text": "Plant beans in May."}]]},
               "first", "what goes in the beds?")
    saved_by_p(tui, {"prompts": [[{"text": "The harbour lantern is lit at dusk."}]]}, "second",
               "tell me about the old town")
    store = SessionStore(sessions_root(tui.env))
    convs = {c.title: c for c in store.conversations()}
    # saved cleaned: the escapes gone whole, no "[31m" left of them
    assert set(convs) == {"Garden beds plan", "tell me about the old town"}, convs
    first, second = convs["Garden beds plan"], convs["tell me about the old town"]
    # A title with its escapes still in it (a session.json from elsewhere): the picker shows it inert.
    meta_file = store.root / first.id / "session.json"
    meta_file.write_text(meta_file.read_text().replace("Garden beds", "Garden \\u001b[31mbeds"))
    assert store.meta(first.id).title.startswith("Garden \x1b[31mbeds")

    screen = tui.open(None)
    screen.wait_for("ready")
    screen.type_line("/sessions")
    shown = screen.wait_all("Sessions: type to search", "tell me about the old town", "Garden")
    rows = picker_rows(shown)
    assert any("tell me about the old town" in row and row.startswith("▶") for row in rows)  # newest, chosen
    garden = next(row for row in rows if "Garden" in row)
    assert "Garden ^[[31mbeds plan" in garden and "scripted_agent" in garden and "1 turn" in garden
    assert b"\x1b[31mbeds" not in bytes(screen.raw)  # the agent's escape never reached the terminal

    screen.send("harbour")  # a word of the second conversation's text only (not of a title)
    shown = screen.wait_for(lambda s: "harbour lantern is lit" in s and "Garden" not in s)
    rows = picker_rows(shown)
    hit = next(row for row in rows if "tell me about the old town" in row)
    assert hit.startswith("▶") and "1 of 2" in shown
    assert shown.splitlines()[-2].strip() == "›"  # the input box got none of it
    screen.send("\r")
    screen.wait_all(f"going on with tell me about the old town ({second.id}", "end of history")
    shown = screen.wait_for(lambda s: "ready" in s.splitlines()[-1])
    assert "Sessions: type to search" not in shown
    assert "scripted_agent" in shown.splitlines()[-1]  # the status bar names the conversation's agent

    screen.type_line("and after dusk?")
    screen.wait_for(lambda s: "harbour lantern is lit" in s.split("› and after dusk?")[-1])
    # The conversation's own agent (its command, its script) reopened its own session.
    second_log = tui.tmp / "second-log.jsonl"
    resumed = frames(second_log, "session/resume")
    assert [f["params"]["sessionId"] for f in resumed] == [store.meta(second.id).agent_session_id]
    # (the agent logs a frame as it handles it: the answer can be on screen a moment before)
    wait_until(lambda: len(frames(second_log, "session/prompt")) >= 2)
    assert [p["params"]["prompt"][0]["text"] for p in frames(second_log, "session/prompt")] == [
        "tell me about the old town", "and after dusk?"]
    assert frames(tui.tmp / "first-log.jsonl", "session/resume") == []
    # The turn landed in that conversation's entry, and nowhere else (its end is saved as the turn
    # ends, maybe after its text is on screen).
    wait_until(lambda: {c.id: c.turns for c in store.conversations()} == {first.id: 1, second.id: 2})
    said = [r["text"] for r in store.conversation_events(second.id) if r["type"] == "user_message"]
    assert said == ["tell me about the old town", "and after dusk?"]
    assert [r["text"] for r in store.conversation_events(first.id) if r["type"] == "user_message"] == [
        "what goes in the beds?"]
    leave(screen)
    assert f"cru session resume {second.id}" in screen.text()  # what the chat was on when it ended


def test_esc_closes_the_picker_and_no_key_reaches_the_input_box(tui: TuiRunner) -> None:
    saved_by_p(tui, {}, "only", "hello picker")
    screen = tui.open(None)
    screen.wait_for("ready")
    screen.type_line("/sessions zzz")
    shown = screen.wait_for("no saved session mentions 'zzz'")
    assert "0 of 1" in shown
    screen.send("\x7f\x7f\x7f")  # backspace: the search line is empty again, every conversation listed
    screen.wait_all("hello picker", "1 of 1")
    screen.send(DOWN + UP + "q")
    screen.wait_for("search: q")
    screen.send(ESC)
    shown = screen.wait_for(lambda s: "Sessions: type to search" not in s)
    assert shown.splitlines()[-2].strip() == "›"  # nothing typed in the picker is in the input box
    screen.type_line("still here")
    screen.wait_for("echo: still here")
    leave(screen)


def test_a_conversation_chosen_while_the_agent_starts_takes_its_place(tui: TuiRunner) -> None:
    saved_by_p(tui, {"default_turn": [{"text": "saved agent: {prompt}"}]}, "saved", "an earlier question")
    screen = tui.open({"initialize": {"delay": 60}})  # the chat's own agent takes its time
    screen.wait_for(lambda s: "starting" in s.splitlines()[-1])
    screen.type_line("/sessions")
    screen.wait_all("an earlier question", "1 of 1")
    screen.send("\r")
    screen.wait_all("going on with an earlier question", "end of history")
    screen.wait_for(lambda s: "ready" in s.splitlines()[-1])
    screen.type_line("are you there?")
    screen.wait_for("saved agent: are you there?")
    assert frames(tui.log, "session/new") == []  # the slow start was given up
    assert len(frames(tui.tmp / "saved-log.jsonl", "session/resume")) == 1
    leave(screen)


def test_the_picker_over_a_thousand_conversations(tui: TuiRunner) -> None:
    """A thousand saved conversations: listed and searched (titles at once, text from the index)."""
    store = SessionStore(sessions_root(tui.env))
    for i in range(1000):
        w = store.create(SessionMeta(id=f"20260101-{i:06d}-{i:06x}", agent="scripted_agent", created=i, updated=i,
                                     cwd=str(tui.tmp), kiln=str(tui.kiln)))
        w.append({"type": "user_message", "text": f"question number {i}"})
        w.append({"type": "agent_message", "text": "plain words " * 200 + ("a rare zeppelin" if i == 321 else "")})
        w.append({"type": "turn_end", "stop_reason": "end_turn"})
        w.close()
    screen = tui.open(None, rows=30)
    screen.wait_for("ready")
    screen.type_line("/sessions")
    screen.wait_all("question number 999", "1000 of 1000")
    screen.send("zeppe")  # part of a word of one transcript
    shown = screen.wait_for("a rare zeppelin")
    rows = picker_rows(shown)
    assert [row for row in rows if "question number" in row] == [
        next(row for row in rows if "question number 321" in row)]
    screen.send(ESC)
    screen.wait_for(lambda s: "Sessions: type to search" not in s)
    leave(screen)


def test_the_conversation_index_rereads_only_what_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import crucible.session_store as session_store
    from crucible.session_store import ConversationIndex

    store = SessionStore(tmp_path)
    for sid, text in (("20260101-000001-aaaaaa", "seedlings in the greenhouse"),
                      ("20260101-000002-bbbbbb", "a lantern by the harbour")):
        w = store.create(SessionMeta(id=sid, agent="a", created=0, updated=0, cwd=str(tmp_path)))
        w.append({"type": "user_message", "text": text})
        w.append({"type": "turn_end", "stop_reason": "end_turn"})
        w.close()
    index = ConversationIndex()
    index.refresh(store)
    found = index.search(store, "seedli", prefix=True)  # a word still being typed: its stem matches
    assert [h.conversation.id for h in found] == ["20260101-000001-aaaaaa"]
    assert "greenhouse" in found[0].snippet
    assert index.search(store, "harb", prefix=True)[0].conversation.id == "20260101-000002-bbbbbb"
    assert index.search(store, "harb") == []  # a whole-word search (cru session search) wants the word

    # One conversation goes on, another is deleted: only the first is read again.
    w, _ = store.continue_conversation("20260101-000002-bbbbbb", store.meta("20260101-000002-bbbbbb"))
    w.append({"type": "user_message", "text": "and a zeppelin"})
    w.append({"type": "turn_end", "stop_reason": "end_turn"})
    w.close()
    shutil.rmtree(tmp_path / "20260101-000001-aaaaaa")
    read: list[str] = []
    real = session_store._conversation_text

    def counting(store_: SessionStore, conv: Conversation) -> list[str]:
        read.append(conv.id)
        return real(store_, conv)

    monkeypatch.setattr(session_store, "_conversation_text", counting)
    index.refresh(store)
    assert read == ["20260101-000002-bbbbbb"]
    assert [h.conversation.id for h in index.search(store, "zeppelin seedlings")] == ["20260101-000002-bbbbbb"]


def test_term_counts_are_tokenizes_counts() -> None:
    """The index counts words before stemming them (each distinct word once): the same terms
    and counts as `tokenize`, whatever the punctuation, case, digits or non-ASCII letters; the
    total is the words' (a compound's own term, "cap-add"'s "capadd", adds no length, nor the
    parts of a camelCase name)."""
    import random
    import re
    from collections import Counter

    from crucible.kiln.lexical import term_counts, tokenize

    rng = random.Random(3)
    alphabet = list("abc déf_GHI İ.,;:!? \n\t-'\"()[]0123456789ßﬁ") + ["the ", "and ", "Seedlings "]
    for _ in range(300):
        texts = ["".join(rng.choices(alphabet, k=rng.randrange(0, 200))) for _ in range(rng.randrange(1, 4))]
        want = Counter(term for text in texts for term in tokenize(text))
        # each word is one (no joiners; a camelCase name, "abG", is one word)
        words = sum(1 for text in texts for word in re.findall(r"[^\W_]+", text.lower()) if tokenize(word))
        counts, total = term_counts(texts)
        assert counts == dict(want) and total == words, texts
