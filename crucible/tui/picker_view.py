"""The /sessions picker drawn (picker.py holds its state, its search and its keys): its head, its
search line, the list of conversations — a row each (when, agent, turns, title), a full-text
hit with the line that matched under it, scrolled so the chosen one shows — and its keys on a
row like the dialog's; its place in the chat's layout. Titles and matched lines come from
agents: sanitized, one line, cut to the width."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prompt_toolkit.filters import Condition
from prompt_toolkit.formatted_text import StyleAndTextTuples
from prompt_toolkit.layout import ConditionalContainer, Container, HSplit, Window
from prompt_toolkit.layout.controls import FormattedTextControl
from prompt_toolkit.layout.dimension import Dimension

from crucible.session_store import when_text
from crucible.terminal import sanitize
from crucible.tui.markdown import Fragments, wrap
from crucible.tui.permissions import key_rows

if TYPE_CHECKING:
    from crucible.tui.picker import Row, SessionPicker

AGENT_CELLS = 14  # the agent (and card) column of a row
KEYS = [("↑↓", "move", "move"), ("Enter", "resume here", "resume"), ("Esc", "close", "close")]


def one_line(text: str) -> str:
    """An agent's title or a transcript's line as one safe row (escapes and secrets gone)."""
    return " ".join(sanitize(text).split())


class PickerView:
    """The picker's part of the screen, drawn from its state at each frame."""

    def __init__(self, picker: SessionPicker) -> None:
        self.picker = picker

    def sizes(self) -> tuple[int, int]:
        size = self.picker.ui.app.output.get_size()
        return size.columns, max(6, size.rows // 2)  # as much of the screen as the dialog may take

    def _key_rows(self, width: int) -> list[Fragments]:
        p = self.picker
        return key_rows(KEYS, width, f"{len(p.rows)} of {len(p.conversations or [])}")

    def list_rows(self) -> int:
        """The rows the list may take."""
        width, height = self.sizes()
        return max(1, height - 2 - len(self._key_rows(width)))

    def _list_height(self) -> int:
        """The rows the list takes now (a full-text hit has a second row: the line that matched)."""
        p = self.picker
        room = self.list_rows()
        if not p.rows:
            return 1
        used = 0
        for row in p.rows:
            used += 2 if row.snippet else 1
            if used >= room:
                return room
        return used

    def head_text(self) -> StyleAndTextTuples:
        p = self.picker
        width, _ = self.sizes()
        state = ""
        if p.problem is None and p.conversations is not None and not p.indexed:
            state = "  (indexing the text…)"  # titles match meanwhile
        line: Fragments = [("class:dialog.title", "Sessions: type to search titles and full text"),
                           ("class:dim", state)]
        return list(wrap(line, width)[0])

    def list_text(self) -> StyleAndTextTuples:
        p = self.picker
        width, _ = self.sizes()
        room = self.list_rows()
        if p.problem is not None:
            return [("class:error", one_line(p.problem)[:width])]
        if p.conversations is None:
            return [("class:dim", "  reading the saved sessions…")]
        if not p.rows:
            query = p.buffer.text.strip()
            if not p.conversations:
                said = "  no saved sessions yet"
            elif not p.indexed:
                said = f"  no title matches {one_line(query)!r}; searching the text…"
            else:
                said = f"  no saved session mentions {one_line(query)!r}"
            return [("class:dim", said[:width])]
        if p.selected < p.top:
            p.top = p.selected
        while p.top < p.selected and sum(
                2 if row.snippet else 1 for row in p.rows[p.top:p.selected + 1]) > room:
            p.top += 1  # the chosen one's rows are on screen
        lines: list[Fragments] = []
        for i in range(p.top, len(p.rows)):
            lines.extend(self._row(p.rows[i], i == p.selected, width))
            if len(lines) >= room:
                break
        out: StyleAndTextTuples = []
        for line in lines[:room]:
            if out:
                out.append(("", "\n"))
            out.extend(line)
        return out

    def _row(self, row: Row, selected: bool, width: int) -> list[Fragments]:
        """A conversation's row, and for a full-text hit the line that matched under it."""
        conv = row.conversation
        base = "class:focus" if selected else ""
        agent = one_line(conv.agent + (f" › {conv.card}" if conv.card else ""))
        agent = agent if len(agent) <= AGENT_CELLS else agent[:AGENT_CELLS - 1] + "…"
        turns = f"{conv.turns:>3} turn{'s' if conv.turns != 1 else ' '}"
        line: Fragments = [
            (base, "▶ " if selected else "  "),
            (base or "class:dim", f"{when_text(conv.updated)}  {agent:<{AGENT_CELLS}} {turns}  "),
            (base or "class:tool.title", one_line(conv.title) or "(untitled)"),
        ]
        session = self.picker.ui.session
        if session is not None and session.id in conv.ids:
            line.append(("class:dim", "  (this chat)"))
        rows = [wrap(line, width)[0]]
        if row.snippet:
            rows.append(wrap([("class:dim", "    " + one_line(row.snippet))], width)[0])
        return rows

    def keys_text(self) -> StyleAndTextTuples:
        width, _ = self.sizes()
        out: StyleAndTextTuples = []
        for i, row in enumerate(self._key_rows(width)):
            if i:
                out.append(("", "\n"))
            out.extend(row)
        return out

    def container(self) -> Container:
        """Its place in the chat's layout: where the dialog is, while no question is asked."""
        p = self.picker
        return ConditionalContainer(HSplit([
            Window(FormattedTextControl(self.head_text), height=1),
            p.window,
            Window(FormattedTextControl(self.list_text), height=lambda: Dimension.exact(self._list_height())),
            Window(FormattedTextControl(self.keys_text),
                   height=lambda: Dimension.exact(len(self._key_rows(self.sizes()[0])))),
        ], style="class:dialog"), filter=Condition(lambda: p.open and not p.ui.dialog_up))
