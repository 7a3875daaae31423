"""delegate_session: an agent hands a task to a card or another agent, run as a real child
session (its own agent process and bridge) on the same `BridgeHost`.

One `Delegation` per session (attached by `open_session`). It owns a nursery where every
child runs as a job — a blocking `delegate_session` call waits for its job, a background one
returns the job id for `list_jobs` / `get_job_result` / `cancel_job`. Children therefore live
inside their parent session's task tree: cancelling or ending the parent's turn, or closing the
parent, cancels them and stops their processes.

Limits: `[delegation]` in the config (enabled, max_depth, allowed_targets, max_concurrent —
children of one session running at once, over it they queue or, with `queue = false`, are
refused —, result_max_bytes, timeout_secs) and the delegating session's card (`delegation:`
enabled, targets, max_depth, relative to that card's session). The tools' own timeout is
`timeout_secs` + 30 s, so the bridge's flat 30 s never cuts a delegation; the child itself is
stopped at `timeout_secs`. A job's result is final when the child's turn ends (the parent
reads it then); its slot is held until the child's process is gone.

What the child gets: the card's instructions (first, as every session), a handoff the parent
chose (a summary and kiln note paths — never the parent's transcript), and the prompt. Its
policy is `parent.policy.child(card rules)`, so it can never widen what the parent had; its
`ask`s go to the parent's person (the parent's asker) labelled with the chain
("claude › reviewer").

Events: every child event reaches the parent session's `on_child_event` hook as a
`ChildEvent` (crucible/events.py; grandchildren bubble up the same way);
`crucible.renderers.child_event_printer` shows them as `[child claude › reviewer] ...` lines
for `cru chat -p`.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import trio
from pydantic import BaseModel, ConfigDict, Field

from acp_host.registry import AgentRegistryError, known_names, resolve_agent
from acp_host.session import MessageChunk
from crucible.cards import load_cards
from crucible.errors import CrucibleError
from crucible.events import ChildEvent, ChildStatus, Notice, Pipeline, Renderer
from crucible.kiln.paths import resolve_in_kiln
from mcp_bridge.tools import ToolContext, ToolError, ToolSpec

if TYPE_CHECKING:
    from acp_host.registry import AgentSpec
    from crucible.cards import Card
    from crucible.sessions import BridgeHost, CrucibleSession, OpenSession

# The tool's own timeout is the child's plus this margin, so the child's timeout answers first.
TOOL_MARGIN_SECS = 30.0
# How long a finished turn waits for its cancelled children to stop their processes.
TEARDOWN_SECS = 15.0
KEEP_FINISHED_JOBS = 50
# While a call waits for a child, progress goes to the caller this often: clients that reset
# their request timeout on progress (OpenCode: 60 s otherwise) keep waiting, and the stdio
# relay's stream (300 s read timeout) stays alive.
HEARTBEAT_SECS = 10.0

JobStatus = Literal["queued", "running", "completed", "failed", "cancelled", "timed_out"]
FINISHED: frozenset[str] = frozenset({"completed", "failed", "cancelled", "timed_out"})


# -- the tools' arguments and results --------------------------------------------------------


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Handoff(_Args):
    summary: str = Field(default="", description="what the child needs to know: the task's background, "
                                                 "what you found so far, constraints")
    notes: list[str] = Field(default_factory=list, description="kiln-relative paths of notes the child "
                                                               "should read, e.g. 'Projects/Idea.md'")


class DelegateArgs(_Args):
    target: str = Field(description="a card name (see the cards the person has) or an agent name, "
                                    "e.g. 'reviewer' or 'opencode'")
    prompt: str = Field(description="the task for the child, self-contained")
    context: Handoff | None = Field(default=None, description="a curated handoff: a summary and note paths; "
                                                              "the child does not see this conversation")
    background: bool = Field(default=False, description="true: return a job id at once and run the child in "
                                                        "the background (see get_job_result)")


class JobArgs(_Args):
    job_id: str = Field(description="the job id delegate_session returned")


class GetJobArgs(_Args):
    job_id: str = Field(description="the job id delegate_session returned")
    wait: bool = Field(default=False, description="true: wait until the job has finished")


class NoArgs(_Args):
    pass


class DelegateResult(BaseModel):
    job_id: str
    target: str
    status: JobStatus
    reply: str = Field(default="", description="the child's reply text")
    truncated: bool = False
    child_session: str | None = None
    error: str | None = None
    seconds: float = 0.0


class JobInfo(BaseModel):
    job_id: str
    target: str
    status: JobStatus
    background: bool
    child_session: str | None = None
    seconds: float = 0.0


class JobList(BaseModel):
    jobs: list[JobInfo]


# -- jobs ------------------------------------------------------------------------------------


@dataclass
class Job:
    id: str
    target: str
    label: str
    background: bool
    status: JobStatus = "queued"
    parts: list[str] = field(default_factory=list)  # the child's message text so far
    error: str | None = None
    child_id: str | None = None
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    settled: trio.Event = field(default_factory=trio.Event)  # status and reply are final
    done: trio.Event = field(default_factory=trio.Event)  # and the child's process is gone
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    cancel_reason: str | None = None

    @property
    def reply(self) -> str:
        return "".join(self.parts)

    @property
    def seconds(self) -> float:
        return round((self.ended or time.monotonic()) - self.started, 3)

    def cancel(self, reason: str) -> None:
        if not self.done.is_set():
            self.cancel_reason = self.cancel_reason or reason
            self.scope.cancel()

    def info(self) -> JobInfo:
        return JobInfo(job_id=self.id, target=self.target, status=self.status, background=self.background,
                       child_session=self.child_id, seconds=self.seconds)


def shape_reply(text: str, limit: int) -> tuple[str, bool]:
    """The reply within `limit` UTF-8 bytes, with a marked cut when it was longer."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text, False
    cut = data[:limit].decode("utf-8", errors="ignore")
    return (cut + f"\n[truncated: the child's reply was {len(data)} bytes; the first {limit} are shown "
                  "([delegation] result_max_bytes)]"), True


# Absolute paths left after the known roots are replaced: keep only the last part.
_ABS_PATH = re.compile(r"(?<![\w:/.~-])/(?:[^\s/'\"`:]+/)+")


def redact_paths(text: str, roots: list[tuple[Path, str]]) -> str:
    """No absolute path of the person's machine in what the agent reads."""
    for root, name in sorted(roots, key=lambda r: len(str(r[0])), reverse=True):
        if str(root) not in ("", "/"):
            text = text.replace(str(root), name)
    return _ABS_PATH.sub("…/", text)


def handoff_text(parent_label: str, handoff: Handoff | None, prompt: str) -> str:
    if handoff is None or (not handoff.summary.strip() and not handoff.notes):
        return prompt
    parts = [f'<handoff from="{parent_label}">']
    if handoff.summary.strip():
        parts.append(f"<summary>\n{handoff.summary.strip()}\n</summary>")
    if handoff.notes:
        listed = "\n".join(f"- {n}" for n in handoff.notes)
        parts.append(f"<notes hint=\"kiln notes to read with read_note\">\n{listed}\n</notes>")
    parts.append("</handoff>")
    return "\n".join(parts) + "\n\n" + prompt


# -- the per-session delegation state --------------------------------------------------------

class Delegation:
    """A session's children and the limits on them. Created by `attach`."""

    def __init__(self, session: CrucibleSession, host: BridgeHost, parent: Delegation | None,
                 open_child: OpenSession | None = None) -> None:
        self.session = session
        self.host = host
        self.parent = parent
        self.open_child = open_child  # `crucible.sessions.open_session`, handed in: it attaches us
        opts = session.opts
        self.config = opts.config.delegation
        card = opts.card
        self.depth: int = parent.depth + 1 if parent is not None else 0
        # Levels this session may still delegate below itself.
        remaining = parent.remaining - 1 if parent is not None else self.config.max_depth
        if card is not None and card.delegation.max_depth is not None:
            remaining = min(remaining, card.delegation.max_depth)
        self.remaining: int = remaining
        self.enabled = self.config.enabled and (card is None or card.delegation.enabled)
        self.card_targets = card.delegation.targets if card is not None else None
        self.limiter = trio.CapacityLimiter(max(1, self.config.max_concurrent))
        self.jobs: dict[str, Job] = {}
        self._ids = itertools.count(1)
        self._nursery: trio.Nursery | None = None

    # -- wiring --------------------------------------------------------------------------
    @classmethod
    def attach(cls, session: CrucibleSession, host: BridgeHost, *, open_child: OpenSession,
               parent: Delegation | None = None) -> Delegation:
        """For `open_session`, before the agent lists its tools: the tools on the session's
        bridge (when delegation is enabled for it). Then `async with d.running():`.
        `open_child` opens a child session (`open_session`); `parent` is the delegation of the
        session that started this one, if any."""
        self = cls(session, host, parent, open_child)
        session.delegation = self
        if self.enabled and session.bridge is not None:
            for spec in self.tool_specs():
                session.bridge.add_tool(spec)
        return self

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Delegation]:
        """A nursery for the children; on exit every child is cancelled and its process stopped."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    yield self
                finally:
                    self.cancel_all("the parent session closed")
                    nursery.cancel_scope.cancel()
        finally:
            self._nursery = None

    def tool_specs(self) -> list[ToolSpec]:
        long = float(self.config.timeout_secs) + TOOL_MARGIN_SECS
        return [
            ToolSpec("delegate_session", DELEGATE_DESCRIPTION, DelegateArgs, DelegateResult, _delegate_tool,
                     read_only=False, destructive=False, open_world=True, title="Delegate to a child session",
                     timeout=long),
            ToolSpec("list_jobs", "List this session's delegated jobs (background and finished) with their status.",
                     NoArgs, JobList, _list_jobs_tool, read_only=True, idempotent=True, title="List delegated jobs"),
            ToolSpec("get_job_result", "The status and, once finished, the reply of a delegated job. "
                     "wait=true waits for it to finish.", GetJobArgs, DelegateResult, _get_job_tool,
                     read_only=True, idempotent=True, title="Get a delegated job's result", timeout=long),
            ToolSpec("cancel_job", "Cancel a delegated job; its child session is stopped.", JobArgs, JobInfo,
                     _cancel_job_tool, read_only=False, destructive=True, idempotent=True,
                     title="Cancel a delegated job"),
        ]

    def emit(self, event: ChildEvent) -> None:
        hook = self.session.on_child_event
        if hook is None:
            return
        try:
            hook(event)
        except Exception as exc:  # a display bug must not break the child
            self.session.warn(f"the child event hook failed: {type(exc).__name__}: {exc}")

    def redact(self, text: str) -> str:
        opts = self.session.opts
        return redact_paths(text, [(opts.kiln, "<kiln>"), (opts.cwd, "<cwd>"), (Path.home(), "~")])

    # -- cancel cascade ------------------------------------------------------------------
    def cancel_all(self, reason: str) -> None:
        for job in self.jobs.values():
            job.cancel(reason)

    async def end_turn(self, reason: str = "the parent turn ended") -> None:
        """The parent's turn is over: its children stop, and this returns once their
        processes are gone (bounded by TEARDOWN_SECS)."""
        running = [j for j in self.jobs.values() if not j.done.is_set()]
        for job in running:
            job.cancel(reason)
        with trio.move_on_after(TEARDOWN_SECS):
            for job in running:
                await job.done.wait()

    # -- starting a child ----------------------------------------------------------------
    async def resolve_target(self, target: str) -> tuple[AgentSpec, Card | None]:
        opts = self.session.opts
        try:
            cards = await trio.to_thread.run_sync(load_cards, opts.kiln, opts.cwd)
        except CrucibleError as exc:
            raise ToolError(self.redact(str(exc))) from None
        card = cards.get(target)
        name = (card.agent if card is not None else target) or ""
        if card is not None and not card.agent:
            return opts.agent, card  # a card that names no agent runs on the parent's agent
        profiles = opts.config.agents
        try:
            spec = resolve_agent(name, profiles=profiles)
        except AgentRegistryError as exc:
            if card is None:
                raise ToolError(
                    f"unknown delegation target {target!r}: it is neither a card nor an agent. "
                    f"Cards: {', '.join(sorted(cards)) or 'none'}; agents: {', '.join(known_names(profiles))}"
                ) from None
            raise ToolError(self.redact(f"the card {target!r} names the agent {name!r}, which cannot be "
                                        f"used: {exc.message}")) from None
        if not spec.found:
            raise ToolError(f"the agent {spec.name} (for target {target!r}) is not installed on this machine")
        return spec, card

    def check_allowed(self, target: str) -> None:
        if not self.enabled:
            raise ToolError("delegation is turned off for this session ([delegation] enabled = false in the "
                            "config, or the card does not enable delegation)")
        if self.remaining < 1:
            raise ToolError(
                f"delegation refused: the depth limit is reached — this session ({self.session.label}) is at "
                f"depth {self.depth} and may not start child sessions (max_depth {self.config.max_depth} in "
                "[delegation], or the card's delegation.max_depth). Do the task yourself and answer with "
                "what you found.")
        allowed = self.config.allowed_targets
        if allowed is not None and target not in allowed:
            raise ToolError(f"delegation to {target!r} is not allowed: [delegation] allowed_targets is "
                            f"{', '.join(allowed) or 'empty'}")
        if self.card_targets is not None and target not in self.card_targets:
            raise ToolError(f"delegation to {target!r} is not allowed by this session's card: its "
                            f"delegation.targets are {', '.join(self.card_targets) or 'empty'}")
        active = sum(1 for j in self.jobs.values() if not j.done.is_set())
        if not self.config.queue and active >= self.config.max_concurrent:
            raise ToolError(
                f"delegation refused: {active} child sessions are already running, the limit is "
                f"{self.config.max_concurrent} ([delegation] max_concurrent, queue = false). Wait for one "
                "with get_job_result(wait=true) or stop one with cancel_job, then try again.")

    async def check_notes(self, handoff: Handoff | None) -> None:
        if handoff is None:
            return
        kiln = self.session.opts.kiln
        for note in handoff.notes:
            try:
                await trio.to_thread.run_sync(partial(resolve_in_kiln, kiln, note, must_exist=True))
            except CrucibleError as exc:
                raise ToolError(f"context.notes: {self.redact(str(exc))}") from None

    async def submit(self, args: DelegateArgs) -> Job:
        """Checks, then the child's job in this session's nursery (queued for a slot)."""
        target = args.target.strip()
        if not args.prompt.strip():
            raise ToolError("prompt is empty: give the child a self-contained task")
        self.check_allowed(target)
        spec, card = await self.resolve_target(target)
        await self.check_notes(args.context)
        if self._nursery is None:
            raise ToolError("this session is closing; no child can start")
        name = card.name if card is not None else spec.name
        label = f"{self.session.label} › {name}" if self.session.label else name
        job = Job(id=f"job-{next(self._ids)}", target=target, label=label, background=args.background)
        self.jobs[job.id] = job
        self._forget_old_jobs()
        text = handoff_text(self.session.label, args.context, args.prompt)
        self.session.writer.append({"type": "delegation", "job": job.id, "target": target,
                                    "background": args.background, "status": "queued"})
        self._nursery.start_soon(self._run, job, spec, card, text)
        return job

    def _forget_old_jobs(self) -> None:
        finished = [j for j in self.jobs.values() if j.done.is_set()]
        for job in finished[: max(0, len(finished) - KEEP_FINISHED_JOBS)]:
            del self.jobs[job.id]

    async def _run(self, job: Job, spec: AgentSpec, card: Card | None, text: str) -> None:
        self.emit(ChildEvent(job.label, job.id, None, self.depth + 1, ChildStatus("queued")))
        timeout = float(self.config.timeout_secs)
        try:
            with job.scope:
                with trio.move_on_after(timeout) as deadline:
                    async with self.limiter:
                        job.status = "running"
                        await self._run_child(job, spec, card, text)
                if deadline.cancelled_caught and not job.settled.is_set():
                    self._settle(job, "timed_out", f"the child session {job.label} did not finish within "
                                                   f"{timeout:g} s ([delegation] timeout_secs); it was stopped")
        except CrucibleError as exc:
            self._settle(job, "failed", self.redact(str(exc)))
        except Exception as exc:  # the job boundary: the parent gets an error result, never a hang
            self._settle(job, "failed", self.redact(f"the child session failed: {type(exc).__name__}: {exc}"))
        finally:
            if job.scope.cancelled_caught:
                self._settle(job, "cancelled", f"the child session was cancelled: {job.cancel_reason or 'cancelled'}")
            self._settle(job, "failed", "the child session ended without a result")
            job.done.set()

    def _settle(self, job: Job, status: JobStatus, error: str | None) -> None:
        """The job's outcome, once: the parent may read it while the child's process stops."""
        if job.settled.is_set():
            return
        job.status, job.error, job.ended = status, error, time.monotonic()
        detail = status if error is None else f"{status}: {error}"
        self.emit(ChildEvent(job.label, job.id, job.child_id, self.depth + 1, ChildStatus("finished", detail)))
        self.session.writer.append({"type": "delegation", "job": job.id, "target": job.target,
                                    "child_session": job.child_id, "status": status, "error": error,
                                    "seconds": job.seconds})
        job.settled.set()

    async def _run_child(self, job: Job, spec: AgentSpec, card: Card | None, text: str) -> None:
        assert self.open_child is not None, "attach() hands the delegation its session opener"
        opts = self.session.opts.for_child(spec, card, self.session.policy, self.session.id)
        depth = self.depth + 1
        async with self.open_child(opts, self.host, parent=self) as child:
            job.child_id = child.id
            pipeline = Pipeline(child, [JobView(self, job, child.id, depth)])
            self.emit(ChildEvent(job.label, job.id, child.id, depth,
                                 ChildStatus("started", spec.name, terminal_output=child.terminal_output)))
            ended = await pipeline.turn(text)
            # Settled before the child's teardown (an agent can take seconds to exit): the
            # parent reads the reply now; the slot is held until the process is gone.
            if ended.error:
                self._settle(job, "failed", self.redact(f"the child session {job.label} failed: {ended.error}"))
            elif ended.stop_reason == "cancelled":
                self._settle(job, "cancelled", f"the child session {job.label} was cancelled")
            elif ended.stop_reason != "end_turn":
                self._settle(job, "completed", f"the child's turn ended with stopReason {ended.stop_reason}")
            else:
                self._settle(job, "completed", None)

    def result(self, job: Job) -> DelegateResult:
        reply, truncated = shape_reply(job.reply, self.config.result_max_bytes)
        return DelegateResult(job_id=job.id, target=job.target, status=job.status, reply=reply,
                              truncated=truncated, child_session=job.child_id, error=job.error,
                              seconds=job.seconds)

    def job(self, job_id: str) -> Job:
        job = self.jobs.get(job_id.strip())
        if job is None:
            known = ", ".join(self.jobs) or "none"
            raise ToolError(f"no delegated job {job_id!r} in this session (jobs: {known})")
        return job


class JobView(Renderer):
    """A child session's events as its parent sees them: the child's reply gathered in its job,
    each event (its notices too) passed up labelled with the job; a grandchild's events pass up
    with their own label."""

    def __init__(self, delegation: Delegation, job: Job, child_id: str, depth: int) -> None:
        self.delegation = delegation
        self.job = job
        self.child_id = child_id
        self.depth = depth

    def render(self, events: Sequence[Any]) -> None:
        job, emit = self.job, self.delegation.emit
        for event in events:
            kind = type(event)
            if kind is ChildEvent:
                emit(event)
                continue
            if kind is MessageChunk:
                job.parts.append(event.text)
            elif kind is Notice:
                event = ChildStatus("notice", event.text, permission=event.permission)
            emit(ChildEvent(job.label, job.id, self.child_id, self.depth, event))


DELEGATE_DESCRIPTION = (
    "Hand a task to another agent or to an agent card (a configured role such as 'reviewer'), run as a "
    "separate child session with its own tools and permissions. The child does not see this conversation: "
    "put everything it needs in `prompt`, and pass a short `context` (summary, kiln note paths). Returns the "
    "child's reply; with background=true returns a job id at once (see get_job_result, list_jobs, cancel_job)."
)


# -- tool handlers ---------------------------------------------------------------------------


def _delegation(ctx: ToolContext) -> Delegation:
    session = ctx.extra.get("session")
    delegation = getattr(session, "delegation", None)
    if delegation is None:
        raise ToolError("delegation is not available on this bridge (no Crucible session behind it)")
    assert isinstance(delegation, Delegation)
    return delegation


async def _wait_reporting(ctx: ToolContext, job: Job) -> None:
    """Wait for the job's result, with a progress heartbeat to the caller."""
    while not job.settled.is_set():
        with trio.move_on_after(HEARTBEAT_SECS):
            await job.settled.wait()
        if not job.settled.is_set():
            try:
                await ctx.report_progress(job.seconds, None, f"{job.label}: {job.status} for {job.seconds:.0f} s")
            except Exception:  # the caller went away; its cancel (if any) arrives on its own
                pass


async def _await_job(ctx: ToolContext, job: Job, why: str) -> None:
    try:
        await _wait_reporting(ctx, job)
    finally:
        if not job.settled.is_set():  # the call itself was cancelled (or timed out): so is the child
            job.cancel(why)


def _failed(d: Delegation, job: Job) -> ToolError:
    reply, _ = shape_reply(job.reply, min(d.config.result_max_bytes, 4000))
    partial = f"\nIts reply so far:\n{reply}" if reply.strip() else ""
    return ToolError(f"{job.error or job.status} (job {job.id}){partial}")


async def _delegate_tool(ctx: ToolContext, args: DelegateArgs) -> DelegateResult:
    d = _delegation(ctx)
    job = await d.submit(args)
    if args.background:
        return DelegateResult(job_id=job.id, target=job.target, status=job.status, seconds=job.seconds)
    await _await_job(ctx, job, "the delegate_session call was cancelled")
    if job.status != "completed":
        raise _failed(d, job)
    return d.result(job)


async def _list_jobs_tool(ctx: ToolContext, args: NoArgs) -> JobList:
    d = _delegation(ctx)
    return JobList(jobs=[j.info() for j in d.jobs.values()])


async def _get_job_tool(ctx: ToolContext, args: GetJobArgs) -> DelegateResult:
    d = _delegation(ctx)
    job = d.job(args.job_id)
    if args.wait:
        # Waiting is not the child's owner: a cancelled wait leaves the job running.
        await _wait_reporting(ctx, job)
    return d.result(job)


async def _cancel_job_tool(ctx: ToolContext, args: JobArgs) -> JobInfo:
    d = _delegation(ctx)
    job = d.job(args.job_id)
    job.cancel("cancelled with cancel_job")
    with trio.move_on_after(TEARDOWN_SECS):
        await job.done.wait()
    return job.info()
