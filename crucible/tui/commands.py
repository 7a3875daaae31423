"""Slash commands: what the chat's own commands are, how a line is read as one, and what each does."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from crucible.terminal import sanitize

if TYPE_CHECKING:
    from crucible.tui.app import ChatUI

# Crucible's own commands (the agent's `available_commands` come beside them).
OWN_COMMANDS: dict[str, str] = {
    "help": "list the commands and keys",
    "cancel": "cancel the running turn (Ctrl-C)",
    "sessions": "list saved sessions",
    "card": "show the agent card of this session",
    "mcp": "the upstream MCP servers: up or down, their tools, the last error",
    "usage": "tokens and cost, this turn and this session",
    "children": "expand/collapse the delegated child sessions (/children open|close)",
    "mode": "list the agent's modes, or /mode ID to switch (Shift-Tab cycles)",
    "model": "list the models, or /model VALUE to switch",
    "restart": "start the agent again, the conversation going on",
    "exit": "leave the chat (Ctrl-D on an empty line)",
}


@dataclass(frozen=True)
class SlashCommand:
    name: str
    args: str
    own: bool


def parse_slash(text: str, agent_commands: Iterable[str]) -> SlashCommand | None:
    """`/name args` → a command of ours or of the agent; None for plain text (or `//text`)."""
    stripped = text.strip()
    if not stripped.startswith("/") or stripped.startswith("//"):
        return None
    name, _, args = stripped[1:].partition(" ")
    if name in OWN_COMMANDS or name == "quit":
        return SlashCommand("exit" if name == "quit" else name, args.strip(), True)
    if name in set(agent_commands):
        return SlashCommand(name, args.strip(), False)
    return SlashCommand(name, args.strip(), True)  # unknown: the app says so


HELP_KEYS = [
    ("Enter", "send"), ("Esc Enter / Shift-Enter / Ctrl-J", "new line"), ("Ctrl-C", "cancel the turn; twice: leave"),
    ("Ctrl-D", "leave (on an empty line)"), ("Shift-Tab", "next mode"), ("Ctrl-T", "show/hide thoughts"),
    ("Ctrl-O", "expand/collapse the newest child section"),
    ("PageUp / PageDown", "scroll"), ("@note", "attach a note from the kiln"),
]


class Commands:
    """The chat's own slash commands (`OWN_COMMANDS`), each a method named after it."""

    def __init__(self, ui: ChatUI) -> None:
        self.ui = ui

    async def run(self, name: str, args: str) -> None:
        handler = getattr(self, f"do_{name}", None) if name in OWN_COMMANDS else None
        if handler is None:
            self.ui.error(f"unknown command /{name}: /help lists the commands")
        else:
            await handler(args)
        self.ui.refresh()

    def _acp(self) -> Any:
        session = self.ui.session
        return session.acp if session is not None else None

    async def do_help(self, args: str) -> None:
        lines = ["Commands:"] + [f"  /{n:<9} {d}" for n, d in OWN_COMMANDS.items()]
        agent = self.ui.agent_commands()
        if agent:
            lines += ["The agent's commands:"] + [f"  /{n:<9} {sanitize(d)}" for n, d in agent.items()]
        lines += ["Keys:"] + [f"  {k:<22} {d}" for k, d in HELP_KEYS]
        self.ui.notice("\n".join(lines))

    async def do_exit(self, args: str) -> None:
        self.ui.quit()

    async def do_cancel(self, args: str) -> None:
        session, acp = self.ui.session, self._acp()
        if session is not None and acp is not None and acp.turn_running:
            self.ui.status.state = "cancelling"
            await session.cancel()
        else:
            self.ui.notice("no turn is running")

    async def do_usage(self, args: str) -> None:
        self.ui.notice(self.ui.status.usage_text())

    async def do_card(self, args: str) -> None:
        card = self.ui.opts.card
        if card is None:
            self.ui.notice("no agent card in this session (cru chat --card NAME)")
        else:
            rules = ", ".join(f"{k}={v}" for k, v in card.tools.items()) or "none"
            self.ui.notice(f"card {card.name}: {card.description}\ntool rules: {rules}")

    async def do_sessions(self, args: str) -> None:
        store = self.ui.opts.store
        if store is None:
            self.ui.notice("no sessions yet")
            return
        metas = await trio.to_thread.run_sync(store.list)
        if not metas:
            self.ui.notice("no saved sessions")
            return
        lines = ["Saved sessions (cru session resume ID):"]
        for meta in metas[:10]:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(meta.updated))
            lines.append(f"  {meta.id}  {when}  {meta.agent}  {sanitize(meta.title or '')[:40]}")
        self.ui.notice("\n".join(lines))

    async def do_mcp(self, args: str) -> None:
        """/mcp: the upstream MCP servers of this process (the gateway) and how each is."""
        from crucible.mcp_gateway import status_lines  # only /mcp reads the gateway's state

        session = self.ui.session
        gateway = session.bridge.gateway if session is not None and session.bridge is not None else None
        if gateway is None:
            self.ui.notice("no MCP servers configured: add [[mcp.servers]] to the config (see the README)")
            return
        self.ui.notice("\n".join(["MCP servers:"] + [sanitize(line) for line in status_lines(gateway.status())]))

    async def do_children(self, args: str) -> None:
        sections = self.ui.children.all()
        if args not in ("", "open", "close"):
            self.ui.error(f"/children {args}: use /children, /children open or /children close")
            return
        if not sections:
            self.ui.notice("no child sessions yet (they appear when the agent calls delegate_session)")
            return
        collapse = args == "close" or (args == "" and not any(s.collapsed for s in sections))
        for section in sections:
            section.set_collapsed(collapse)
        self.ui.say_flash(f"{len(sections)} child section{'s' if len(sections) != 1 else ''} "
                          + ("collapsed" if collapse else "expanded"))

    async def do_mode(self, args: str) -> None:
        acp = self._acp()
        if acp is None or not acp.state.modes:
            self.ui.notice("the agent offers no modes")
            return
        if not args:
            lines = ["Modes (/mode ID, Shift-Tab cycles):"]
            for mode in acp.state.modes:
                mark = "*" if mode.id == acp.state.current_mode else " "
                lines.append(f" {mark} {mode.id}  {sanitize(mode.name)}"
                             + (f" — {sanitize(mode.description)}" if mode.description else ""))
            self.ui.notice("\n".join(lines))
            return
        await self.set_mode(args)

    async def set_mode(self, mode_id: str) -> None:
        acp = self._acp()
        if acp is None:
            return
        if mode_id not in {m.id for m in acp.state.modes}:
            self.ui.error(f"no mode {mode_id}: /mode lists them")
            return
        try:
            await acp.set_mode(mode_id)
        except Exception as exc:  # the agent's refusal is shown, the chat goes on
            self.ui.error(f"the agent refused mode {mode_id}: {exc}")
            return
        self.ui.say_flash(f"mode: {mode_id}")

    async def cycle_mode(self) -> None:
        acp = self._acp()
        if acp is None or not acp.state.modes:
            self.ui.say_flash("the agent offers no modes")
            return
        ids = [m.id for m in acp.state.modes]
        current = acp.state.current_mode
        nxt = ids[(ids.index(current) + 1) % len(ids)] if current in ids else ids[0]
        await self.set_mode(nxt)

    async def do_model(self, args: str) -> None:
        acp = self._acp()
        models = acp.state.models if acp is not None else ()
        if acp is None or not models:
            self.ui.notice("the agent offers no model choice")
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
            self.ui.notice("\n".join(lines))
            return
        if values and args not in {v for v, _ in values}:
            self.ui.error(f"no model {args}: /model lists them")
            return
        try:
            await acp.set_config_option(option.id, args)
        except Exception as exc:  # the agent's refusal is shown, the chat goes on
            self.ui.error(f"the agent refused model {args}: {exc}")
            return
        self.ui.say_flash(f"model: {args}")

    async def do_restart(self, args: str) -> None:
        self.ui.notice("restarting the agent…")
        self.ui.loop.request_restart()
