"""The chat's screen, top to bottom: the transcript (transcript.py; the session's events drawn
by feed.py, a collapsible section per delegated child under the delegate_session call that
started it, children.py; the mouse wheel scrolls it), the agent's plan (status.py), the dialog
when something waits for the person (permissions.py: a permission, or one of the chat's own
questions), the /sessions picker in the dialog's place (picker_view.py), the prompts queued
for the agent (prompts.py), the input box (input.py; its slash commands in commands.py) and
the status bar (status.py). Completions float at the cursor."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prompt_toolkit.filters import Condition
from prompt_toolkit.formatted_text import StyleAndTextTuples
from prompt_toolkit.layout import (
    ConditionalContainer,
    Float,
    FloatContainer,
    HSplit,
    Layout,
    Window,
)
from prompt_toolkit.layout.controls import BufferControl, FormattedTextControl
from prompt_toolkit.layout.dimension import Dimension
from prompt_toolkit.layout.menus import CompletionsMenu

from crucible.tui.permissions import dialog_height, dialog_text

if TYPE_CHECKING:
    from crucible.tui.app import ChatUI


class ChatScreen:
    """The chat's layout, and the windows the keys go to (`ChatUI.refresh_now` focuses one)."""

    def __init__(self, ui: ChatUI) -> None:
        self.ui = ui
        status, queue, questions, buffer, prompts = ui.status, ui.queue, ui.questions, ui.input.buffer, \
            ui.prompts
        # The dialog takes the keys while it asks (focused: keys that do not answer it go nowhere,
        # none reaches the input box); the input box has them back when it goes. An upstream
        # server's question is answered in the input box: the dialog shows it without the focus.
        self.dialog_window = Window(
            FormattedTextControl(lambda: dialog_text(queue, ui.question, questions), focusable=True,
                                 show_cursor=False, key_bindings=ui.keys.dialog_bindings()),
            height=lambda: dialog_height(queue, ui.question, questions), style="class:dialog", wrap_lines=False)
        self.input_window = Window(BufferControl(buffer), wrap_lines=True,
                                   height=lambda: Dimension.exact(min(6, max(1, buffer.document.line_count))),
                                   get_line_prefix=lambda line, wrap: "› " if line == 0 and wrap == 0 else "  ")
        body = HSplit([
            Window(ui.transcript, wrap_lines=False),
            ConditionalContainer(Window(FormattedTextControl(status.plan_text), height=status.plan_height,
                                        style="class:plan"), filter=Condition(lambda: bool(status.plan))),
            ConditionalContainer(self.dialog_window,
                                 filter=Condition(lambda: ui.dialog_up or questions.current is not None)),
            ui.picker.view.container(),
            ConditionalContainer(Window(FormattedTextControl(lambda: prompts.text(self._columns())),
                                        height=lambda: Dimension.exact(prompts.height()), style="class:queue"),
                                 filter=Condition(lambda: bool(prompts.items))),
            Window(FormattedTextControl([("class:separator", "─" * 200)]), height=1, style="class:separator"),
            self.input_window,
            Window(FormattedTextControl(self._status_text), height=1, style="class:status"),
        ])
        root = FloatContainer(body, floats=[Float(xcursor=True, ycursor=True,
                                                  content=CompletionsMenu(max_height=8, scroll_offset=1))])
        self.layout = Layout(root, focused_element=buffer)

    def _status_text(self) -> StyleAndTextTuples:
        ui = self.ui
        acp = ui.session.acp if ui.session is not None else None
        return ui.status.text(acp, waiting=ui.dialog_up or ui.questions.current is not None,
                              scrolled=ui.transcript.scroll > 0, width=self._columns())

    def _columns(self) -> int:
        return self.ui.app.output.get_size().columns
