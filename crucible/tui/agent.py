"""The agent session in the chat: started, started again (/restart, or after it died) with
the conversation going on, its events pumped to the screen, the person's prompts sent one turn
at a time, and a resumed conversation's saved history drawn first."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import trio

from crucible import hard_stop
from crucible.errors import CrucibleError
from crucible.events import Pipeline, saved_events
from crucible.kiln.paths import iter_markdown
from crucible.session_store import Conversation
from crucible.sessions import BridgeHost, CrucibleSession, open_session
from crucible.terminal import sanitize, shown_path
from crucible.tui.prompts import STEER_NOTE
from crucible.tui.status import TICK
from crucible.tui.transcript import TextEntry

if TYPE_CHECKING:
    from crucible.tui.app import ChatUI


def _leaves(exc: BaseException) -> list[BaseException]:
    """The real errors inside (nested) exception groups from trio nurseries."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


class AgentLoop:
    """The trio side of the chat (`main` runs as prompt-toolkit's guest)."""

    def __init__(self, ui: ChatUI) -> None:
        self.ui = ui
        self.session_scope: trio.CancelScope | None = None
        self.session_done = trio.Event()  # this agent session should end (agent died, /restart, quit)
        self.restart = trio.Event()  # between sessions: start the agent again
        self.restart_requested = False
        # /restart goes on with the same conversation: the agent reopens its session (its replay
        # is not drawn again) or gets the saved transcript as context.
        self.last_session_id: str | None = None
        self.restarted = False
        self.prompts_sent = 0
        # The saved conversation the next agent session goes on with (the /sessions picker).
        self.switching: str | None = None

    def stop(self) -> None:
        """The person leaves: end the agent session and do not start another."""
        if self.session_scope is not None:
            self.session_scope.cancel()
        self.session_done.set()
        self.restart.set()

    def request_restart(self) -> None:
        if self.ui.session is not None:
            self.restart_requested = True
            self.session_done.set()
        elif self.session_scope is not None:
            # The agent is still starting (perhaps stuck: a download, an initialize that never
            # answers): that start is stopped, its process with it, and the agent started again
            # (or the conversation chosen in the picker).
            self.restart_requested = True
            self.session_scope.cancel()
        else:
            self.restart.set()

    async def switch_to(self, conv: Conversation) -> None:
        """Go on with the saved conversation `conv` in this chat (the /sessions picker): the
        agent session stops, and the next one resumes `conv` with its own agent, card, kiln and
        cwd (`SessionOptions.continued`), its saved history drawn first."""
        ui = self.ui
        store = ui.opts.store
        if ui.session is not None and ui.session.id in conv.ids:
            ui.say_flash("that is the conversation you are in")
            return
        if store is None:
            return
        opts = ui.opts
        try:
            resumed = await trio.to_thread.run_sync(lambda: opts.continued(store.meta(conv.id)))
        except CrucibleError as exc:
            ui.error(f"cannot resume {conv.id}: {exc.message}" + (f"\nfix: {exc.fix}" if exc.fix else ""))
            return
        ui.feed.end_text()
        ui.notice(f"── going on with {sanitize(conv.title) or conv.id} ({conv.id}, {sanitize(resumed.agent.name)}) ──",
                  "class:history")
        ui.use_options(resumed)
        self.switching = conv.id
        self.request_restart()

    async def main(self) -> int:
        ui = self.ui
        ui.token = trio.lowlevel.current_trio_token()
        held, ui.log_lines_held = ui.log_lines_held, []
        for line in held:
            ui.show_log_line(line)
        async with trio.open_nursery() as nursery:
            ui.nursery = nursery
            # SIGTERM, SIGHUP (the terminal closed): agents stopped at once, the session's
            # files closed, the terminal given back as it was (not the default death).
            nursery.start_soon(hard_stop.stop_on_signals, nursery.cancel_scope)
            nursery.start_soon(self.load_notes)
            async with BridgeHost().running() as host:
                first = True
                while not ui.quitting:
                    self.session_done = trio.Event()
                    await self.run_session(host, first)
                    first = False
                    if ui.quitting:
                        break
                    if not self.restart_requested:
                        self.restart = trio.Event()
                        await self.restart.wait()  # /restart or leave
                    self.restart_requested = False
            nursery.cancel_scope.cancel()
        return hard_stop.exit_code()  # 128 + the signal that stopped us, else 0

    async def load_notes(self) -> None:
        def scan() -> list[str]:
            out = []
            for rel in iter_markdown(self.ui.opts.kiln):
                out.append(rel)
                if len(out) >= 20000:
                    break
            return sorted(out)

        try:
            self.ui.notes = await trio.to_thread.run_sync(scan)
        except OSError as exc:
            self.ui.notice(f"could not list the kiln's notes for @mentions: {exc}")

    async def run_session(self, host: BridgeHost, first: bool) -> None:
        ui = self.ui
        self.restarted = not first and self.switching is None
        if self.switching is not None:  # another saved conversation (opts set by switch_to)
            ui.opts = replace(ui.opts, resume=self.switching)
            self.switching = None
        elif not first:
            ui.opts = replace(ui.opts, resume=self.last_session_id)
        ui.status.state = "starting agent"
        ui.refresh_now()
        with trio.CancelScope() as scope:
            self.session_scope = scope
            try:
                async with open_session(ui.opts, host) as session:
                    ui.session = session
                    if session.bridge is not None:  # `indexing 34%` in the status bar while it builds
                        ui.status.follow_index(session.bridge.backend, ui.index_changed_from_thread)
                    self.last_session_id = session.id
                    ui.agent_alive = True
                    pipeline = Pipeline(session, [ui.feed])
                    if first and not ui.opts.resume:  # what a new user needs to find the rest
                        # (each part's spaces non-breaking: a narrow screen breaks the line
                        # between its parts, not in "Ctrl-D: | leave")
                        parts = ["/help: commands and keys", "@: attach a note", "Ctrl-D: leave"]
                        ui.notice(" · ".join([f"{ui.opts.agent.name}", f"kiln {shown_path(ui.opts.kiln)}",
                                              *(part.replace(" ", "\u00a0") for part in parts)]))
                    for warning in session.warnings:
                        ui.notice(f"warning: {warning}")
                    ui.status.state = "ready"
                    if ui.prompts.held and ui.question is None:
                        ui.prompts.release()  # held after a failed send: this session sends it
                    await self._show_saved_history(session)
                    ui.refresh_now()
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self.pump_events, pipeline)
                        nursery.start_soon(self.run_turns, session)
                        await self.session_done.wait()
                        nursery.cancel_scope.cancel()
            except Exception as exc:  # the chat outlives its agent session, whatever broke it
                for leaf in _leaves(exc):
                    if isinstance(leaf, CrucibleError):
                        ui.error(leaf.message + (f"\nfix: {leaf.fix}" if leaf.fix else ""))
                    else:
                        ui.error(f"the agent session failed: {sanitize(str(leaf)) or type(leaf).__name__}")
                ui.notice("/restart tries again; Ctrl-D leaves")
            finally:
                ui.agent_alive = False
                ui.session = None
                self.session_scope = None
                ui.status.plan = ()
                ui.status.state = "leaving" if ui.quitting else "agent stopped"
                ui.refresh_now()

    async def _show_saved_history(self, session: CrucibleSession) -> None:
        """Resumed: the agent replays its history itself (session/load, shown from the event
        stream), or it does not (session/resume, or a new session with the transcript as
        context): then our own saved transcript is drawn as the live events are, as history."""
        ui = self.ui
        resumed = ui.opts.resume
        if not resumed or ui.opts.store is None or self.restarted:
            return
        caps = session.client.capabilities if session.client is not None else None
        has_resume = getattr(getattr(caps, "session_capabilities", None), "resume", None) is not None
        if session.resumed_natively and not has_resume:
            return  # session/load: the replay is in the event stream
        store = ui.opts.store
        events = await trio.to_thread.run_sync(lambda: saved_events(store.conversation_events(resumed)))
        ui.feed.add_notice(f"── history (saved session {resumed}) ──", "class:history")
        ui.feed.history = True
        ui.feed.render(events)
        ui.feed.end_text()
        ui.feed.history = False
        ui.notice("── end of history ──", "class:history")

    async def pump_events(self, pipeline: Pipeline) -> None:
        await pipeline.run()
        self.ui.check_agent()

    async def run_turns(self, session: CrucibleSession) -> None:
        """The queued prompts, one turn at a time: each drawn when it is sent, with its
        attachments; a steering prompt says it interrupts the turn before it."""
        assert session.acp is not None
        ui = self.ui
        while True:
            item = await ui.prompts.get()
            ui.feed.unpin_plan()
            ui.feed.end_text()
            entry = TextEntry("user", markdown=False)
            entry.append("› " + item.text)
            entry.finish()
            ui.transcript.add(entry)
            if item.steer:
                ui.feed.add_notice("(sent as steering: it interrupts the turn before it)")
            blocks = await ui.input.attachments(item.text)
            if item.steer:
                blocks.append({"type": "text", "text": STEER_NOTE})
            ui.status.turn_started()
            ui.keys.forget_ctrl_c()
            ui.refresh_now()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._tick)
                try:
                    self.prompts_sent += 1
                    await session.prompt(item.text, blocks or None)
                except RuntimeError as exc:
                    ui.error(f"could not send the prompt: {exc}; it waits in the queue (/restart sends it, "
                             "/queue drop 1 drops it)")
                    ui.prompts.put(item, first=True)
                    ui.prompts.hold()
                finally:
                    nursery.cancel_scope.cancel()
                    ui.status.turn_stopped()
            ui.status.state = "ready" if ui.agent_alive else "agent stopped"
            ui.refresh_now()

    async def _tick(self) -> None:
        """The spinner and the elapsed time move while the turn runs."""
        while True:
            await trio.sleep(TICK)
            self.ui.refresh()
