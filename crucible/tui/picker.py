"""The /sessions picker: every saved conversation, across agents, to go on with in this chat.

It opens where the chat's dialog is (permissions.py), in the dialog's colours, with its keys
on a row like the dialog's: what is typed searches (the search line is the picker's own, so
no key reaches the input box), ↑/↓ (PageUp/PageDown) move, Enter resumes the chosen
conversation here (agent.py: the agent session stops and the conversation's own agent, card,
kiln and cwd go on with it, as `cru session resume` does), Esc closes it. A permission
question that comes meanwhile goes first: the picker waits under it.

What is typed matches the titles at once (words anywhere in the title, id or agent), then the
full text of every transcript (crucible.session_store.ConversationIndex: the BM25 that
`cru session search` ranks with; the word being typed stands for the words it starts). The
conversations are read and indexed in a thread, and every search runs in one, so a thousand
of them never hold the keys; the index is kept between two openings and re-reads only what
changed. How it is drawn is picker_view.py.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, TypeVar

import trio
from prompt_toolkit.buffer import Buffer
from prompt_toolkit.document import Document
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.layout import Window
from prompt_toolkit.layout.controls import BufferControl

from crucible.errors import CrucibleError
from crucible.session_store import Conversation, ConversationIndex, SessionHit, SessionStore
from crucible.tui.picker_view import PickerView

if TYPE_CHECKING:
    from crucible.tui.app import ChatUI

T = TypeVar("T")

TEXT_HITS = 50  # full-text hits asked of the index per search (titles match without a bound)
SNIPPETS = 8  # of them with the line that matched (each reads its transcript again)
# A full-text search waits for the keys to pause this long (seconds): typing a word runs one
# search, not one per letter (each is a thread that takes the GIL from the keys' echo).
SETTLE = 0.08


class _KeysFirst:
    """While a thread indexes or searches, the thread that draws the keys gets the GIL back
    sooner (1 ms, not CPython's 5 ms), so typing does not wait on it. Entered from the trio
    thread only; the interval comes back when the last such thread is done."""

    def __init__(self) -> None:
        self.depth = 0
        self.before = sys.getswitchinterval()

    @contextmanager
    def __call__(self) -> Iterator[None]:
        if self.depth == 0:
            self.before = sys.getswitchinterval()
            sys.setswitchinterval(min(self.before, 0.001))
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0:
                sys.setswitchinterval(self.before)


_keys_first = _KeysFirst()


@dataclass(frozen=True)
class Row:
    conversation: Conversation
    snippet: str = ""  # the line of its text that matched (a full-text hit)


class SessionPicker:
    """The picker's state, its search line and its keys (`view` draws it); its work runs on trio."""

    def __init__(self, ui: ChatUI) -> None:
        self.ui = ui
        self.open = False
        self.buffer = Buffer(multiline=False, on_text_changed=lambda _: self._typed())
        self.conversations: list[Conversation] | None = None  # newest first; None while read
        self.index: ConversationIndex | None = None  # made in a thread (its imports take 80 ms)
        self.indexed = False  # the index holds the conversations now listed
        self.hits: tuple[str, list[SessionHit]] | None = None  # the last full-text search: query, hits
        self.rows: list[Row] = []
        self.selected = 0
        self.top = 0  # the first row shown
        self.problem: str | None = None  # why the saved conversations could not be read
        self._generation = 0  # each opening's work stops when a newer one starts
        self._wake: trio.Event | None = None
        self._typed_at = 0.0  # when a key last changed the query (monotonic)
        self.window = Window(BufferControl(self.buffer, key_bindings=self._key_bindings()), height=1,
                             get_line_prefix=lambda line, wrap_count: [("class:dim", " search: ")])
        self.view = PickerView(self)  # its part of the screen

    # -- opening and closing -------------------------------------------------------------
    def show(self, query: str = "") -> None:
        """Open it (from trio), the search line holding `query`."""
        self._generation += 1
        self.open = True
        self.problem = None
        self.indexed = False
        self.hits = None
        self.conversations = None
        self.selected = self.top = 0
        self.buffer.set_document(Document(query, len(query)), bypass_readonly=True)
        self._filter()
        self.ui.start_soon(self._work, self._generation)
        self.ui.refresh_now()

    def close(self) -> None:
        self.open = False
        self._generation += 1  # its work stops (an indexing thread at the next conversation)
        self._poke()
        self.buffer.reset()
        self.ui.refresh_now()

    def _poke(self) -> None:
        """Wake the trio side: the query changed, or the picker closed."""
        wake, token = self._wake, self.ui.token
        if wake is not None and token is not None:
            try:
                token.run_sync_soon(wake.set)
            except trio.RunFinishedError:
                pass

    # -- the work, on trio ------------------------------------------------------------------
    async def _work(self, generation: int) -> None:
        """Read the conversations, index them, then search what is typed until it closes
        (every read and search in a thread)."""
        store = self.ui.opts.store
        if store is None:
            self.conversations = []
            self._filter()
            return

        def alive() -> bool:  # (also read by the indexing thread, to stop at once)
            return self._generation == generation

        try:
            await self._steps(store, alive)
        except trio.Cancelled:  # the chat ends: its threads are left to stop on their own
            if alive():
                self._generation += 1
            raise
        except CrucibleError as exc:  # e.g. a conversation deleted meanwhile
            self.problem = exc.message
        except Exception as exc:  # the chat outlives its picker, whatever broke it
            self.problem = f"could not read the saved sessions: {getattr(exc, 'strerror', None) or exc}"
        if alive():
            self.ui.refresh_now()

    async def _steps(self, store: SessionStore, alive: Callable[[], bool]) -> None:
        # The threads are abandoned when the chat ends (not waited for): `alive` then says no,
        # and the indexing stops at the next conversation.
        def in_thread(fn: Callable[[], T]) -> Awaitable[T]:
            return trio.to_thread.run_sync(fn, abandon_on_cancel=True)

        convs = await in_thread(store.conversations)
        if not alive():
            return
        self.conversations = convs
        self._filter()
        self.ui.refresh_now()
        if self.index is None:
            self.index = await in_thread(ConversationIndex)
        index = self.index
        with _keys_first():
            done = await in_thread(lambda: index.refresh(store, convs, stop=lambda: not alive()))
        if not done:
            return
        self.indexed = True
        while alive():
            self._wake = trio.Event()
            query = self.buffer.text
            if query.strip() and (self.hits is None or self.hits[0] != query):
                pause = self._typed_at + SETTLE - time.monotonic()
                if pause > 0:  # still typing: search what is there once the keys pause
                    await trio.sleep(pause)
                    continue
                width = max(20, self.view.sizes()[0] - 6)
                with _keys_first():
                    hits = await in_thread(partial(index.search, store, query, TEXT_HITS, prefix=True,
                                                   snippets=SNIPPETS, snippet_width=width))
                if not alive():
                    return
                self.hits = (query, hits)
                self._filter()
                self.ui.refresh_now()
                continue  # typed meanwhile? search again
            self._filter()
            self.ui.refresh_now()
            await self._wake.wait()

    # -- what it lists ------------------------------------------------------------------------
    def _typed(self) -> None:
        """A key changed the query: the titles are matched at once, the text by the trio side."""
        self._typed_at = time.monotonic()
        self._filter()
        self._poke()

    def _filter(self) -> None:
        query = self.buffer.text.strip().lower()
        convs = self.conversations or []
        chosen = self.rows[self.selected].conversation.id if self.rows and self.selected < len(self.rows) else None
        if not query:
            rows = [Row(c) for c in convs]
        else:
            words = query.split()
            rows = [Row(c) for c in convs
                    if all(w in f"{c.title} {c.id} {c.agent}".lower() for w in words)]
            if self.hits is not None and self.hits[0].strip().lower() == query:
                titled = {row.conversation.id for row in rows}
                listed = {c.id for c in convs}
                rows += [Row(h.conversation, h.snippet) for h in self.hits[1]
                         if h.conversation.id not in titled and h.conversation.id in listed]
        self.rows = rows
        ids = [row.conversation.id for row in rows]
        self.selected = ids.index(chosen) if chosen in ids else 0
        self.top = min(self.top, self.selected)

    def move(self, by: int) -> None:
        if self.rows:
            self.selected = max(0, min(len(self.rows) - 1, self.selected + by))
        self.ui.refresh_now()

    def choose(self) -> None:
        """Enter: go on with the chosen conversation in this chat."""
        if not self.rows:
            self.ui.say_flash("nothing to resume: type fewer words, or Esc to close")
            return
        conv = self.rows[self.selected].conversation
        self.close()
        self.ui.to_trio(self.ui.loop.switch_to, conv)

    # -- its keys (the search line has them: nothing reaches the input box) ----------------------
    def _key_bindings(self) -> KeyBindings:
        kb = KeyBindings()

        @kb.add("up")
        def _up(event: KeyPressEvent) -> None:
            self.move(-1)

        @kb.add("down")
        def _down(event: KeyPressEvent) -> None:
            self.move(1)

        @kb.add("pageup")
        def _page_up(event: KeyPressEvent) -> None:
            self.move(-self.view.list_rows())

        @kb.add("pagedown")
        def _page_down(event: KeyPressEvent) -> None:
            self.move(self.view.list_rows())

        @kb.add("enter")
        def _enter(event: KeyPressEvent) -> None:
            self.choose()

        @kb.add("escape", eager=True)
        def _escape(event: KeyPressEvent) -> None:
            self.close()

        return kb
