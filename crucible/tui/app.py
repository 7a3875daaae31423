"""`cru chat`: the full-screen terminal chat.

Layout, top to bottom: the transcript (streamed markdown, dimmed thoughts, tool calls with
their diffs and output, and a nested, collapsible section per delegated child session under
the delegate_session call that started it), the agent's plan, the permission dialog when
something waits for the person (a child's questions too, labelled with the chain), the input
box, and a status bar (state, agent, card, mode, model, tokens, cost).

Threads of control: prompt-toolkit owns the asyncio loop and the keys; the session runs
on trio as its guest (see bridge.py). Key handlers hand work to trio with `self.to_trio`;
trio code changes the model and asks for a paced redraw.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import trio
from prompt_toolkit.application import Application
from prompt_toolkit.buffer import Buffer
from prompt_toolkit.filters import Condition
from prompt_toolkit.formatted_text import StyleAndTextTuples
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.keys import Keys
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
from prompt_toolkit.styles import Style

from acp_host.session import (
    CommandsChanged,
    ConfigOptionsChanged,
    HistoryReplay,
    ModeChanged,
    PlanChanged,
    SessionError,
    SessionInfoChanged,
    ToolCallEvent,
    TurnEnded,
    UsageChanged,
)
from crucible.delegation import ChildEvent, ChildStatus, live_session
from crucible.errors import CrucibleError
from crucible.permissions import tool_key_from_acp
from crucible.sessions import BridgeHost, CrucibleSession, SessionOptions, open_session
from crucible.terminal import sanitize
from crucible.tui.bridge import Pacer, run_with_trio
from crucible.tui.commands import OWN_COMMANDS, ChatCompleter, mentions, parse_slash
from crucible.tui.elicitation import ElicitationQueue
from crucible.tui.markdown import Fragments
from crucible.tui.permissions import KEYS, PermissionQueue, save_permission_rule
from crucible.tui.transcript import (
    ChildSection,
    Feed,
    TextEntry,
    TranscriptControl,
    diff_lines,
    pretty,
    text_block_lines,
)

STYLE = Style.from_dict({
    "agent": "",
    "thought": "italic #8a8a8a",
    "user": "bold #5fafff",
    "notice": "#8a8a8a",
    "error": "bold #ff5f5f",
    "dim": "#8a8a8a",
    "md.heading": "bold underline",
    "md.bold": "bold",
    "md.italic": "italic",
    "md.code": "#d7af5f",
    "md.fence": "#6c6c6c",
    "md.bullet": "#5fafff",
    "md.quote": "italic #a8a8a8",
    "tool.title": "bold",
    "tool.ok": "#5fd75f",
    "tool.failed": "#ff5f5f",
    "tool.running": "#d7d75f",
    "tool.pending": "#a8a8a8",
    "tool.output": "#bcbcbc",
    "terminal": "#bcbcbc",
    "diff.add": "#5fd75f",
    "diff.del": "#ff5f5f",
    "diff.hunk": "#5fafd7",
    "diff.file": "bold",
    "plan": "#a8a8a8",
    "plan.active": "bold #d7d75f",
    "plan.done": "#5fd75f",
    "dialog": "bg:#262626",
    "dialog.title": "bold #ffaf00",
    "dialog.key": "bold reverse",
    "separator": "#4e4e4e",
    "status": "reverse",
    "status.flash": "reverse bold",
    "history": "#6c6c6c",
    "child.head": "bold #87afd7",
    "child.bar": "#5f87af",
})

MAX_SECTIONS = 500  # child sections the chat keeps track of (they stay in the transcript)

HELP_KEYS = [
    ("Enter", "send"), ("Esc Enter / Shift-Enter / Ctrl-J", "new line"), ("Ctrl-C", "cancel the turn; twice: leave"),
    ("Ctrl-D", "leave (on an empty line)"), ("Shift-Tab", "next mode"), ("Ctrl-T", "show/hide thoughts"),
    ("Ctrl-O", "expand/collapse the newest child section"),
    ("PageUp / PageDown", "scroll"), ("@note", "attach a note from the kiln"),
]


def _shift_enter_is_newline() -> None:
    """Terminals that tell Shift-Enter apart send CSI-u (kitty, foot, WezTerm) or xterm's
    modifyOtherKeys form; prompt-toolkit maps the latter to Enter. Both insert a new line here."""
    from prompt_toolkit.input.ansi_escape_sequences import ANSI_SEQUENCES

    ANSI_SEQUENCES["\x1b[13;2u"] = Keys.ControlJ
    ANSI_SEQUENCES["\x1b[27;2;13~"] = Keys.ControlJ


def _leaves(exc: BaseException) -> list[BaseException]:
    """The real errors inside (nested) exception groups from trio nurseries."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _fmt_tokens(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


class ChatUI:
    """The chat's state, its prompt-toolkit application and its trio side."""

    def __init__(self, opts: SessionOptions, history: History | None = None) -> None:
        self.opts = opts
        self.transcript = TranscriptControl()
        self.queue = PermissionQueue(self.refresh_now)
        opts.asker = self.queue
        self.questions = ElicitationQueue(self.refresh_now)  # upstream MCP servers' questions
        opts.elicitor = self.questions
        self.session: CrucibleSession | None = None
        self.state = "starting"
        self.flash = ""
        self.flash_until = 0.0
        self.last_ctrl_c = 0.0
        self.show_thoughts = True
        self.quitting = False
        self.agent_alive = False
        self.notes: list[str] = []
        self.plan: tuple[Any, ...] = ()
        self._thoughts: list[TextEntry] = []
        self.feed = Feed(self.transcript.add, terminal_text=self._terminal_text, on_thought=self._new_thought)
        # Delegated children: a section per (chain label, job id), placed under the
        # delegate_session call that started it: running calls without a section yet, in order.
        self._sections: dict[tuple[str, str], ChildSection] = {}
        self._section_order: deque[tuple[ChildSection, int]] = deque(maxlen=MAX_SECTIONS)  # (section, depth)
        self._delegate_calls: dict[str, Any] = {}
        self._anchored: set[str] = set()
        # usage
        self.context: tuple[int, int] | None = None
        self.cost: tuple[float, str] | None = None
        self.turn_start_cost = 0.0
        self.turn_tokens: int | None = None
        self.session_tokens = 0
        self.turns = 0
        # trio side (set in main)
        self.token: trio.lowlevel.TrioToken | None = None
        self.nursery: trio.Nursery | None = None
        self.session_scope: trio.CancelScope | None = None
        self.session_done = trio.Event()  # this agent session should end (agent died, /restart, quit)
        self.restart = trio.Event()  # between sessions: start the agent again
        self.restart_requested = False
        # /restart goes on with the same conversation: the agent reopens its session (its replay
        # is not drawn again) or gets the saved transcript as context.
        self.last_session_id: str | None = None
        self.restarted = False
        self.skipping_replay = False
        self.submit_send, self.submit_recv = trio.open_memory_channel[tuple[str, list[dict[str, Any]]]](64)

        _shift_enter_is_newline()
        self.input = Buffer(
            multiline=True, history=history or InMemoryHistory(), complete_while_typing=True,
            completer=ChatCompleter(self.agent_commands, lambda: self.notes),
        )
        self.app: Application[None] = Application(
            layout=self._layout(), key_bindings=self._keys(), style=STYLE, full_screen=True,
            mouse_support=False, max_render_postpone_time=None, refresh_interval=None,
        )
        self.pacer = Pacer(self.app)

    # -- layout ----------------------------------------------------------------------------
    def _layout(self) -> Layout:
        dialog_visible = Condition(lambda: self.queue.current is not None or self.questions.current is not None)
        plan_visible = Condition(lambda: bool(self.plan))
        body = HSplit([
            Window(self.transcript, wrap_lines=False),
            ConditionalContainer(Window(FormattedTextControl(self._plan_text), height=self._plan_height,
                                        style="class:plan"), filter=plan_visible),
            ConditionalContainer(Window(FormattedTextControl(self._dialog_text), height=self._dialog_height,
                                        style="class:dialog", wrap_lines=True), filter=dialog_visible),
            Window(FormattedTextControl(self._separator_text), height=1, style="class:separator"),
            Window(BufferControl(self.input), wrap_lines=True,
                   height=lambda: Dimension.exact(min(6, max(1, self.input.document.line_count))),
                   get_line_prefix=lambda line, wrap: "› " if line == 0 and wrap == 0 else "  "),
            Window(FormattedTextControl(self._status_text), height=1, style="class:status"),
        ])
        root = FloatContainer(body, floats=[Float(xcursor=True, ycursor=True,
                                                  content=CompletionsMenu(max_height=8, scroll_offset=1))])
        return Layout(root, focused_element=self.input)

    def _plan_height(self) -> Dimension:
        return Dimension.exact(min(6, len(self.plan) + 1))

    def _plan_text(self) -> StyleAndTextTuples:
        out: StyleAndTextTuples = [("class:plan", "Plan\n")]
        for entry in self.plan[:5]:
            status = getattr(entry, "status", "pending")
            mark, style = {"completed": ("[x]", "class:plan.done"),
                           "in_progress": ("[>]", "class:plan.active")}.get(status, ("[ ]", "class:plan"))
            out.append((style, f" {mark} {sanitize(str(getattr(entry, 'content', '')))}\n"))
        if len(self.plan) > 5:
            out.append(("class:plan", f"  … {len(self.plan) - 5} more\n"))
        return out

    def _dialog_lines(self) -> list[Fragments]:
        pending = self.queue.current
        if pending is None:
            return self.questions.dialog_lines()
        ask = pending.ask
        request = ask.request
        call = request.tool_call if request is not None else None
        kind = (call.kind if call is not None else None) or ("bridge tool" if ask.key.bridge else "other")
        lines: list[Fragments] = [
            [("class:dialog.title", f"Permission: {sanitize(ask.label)} wants to run "),
             ("class:tool.title", sanitize(ask.title)), ("class:dim", f"  [{sanitize(kind)}]")],
        ]
        details: list[Fragments] = []
        if call is not None and call.diffs:
            for diff in call.diffs:
                details.extend(diff_lines(diff))
        else:
            raw = call.raw_input if call is not None else ask.arguments
            if raw is None and ask.key.summary:
                raw = ask.key.summary
            if raw is not None:
                details.extend(text_block_lines(pretty(raw)))
        if len(details) > 6:
            details = details[:6] + [[("class:dim", f"  … {len(details) - 6} more lines")]]
        lines.extend(details)
        choices: Fragments = []
        for key in self.queue.offered_keys(pending):
            choices += [("class:dialog.key", f" {key} "), ("", f" {KEYS[key][2]}  ")]
        more = len(self.queue.items) - 1
        if more:
            choices.append(("class:dim", f"(+{more} waiting)"))
        lines.append(choices)
        return lines

    def _dialog_text(self) -> StyleAndTextTuples:
        out: StyleAndTextTuples = []
        for i, line in enumerate(self._dialog_lines()):
            if i:
                out.append(("", "\n"))
            out.extend(line)
        return out

    def _dialog_height(self) -> Dimension:
        return Dimension(min=2, max=10, preferred=len(self._dialog_lines()))

    def _separator_text(self) -> StyleAndTextTuples:
        return [("class:separator", "─" * 200)]

    def _status_text(self) -> StyleAndTextTuples:
        session = self.session
        waiting = self.queue.current is not None or self.questions.current is not None
        parts = ["waiting for your answer" if waiting else self.state]
        parts.append(self.opts.agent.name + (f" › {self.opts.card.name}" if self.opts.card else ""))
        if session is not None and session.acp is not None:
            st = session.acp.state
            if st.current_mode:
                parts.append(f"mode: {sanitize(st.current_mode)}")
            for option in st.models[:1]:
                parts.append(f"model: {sanitize(str(getattr(option, 'current_value', '')))}")
        if self.context is not None:
            parts.append(f"ctx {_fmt_tokens(self.context[0])}/{_fmt_tokens(self.context[1])}")
        if self.session_tokens:
            parts.append(f"{_fmt_tokens(self.session_tokens)} tok")
        if self.cost is not None:
            parts.append(f"{self.cost[0]:.4f} {self.cost[1]}")
        text = " " + " │ ".join(parts)
        if self.flash and time.monotonic() < self.flash_until:
            return [("class:status.flash", f" {self.flash} "), ("class:status", text)]
        return [("class:status", text)]

    # -- drawing ---------------------------------------------------------------------------
    def refresh(self) -> None:
        """Output changed: a paced redraw."""
        self.pacer.request()

    def refresh_now(self) -> None:
        self.app.invalidate()

    def say_flash(self, text: str, seconds: float = 3.0) -> None:
        self.flash = text
        self.flash_until = time.monotonic() + seconds
        self.refresh_now()
        if self.app.loop is not None:
            self.app.loop.call_later(seconds + 0.05, self.app.invalidate)

    @property
    def in_history(self) -> bool:
        return self.feed.history

    @in_history.setter
    def in_history(self, value: bool) -> None:
        self.feed.history = value

    def _end_text(self) -> None:
        self.feed.end_text()

    def notice(self, text: str, style: str = "class:notice") -> None:
        self.feed.notice(text, style)
        self.refresh()

    def error(self, text: str) -> None:
        self.notice(text, "class:error")

    def _text(self, kind: str, text: str, *, markdown: bool = True) -> None:
        self.feed.text(kind, text, markdown=markdown)

    def _new_thought(self, entry: TextEntry) -> None:
        entry.collapsed = not self.show_thoughts
        self._thoughts.append(entry)

    # -- events ----------------------------------------------------------------------------
    def show(self, event: Any) -> None:
        if self.skipping_replay:  # /restart: this history is on the screen already
            if isinstance(event, HistoryReplay) and not event.started:
                self.skipping_replay = False
            return
        if isinstance(event, HistoryReplay) and event.started and self.restarted:
            self.skipping_replay = True
            return
        if isinstance(event, ToolCallEvent):
            call = event.call
            raw = {"toolCallId": call.tool_call_id, "title": call.title, "kind": call.kind}
            if tool_key_from_acp(raw).name == "delegate_session":
                if call.status in ("completed", "failed"):  # too late to start a child now
                    self._delegate_calls.pop(call.tool_call_id, None)
                    self._anchored.discard(call.tool_call_id)
                elif call.tool_call_id not in self._anchored:
                    self._delegate_calls[call.tool_call_id] = call
        if self.feed.show(event):
            pass
        elif isinstance(event, PlanChanged):
            self.plan = event.entries
        elif isinstance(event, UsageChanged):
            self.context = (event.used, event.size)
            if event.cost is not None:
                self.cost = (event.cost.amount, event.cost.currency)
        elif isinstance(event, HistoryReplay):
            if event.started:
                self.notice("── history (replayed by the agent) ──", "class:history")
                self.in_history = True
            else:
                self._end_text()
                self.in_history = False
                self.notice("── end of history ──", "class:history")
        elif isinstance(event, TurnEnded):
            self._turn_ended(event)
        elif isinstance(event, SessionError):
            self.error(event.message)
            self._check_agent()
        elif isinstance(event, (ModeChanged, ConfigOptionsChanged, CommandsChanged, SessionInfoChanged)):
            pass  # the status bar and the completer read the session state
        self.refresh()

    def _terminal_text(self, terminal_id: str, session: CrucibleSession | None = None) -> str | None:
        session = session or self.session
        services = session.acp.services if session is not None and session.acp else None
        return services.output_so_far(terminal_id) if services is not None else None

    def _turn_ended(self, event: TurnEnded) -> None:
        self._end_text()
        self.turns += 1
        if event.usage is not None:
            self.turn_tokens = event.usage.total_tokens
            self.session_tokens += event.usage.total_tokens
        if event.error:
            self.error(f"the turn failed: {event.error}")
            self._check_agent()
        elif event.stop_reason == "cancelled":
            self.notice("the turn was cancelled")
        elif event.stop_reason != "end_turn":
            self.notice(f"the turn ended: {event.stop_reason}")

    def _check_agent(self) -> None:
        session = self.session
        proc = session.client.process if session is not None and session.client is not None else None
        if proc is not None and proc.returncode is not None and self.agent_alive:
            self.agent_alive = False
            self.state = "agent stopped"
            self.notice("The agent stopped. Type /restart to start it again, or Ctrl-D to leave.", "class:error")
            self.session_done.set()

    # -- delegated children ----------------------------------------------------------------
    def on_child_event(self, ev: ChildEvent) -> None:
        """The session's `on_child_event` hook (crucible/delegation.py): a child's (or
        grandchild's) event, drawn in that child's section."""
        key = (ev.label, ev.job_id)
        section = self._sections.get(key)
        restarted = isinstance(ev.event, ChildStatus) and ev.event.status == "queued"
        if section is None or (section.finished and restarted):  # job ids restart with a new session
            section = ChildSection(ev.label, ev.job_id, on_thought=self._new_thought)
            section.feed.terminal_text = self._child_terminal_text(section)
            if len(self._sections) >= MAX_SECTIONS:
                self._sections = {k: s for k, s in self._sections.items() if not s.finished}
            self._sections[key] = section
            self._place(section, ev.depth)
            self._section_order.append((section, ev.depth))
        section.session_id = ev.session_id or section.session_id
        section.show(ev.event)
        self.refresh()

    def _child_terminal_text(self, section: ChildSection) -> Callable[[str], str | None]:
        """A child's terminal output, read from the child session while it runs."""
        def text(terminal_id: str) -> str | None:
            child = live_session(section.session_id)
            return self._terminal_text(terminal_id, child) if child is not None else None

        return text

    def _place(self, section: ChildSection, depth: int) -> None:
        """A grandchild inside its parent's section; a child under the delegate_session call
        that started it (the oldest running one not taken yet), else at the end."""
        if depth > 1:
            parent_label = section.label.rsplit(" › ", 1)[0]
            for parent, _ in reversed(self._section_order):
                if parent.label == parent_label and not parent.finished:
                    parent.add_child(section)
                    return
        anchor = None
        call_id = next(iter(self._delegate_calls), None) if depth == 1 else None
        if call_id is not None:
            del self._delegate_calls[call_id]
            self._anchored.add(call_id)
            anchor = self.feed.tools.get(call_id)
        if anchor is None:
            self._end_text()
        self.transcript.insert_after(anchor, section)

    def toggle_newest_child(self) -> None:
        """Ctrl-O: the newest child of this session (a grandchild is inside its section)."""
        section = next((s for s, depth in reversed(self._section_order) if depth == 1), None)
        if section is None:
            self.say_flash("no child sessions yet")
            return
        section.set_collapsed(not section.collapsed)
        self.refresh_now()

    def children_command(self, args: str) -> None:
        sections = [s for s, _ in self._section_order]
        if args not in ("", "open", "close"):
            self.error(f"/children {args}: use /children, /children open or /children close")
            return
        if not sections:
            self.notice("no child sessions yet (they appear when the agent calls delegate_session)")
            return
        collapse = args == "close" or (args == "" and not any(s.collapsed for s in sections))
        for section in sections:
            section.set_collapsed(collapse)
        self.say_flash(f"{len(sections)} child section{'s' if len(sections) != 1 else ''} "
                       + ("collapsed" if collapse else "expanded"))

    # -- keys ------------------------------------------------------------------------------
    def _keys(self) -> KeyBindings:
        kb = KeyBindings()
        dialog = Condition(lambda: self.queue.current is not None)
        question = Condition(lambda: self.queue.current is None and self.questions.current is not None)

        @kb.add("enter", filter=question)
        def _answer_question(event: KeyPressEvent) -> None:
            problem = self.questions.answer(self.input.text)
            if problem is not None:
                self.say_flash(problem)
            else:
                self.input.reset()

        @kb.add("escape", filter=question, eager=True)
        def _decline_question(event: KeyPressEvent) -> None:
            self.questions.decline()

        for key in KEYS:
            @kb.add(key, filter=dialog, eager=True)
            def _answer(event: KeyPressEvent, key: str = key) -> None:
                self.answer_permission(key)

        @kb.add("enter", filter=~dialog & ~question)
        def _submit(event: KeyPressEvent) -> None:
            state = self.input.complete_state
            if state is not None and state.current_completion is not None:
                self.input.complete_state = None  # Enter takes the chosen completion
                return
            self.submit()

        @kb.add("escape", "enter")
        @kb.add("c-j")
        def _newline(event: KeyPressEvent) -> None:
            self.input.insert_text("\n")

        @kb.add("c-c")
        @kb.add(Keys.SIGINT)
        def _ctrl_c(event: KeyPressEvent) -> None:
            self.on_ctrl_c()

        @kb.add("c-d", filter=Condition(lambda: not self.input.text))
        def _ctrl_d(event: KeyPressEvent) -> None:
            self.quit()

        @kb.add("s-tab")
        def _mode(event: KeyPressEvent) -> None:
            self.to_trio(self.cycle_mode)

        @kb.add("c-t")
        def _thoughts(event: KeyPressEvent) -> None:
            self.show_thoughts = not self.show_thoughts
            for entry in self._thoughts:
                entry.collapsed = not self.show_thoughts
            self.refresh_now()

        @kb.add("c-o")
        def _children(event: KeyPressEvent) -> None:
            self.toggle_newest_child()

        @kb.add("pageup")
        def _up(event: KeyPressEvent) -> None:
            self.transcript.page(1)

        @kb.add("pagedown")
        def _down(event: KeyPressEvent) -> None:
            self.transcript.page(-1)

        return kb

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
        from crucible.config import config_path

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
            self.state = "cancelling"
            self.say_flash("cancelling the turn (Ctrl-C again to leave)")
            self.to_trio(session.cancel)
        elif self.input.text:
            self.input.reset()
        else:
            self.say_flash("Ctrl-C again or Ctrl-D to leave")

    def quit(self) -> None:
        if self.quitting:
            return
        self.quitting = True
        self.state = "leaving"
        self.refresh_now()
        if self.token is None:
            return
        self.token.run_sync_soon(self._quit_in_trio)

    def _quit_in_trio(self) -> None:
        if self.session_scope is not None:
            self.session_scope.cancel()
        self.session_done.set()
        self.restart.set()

    # -- input -----------------------------------------------------------------------------
    def agent_commands(self) -> dict[str, str]:
        session = self.session
        if session is None or session.acp is None:
            return {}
        return {c.name: c.description for c in session.acp.state.commands}

    def submit(self) -> None:
        text = self.input.text
        if not text.strip():
            return
        self.input.append_to_history()
        self.input.reset()
        self.transcript.scroll = 0
        command = parse_slash(text, self.agent_commands())
        if command is not None and command.own:
            self.to_trio(self.run_command, command.name, command.args)
            return
        self.to_trio(self.send_prompt, text)

    async def send_prompt(self, text: str) -> None:
        self._end_text()
        entry = TextEntry("user", markdown=False)
        entry.append("› " + text)
        entry.finish()
        self.transcript.add(entry)
        starting = self.state == "starting agent"
        if not self.agent_alive and not starting:
            self.error("the agent is not running: /restart starts it again")
            return
        blocks = await self.mention_blocks(text)
        running = self.session is not None and self.session.acp is not None and self.session.acp.turn_running
        if starting:
            self.notice("(queued: sent when the agent is ready)")
        elif running:
            self.notice("(queued: sent when the current turn ends)")
        self.refresh()
        try:
            self.submit_send.send_nowait((text, blocks))
        except trio.WouldBlock:
            self.error("too many messages are waiting; wait for the turn to end")

    async def mention_blocks(self, text: str) -> list[dict[str, Any]]:
        """Each `@note` that names a note in the kiln becomes an embedded resource (or inline
        text when the agent cannot take embedded context)."""
        from crucible.kiln.paths import resolve_in_kiln

        names = list(dict.fromkeys(mentions(text)))
        if not names:
            return []
        session = self.session
        caps = session.client.capabilities if session is not None and session.client is not None else None
        prompt_caps = getattr(caps, "prompt_capabilities", None)
        embedded = bool(getattr(prompt_caps, "embedded_context", False))
        blocks: list[dict[str, Any]] = []
        for name in names:
            rel = name if name.endswith(".md") else name + ".md"
            def load(rel: str = rel) -> str:
                path = resolve_in_kiln(self.opts.kiln, rel, must_exist=True)
                return path.read_text(encoding="utf-8", errors="replace")

            try:
                body = await trio.to_thread.run_sync(load)
            except (CrucibleError, OSError):
                self.notice(f"@{name}: no such note in the kiln; sent as plain text")
                continue
            if embedded:
                blocks.append({"type": "resource", "resource": {"uri": f"kiln://notes/{rel}", "text": body,
                                                                "mimeType": "text/markdown"}})
            else:
                blocks.append({"type": "text", "text": f"<note path=\"{rel}\">\n{body}\n</note>"})
            self.notice(f"attached {rel} ({len(body)} characters)")
        return blocks

    # -- commands --------------------------------------------------------------------------
    async def run_command(self, name: str, args: str) -> None:
        session = self.session
        acp = session.acp if session is not None else None
        if name == "help":
            lines = ["Commands:"] + [f"  /{n:<9} {d}" for n, d in OWN_COMMANDS.items()]
            agent = self.agent_commands()
            if agent:
                lines += ["The agent's commands:"] + [f"  /{n:<9} {sanitize(d)}" for n, d in agent.items()]
            lines += ["Keys:"] + [f"  {k:<22} {d}" for k, d in HELP_KEYS]
            self.notice("\n".join(lines))
        elif name == "exit":
            self.quit()
        elif name == "cancel":
            if session is not None and acp is not None and acp.turn_running:
                self.state = "cancelling"
                await session.cancel()
            else:
                self.notice("no turn is running")
        elif name == "usage":
            self.notice(self.usage_text())
        elif name == "card":
            card = self.opts.card
            if card is None:
                self.notice("no agent card in this session (cru chat --card NAME)")
            else:
                rules = ", ".join(f"{k}={v}" for k, v in card.tools.items()) or "none"
                self.notice(f"card {card.name}: {card.description}\ntool rules: {rules}")
        elif name == "sessions":
            await self.list_sessions()
        elif name == "mcp":
            self.mcp_command()
        elif name == "children":
            self.children_command(args)
        elif name == "mode":
            await self.mode_command(args)
        elif name == "model":
            await self.model_command(args)
        elif name == "restart":
            self.notice("restarting the agent…")
            if self.session is not None:
                self.restart_requested = True
                self.session_done.set()
            else:
                self.restart.set()
        else:
            self.error(f"unknown command /{name}: /help lists the commands")
        self.refresh()

    def mcp_command(self) -> None:
        """/mcp: the upstream MCP servers of this process (the gateway) and how each is."""
        from crucible.mcp_gateway import status_lines

        gateway = self.session.bridge.gateway if self.session is not None and self.session.bridge else None
        if gateway is None:
            self.notice("no MCP servers configured: add [[mcp.servers]] to the config (see the README)")
            return
        self.notice("\n".join(["MCP servers:"] + [sanitize(line) for line in status_lines(gateway.status())]))

    def usage_text(self) -> str:
        lines = []
        if self.turn_tokens is not None:
            lines.append(f"last turn: {self.turn_tokens} tokens")
        lines.append(f"this session: {self.session_tokens} tokens over {self.turns} turns")
        if self.cost is not None:
            lines.append(f"cost: {self.cost[0] - self.turn_start_cost:.4f} {self.cost[1]} last turn, "
                         f"{self.cost[0]:.4f} {self.cost[1]} this session")
        if self.context is not None:
            lines.append(f"context: {self.context[0]} of {self.context[1]} tokens")
        if len(lines) == 1 and not self.session_tokens:
            lines.append("(the agent has not reported usage yet)")
        return "\n".join(lines)

    async def list_sessions(self) -> None:
        store = self.opts.store
        if store is None:
            self.notice("no sessions yet")
            return
        metas = await trio.to_thread.run_sync(store.list)
        if not metas:
            self.notice("no saved sessions")
            return
        lines = ["Saved sessions (cru session resume ID):"]
        for meta in metas[:10]:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(meta.updated))
            lines.append(f"  {meta.id}  {when}  {meta.agent}  {sanitize(meta.title or '')[:40]}")
        self.notice("\n".join(lines))

    async def mode_command(self, args: str) -> None:
        acp = self.session.acp if self.session is not None else None
        if acp is None or not acp.state.modes:
            self.notice("the agent offers no modes")
            return
        if not args:
            lines = ["Modes (/mode ID, Shift-Tab cycles):"]
            for mode in acp.state.modes:
                mark = "*" if mode.id == acp.state.current_mode else " "
                lines.append(f" {mark} {mode.id}  {sanitize(mode.name)}"
                             + (f" — {sanitize(mode.description)}" if mode.description else ""))
            self.notice("\n".join(lines))
            return
        await self.set_mode(args)

    async def set_mode(self, mode_id: str) -> None:
        acp = self.session.acp if self.session is not None else None
        if acp is None:
            return
        if mode_id not in {m.id for m in acp.state.modes}:
            self.error(f"no mode {mode_id}: /mode lists them")
            return
        try:
            await acp.set_mode(mode_id)
        except Exception as exc:  # the agent's refusal is shown, the chat goes on
            self.error(f"the agent refused mode {mode_id}: {exc}")
            return
        self.say_flash(f"mode: {mode_id}")

    async def cycle_mode(self) -> None:
        acp = self.session.acp if self.session is not None else None
        if acp is None or not acp.state.modes:
            self.say_flash("the agent offers no modes")
            return
        ids = [m.id for m in acp.state.modes]
        current = acp.state.current_mode
        nxt = ids[(ids.index(current) + 1) % len(ids)] if current in ids else ids[0]
        await self.set_mode(nxt)

    async def model_command(self, args: str) -> None:
        acp = self.session.acp if self.session is not None else None
        models = acp.state.models if acp is not None else ()
        if acp is None or not models:
            self.notice("the agent offers no model choice")
            return
        option = models[0]
        values: list[tuple[str, str]] = []
        for item in getattr(option, "options", []) or []:
            if hasattr(item, "value"):
                values.append((item.value, item.name))
            for sub in getattr(item, "options", []) or []:
                values.append((sub.value, sub.name))
        if not args:
            current = getattr(option, "current_value", None)
            lines = ["Models (/model VALUE):"] + [f" {'*' if v == current else ' '} {sanitize(v)}  {sanitize(n)}"
                                                  for v, n in values]
            self.notice("\n".join(lines))
            return
        if values and args not in {v for v, _ in values}:
            self.error(f"no model {args}: /model lists them")
            return
        try:
            await acp.set_config_option(option.id, args)
        except Exception as exc:  # the agent's refusal is shown, the chat goes on
            self.error(f"the agent refused model {args}: {exc}")
            return
        self.say_flash(f"model: {args}")

    # -- trio main -------------------------------------------------------------------------
    async def main(self) -> int:
        self.token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            nursery.start_soon(self.load_notes)
            async with BridgeHost().running() as host:
                first = True
                while not self.quitting:
                    self.session_done = trio.Event()
                    await self.run_session(host, first)
                    first = False
                    if self.quitting:
                        break
                    if not self.restart_requested:
                        self.restart = trio.Event()
                        await self.restart.wait()  # /restart or leave
                    self.restart_requested = False
            nursery.cancel_scope.cancel()
        return 0

    async def load_notes(self) -> None:
        from crucible.kiln.paths import iter_markdown

        def scan() -> list[str]:
            out = []
            for rel in iter_markdown(self.opts.kiln):
                out.append(rel)
                if len(out) >= 20000:
                    break
            return sorted(out)

        try:
            self.notes = await trio.to_thread.run_sync(scan)
        except OSError as exc:
            self.notice(f"could not list the kiln's notes for @mentions: {exc}")

    async def run_session(self, host: BridgeHost, first: bool) -> None:
        self.restarted = not first
        if not first:
            self.opts.resume = self.last_session_id
        self.state = "starting agent"
        self.refresh_now()
        with trio.CancelScope() as scope:
            self.session_scope = scope
            try:
                async with open_session(self.opts, host) as session:
                    self.session = session
                    self.last_session_id = session.id
                    self.agent_alive = True
                    session.on_notice = self.notice
                    session.on_child_event = self.on_child_event
                    for warning in session.warnings:
                        self.notice(f"warning: {warning}")
                    self.state = "ready"
                    await self._show_saved_history(session)
                    self.refresh_now()
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self.pump_events, session)
                        nursery.start_soon(self.run_turns, session)
                        await self.session_done.wait()
                        nursery.cancel_scope.cancel()
            except Exception as exc:  # the chat outlives its agent session, whatever broke it
                for leaf in _leaves(exc):
                    if isinstance(leaf, CrucibleError):
                        self.error(leaf.message + (f"\nfix: {leaf.fix}" if leaf.fix else ""))
                    else:
                        self.error(f"the agent session failed: {sanitize(str(leaf)) or type(leaf).__name__}")
                self.notice("/restart tries again; Ctrl-D leaves")
            finally:
                self.agent_alive = False
                self.session = None
                self.session_scope = None
                self.plan = ()
                self.state = "leaving" if self.quitting else "agent stopped"
                self.refresh_now()

    async def _show_saved_history(self, session: CrucibleSession) -> None:
        """Resumed: the agent replays its history itself (session/load, shown from the event
        stream), or it does not (session/resume, or a new session with the transcript as
        context): then show our own saved transcript, as history."""
        resumed = self.opts.resume
        if not resumed or self.opts.store is None or self.restarted:
            return
        caps = session.client.capabilities if session.client is not None else None
        has_resume = getattr(getattr(caps, "session_capabilities", None), "resume", None) is not None
        if session.resumed_natively and not has_resume:
            return  # session/load: the replay is in the event stream
        store = self.opts.store
        events = await trio.to_thread.run_sync(lambda: list(store.events(resumed)))
        self.notice(f"── history (saved session {resumed}) ──", "class:history")
        self.in_history = True
        for ev in events:
            kind = ev.get("type")
            if kind in ("user_message", "history_user_message"):
                self._end_text()
                self._text("user", "› " + str(ev.get("text", "")), markdown=False)
                self._end_text()
            elif kind == "agent_message":
                self._text("agent", str(ev.get("text", "")))
            elif kind == "tool_call" and ev.get("status") in ("completed", "failed"):
                self.notice(f"tool {ev.get('title') or ev.get('id')} [{ev.get('kind')}] {ev.get('status')}",
                            "class:history")
        self._end_text()
        self.in_history = False
        self.notice("── end of history ──", "class:history")

    async def pump_events(self, session: CrucibleSession) -> None:
        assert session.acp is not None
        channel = session.acp.events
        while True:
            try:
                batch = [await channel.receive()]
            except (trio.EndOfChannel, trio.ClosedResourceError):
                break
            # Drain what is already there: one wake-up per batch, not per chunk.
            while len(batch) < 256:
                try:
                    batch.append(channel.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                    break
            for event in batch:
                session.record(event)
                self.show(event)
        self._check_agent()

    async def run_turns(self, session: CrucibleSession) -> None:
        assert session.acp is not None
        while True:
            text, blocks = await self.submit_recv.receive()
            self.state = "running"
            self.turn_start_cost = self.cost[0] if self.cost is not None else 0.0
            self.refresh_now()
            try:
                await session.prompt(text, blocks or None)
            except RuntimeError as exc:
                self.error(f"could not send the prompt: {exc}")
            self.state = "ready" if self.agent_alive else "agent stopped"
            self.refresh_now()


def run_tui(opts: SessionOptions) -> int:
    """`cru chat` without -p: the terminal chat. Returns the exit code."""
    import sys

    from crucible.config import data_dir
    from crucible.session_store import SessionStore

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
    opts.store = opts.store or SessionStore()
    ui = ChatUI(opts, history)
    result = run_with_trio(ui.app, ui.main)
    return result or 0
