"""The chat's keys: what each key does (in the input box and around it; in the dialog while it
asks, where a key answers or does nothing), and what only keys do: Ctrl-C (cancel the turn,
hold the queued prompts; twice: leave), Ctrl-O (the newest child's section), Alt-↑/↓ (focus a
tool call) and Ctrl-E (show it in full). Terminals that tell Shift-Enter apart get a new line
from it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from prompt_toolkit.filters import Condition
from prompt_toolkit.input.ansi_escape_sequences import ANSI_SEQUENCES
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.keys import Keys

from crucible.tui.permissions import KEYS, Question
from crucible.tui.tool_calls import ToolEntry

if TYPE_CHECKING:
    from crucible.tui.app import ChatUI


def shift_enter_is_newline() -> None:
    """Terminals that tell Shift-Enter apart send CSI-u (kitty, foot, WezTerm) or xterm's
    modifyOtherKeys form; prompt-toolkit maps the latter to Enter. Both insert a new line here."""
    ANSI_SEQUENCES["\x1b[13;2u"] = Keys.ControlJ
    ANSI_SEQUENCES["\x1b[27;2;13~"] = Keys.ControlJ


class ChatKeys:
    """The chat's key bindings, and the state of the keys that act on the transcript."""

    def __init__(self, ui: ChatUI) -> None:
        self.ui = ui
        self.focused: ToolEntry | None = None  # the tool call Ctrl-E expands (Alt-↑/↓ moves)
        self.last_ctrl_c = 0.0
        shift_enter_is_newline()

    def dialog_bindings(self) -> KeyBindings:
        """The dialog's keys (it has the focus while it asks): a key answers the question, or
        does nothing."""
        ui = self.ui
        kb = KeyBindings()
        permission = Condition(lambda: ui.queue.current is not None)

        for key in KEYS:
            @kb.add(key, filter=permission)
            def _answer(event: KeyPressEvent, key: str = key) -> None:
                ui.answer_permission(key)

        @kb.add(Keys.Any)
        @kb.add("enter")
        @kb.add("tab")
        @kb.add("backspace")
        def _other(event: KeyPressEvent) -> None:
            if ui.queue.current is None:
                ui.answer_question(event.data)
            elif ui.settling is not None:
                ui.typed_over_dialog(event.data)  # a key right after a choice's key: typing
            else:
                ui.held_key(event.data)  # still typing: into the input box, and the hold goes on

        return kb

    def bindings(self) -> KeyBindings:
        """The keys everywhere else: the input box's, and the chat's."""
        ui, buffer = self.ui, self.ui.input.buffer
        kb = KeyBindings()
        dialog = Condition(lambda: ui.dialog_up)
        # An upstream MCP server's question (nothing else asked before it): typed, then Enter.
        question = Condition(lambda: not ui.dialog_up and ui.questions.answering)

        @kb.add("enter", filter=question)
        def _answer_question(event: KeyPressEvent) -> None:
            problem = ui.questions.answer(buffer.text)
            if problem is not None:
                ui.say_flash(problem)
            else:
                buffer.reset()

        @kb.add("escape", filter=question, eager=True)
        def _decline_question(event: KeyPressEvent) -> None:
            ui.questions.decline()

        @kb.add("enter", filter=~dialog & ~question)
        def _submit(event: KeyPressEvent) -> None:
            state = buffer.complete_state
            if state is not None and state.current_completion is not None:
                buffer.complete_state = None  # Enter takes the chosen completion
                return
            ui.input.submit()

        @kb.add("escape", "enter", filter=~dialog)
        @kb.add("c-j", filter=~dialog)
        def _newline(event: KeyPressEvent) -> None:
            buffer.insert_text("\n")

        @kb.add("c-c")
        @kb.add(Keys.SIGINT)
        def _ctrl_c(event: KeyPressEvent) -> None:
            self.on_ctrl_c()

        @kb.add("c-d", filter=Condition(lambda: not buffer.text))
        def _ctrl_d(event: KeyPressEvent) -> None:
            ui.quit()

        @kb.add("s-tab", filter=~dialog)
        def _mode(event: KeyPressEvent) -> None:
            ui.to_trio(ui.commands.cycle_mode)

        @kb.add("c-t")
        def _thoughts(event: KeyPressEvent) -> None:
            ui.toggle_thoughts()

        @kb.add("c-o")
        def _children(event: KeyPressEvent) -> None:
            self.toggle_newest_child()

        @kb.add("c-e", filter=~dialog)
        def _expand(event: KeyPressEvent) -> None:
            self.toggle_expand()

        @kb.add("escape", "up")
        def _focus_up(event: KeyPressEvent) -> None:
            self.move_focus(-1)

        @kb.add("escape", "down")
        def _focus_down(event: KeyPressEvent) -> None:
            self.move_focus(1)

        @kb.add("up", filter=Condition(lambda: not buffer.text and bool(ui.prompts.items) and not ui.dialog_up))
        def _edit_queued(event: KeyPressEvent) -> None:
            ui.input.edit_queued(None)

        @kb.add("pageup")
        def _up(event: KeyPressEvent) -> None:
            ui.transcript.page(1)

        @kb.add("pagedown")
        def _down(event: KeyPressEvent) -> None:
            ui.transcript.page(-1)

        return kb

    # -- Ctrl-C ------------------------------------------------------------------------------
    def on_ctrl_c(self) -> None:
        """Cancel the running turn; with prompts queued, hold them and ask whether to drop
        them. Twice within 2 s (while the hint says so): leave."""
        ui = self.ui
        now = time.monotonic()
        if now - self.last_ctrl_c < 2.0:
            ui.quit()
            return
        self.last_ctrl_c = now
        session = ui.session
        if session is not None and session.acp is not None and session.acp.turn_running:
            ui.status.state = "cancelling"
            ui.say_flash("cancelling the turn (Ctrl-C again to leave)")
            ui.to_trio(session.cancel)
            # (A /steer waiting is what the person just asked for: it goes without a question.)
            if ui.prompts.items and not any(item.steer for item in ui.prompts.items):
                self.ask_about_queue()
        elif ui.input.buffer.text:
            ui.input.buffer.reset()
        else:
            ui.say_flash("Ctrl-C again or Ctrl-D to leave")

    def ask_about_queue(self) -> None:
        """Hold the queued prompts until the person says whether they still want them sent."""
        ui = self.ui
        count = len(ui.prompts.items)
        ui.prompts.hold()

        def drop() -> None:
            ui.prompts.clear()
            ui.notice(f"dropped {count} queued prompt{'s' if count != 1 else ''}")

        def keep() -> None:
            ui.prompts.release()

        ui.ask(Question(f"The turn is cancelled. {count} prompt{'s are' if count != 1 else ' is'} queued: "
                        "send or drop?", {"d": ("drop them", drop), "k": ("keep: send them", keep)},
                        [item.text.strip().split("\n", 1)[0][:100] for item in list(ui.prompts.items)[:3]]))

    def forget_ctrl_c(self) -> None:
        """A turn started or ended: the hint of an earlier Ctrl-C goes, and so does its meaning
        (the next Ctrl-C cancels or warns; it does not leave)."""
        if self.last_ctrl_c:
            self.last_ctrl_c = 0.0
            self.ui.status.clear_flash()

    # -- the transcript: Ctrl-O a child's section; Alt-↑/↓ focus a tool call, Ctrl-E expands it
    def toggle_newest_child(self) -> None:
        """Ctrl-O: the newest child section of this session."""
        section = self.ui.children.newest()
        if section is None:
            self.ui.say_flash("no child sessions yet")
            return
        section.set_collapsed(not section.collapsed)
        self.ui.refresh_now()

    def move_focus(self, direction: int) -> None:
        """Alt-↑ / Alt-↓: focus the previous / next tool call of the session (Ctrl-E expands it)."""
        entries = [e for e in self.ui.transcript.entries if isinstance(e, ToolEntry)]
        if not entries:
            self.ui.say_flash("no tool calls yet")
            return
        if self.focused in entries:
            index = entries.index(self.focused) + direction
            index = max(0, min(len(entries) - 1, index))
        else:
            index = len(entries) - 1
        self.set_focus(entries[index])

    def set_focus(self, entry: ToolEntry | None) -> None:
        if self.focused is not None:
            self.focused.focused = False
            self.focused.redraw()
        self.focused = entry
        if entry is not None:
            entry.focused = True
            entry.redraw()
            self.ui.transcript.scroll_to(entry)
        self.ui.refresh_now()

    def toggle_expand(self) -> None:
        """Ctrl-E: the focused tool call (else the newest) in full, or cut again."""
        transcript = self.ui.transcript
        entry = self.focused
        if entry is None or entry not in transcript.entries:
            entry = next((e for e in reversed(transcript.entries) if isinstance(e, ToolEntry)), None)
        if entry is None:
            self.ui.say_flash("no tool calls yet")
            return
        entry.expanded = not entry.expanded
        entry.redraw()
        if self.focused is entry or transcript.scroll:
            transcript.scroll_to(entry)
        self.ui.say_flash("tool call shown in full" if entry.expanded else "tool call cut again")
