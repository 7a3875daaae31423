"""`cru chat`: one turn headless with `-p`, or the terminal chat (crucible/tui).

Headless (`-p TEXT`): the agent's message text goes to stdout as it streams; tool calls,
permissions and errors go to stderr as short lines; exit 0 when the turn ends with
`end_turn`, 130 when cancelled with Ctrl-C, 1 otherwise. `--format json` prints one JSON
object per event on stdout instead. Permission requests follow `--approve-all` /
`--deny-all`, else the card policy, else deny.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import IO, Any

import trio

from crucible.errors import CrucibleError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CANCELLED = 130
# After a headless turn nothing more is asked of the agent, and the transcript is written:
# claude-agent-acp never exits on stdin EOF, so waiting the usual 2 s before SIGTERM only
# delays the person. Agents that do exit on EOF (opencode, gemini) do it well within this.
HEADLESS_EXIT_GRACE = 0.5


def build_options(args: argparse.Namespace) -> Any:
    """Config, kiln, card and agent from the command line (shared by chat, session create, acp)."""
    from acp_host.registry import AgentRegistryError, resolve_agent
    from crucible.config import load_config, resolve_kiln
    from crucible.sessions import SessionOptions, approve_all_asker, deny_all_asker, deny_asker

    config = load_config(getattr(args, "config", None))
    kiln = resolve_kiln(getattr(args, "kiln", None), config)
    cwd = Path(getattr(args, "cwd", None) or os.getcwd()).resolve()
    if not cwd.is_dir():
        raise CrucibleError(f"--cwd {getattr(args, 'cwd', '')} is not a folder", "pass an existing folder")
    card = None
    if getattr(args, "card", None):  # cards (ruamel.yaml) load only when asked: the agent starts after this
        from crucible.cards import get_card

        card = get_card(args.card, kiln, cwd)
    name = getattr(args, "agent", None) or (card.agent if card else None) or config.default_agent
    try:
        spec = resolve_agent(None if getattr(args, "agent_command", None) else name,
                             agent_command=getattr(args, "agent_command", None), profiles=config.agents)
    except AgentRegistryError as exc:
        raise CrucibleError(exc.message, exc.fix) from None
    if not spec.found:
        from acp_host.registry import install_hint

        raise CrucibleError(f"the agent {spec.name} is not installed ({spec.source})", install_hint(spec.name))
    if getattr(args, "approve_all", False):
        asker = approve_all_asker()
    elif getattr(args, "deny_all", False):
        asker = deny_all_asker()
    else:
        asker = deny_asker
    record = Path(args.record) if getattr(args, "record", None) else None
    return SessionOptions(agent=spec, kiln=kiln, cwd=cwd, config=config, card=card, asker=asker, record=record,
                          resume=getattr(args, "resume", None))


def cmd_chat(args: argparse.Namespace) -> int:
    opts = build_options(args)
    if args.prompt is not None:
        return trio.run(run_headless, opts, args.prompt, args.format)
    try:
        from crucible.tui.app import run_tui  # type: ignore[import-not-found,unused-ignore]
    except ModuleNotFoundError:
        raise CrucibleError("the interactive chat is not in this version yet",
                            "run one turn with `cru chat -p \"your question\"`") from None
    result: int = run_tui(opts)
    return result


def cmd_session_create(args: argparse.Namespace) -> int:
    """`cru session create --agent CARD`: a session from a card, as `cru chat --card CARD`."""
    ns = argparse.Namespace(**{**vars(args), "card": args.agent, "agent": None, "agent_command": None,
                               "cwd": None, "prompt": None, "format": "text", "approve_all": False,
                               "deny_all": False, "record": None, "resume": None})
    return cmd_chat(ns)


# -- headless --------------------------------------------------------------------------------


def event_json(event: Any) -> dict[str, Any]:
    """A session event as one JSON object with a `type` (the event class in snake case)."""
    name = type(event).__name__
    kind = "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")
    data: dict[str, Any] = asdict(event) if is_dataclass(event) and not isinstance(event, type) else {}
    return {"type": kind, **json.loads(json.dumps(data, default=_json_default))}


def _json_default(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    return str(value)


class HeadlessPrinter:
    def __init__(self, fmt: str, out: IO[str] = sys.stdout, err: IO[str] = sys.stderr) -> None:
        self.fmt = fmt
        self.out = out
        self.err = err
        self._ended_line = True

    def note(self, text: str) -> None:
        if self.fmt == "json":
            self.out.write(json.dumps({"type": "note", "message": text}) + "\n")
            self.out.flush()
        else:
            from crucible.terminal import sanitize

            self.err.write(sanitize(text) + "\n")  # notices carry agent-given names (modes, servers)
            self.err.flush()

    def show(self, event: Any) -> None:
        from acp_host.session import (
            MessageChunk,
            PermissionResolved,
            SessionError,
            ToolCallEvent,
            TurnEnded,
        )
        from crucible.terminal import json_safe, sanitize

        if self.fmt == "json":
            self.out.write(json_safe(json.dumps(event_json(event), ensure_ascii=False)) + "\n")
            self.out.flush()
            return
        if isinstance(event, MessageChunk):
            self.out.write(sanitize(event.text))
            self.out.flush()
            self._ended_line = event.text.endswith("\n")
        elif isinstance(event, ToolCallEvent):
            c = event.call
            if event.created or c.status in ("completed", "failed"):
                status = c.status or "pending"
                self.err.write(sanitize(f"[tool] {c.title or c.tool_call_id} ({c.kind or 'other'}): {status}") + "\n")
        elif isinstance(event, PermissionResolved):
            decision = event.decision.kind if event.decision else event.outcome.get("outcome", "")
            reason = event.decision.reason if event.decision else event.note
            title = event.request.tool_call.title or event.request.tool_call.tool_call_id
            self.err.write(sanitize(f"[permission] {title}: {decision} ({reason})") + "\n")
        elif isinstance(event, SessionError):
            self.err.write(sanitize(f"[error] {event.message}") + "\n")
        elif isinstance(event, TurnEnded):
            if not self._ended_line:
                self.out.write("\n")
                self.out.flush()
        self.err.flush()


async def run_headless(opts: Any, text: str, fmt: str) -> int:
    # The agent is spawned before anything heavy is imported (acp.schema alone is ~0.3 s):
    # it boots while we import.
    from crucible import hard_stop
    from crucible.sessions import preload, spawn_agent

    printer = HeadlessPrinter(fmt)
    ended = None
    async with trio.open_nursery() as owner:
        owner.start_soon(hard_stop.stop_on_signals, owner.cancel_scope)  # SIGTERM/SIGHUP: stop now
        process = await spawn_agent(owner, opts)
        process.exit_grace = HEADLESS_EXIT_GRACE
        await trio.to_thread.run_sync(preload)
        ended, _ = await _one_turn(opts, text, printer, process)
        owner.cancel_scope.cancel()
    if hard_stop.received:
        return hard_stop.exit_code()
    return _exit_code(opts, ended, printer)


async def _one_turn(opts: Any, text: str, printer: HeadlessPrinter, process: Any) -> tuple[Any, bool]:
    from acp_host.session import TurnEnded
    from crucible.delegation import child_event_printer
    from crucible.sessions import BridgeHost, open_session

    cancelled_by_user = False
    ended: TurnEnded | None = None
    async with BridgeHost().running() as host, open_session(opts, host, process=process) as session:
        session.on_notice = printer.note
        session.on_child_event = child_event_printer(printer.fmt, printer.out, printer.err)
        for warning in session.warnings:
            printer.note(f"[warning] {warning}")
        drained = trio.Event()

        async def show_events() -> None:
            async for event in session.events():
                printer.show(event)
                if isinstance(event, TurnEnded):
                    break
            drained.set()

        async def on_sigint(cancel_scope: trio.CancelScope) -> None:
            nonlocal cancelled_by_user
            with trio.open_signal_receiver(signal.SIGINT) as signals:  # SIGTERM: crucible.hard_stop
                async for _ in signals:
                    if not cancelled_by_user:
                        cancelled_by_user = True
                        printer.note("[cancel] cancelling the turn (Ctrl-C again to stop at once)")
                        await session.cancel()
                    else:
                        cancel_scope.cancel()
                        return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(show_events)
            nursery.start_soon(on_sigint, nursery.cancel_scope)
            ended = await session.prompt(text)
            with trio.move_on_after(5):
                await drained.wait()
            nursery.cancel_scope.cancel()
    return ended, cancelled_by_user


def _exit_code(opts: Any, ended: Any, printer: HeadlessPrinter) -> int:
    from acp_host.registry import auth_hint

    if ended is None:
        return EXIT_CANCELLED
    if ended.error:
        message = ended.error
        lowered = message.lower()
        if "authentication" in lowered or "api key" in lowered or "login" in lowered:
            raise CrucibleError(f"the agent {opts.agent.name} needs you to log in: {message}",
                                auth_hint(opts.agent.name))
        raise CrucibleError(f"the turn failed: {message}")
    if ended.stop_reason == "end_turn":
        return EXIT_OK
    if ended.stop_reason == "cancelled":
        printer.note("[cancelled] the turn was cancelled")
        return EXIT_CANCELLED
    printer.note(f"[stopped] the turn ended with stopReason {ended.stop_reason}")
    return EXIT_FAILED
