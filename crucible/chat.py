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
import shlex
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from acp_host.registry import AgentRegistryError, install_hint, resolve_agent
from crucible.config import load_config, resolve_kiln
from crucible.errors import CrucibleError
from crucible.session_store import SessionStore
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
# After Ctrl-C in -p, how long the agent may take to end its turn (session/cancel) before it is
# stopped anyway: a person at a shell waits seconds, not the 30 s the chat allows.
HEADLESS_CANCEL_GRACE = 3.0


def build_options(args: argparse.Namespace) -> SessionOptions:
    """Config, kiln, card and agent from the command line (shared by chat, session create, acp).
    With `--resume ID` the saved session's own agent, card, kiln and cwd, unless told otherwise."""
    config = load_config(getattr(args, "config", None))
    saved = SessionStore().meta(args.resume) if getattr(args, "resume", None) else None
    kiln = resolve_kiln(getattr(args, "kiln", None) or (saved.kiln if saved is not None and saved.kiln else None),
                        config)
    cwd_arg = getattr(args, "cwd", None)
    if cwd_arg is None and saved is not None:
        if not Path(saved.cwd).is_dir():
            raise CrucibleError(f"the folder of session {saved.id} is gone ({saved.cwd})",
                                "pass --cwd DIR to go on in another folder")
        cwd_arg = saved.cwd
    cwd = Path(cwd_arg or os.getcwd()).resolve()
    if not cwd.is_dir():
        raise CrucibleError(f"--cwd {cwd_arg} is not a folder", "pass an existing folder")
    card_name = getattr(args, "card", None)
    if card_name is None and saved is not None:
        card_name = saved.card
    card = None
    if card_name:
        from crucible.cards import (
            get_card,  # ruamel.yaml, only when asked: the agent starts after this
        )

        card = get_card(card_name, kiln, cwd)
    name = getattr(args, "agent", None)
    agent_command = getattr(args, "agent_command", None)
    if name is None and agent_command is None and saved is not None:
        name = saved.agent
        agent_command = shlex.join(saved.agent_command) if saved.agent_command else None
    elif agent_command is not None:
        name = None  # named after its program (acp_host.registry)
    if agent_command is None:
        name = name or (card.agent if card else None) or config.default_agent
    try:
        spec = resolve_agent(name, agent_command=agent_command, profiles=config.agents)
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
                          resume=saved.id if saved is not None else None, model=getattr(args, "model", None),
                          mode=getattr(args, "mode", None), elicitor=elicitor)


def cmd_chat(args: argparse.Namespace) -> int:
    opts = build_options(args)
    if args.prompt is not None:
        return trio.run(run_headless, opts, args.prompt, args.format)
    from crucible.tui.app import run_tui  # prompt-toolkit and acp.schema: only for the TUI

    result: int = run_tui(opts)
    return result


# -- headless --------------------------------------------------------------------------------


async def run_headless(opts: Any, text: str, fmt: str) -> int:
    return await _HeadlessRun(opts, text, fmt).run()


class _HeadlessRun:
    """One `cru chat -p` turn, and what Ctrl-C does to it: while the agent starts (no prompt
    sent yet), stop at once; during the turn, cancel it gracefully (session/cancel), bounded by
    HEADLESS_CANCEL_GRACE for an agent that ignores the cancel; a second Ctrl-C stops at once."""

    def __init__(self, opts: Any, text: str, fmt: str) -> None:
        self.opts, self.text, self.fmt = opts, text, fmt
        opts.cancel_timeout = HEADLESS_CANCEL_GRACE
        self.printer: Printer | None = None
        self.session: Any = None
        self.prompt_sent = False
        self.interrupted: str | None = None  # where the first Ctrl-C came: "starting" or "turn"
        self.work = trio.CancelScope()

    async def run(self) -> int:
        from crucible import hard_stop  # trio + acp_host.process only; kept off `cru` start-up

        ended: Any = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hard_stop.stop_on_signals, nursery.cancel_scope)  # SIGTERM/SIGHUP: stop now
            await nursery.start(self._watch_signals)
            with self.work:
                ended = await self._start_and_turn()
            nursery.cancel_scope.cancel()
        if hard_stop.received:
            return hard_stop.exit_code()
        return self._exit_code(ended)

    async def _watch_signals(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        # Ctrl-C only: SIGTERM and SIGHUP stop at once (crucible.hard_stop).
        with trio.open_signal_receiver(signal.SIGINT) as signals:
            task_status.started()
            async for _ in signals:
                acp = self.session.acp if self.session is not None else None
                if self.interrupted is None and acp is not None and acp.turn_running:
                    self.interrupted = "turn"
                    self._note(f"[cancel] cancelling the turn (waiting up to {HEADLESS_CANCEL_GRACE:g} s; "
                               "Ctrl-C again to stop at once)")
                    await self.session.cancel()
                    continue
                if self.interrupted is None:
                    self.interrupted = "turn" if self.prompt_sent else "starting"
                self.work.cancel()
                return

    async def _start_and_turn(self) -> Any:
        opts = self.opts
        async with trio.open_nursery() as owner:
            # The agent is spawned before anything heavy is imported (acp.schema alone is ~0.5 s):
            # it boots while we import, in a thread.
            process = await spawn_agent(owner, opts)
            process.exit_grace = HEADLESS_EXIT_GRACE
            await trio.to_thread.run_sync(preload, abandon_on_cancel=True)
            # acp.schema: imported by `preload` just now
            from crucible.attachments import prompt_attachments
            from crucible.events import Pipeline
            from crucible.renderers import printer_for

            self.printer = printer_for(self.fmt)
            # One turn: no background embedding (the vector store stays unloaded unless searched).
            async with BridgeHost(index_early=False).running() as host, \
                    open_session(opts, host, process=process) as session:
                self.session = session
                pipeline = Pipeline(session, [self.printer])
                for warning in session.warnings:
                    pipeline.notice(f"[warning] {warning}")
                client = session.client
                caps = client.capabilities if client is not None else None
                blocks = await prompt_attachments(self.text, kiln=opts.kiln, cwd=opts.cwd, say=pipeline.notice,
                                                  prompt_caps=getattr(caps, "prompt_capabilities", None))
                self.prompt_sent = True
                return await pipeline.turn(self.text, blocks)
        return None  # not reached: the turn returns from inside (mypy cannot tell)

    def _note(self, text: str) -> None:
        if self.printer is not None:
            self.printer.note(text)
        elif self.fmt == "json":
            sys.stdout.write(json.dumps({"type": "note", "message": text}) + "\n")
            sys.stdout.flush()
        else:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()

    def _exit_code(self, ended: Any) -> int:
        grace = f"{HEADLESS_CANCEL_GRACE:g}"
        if self.interrupted == "starting":
            self._note("[cancelled] stopped by Ctrl-C while the agent was starting; no prompt was sent")
            return EXIT_CANCELLED
        if ended is None:
            self._note("[cancelled] stopped at once by a second Ctrl-C; the agent was stopped")
            return EXIT_CANCELLED
        if ended.error and self.interrupted == "turn":
            self._note(f"[cancelled] the agent did not end the turn within {grace} s of the cancel; "
                       "it was stopped")
            return EXIT_CANCELLED
        if ended.error:
            failure = self.session.failure if self.session is not None else None
            if failure is not None:
                raise CrucibleError(failure.cause, failure.fix)
            raise CrucibleError(f"the turn failed: {ended.error}")
        if ended.stop_reason == "end_turn":
            return EXIT_OK
        if ended.stop_reason == "cancelled":
            self._note("[cancelled] the turn was cancelled")
            return EXIT_CANCELLED
        self._note(f"[stopped] the turn ended with stopReason {ended.stop_reason}")
        return EXIT_FAILED
