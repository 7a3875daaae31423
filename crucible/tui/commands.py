"""Slash commands: what the chat's own commands are, how a line is read as one, and what each does."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from crucible.config import config_path
from crucible.errors import CrucibleError
from crucible.kiln_calls import kiln_search_text
from crucible.terminal import counted, sanitize
from crucible.tui.permissions import Question, drop_permission_rule
from crucible.tui.transcript import TextEntry

if TYPE_CHECKING:
    from crucible.tui.app import ChatUI

# Crucible's own commands (the agent's `available_commands` come beside them).
OWN_COMMANDS: dict[str, str] = {
    "help": "list the commands and keys",
    "cancel": "cancel the running turn (Ctrl-C)",
    "sessions": "find a saved conversation (titles and text, any agent) and go on with it here",
    "card": "show the agent card of this session",
    "mcp": "the upstream MCP servers: up or down, their tools, the last error",
    "permissions": "the tool rules in effect; /permissions forget TOOL drops an 'always' answer",
    "usage": "tokens and cost, this turn and this session",
    "children": "expand/collapse the delegated child sessions (/children open|close)",
    "mode": "list the agent's modes, or /mode ID to switch (Shift-Tab cycles)",
    "model": "list the models, or /model VALUE to switch",
    "restart": "start the agent again, the conversation going on",
    "exit": "leave the chat (Ctrl-D on an empty line)",
    "steer": "/steer TEXT: cancel the turn and send TEXT, saying it interrupts",
    "queue": "the queued prompts; /queue edit N, /queue drop N|all",
    "copy": "the last answer to the clipboard (/copy N, /copy code [N])",
    "mouse": "/mouse off: the terminal selects; /mouse on: the wheel scrolls",
    "kiln-search": "your notes for WORDS (no agent turn)",
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
    ("Enter", "send (queued while a turn runs)"), ("Esc Enter / Shift-Enter / Ctrl-J", "new line"),
    ("Ctrl-C", "cancel the turn; twice: leave"),
    ("Ctrl-D", "leave (on an empty line)"), ("Shift-Tab", "next mode"), ("Ctrl-T", "show/hide thoughts"),
    ("Ctrl-O", "expand/collapse the newest child section"),
    ("Alt-↑ / Alt-↓", "focus the previous / next tool call"), ("Ctrl-E", "show the focused tool call in full"),
    ("↑ (empty input)", "take the last queued prompt back to edit it"),
    ("PageUp / PageDown / wheel", "scroll (Shift-drag selects text)"),
    ("@note, @image.png", "attach a note from the kiln, an image"),
]

# Words in a mode's id or name that say it runs tools without asking (Claude's bypassPermissions,
# Gemini's yolo, Codex's full-access): Shift-Tab asks before it switches to one.
BYPASS_WORDS = ("bypass", "yolo", "dangerous", "full-access", "full_access", "skip-permission",
                "skip_permission", "no-permission")


def bypasses_permissions(mode: Any) -> bool:
    text = f"{getattr(mode, 'id', '')} {getattr(mode, 'name', '')}".lower()
    return any(word in text for word in BYPASS_WORDS)


class Commands:
    """The chat's own slash commands (`OWN_COMMANDS`), each a method named after it."""

    def __init__(self, ui: ChatUI) -> None:
        self.ui = ui

    async def run(self, name: str, args: str) -> None:
        handler = getattr(self, f"do_{name.replace('-', '_')}", None) if name in OWN_COMMANDS else None
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
        # The keys as one paragraph (the chat wraps it at words): the whole help fits a small screen.
        lines += ["Keys: " + " · ".join(f"{k}: {d}" for k, d in HELP_KEYS)]
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

    async def do_permissions(self, args: str) -> None:
        """/permissions: where each tool decision comes from; `forget TOOL` undoes an "always"
        answer (remembered, or saved in the config with `s`/`x`)."""
        session = self.ui.session
        policy = session.policy if session is not None else None
        if policy is None:
            self.ui.notice("no session yet: the rules are listed once the agent is up")
            return
        verb, _, tool = args.strip().partition(" ")
        tool = tool.strip()
        if verb == "forget" and tool:
            await self._forget_rule(policy, tool)
            return
        if verb:
            self.ui.error(f"/permissions {args.strip()}: use /permissions or /permissions forget TOOL")
            return
        lines = ["Tool rules, consulted in this order (in each, the longest matching pattern decides):"]
        lines += [f"  {source}: {pattern} = {rule}" for source, pattern, rule in policy.rules()]
        lines += ["  otherwise: read-only tools run, tools that change things ask",
                  "/permissions forget TOOL drops an always-answer (and the config rule of that name)"]
        self.ui.notice(sanitize("\n".join(lines)))

    async def _forget_rule(self, policy: Any, tool: str) -> None:
        dropped = policy.forget(tool)
        path = self.ui.opts.config.source or config_path()
        try:
            if await trio.to_thread.run_sync(drop_permission_rule, path, tool):
                if not any(d.startswith("the config rule") for d in dropped):
                    dropped.append(f"the config rule {tool}")
                dropped[-1] += f" (removed from {path.name})"
        except (OSError, CrucibleError) as exc:
            self.ui.error(f"could not edit {path.name}: {getattr(exc, 'message', exc)}")
        card = [pattern for source, pattern, _ in policy.rules() if source.startswith("card") and pattern == tool]
        said = (f"forgot {' and '.join(dropped)}: {tool} follows the other rules now (/permissions lists them)"
                if dropped else f"no remembered answer or saved rule named {tool}")
        if card:
            said += f" (the card's own rule for {tool} stays: edit the card to change it)"
        self.ui.notice(sanitize(said))

    async def do_kiln_search(self, args: str) -> None:
        """/kiln-search WORDS: the kiln's notes for WORDS (as `cru acp`'s command), no model turn."""
        session = self.ui.session
        text = await kiln_search_text(session.bridge if session is not None else None, args.strip())
        self.ui.notice(sanitize(text))

    async def do_sessions(self, args: str) -> None:
        """/sessions [WORDS]: the picker over the saved conversations, searching WORDS."""
        self.ui.picker.show(args)

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
        if acp is None or not acp.state.mode_choices:
            self.ui.notice("the agent offers no modes")
            return
        if not args:
            lines = ["Modes (/mode ID, Shift-Tab cycles):"]
            for mode in acp.state.mode_choices:
                mark = "*" if mode.id == acp.state.mode_now else " "
                named = f"  {sanitize(mode.name)}" if mode.name != mode.id else ""  # OpenCode: id = name
                lines.append(f" {mark} {sanitize(mode.id)}{named}"
                             + (f" — {sanitize(mode.description)}" if mode.description else ""))
            self.ui.notice("\n".join(lines))
            return
        await self.set_mode(args)

    async def set_mode(self, mode_id: str) -> None:
        acp = self._acp()
        if acp is None:
            return
        if mode_id not in {m.id for m in acp.state.mode_choices}:
            self.ui.error(f"no mode {sanitize(mode_id)}: /mode lists them")
            return
        try:
            await acp.switch_mode(mode_id)
        except Exception as exc:  # the agent's refusal is shown, the chat goes on
            self.ui.error(f"the agent refused mode {sanitize(mode_id)}: {exc}")
            return
        if self.ui.session is not None:
            self.ui.session.chose("mode", mode_id)
        self.ui.say_flash(f"mode: {sanitize(mode_id)}")

    async def cycle_mode(self) -> None:
        acp = self._acp()
        if acp is None or not acp.state.mode_choices:
            self.ui.say_flash("the agent offers no modes")
            return
        modes = list(acp.state.mode_choices)
        ids = [m.id for m in modes]
        current = acp.state.mode_now
        index = (ids.index(current) + 1) % len(ids) if current in ids else 0
        if bypasses_permissions(modes[index]):
            self.ask_bypass(modes, index)
            return
        await self.set_mode(ids[index])

    def ask_bypass(self, modes: list[Any], index: int) -> None:
        """Shift-Tab reached a mode that runs tools without asking: switch only if the person says so."""
        mode = modes[index]
        acp = self._acp()
        current = acp.state.mode_now if acp is not None else None
        after = next((m.id for m in modes[index + 1:] + modes[:index] if not bypasses_permissions(m)), None)
        ui = self.ui
        choices = {"y": (f"switch to {sanitize(mode.id)}", lambda: ui.to_trio(self.set_mode, mode.id))}
        if after is not None and after != current:
            choices["s"] = (f"skip to {sanitize(after)}", lambda: ui.to_trio(self.set_mode, after))
        choices["n"] = ("stay", lambda: ui.say_flash("mode unchanged"))
        ui.ask(Question(f"Mode {sanitize(mode.name or mode.id)} lets the agent run tools without asking you. "
                        "Switch to it?", choices))

    async def do_model(self, args: str) -> None:
        acp = self._acp()
        choices = acp.state.model_choices if acp is not None else ()
        if acp is None or not choices:
            self.ui.notice("the agent offers no model choice")
            return
        if not args:
            current = acp.state.model_now
            lines = ["Models (/model VALUE):"] + [
                f" {'*' if c.id == current else ' '} {sanitize(c.id)}"
                + (f"  {sanitize(c.name)}" if c.name != c.id else "")
                + (f" — {sanitize(c.description)}" if c.description else "") for c in choices]
            self.ui.notice("\n".join(lines))
            return
        if args not in {c.id for c in choices}:
            self.ui.error(f"no model {sanitize(args)}: /model lists them")
            return
        try:
            await acp.switch_model(args)
        except Exception as exc:  # the agent's refusal is shown, the chat goes on
            self.ui.error(f"the agent refused model {sanitize(args)}: {exc}")
            return
        if self.ui.session is not None:
            self.ui.session.chose("model", args)
        self.ui.say_flash(f"model: {sanitize(args)}")

    async def do_restart(self, args: str) -> None:
        self.ui.notice("restarting the agent…")
        self.ui.loop.request_restart()

    async def do_steer(self, args: str) -> None:
        """Cancel the running turn and send TEXT next, as one step."""
        ui = self.ui
        if not args.strip():
            ui.error("/steer TEXT: say what the agent should do instead")
            return
        acp = self._acp()
        running = ui.session is not None and acp is not None and acp.turn_running
        if not running:
            ui.notice("no turn is running: sent as a plain prompt")
            ui.input.queue_prompt(args)
            return
        ui.input.queue_prompt(args, steer=True)
        ui.status.state = "cancelling"
        assert ui.session is not None
        await ui.session.cancel()

    async def do_queue(self, args: str) -> None:
        ui = self.ui
        verb, _, rest = args.partition(" ")
        rest = rest.strip()
        if not verb:
            ui.notice(ui.prompts.listing())
        elif verb == "drop" and rest == "all":
            count = ui.prompts.clear()
            ui.notice(f"dropped {count} queued prompt{'s' if count != 1 else ''}")
        elif verb in ("drop", "edit") and rest.isdigit() and 1 <= int(rest) <= len(ui.prompts.items):
            if verb == "edit":
                ui.input.edit_queued(int(rest))
            else:
                item = ui.prompts.take(int(rest))
                ui.notice(f"dropped: {sanitize(item.text.strip())[:80]}" if item else "nothing dropped")
        else:
            ui.error(f"/queue {args}: use /queue, /queue edit N, /queue drop N or /queue drop all "
                     f"({len(ui.prompts.items)} queued)")

    async def do_copy(self, args: str) -> None:
        """The last answer (or the Nth last; `code`: a code block) to the clipboard."""
        ui = self.ui
        words = args.split()
        code = bool(words) and words[0] == "code"
        number_text = words[1] if code and len(words) > 1 else (words[0] if words and not code else "1")
        if not number_text.isdigit() or int(number_text) < 1 or len(words) > (2 if code else 1):
            ui.error(f"/copy {args}: use /copy, /copy N, /copy code or /copy code N")
            return
        number = int(number_text)
        answers = [e for e in ui.transcript.entries if isinstance(e, TextEntry) and e.kind == "agent"]
        if code:
            blocks = [block for entry in answers for block in entry.code_blocks()]
            if len(blocks) < number:
                ui.error(f"there {'is' if len(blocks) == 1 else 'are'} {counted(len(blocks), 'code block')} "
                         "in the answers")
                return
            ui.copy(blocks[-number], "the code block" if number == 1 else f"code block {number} from the end")
            return
        if len(answers) < number:
            ui.error(f"there {'is' if len(answers) == 1 else 'are'} {counted(len(answers), 'answer')} to copy")
            return
        ui.copy(answers[-number].text(), "the last answer" if number == 1 else f"answer {number} from the end")

    async def do_mouse(self, args: str) -> None:
        ui = self.ui
        if args not in ("", "on", "off"):
            ui.error(f"/mouse {args}: use /mouse on or /mouse off")
            return
        ui.mouse = (not ui.mouse) if not args else args == "on"
        ui.say_flash("mouse on: the wheel scrolls (Shift-drag selects)" if ui.mouse
                     else "mouse off: the terminal selects and scrolls its own way")
