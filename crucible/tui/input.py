"""The input box: its buffer, completion (slash commands, `@note` paths), the keys of the chat,
and sending what was typed (a prompt, with each `@note` attached, or a slash command)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import trio
from prompt_toolkit.buffer import Buffer
from prompt_toolkit.completion import CompleteEvent, Completer, Completion
from prompt_toolkit.document import Document
from prompt_toolkit.filters import Condition
from prompt_toolkit.history import History, InMemoryHistory
from prompt_toolkit.input.ansi_escape_sequences import ANSI_SEQUENCES
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.keys import Keys

from crucible.errors import CrucibleError
from crucible.kiln.paths import resolve_in_kiln
from crucible.tui.commands import OWN_COMMANDS, parse_slash
from crucible.tui.permissions import KEYS
from crucible.tui.transcript import TextEntry

if TYPE_CHECKING:
    from crucible.tui.app import ChatUI


# `@path` or `@"path with spaces"`, starting a word.
MENTION = re.compile(r'(?<!\S)@(?:"([^"]+)"|([^\s"]+))')


def mentions(text: str) -> list[str]:
    return [m.group(1) or m.group(2) for m in MENTION.finditer(text)]


class ChatCompleter(Completer):
    """Slash commands at the start of the input, note paths after `@`."""

    def __init__(self, agent_commands: Callable[[], dict[str, str]], notes: Callable[[], list[str]]) -> None:
        self.agent_commands = agent_commands
        self.notes = notes

    def get_completions(self, document: Document, complete_event: CompleteEvent) -> Iterator[Completion]:
        before = document.text_before_cursor
        if before.startswith("/") and " " not in before and "\n" not in before:
            word = before[1:]
            seen = set()
            for name, desc in [*OWN_COMMANDS.items(), *self.agent_commands().items()]:
                if name.startswith(word) and name not in seen:
                    seen.add(name)
                    yield Completion("/" + name, start_position=-len(before), display="/" + name,
                                     display_meta=desc[:60])
            return
        m = re.search(r'(?<!\S)@("?)([^\s"]*)$', before)
        if m is None:
            return
        typed = m.group(2).lower()
        count = 0
        for path in self.notes():
            low = path.lower()
            if typed in low:
                text = f'@"{path}"' if " " in path else f"@{path}"
                yield Completion(text, start_position=-(len(m.group(0))), display=path)
                count += 1
                if count >= 50:
                    return


def shift_enter_is_newline() -> None:
    """Terminals that tell Shift-Enter apart send CSI-u (kitty, foot, WezTerm) or xterm's
    modifyOtherKeys form; prompt-toolkit maps the latter to Enter. Both insert a new line here."""
    ANSI_SEQUENCES["\x1b[13;2u"] = Keys.ControlJ
    ANSI_SEQUENCES["\x1b[27;2;13~"] = Keys.ControlJ


class ChatInput:
    """What the person types, and what becomes of it."""

    def __init__(self, ui: ChatUI, history: History | None = None) -> None:
        self.ui = ui
        shift_enter_is_newline()
        self.buffer = Buffer(
            multiline=True, history=history or InMemoryHistory(), complete_while_typing=True,
            completer=ChatCompleter(ui.agent_commands, lambda: ui.notes),
        )
        # Prompts wait here for the session (a turn running, or the agent still starting).
        self.send, self.receive = trio.open_memory_channel[tuple[str, list[dict[str, Any]]]](64)

    def key_bindings(self) -> KeyBindings:
        ui, buffer = self.ui, self.buffer
        kb = KeyBindings()
        dialog = Condition(lambda: ui.queue.current is not None)
        # An upstream MCP server's question (no permission request before it): typed, then Enter.
        question = Condition(lambda: ui.queue.current is None and ui.questions.current is not None)

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

        for key in KEYS:
            @kb.add(key, filter=dialog, eager=True)
            def _answer(event: KeyPressEvent, key: str = key) -> None:
                ui.answer_permission(key)

        @kb.add("enter", filter=~dialog & ~question)
        def _submit(event: KeyPressEvent) -> None:
            state = buffer.complete_state
            if state is not None and state.current_completion is not None:
                buffer.complete_state = None  # Enter takes the chosen completion
                return
            self.submit()

        @kb.add("escape", "enter")
        @kb.add("c-j")
        def _newline(event: KeyPressEvent) -> None:
            buffer.insert_text("\n")

        @kb.add("c-c")
        @kb.add(Keys.SIGINT)
        def _ctrl_c(event: KeyPressEvent) -> None:
            ui.on_ctrl_c()

        @kb.add("c-d", filter=Condition(lambda: not buffer.text))
        def _ctrl_d(event: KeyPressEvent) -> None:
            ui.quit()

        @kb.add("s-tab")
        def _mode(event: KeyPressEvent) -> None:
            ui.to_trio(ui.commands.cycle_mode)

        @kb.add("c-t")
        def _thoughts(event: KeyPressEvent) -> None:
            ui.toggle_thoughts()

        @kb.add("c-o")
        def _children(event: KeyPressEvent) -> None:
            ui.toggle_newest_child()

        @kb.add("pageup")
        def _up(event: KeyPressEvent) -> None:
            ui.transcript.page(1)

        @kb.add("pagedown")
        def _down(event: KeyPressEvent) -> None:
            ui.transcript.page(-1)

        return kb

    def submit(self) -> None:
        text = self.buffer.text
        if not text.strip():
            return
        self.buffer.append_to_history()
        self.buffer.reset()
        ui = self.ui
        ui.transcript.scroll = 0
        command = parse_slash(text, ui.agent_commands())
        if command is not None and command.own:
            ui.to_trio(ui.commands.run, command.name, command.args)
            return
        ui.to_trio(self.send_prompt, text)

    async def send_prompt(self, text: str) -> None:
        ui = self.ui
        ui.feed.end_text()
        entry = TextEntry("user", markdown=False)
        entry.append("› " + text)
        entry.finish()
        ui.transcript.add(entry)
        starting = ui.status.state in ("starting", "starting agent")  # queued until the agent is up
        if not ui.agent_alive and not starting:
            ui.error("the agent is not running: /restart starts it again")
            return
        blocks = await self.mention_blocks(text)
        session = ui.session
        running = session is not None and session.acp is not None and session.acp.turn_running
        if starting:
            ui.notice("(queued: sent when the agent is ready)")
        elif running:
            ui.notice("(queued: sent when the current turn ends)")
        ui.refresh()
        try:
            self.send.send_nowait((text, blocks))
        except trio.WouldBlock:
            ui.error("too many messages are waiting; wait for the turn to end")

    async def mention_blocks(self, text: str) -> list[dict[str, Any]]:
        """Each `@note` that names a note in the kiln becomes an embedded resource (or inline
        text when the agent cannot take embedded context)."""
        names = list(dict.fromkeys(mentions(text)))
        if not names:
            return []
        ui = self.ui
        session = ui.session
        caps = session.client.capabilities if session is not None and session.client is not None else None
        prompt_caps = getattr(caps, "prompt_capabilities", None)
        embedded = bool(getattr(prompt_caps, "embedded_context", False))
        blocks: list[dict[str, Any]] = []
        for name in names:
            rel = name if name.endswith(".md") else name + ".md"
            def load(rel: str = rel) -> str:
                path = resolve_in_kiln(ui.opts.kiln, rel, must_exist=True)
                return path.read_text(encoding="utf-8", errors="replace")

            try:
                body = await trio.to_thread.run_sync(load)
            except (CrucibleError, OSError):
                ui.notice(f"@{name}: no such note in the kiln; sent as plain text")
                continue
            if embedded:
                blocks.append({"type": "resource", "resource": {"uri": f"kiln://notes/{rel}", "text": body,
                                                                "mimeType": "text/markdown"}})
            else:
                blocks.append({"type": "text", "text": f"<note path=\"{rel}\">\n{body}\n</note>"})
            ui.notice(f"attached {rel} ({len(body)} characters)")
        return blocks
