"""`cru chat`: one turn headless with `-p`, or the terminal chat (crucible/tui).

Headless (`-p TEXT`): the agent's message text goes to stdout as it streams; tool calls,
permissions and errors go to stderr as short lines; exit 0 when the turn ends with
`end_turn`, 130 when cancelled with Ctrl-C, 1 otherwise. `--format json` prints one JSON
object per event on stdout instead. Permission requests follow `--approve-all` /
`--deny-all`, else the card policy, else deny.
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from acp_host.registry import AgentRegistryError, auth_hint, install_hint, resolve_agent
from crucible.config import load_config, resolve_kiln
from crucible.errors import CrucibleError
from crucible.sessions import (
    BridgeHost,
    SessionOptions,
    approve_all_asker,
    decline_elicitor,
    defaults_elicitor,
    deny_all_asker,
    deny_asker,
    open_session,
    preload,
    spawn_agent,
)

if TYPE_CHECKING:
    from crucible.renderers import Printer

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CANCELLED = 130
# After a headless turn nothing more is asked of the agent, and the transcript is written:
# claude-agent-acp never exits on stdin EOF, so waiting the usual 2 s before SIGTERM only
# delays the person. Agents that do exit on EOF (opencode, gemini) do it well within this.
HEADLESS_EXIT_GRACE = 0.5


def build_options(args: argparse.Namespace) -> SessionOptions:
    """Config, kiln, card and agent from the command line (shared by chat, session create, acp)."""
    config = load_config(getattr(args, "config", None))
    kiln = resolve_kiln(getattr(args, "kiln", None), config)
    cwd = Path(getattr(args, "cwd", None) or os.getcwd()).resolve()
    if not cwd.is_dir():
        raise CrucibleError(f"--cwd {getattr(args, 'cwd', '')} is not a folder", "pass an existing folder")
    card = None
    if getattr(args, "card", None):
        from crucible.cards import (
            get_card,  # ruamel.yaml, only when asked: the agent starts after this
        )

        card = get_card(args.card, kiln, cwd)
    name = getattr(args, "agent", None) or (card.agent if card else None) or config.default_agent
    try:
        spec = resolve_agent(None if getattr(args, "agent_command", None) else name,
                             agent_command=getattr(args, "agent_command", None), profiles=config.agents)
    except AgentRegistryError as exc:
        raise CrucibleError(exc.message, exc.fix) from None
    if not spec.found:
        raise CrucibleError(f"the agent {spec.name} is not installed ({spec.source})", install_hint(spec.name))
    if getattr(args, "approve_all", False):
        asker = approve_all_asker()
    elif getattr(args, "deny_all", False):
        asker = deny_all_asker()
    else:
        asker = deny_asker
    record = Path(args.record) if getattr(args, "record", None) else None
    # An upstream MCP server's question (elicitation) in -p: declined, or its defaults with --approve-all.
    elicitor = defaults_elicitor if getattr(args, "approve_all", False) else decline_elicitor
    return SessionOptions(agent=spec, kiln=kiln, cwd=cwd, config=config, card=card, asker=asker, record=record,
                          resume=getattr(args, "resume", None), elicitor=elicitor)


def cmd_chat(args: argparse.Namespace) -> int:
    opts = build_options(args)
    if args.prompt is not None:
        return trio.run(run_headless, opts, args.prompt, args.format)
    from crucible.tui.app import run_tui  # prompt-toolkit and acp.schema: only for the TUI

    result: int = run_tui(opts)
    return result


# -- headless --------------------------------------------------------------------------------


async def run_headless(opts: Any, text: str, fmt: str) -> int:
    async with trio.open_nursery() as owner:
        # The agent is spawned before anything heavy is imported (acp.schema alone is ~0.5 s):
        # it boots while we import, in a thread.
        process = await spawn_agent(owner, opts)
        process.exit_grace = HEADLESS_EXIT_GRACE
        await trio.to_thread.run_sync(preload)
        from crucible.renderers import printer_for  # acp.schema: imported by `preload` just now

        printer = printer_for(fmt)
        ended, _ = await _one_turn(opts, text, printer, process)
    return _exit_code(opts, ended, printer)


async def _one_turn(opts: Any, text: str, printer: Printer, process: Any) -> tuple[Any, bool]:
    from crucible.events import Pipeline  # acp.schema: loaded by `preload` while the agent boots

    cancelled_by_user = False
    ended: Any = None
    async with BridgeHost().running() as host, open_session(opts, host, process=process) as session:
        pipeline = Pipeline(session, [printer])
        for warning in session.warnings:
            pipeline.notice(f"[warning] {warning}")

        async def on_sigint(cancel_scope: trio.CancelScope) -> None:
            nonlocal cancelled_by_user
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    if not cancelled_by_user:
                        cancelled_by_user = True
                        pipeline.notice("[cancel] cancelling the turn (Ctrl-C again to stop at once)")
                        await session.cancel()
                    else:
                        cancel_scope.cancel()
                        return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(on_sigint, nursery.cancel_scope)
            ended = await pipeline.turn(text)
            nursery.cancel_scope.cancel()
    return ended, cancelled_by_user


def _exit_code(opts: Any, ended: Any, printer: Printer) -> int:
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
