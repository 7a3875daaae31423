"""`cru chat`: the full-screen terminal chat.

Layout, top to bottom: the transcript (transcript.py; the session's events drawn by feed.py,
a collapsible section per delegated child under the delegate_session call that started it,
children.py), the agent's plan and the status bar (status.py), the permission dialog when
something waits for the person (permissions.py), and the input box (input.py; its slash
commands in commands.py).

Threads of control: prompt-toolkit owns the asyncio loop and the keys; the session runs
on trio as its guest (see bridge.py; the agent session's life is agent.py). Key handlers hand
work to trio with `self.to_trio`; trio code changes the model and asks for a paced redraw.
The session's events reach the screen through the one pipeline (crucible/events.py), drawn
by `ChatFeed` (feed.py).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import trio
from prompt_toolkit.application import Application
from prompt_toolkit.filters import Condition
from prompt_toolkit.formatted_text import StyleAndTextTuples
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
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

from crucible.config import config_path, data_dir
from crucible.errors import CrucibleError
from crucible.session_store import SessionStore
from crucible.sessions import CrucibleSession, SessionOptions
from crucible.tui.agent import AgentLoop
from crucible.tui.bridge import Pacer, run_with_trio
from crucible.tui.children import Children
from crucible.tui.commands import Commands
from crucible.tui.elicitation import ElicitationQueue
from crucible.tui.feed import ChatFeed
from crucible.tui.input import ChatInput
from crucible.tui.permissions import (
    PermissionQueue,
    dialog_height,
    dialog_text,
    save_permission_rule,
)
from crucible.tui.status import StatusBar
from crucible.tui.style import STYLE
from crucible.tui.transcript import TextEntry, TranscriptControl


class ChatUI:
    """The chat's parts, its prompt-toolkit application and its trio side."""

    def __init__(self, opts: SessionOptions, history: History | None = None) -> None:
        self.queue = PermissionQueue(self.refresh_now)
        self.questions = ElicitationQueue(self.refresh_now)  # upstream MCP servers' questions
        # the caller's options stay as they were
        self.opts = replace(opts, asker=self.queue, elicitor=self.questions)
        self.session: CrucibleSession | None = None
        self.status = StatusBar(opts.agent.name + (f" › {opts.card.name}" if opts.card else ""))
        self.transcript = TranscriptControl()
        self.show_thoughts = True
        self._thoughts: list[TextEntry] = []
        self.feed = ChatFeed(self)
        self.children = Children(self.transcript, self.feed, self.new_thought)
        self.commands = Commands(self)
        self.last_ctrl_c = 0.0
        self.quitting = False
        self.agent_alive = False
        self.notes: list[str] = []
        # trio side (set in AgentLoop.main)
        self.token: trio.lowlevel.TrioToken | None = None
        self.nursery: trio.Nursery | None = None
        self.loop = AgentLoop(self)
        self.input = ChatInput(self, history)
        self.app: Application[None] = Application(
            layout=self._layout(), key_bindings=self.input.key_bindings(), style=STYLE, full_screen=True,
            mouse_support=False, max_render_postpone_time=None, refresh_interval=None,
        )
        self.pacer = Pacer(self.app)

    def _layout(self) -> Layout:
        status, queue, questions, buffer = self.status, self.queue, self.questions, self.input.buffer
        body = HSplit([
            Window(self.transcript, wrap_lines=False),
            ConditionalContainer(Window(FormattedTextControl(status.plan_text), height=status.plan_height,
                                        style="class:plan"), filter=Condition(lambda: bool(status.plan))),
            ConditionalContainer(Window(FormattedTextControl(lambda: dialog_text(queue, questions)),
                                        height=lambda: dialog_height(queue, questions), style="class:dialog", wrap_lines=True),
                                 filter=Condition(lambda: queue.current is not None or questions.current is not None)),
            Window(FormattedTextControl([("class:separator", "─" * 200)]), height=1, style="class:separator"),
            Window(BufferControl(buffer), wrap_lines=True,
                   height=lambda: Dimension.exact(min(6, max(1, buffer.document.line_count))),
                   get_line_prefix=lambda line, wrap: "› " if line == 0 and wrap == 0 else "  "),
            Window(FormattedTextControl(self._status_text), height=1, style="class:status"),
        ])
        root = FloatContainer(body, floats=[Float(xcursor=True, ycursor=True,
                                                  content=CompletionsMenu(max_height=8, scroll_offset=1))])
        return Layout(root, focused_element=buffer)

    def _status_text(self) -> StyleAndTextTuples:
        acp = self.session.acp if self.session is not None else None
        return self.status.text(acp, waiting=self.queue.current is not None or self.questions.current is not None)

    # -- drawing ---------------------------------------------------------------------------
    def refresh(self) -> None:
        """Output changed: a paced redraw."""
        self.pacer.request()

    def refresh_now(self) -> None:
        self.app.invalidate()

    def say_flash(self, text: str, seconds: float = 3.0) -> None:
        self.status.set_flash(text, seconds)
        self.refresh_now()
        if self.app.loop is not None:
            self.app.loop.call_later(seconds + 0.05, self.app.invalidate)

    def notice(self, text: str, style: str = "class:notice") -> None:
        self.feed.add_notice(text, style)
        self.refresh()

    def error(self, text: str) -> None:
        self.notice(text, "class:error")

    def new_thought(self, entry: TextEntry) -> None:
        entry.collapsed = not self.show_thoughts
        self._thoughts.append(entry)

    def toggle_thoughts(self) -> None:
        self.show_thoughts = not self.show_thoughts
        for entry in self._thoughts:
            entry.collapsed = not self.show_thoughts
        self.refresh_now()

    def toggle_newest_child(self) -> None:
        """Ctrl-O: the newest child section of this session."""
        section = self.children.newest()
        if section is None:
            self.say_flash("no child sessions yet")
            return
        section.set_collapsed(not section.collapsed)
        self.refresh_now()

    def terminal_text(self, terminal_id: str) -> str | None:
        return self.session.terminal_output(terminal_id) if self.session is not None else None

    def check_agent(self) -> None:
        session = self.session
        proc = session.client.process if session is not None and session.client is not None else None
        if proc is not None and proc.returncode is not None and self.agent_alive:
            self.agent_alive = False
            self.status.state = "agent stopped"
            self.notice("The agent stopped. Type /restart to start it again, or Ctrl-D to leave.", "class:error")
            self.loop.session_done.set()

    def agent_commands(self) -> dict[str, str]:
        session = self.session
        if session is None or session.acp is None:
            return {}
        return {c.name: c.description for c in session.acp.state.commands}

    # -- from the keys ---------------------------------------------------------------------
    def to_trio(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run an async function as a trio task (from a key handler)."""
        if self.token is None or self.nursery is None:
            return
        nursery = self.nursery
        try:
            self.token.run_sync_soon(lambda: nursery.start_soon(fn, *args))
        except trio.RunFinishedError:
            pass

    def answer_permission(self, key: str) -> None:
        answered = self.queue.answer(key)
        if answered is None:
            return
        label, rule = answered
        if rule is not None:
            self.to_trio(self.save_rule, *rule)

    async def save_rule(self, tool: str, rule: str) -> None:
        path = self.opts.config.source or config_path()
        try:
            await trio.to_thread.run_sync(save_permission_rule, path, tool, rule)
        except (OSError, CrucibleError) as exc:
            self.error(f"could not save the rule {tool} = {rule}: {getattr(exc, 'message', exc)}")
            return
        self.notice(f"saved [permissions] {tool} = \"{rule}\" in {path.name}")

    def on_ctrl_c(self) -> None:
        now = time.monotonic()
        if now - self.last_ctrl_c < 2.0:
            self.quit()
            return
        self.last_ctrl_c = now
        session = self.session
        if session is not None and session.acp is not None and session.acp.turn_running:
            self.status.state = "cancelling"
            self.say_flash("cancelling the turn (Ctrl-C again to leave)")
            self.to_trio(session.cancel)
        elif self.input.buffer.text:
            self.input.buffer.reset()
        else:
            self.say_flash("Ctrl-C again or Ctrl-D to leave")

    def quit(self) -> None:
        if self.quitting:
            return
        self.quitting = True
        self.status.state = "leaving"
        self.refresh_now()
        if self.token is None:
            return
        self.token.run_sync_soon(self.loop.stop)

    @property
    def restarted(self) -> bool:
        """This agent session follows another one (/restart)."""
        return self.loop.restarted


def run_tui(opts: SessionOptions) -> int:
    """`cru chat` without -p: the terminal chat. Returns the exit code."""
    if not sys.stdin.isatty() or not sys.stdout.isatty():
        raise CrucibleError("the interactive chat needs a terminal",
                            "run it in a terminal, or use `cru chat -p \"your question\"` in scripts")
    history: History
    try:
        folder = data_dir()
        folder.mkdir(parents=True, exist_ok=True)
        history = FileHistory(str(folder / "chat-history"))
    except OSError:
        history = InMemoryHistory()
    ui = ChatUI(replace(opts, store=opts.store or SessionStore()), history)
    result = run_with_trio(ui.app, ui.loop.main)
    return result or 0
