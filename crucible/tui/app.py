"""`cru chat`: the full-screen terminal chat, its parts wired together.

The screen, top to bottom, is layout.py; the keys are keys.py. When the chat ends, the
transcript is written to the terminal's normal screen (so it stays in its scrollback), then
the session's ID and how to resume it.

Threads of control: prompt-toolkit owns the asyncio loop and the keys; the session runs
on trio as its guest (see bridge.py; the agent session's life is agent.py). Key handlers hand
work to trio with `ChatUI.to_trio`; trio code changes the model and asks for a paced redraw.
The session's events reach the screen through the one pipeline (crucible/events.py), drawn
by `ChatFeed` (feed.py).
"""

from __future__ import annotations

import base64
import errno
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

import trio
from prompt_toolkit.application import Application
from prompt_toolkit.filters import Condition
from prompt_toolkit.formatted_text import FormattedText, StyleAndTextTuples
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.shortcuts import print_formatted_text

from crucible import hard_stop
from crucible.config import config_path, data_dir
from crucible.errors import CrucibleError
from crucible.permissions import Rule
from crucible.private_files import open_private, private_dir
from crucible.session_store import SessionStore
from crucible.sessions import CrucibleSession, SessionOptions
from crucible.terminal import log_lines_to
from crucible.tui.agent import AgentLoop
from crucible.tui.bridge import Pacer, run_with_trio
from crucible.tui.children import Children
from crucible.tui.commands import Commands
from crucible.tui.elicitation import ElicitationQueue
from crucible.tui.feed import ChatFeed
from crucible.tui.input import ChatInput
from crucible.tui.keys import ChatKeys
from crucible.tui.layout import ChatScreen
from crucible.tui.permissions import SETTLE, PermissionQueue, Question, save_permission_rule
from crucible.tui.picker import SessionPicker
from crucible.tui.prompts import PromptQueue
from crucible.tui.status import StatusBar
from crucible.tui.style import STYLE
from crucible.tui.transcript import TextEntry, TranscriptControl

SCROLLBACK_ROWS = 20000  # of the transcript written to the normal screen at the end
OSC52_MAX = 1_000_000  # bytes of text sent to the clipboard at once (terminals cap it anyway)


class ChatUI:
    """The chat's parts, its prompt-toolkit application and its trio side."""

    def __init__(self, opts: SessionOptions, history: History | None = None) -> None:
        self.queue = PermissionQueue(self.permissions_changed)
        self.queue.kiln, self.queue.cwd = opts.kiln, opts.cwd
        # upstream MCP servers' questions
        self.questions = ElicitationQueue(self.refresh_now, lambda: not self.input.buffer.text)
        # the caller's options stay as they were
        self.opts = replace(opts, asker=self.queue, elicitor=self.questions)
        self.prompts = PromptQueue(self.refresh_now)
        self.question: Question | None = None  # the chat's own question in the dialog
        # A choice's key pressed and not yet acted on (another key within SETTLE: typing)
        self.settling: tuple[str, Any] | None = None
        self.mouse = True  # the wheel scrolls; /mouse off hands the mouse back to the terminal
        self.session: CrucibleSession | None = None
        self.status = StatusBar(opts.agent.name + (f" › {opts.card.name}" if opts.card else ""))
        self.transcript = TranscriptControl()
        self.show_thoughts = True
        self._thoughts: list[TextEntry] = []
        self.feed = ChatFeed(self)
        self.children = Children(self.transcript, self.feed, self.new_thought)
        self.commands = Commands(self)
        self.picker = SessionPicker(self)  # /sessions
        self.quitting = False
        self.agent_alive = False
        self.notes: list[str] = []
        self.log_lines_held: list[str] = []  # logged while trio is not running: shown at its start, else after
        self._log_line_shown = ""
        # trio side (set in AgentLoop.main)
        self.token: trio.lowlevel.TrioToken | None = None
        self.nursery: trio.Nursery | None = None
        self.loop = AgentLoop(self)
        self.input = ChatInput(self, history)
        self.queue.typing = self.input.typing
        self.keys = ChatKeys(self)
        self.screen = ChatScreen(self)
        self.app: Application[None] = Application(
            layout=self.screen.layout, key_bindings=self.keys.bindings(), style=STYLE, full_screen=True,
            mouse_support=Condition(lambda: self.mouse), max_render_postpone_time=None, refresh_interval=None,
        )
        self.pacer = Pacer(self.app)

    @property
    def dialog_up(self) -> bool:
        """The dialog asks something the keys answer (a permission, or the chat's own question):
        none reaches the input box."""
        return self.queue.current is not None or self.question is not None

    # -- drawing ---------------------------------------------------------------------------
    def refresh(self) -> None:
        """Output changed: a paced redraw."""
        self.pacer.request()

    def index_changed_from_thread(self) -> None:
        """The kiln's index changed (from its indexing thread): the bar is drawn again, and a
        failed build is said in the chat once, with its whole reason."""
        token = self.token
        if token is not None:
            try:
                token.run_sync_soon(self.index_changed)
            except trio.RunFinishedError:
                pass

    def index_changed(self) -> None:
        text = self.status.index_failure_notice()
        if text is not None:
            self.notice(f"warning: {text}")
        self.refresh()

    def refresh_now(self) -> None:
        # The keys go to what asks: a question first, then the /sessions picker, else the input box.
        screen = self.screen
        target = screen.dialog_window if self.dialog_up else self.picker.window if self.picker.open \
            else screen.input_window
        if not self.app.layout.has_focus(target):
            self.app.layout.focus(target)
        self.app.invalidate()

    def say_flash(self, text: str, seconds: float = 3.0) -> None:
        self.status.set_flash(text, seconds)
        self.refresh_now()
        if self.app.loop is not None:
            self.app.loop.call_later(seconds + 0.05, self.app.invalidate)

    def notice(self, text: str, style: str = "class:notice") -> None:
        self.feed.add_notice(text, style)
        self.refresh()

    def log_line(self, text: str) -> None:
        """A log line of this process, from any thread (`terminal.log_lines_to`): a notice in the
        chat, not twice in a row (a line a loop repeats is one line)."""
        token = self.token
        if token is None:
            self.log_lines_held.append(text)
            return
        try:
            token.run_sync_soon(self.show_log_line, text)
        except trio.RunFinishedError:
            self.log_lines_held.append(text)

    def show_log_line(self, text: str) -> None:
        if text != self._log_line_shown:
            self._log_line_shown = text
            self.notice(text)

    def error(self, text: str) -> None:
        self.notice(text, "class:error")

    def use_options(self, opts: SessionOptions) -> None:
        """The next agent session's options (another saved conversation, from /sessions): the
        status bar names its agent, the dialog reads its kiln and cwd, @mentions its notes."""
        kiln_changed = opts.kiln != self.opts.kiln
        self.opts = opts
        self.queue.kiln, self.queue.cwd = opts.kiln, opts.cwd
        self.status.label = opts.agent.name + (f" › {opts.card.name}" if opts.card else "")
        if kiln_changed:
            self.start_soon(self.loop.load_notes)

    def new_thought(self, entry: TextEntry) -> None:
        entry.collapsed = not self.show_thoughts
        self._thoughts.append(entry)

    def toggle_thoughts(self) -> None:
        self.show_thoughts = not self.show_thoughts
        for entry in self._thoughts:
            entry.collapsed = not self.show_thoughts
        self.refresh_now()

    def permissions_changed(self) -> None:
        """The dialog's permission question changed: the call it shows draws its diff there only."""
        for entry in self.feed.tools.values():
            asking = self.queue.asks_about(entry.call)
            if asking != entry.asking:
                entry.asking = asking
                entry.redraw()
        self.refresh_now()

    def ask(self, question: Question) -> None:
        """One of the chat's own questions, in the dialog (after any permission question)."""
        self.question = question
        self.refresh_now()

    def answer_question(self, key: str) -> None:
        question = self.question
        if question is None or self.queue.current is not None or key not in question.choices:
            return
        self.question = None
        question.choices[key][1]()
        self.refresh_now()

    def copy(self, text: str, what: str) -> None:
        """Put `text` on the clipboard through the terminal (OSC 52: works over ssh and in tmux
        with set-clipboard on)."""
        data = text.encode("utf-8")
        if len(data) > OSC52_MAX:
            self.error(f"{what} is {len(data)} bytes: too big for the clipboard through the terminal "
                       f"(at most {OSC52_MAX}); `cru session show` prints the whole session")
            return
        self.app.output.write_raw("\x1b]52;c;" + base64.b64encode(data).decode("ascii") + "\x07")
        self.app.output.flush()
        self.say_flash(f"copied {what} ({len(text)} characters) to the clipboard")

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
    def start_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run an async function as a trio task (from trio code)."""
        if self.nursery is not None:
            self.nursery.start_soon(fn, *args)

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
        """A choice's key in the dialog: it answers once no other key follows it within SETTLE
        (a sentence typed without noticing the dialog must not answer it with its first letter:
        `a draft…` would allow always)."""
        if self.held_key(key):
            return
        if self.settling is not None:  # a key right after a choice's key: typing
            self.typed_over_dialog(key)
            return
        pending = self.queue.current
        if pending is None or key not in self.queue.offered_keys(pending):
            return  # not a choice here: nothing happens
        self.settling = (key, pending)
        if self.app.loop is None:  # (not running: nothing can follow)
            self._settle(key, pending)
        else:
            self.app.loop.call_later(SETTLE, self._settle, key, pending)

    def _settle(self, key: str, pending: Any) -> None:
        if self.settling != (key, pending):
            return  # typing, after all
        self.settling = None
        if self.queue.current is not pending:
            return  # withdrawn (the turn was cancelled) meanwhile
        answered = self.queue.answer(key)
        if answered is not None and answered[1] is not None:
            self.to_trio(self.save_rule, *answered[1])

    def typed_over_dialog(self, data: str) -> None:
        """Another key came right after a choice's key: the person is typing, not answering.
        Both go into the input box and the dialog holds its keys until they pause."""
        if self.settling is None:
            return
        key, _ = self.settling
        self.settling = None
        self.input.buffer.insert_text(key)
        self.queue.hold()
        self.held_key(data)

    def held_key(self, data: str) -> bool:
        """A key pressed while the dialog holds its keys (the person was typing when it opened,
        or typed over it): it goes on into the input box, where they were typing. False when
        not held."""
        if not self.queue.holding():
            return False
        buffer = self.input.buffer
        if data in ("\x7f", "\x08"):
            buffer.delete_before_cursor(1)
        elif data.isprintable():
            buffer.insert_text(data)
        self.say_flash("you were typing when this was asked: your keys went on into the input; pause, then answer")
        return True

    async def save_rule(self, tool: str, rule: str) -> None:
        path = self.opts.config.source or config_path()
        try:
            await trio.to_thread.run_sync(save_permission_rule, path, tool, rule)
        except (OSError, CrucibleError) as exc:
            self.error(f"could not save the rule {tool} = {rule}: {getattr(exc, 'message', exc)}")
            return
        if self.session is not None:  # in effect now, as the file says (/permissions lists it there)
            policy = self.session.policy
            policy.config_rules = {**policy.config_rules, tool: cast(Rule, rule)}
        self.notice(f"saved [permissions] {tool} = \"{rule}\" in {path.name}")

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
        folder = private_dir(data_dir())
        open_private(folder / "chat-history", "a").close()  # the person's prompts: 0600
        history = FileHistory(str(folder / "chat-history"))
    except OSError:
        history = InMemoryHistory()
    ui = ChatUI(replace(opts, store=opts.store or SessionStore()), history)
    try:
        with log_lines_to(ui.log_line):
            result = run_with_trio(ui.app, ui.loop.main)
    except OSError as exc:
        if exc.errno != errno.EIO or not hard_stop.received:
            raise
        return hard_stop.exit_code()  # the terminal closed (SIGHUP): none left to restore
    if hard_stop.received:
        return hard_stop.exit_code()  # stopped at once: no scrollback written to a closing terminal
    write_scrollback(ui)
    for line in dict.fromkeys(ui.log_lines_held):  # logged as the chat closed: not lost
        sys.stderr.write(line + "\n")
    return result or 0


def write_scrollback(ui: ChatUI) -> None:
    """After the full screen is gone: the conversation on the normal screen, so the terminal's
    scrollback keeps it, then the session's ID and the command that resumes it."""
    output = ui.app.output
    width = max(20, output.get_size().columns)
    rows = ui.transcript.rows_for_scrollback(width, SCROLLBACK_ROWS)
    text: StyleAndTextTuples = []
    for row in rows:
        text.extend(row)
        text.append(("", "\n"))
    if text:
        print_formatted_text(FormattedText(text), style=STYLE, output=output, end="")
    session_id = ui.loop.last_session_id
    if session_id is not None and ui.loop.prompts_sent:
        print_formatted_text(FormattedText([("class:dim", "─" * min(width, 60) + "\n"),
                                            ("", f"Session {session_id} is saved. Resume it with:\n"),
                                            ("class:tool.title", f"  cru session resume {session_id}")]),
                             style=STYLE, output=output)
    output.flush()
