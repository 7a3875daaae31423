"""A Crucible session = agent process + ACP session + its MCP bridge + card + transcript,
started and torn down as one unit in one trio nursery.

The bridge: every session gets its own `BridgeServer` (kiln tools, its policy, later its
delegation tools) mounted on the process's one streamable-HTTP endpoint on 127.0.0.1 with
a per-session bearer token. Agents that advertise `mcpCapabilities.http` get the URL; the
others get `cru mcp --connect URL` over stdio, which relays to the same mount, so the
session state is the same whatever the transport.

Permissions: the agent's ACP requests and the bridge's own `ask` tools go through one
`PermissionPolicy`. When the agent asked (over ACP) for one of our bridge tools and the
person said yes, the bridge call that follows is pre-approved, so the person is asked at
most once per call (OpenCode never asks over ACP: then the bridge asks).
"""

from __future__ import annotations

import logging
import math
import shlex
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import trio

from acp_host.jsonrpc import JsonRpcError
from acp_host.process import AgentNotFoundError, AgentProcess, AgentStartError
from acp_host.registry import (
    AgentRegistryError,
    AgentSpec,
    install_hint,
    known_defect,
    resolve_agent,
)
from crucible import hard_stop
from crucible.errors import CrucibleError
from crucible.permissions import (
    GATED_KINDS,
    READ_ONLY_BRIDGE_TOOLS,
    PermissionPolicy,
    ToolKey,
    tool_key_from_acp,
)
from crucible.redaction import held_length, redact, remember_secret
from crucible.session_store import (
    FLUSH_EVERY,
    SessionMeta,
    SessionStore,
    SessionWriter,
    clean_title,
    new_session_id,
)
from crucible.start_failures import (
    Evidence,
    Failure,
    agent_env,
    agent_kind,
    diagnose,
    stderr_summary,
)
from mcp_bridge import BRIDGE_NAME

if TYPE_CHECKING:
    # acp_host.session pulls in acp.schema (~1 s): imported where needed, after the agent is
    # spawned, so the agent boots while we import (see `spawn_agent`).
    from acp_host.client import AcpClient
    from acp_host.session import (
        AcpSession,
        Decision,
        DecisionKind,
        Event,
        PermissionRequest,
        TurnEnded,
    )
    from crucible.cards import Card
    from crucible.config import Config
    from crucible.delegation import Delegation
    from crucible.events import ChildEventHook
    from crucible.plugins.host import PluginHost
    from mcp_bridge.gateway import Gateway
    from mcp_bridge.server import BridgeHTTP, BridgeServer

# `open_session`'s shape, for the delegation that opens child sessions with it.
OpenSession = Callable[..., AbstractAsyncContextManager["CrucibleSession"]]

TOKEN_ENV = "CRUCIBLE_BRIDGE_TOKEN"
# How long after session/new we still wait for the agent's first tools/list on the bridge.
# All three real agents list tools *during* session/new, so this is only a small grace.
BRIDGE_GRACE = 2.0


@dataclass(frozen=True)
class PermissionAsk:
    """A question for the person: may this tool run?"""

    label: str  # provenance, e.g. "claude" or "claude › reviewer"
    key: ToolKey
    title: str
    request: PermissionRequest | None  # None when the bridge asks (no ACP request behind it)
    arguments: dict[str, Any] | None = None


# The person (TUI dialog, -p flags, the editor, or a parent session) answers with a Decision.
Asker = Callable[[PermissionAsk], Awaitable["Decision"]]


def decision_of(kind: DecisionKind, reason: str) -> Decision:
    """A decision made without asking anyone (a rule, a remembered answer, a flag)."""
    # acp_host.session loads acp.schema (~0.5 s): not before the agent is spawned.
    from acp_host.session import Decision

    return Decision(kind, reason, asked=False)


async def deny_asker(ask: PermissionAsk) -> Decision:
    return decision_of("reject_once", "nobody to ask (no --approve-all)")


def approve_all_asker(reason: str = "--approve-all") -> Asker:
    async def asker(ask: PermissionAsk) -> Decision:
        return decision_of("allow_once", reason)

    return asker


def deny_all_asker(reason: str = "--deny-all") -> Asker:
    async def asker(ask: PermissionAsk) -> Decision:
        return decision_of("reject_once", reason)

    return asker


@dataclass(frozen=True)
class ElicitationAsk:
    """An upstream MCP server asks the person something during a tool call (elicitation/create)."""

    label: str  # the session's provenance, e.g. "claude › reviewer"
    server: str  # the upstream MCP server's name
    message: str
    schema: dict[str, Any] | None  # form mode: the fields wanted (JSON schema, flat object)
    url: str | None = None  # url mode: where the person should go


@dataclass(frozen=True)
class ElicitAnswer:
    action: Literal["accept", "decline", "cancel"]
    content: dict[str, Any] | None = None
    note: str = ""  # why, for the transcript


# The person (TUI dialog, the editor) answers an elicitation; `-p` declines unless --approve-all.
Elicitor = Callable[[ElicitationAsk], Awaitable[ElicitAnswer]]


async def decline_elicitor(ask: ElicitationAsk) -> ElicitAnswer:
    return ElicitAnswer("decline", note="nobody to ask (no --approve-all)")


async def defaults_elicitor(ask: ElicitationAsk) -> ElicitAnswer:
    """`--approve-all`: accept with the defaults the server offered; decline when a required
    field has none (there is nothing honest to answer)."""
    if ask.url is not None:
        return ElicitAnswer("decline", note="--approve-all does not open links")
    schema = ask.schema or {}
    props = schema.get("properties") or {}
    content = {k: v["default"] for k, v in props.items() if isinstance(v, dict) and "default" in v}
    missing = [k for k in schema.get("required") or [] if k not in content]
    if missing:
        return ElicitAnswer("decline", note=f"--approve-all: no default for {', '.join(missing)}")
    return ElicitAnswer("accept", content, note="--approve-all: the server's defaults")


@dataclass
class SessionOptions:
    agent: AgentSpec
    kiln: Path
    cwd: Path
    config: Config
    card: Card | None = None
    asker: Asker = deny_asker
    record: Path | None = None
    extra_mcp_servers: list[dict[str, Any]] = field(default_factory=list)  # e.g. the editor's own
    extra_env: dict[str, str] = field(default_factory=dict)
    inactivity_timeout: float = 300.0
    init_timeout: float = 60.0
    store: SessionStore | None = None
    parent_policy: PermissionPolicy | None = None
    parent_id: str | None = None
    resume: str | None = None  # a saved Crucible session id
    # The agent's model and mode the person asked for (--model, --mode): set after session/new,
    # an error listing what the agent offers when it has no such value.
    model: str | None = None
    mode: str | None = None
    cancel_timeout: float = 30.0  # how long a cancelled turn may take to end before it is dropped
    # Every session/update from the agent before it is parsed, params and raw frame (`cru acp`
    # forwards them; see `acp_host.client.AcpClient.on_update`).
    on_update: Callable[[dict[str, Any], bytes | None], Awaitable[None]] | None = None
    # Who answers an upstream MCP server's elicitation/create (declined by default).
    elicitor: Elicitor = decline_elicitor

    def for_child(self, agent: AgentSpec, card: Card | None, parent_policy: PermissionPolicy,
                  parent_id: str) -> SessionOptions:
        """A delegated child's options: the parent's kiln, cwd, config, person (asker), store and
        timeouts; its own agent and card; its policy bounded by the parent's."""
        return SessionOptions(
            agent=agent, kiln=self.kiln, cwd=self.cwd, config=self.config, card=card, asker=self.asker,
            elicitor=self.elicitor,
            store=self.store, inactivity_timeout=self.inactivity_timeout, init_timeout=self.init_timeout,
            parent_policy=parent_policy, parent_id=parent_id,
        )

    def continued(self, saved: SessionMeta) -> SessionOptions:
        """These options going on with the saved conversation `saved` (the chat's /sessions
        picker): its own agent (profile, built-in or the same --agent-command), card, kiln and
        cwd, as `cru session resume` does; the person, the config and the store stay. The model
        and mode asked for stay only with the same agent. Errors say what is missing."""
        if not Path(saved.cwd).is_dir():
            raise CrucibleError(f"the folder of session {saved.id} is gone ({saved.cwd})",
                                f"resume it from another folder: cru session resume {saved.id} --cwd DIR")
        kiln = Path(saved.kiln) if saved.kiln else self.kiln
        if not kiln.is_dir():
            raise CrucibleError(f"the kiln of session {saved.id} is gone ({kiln})",
                                f"resume it with another kiln: cru session resume {saved.id} --kiln DIR")
        command = shlex.join(saved.agent_command) if saved.agent_command else None
        try:
            agent = resolve_agent(saved.agent, agent_command=command, profiles=self.config.agents)
        except AgentRegistryError as exc:
            raise CrucibleError(exc.message, exc.fix) from None
        if not agent.found:
            raise CrucibleError(f"the agent {agent.name} of session {saved.id} is not installed ({agent.source})",
                                install_hint(agent.name))
        card = None
        if saved.card:
            from crucible.cards import get_card  # ruamel.yaml: only for a conversation with a card

            card = get_card(saved.card, kiln, Path(saved.cwd))
        same = agent.name == self.agent.name
        return replace(self, agent=agent, kiln=kiln, cwd=Path(saved.cwd), card=card, resume=saved.id,
                       model=self.model if same else None, mode=self.mode if same else None)


def _kiln_key(kiln: Path) -> Path:
    return kiln.resolve()


class BridgeHost:
    """The process's one streamable-HTTP endpoint serving every session's bridge, and one
    kiln watcher per kiln (keeping the index fresh and telling every bridge of changes).

    `index_early`: start embedding each kiln in the background as its first session opens
    (`cru chat`, `cru acp`); `cru chat -p`'s one turn leaves it to the first search, which
    answers from the lexical index and whatever is embedded."""

    def __init__(self, *, index_early: bool = True) -> None:
        self.index_early = index_early
        self.app: BridgeHTTP | None = None
        self.port: int | None = None
        self._backends: dict[Path, Any] = {}
        self._bridges: dict[Path, set[BridgeServer]] = {}
        self._nursery: trio.Nursery | None = None
        self.gateway: Gateway | None = None
        self.plugins: PluginHost | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[BridgeHost]:
        from mcp_bridge.server import BridgeHTTP, serving_http  # the mcp SDK: see `preload`

        async with trio.open_nursery() as nursery, BridgeHTTP() as app, serving_http(app, port=0) as port:
            self.app, self.port, self._nursery = app, port, nursery
            try:
                yield self
            finally:
                self.app = self._nursery = None
                nursery.cancel_scope.cancel()
                for backend in self._backends.values():
                    backend.close()  # stops its background indexing (bounded)

    def backend(self, kiln: Path, config: Config) -> Any:
        """One kiln backend per kiln per process: sessions share its index and its watcher."""
        from crucible.kiln_mcp import CrucibleKilnBackend  # the kiln stack: see `preload`

        key = _kiln_key(kiln)
        if key not in self._backends:
            backend = CrucibleKilnBackend(key, config)
            if self.index_early:
                backend.start_indexing()  # in the background: the agent is spawned by now in `cru chat`
            self._backends[key] = backend
            self._bridges[key] = set()
            if self._nursery is not None:
                self._nursery.start_soon(self._watch, key, backend)
        return self._backends[key]

    async def gateway_for(self, config: Config) -> Gateway:
        """The process's one gateway to the upstream MCP servers, shared by every session (its
        upstreams start on a bridge's first tools/list)."""
        if self.gateway is None:
            from crucible.mcp_gateway import (
                build_gateway,  # the gateway (the mcp SDK's clients) only when upstreams are configured
            )

            gateway = build_gateway(config)
            assert self._nursery is not None, "BridgeHost must be running"
            await self._nursery.start(self._run_gateway, gateway)
            self.gateway = gateway
        return self.gateway

    async def plugins_for(self, config: Config) -> PluginHost:
        """The process's Lua plugins, loaded once (in a worker thread) and shared by every session."""
        if self.plugins is None:
            from crucible.plugins.host import (
                load_all,  # Lua plugins load when the first bridge is built, not before the agent spawns
            )

            self.plugins = await trio.to_thread.run_sync(load_all, config)
        return self.plugins

    @staticmethod
    async def _run_gateway(gateway: Gateway, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with gateway.running():
            task_status.started()
            await trio.sleep_forever()

    async def _watch(self, key: Path, backend: Any) -> None:
        async def changed(paths: list[str]) -> None:
            for bridge in list(self._bridges.get(key, ())):
                await bridge.notes_changed(paths)

        try:
            await backend.watch_changes(changed)
        except Exception as exc:  # a broken watcher must not end the sessions
            logging.getLogger("crucible.sessions").warning("kiln watcher stopped: %s", exc)

    async def mount(self, kiln: Path, bridge: BridgeServer, token: str, base: str) -> None:
        assert self.app is not None, "BridgeHost must be running"
        await self.app.mount(bridge, token=token, base=base, watch=False)
        self._bridges.setdefault(_kiln_key(kiln), set()).add(bridge)

    def unmount(self, kiln: Path, bridge: BridgeServer, base: str) -> None:
        self._bridges.get(_kiln_key(kiln), set()).discard(bridge)
        if self.app is not None:
            self.app.unmount(base)

    def url(self, base: str) -> str:
        return f"http://127.0.0.1:{self.port}{base}/mcp"


class CrucibleSession:
    """One live session. Create with `open_session`."""

    def __init__(self, opts: SessionOptions, policy: PermissionPolicy, writer: SessionWriter) -> None:
        self.opts = opts
        self.id = writer.meta.id
        self.policy = policy
        self.writer = writer
        self.label = policy.label
        self.client: AcpClient | None = None
        self.acp: AcpSession | None = None
        self.bridge: BridgeServer | None = None
        self.bridge_transport = ""
        self.bridge_listed = trio.Event()
        self.warnings: list[str] = []  # for the person: shown by `cru chat`, sent to the editor by `cru acp`
        self._cancel_defect_said = False  # see cancel_defect_once
        self._preapproved: dict[str, int] = {}  # bridge tool -> calls the person already approved
        # ACP tool kind (execute, edit) -> fs/terminal requests the person approved this turn
        self._service_preapproved: dict[str, int] = {}
        self.preamble_pending = True  # the card body (and a resumed conversation) go with the next prompt
        # Told of what happens outside the ACP event stream (the bridge asking the person); set
        # by the session's events.Pipeline.
        self.on_notice: Callable[[str], None] | None = None
        self.on_permission: Callable[[str, str, str], None] | None = None  # (title, decision, reason)
        self.resumed_natively = False  # the agent loaded its own history (session/load|resume)
        self.previous: SessionMeta | None = None  # the saved session this one goes on from, as it was
        self.failure: Failure | None = None  # the known cause of the last failed turn
        # Delegated children (crucible/delegation.py) and the host's view of their events.
        self.delegation: Delegation | None = None
        self.on_child_event: ChildEventHook | None = None
        # What `aclose` ends, set by `open_session` as each comes up.
        self.nursery: trio.Nursery | None = None  # the agent's connection's tasks
        self.unmount: Callable[[], None] | None = None  # the bridge's mount on the host
        self.closed = False

    async def aclose(self) -> None:
        """The one way a session ends, whatever ended it (its block, an error, a cancel, the
        agent dying, the editor closing it): its children are cancelled; the bridge is unmounted
        first (node agents keep running while an MCP stream is open, and exit on stdin EOF only
        once it is gone, which saves the 2 s SIGTERM grace); then the agent (its ACP sessions
        and their terminals, the connection, its process group), the connection's tasks, and
        the transcript. Shielded, so a cancelled caller still closes everything; bounded, as
        each step is (the agent's exit grace, then SIGTERM and SIGKILL of its group): an error
        from it means "closed without grace", never "still open". A second call does nothing."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.delegation is not None:
                self.delegation.cancel_all("the session closed")
            if self.unmount is not None:
                self.unmount()
            if self.bridge is not None:
                self.bridge.close()  # detach from the process's upstream MCP servers
            if self.client is not None:
                with trio.CancelScope(shield=True):
                    await self.client.aclose()
        finally:
            if self.nursery is not None:
                self.nursery.cancel_scope.cancel()
            self.writer.end_open_turn(hard_stop.why_stopped() or "the session closed before the agent finished")
            self.writer.close()

    # -- permissions ---------------------------------------------------------------------
    async def on_acp_permission(self, request: PermissionRequest) -> Decision:
        """The agent asks, over ACP."""
        call = request.tool_call
        raw = {"toolCallId": call.tool_call_id, "title": call.title, "kind": call.kind, "rawInput": call.raw_input}
        key = tool_key_from_acp(raw)
        if key.bridge:  # an upstream or plugin tool's read-only hint, as the bridge knows it
            key = ToolKey(key.name, bridge=True, read_only=self.bridge_read_only(key.name), summary=key.summary)
        decided = self.policy.decide(key)
        if decided.rule == "allow":
            decision = decision_of("allow_once", decided.reason)
        elif decided.rule == "deny":
            decision = decision_of("reject_once", decided.reason)
        else:
            ask = PermissionAsk(self.label, key, call.title or key.name, request)
            decision = await self.opts.asker(ask)
            if decision.kind == "allow_always":
                self.policy.remember(key.name, "allow")
            elif decision.kind == "reject_always":
                self.policy.remember(key.name, "deny")
        if key.bridge and decision.kind.startswith("allow"):
            self._preapproved[key.name] = self._preapproved.get(key.name, 0) + 1
        elif decision.kind.startswith("allow") and key.name in GATED_KINDS:
            # The agent asked first, as it should: its fs/terminal request that follows this
            # turn is not asked about again (see `gate_service`).
            self._service_preapproved[key.name] = self._service_preapproved.get(key.name, 0) + 1
        return decision

    async def gate_service(self, method: str, kind: str, summary: str, params: Any) -> str | None:
        """The agent's terminal/create or fs/write_text_file, before it runs: the policy (card,
        config, remembered answers, `--deny-all`) decides, as for a tool call of that kind,
        whether or not the agent asked over ACP. None: it runs; else why it is refused."""
        key = ToolKey(kind, bridge=False, read_only=False, summary=summary)
        decided = self.policy.decide(key)
        if decided.rule == "allow":
            return None
        if decided.rule == "deny":
            self._tell_refusal(kind, summary, decided.reason)
            return decided.reason
        if self._service_preapproved.get(kind, 0) > 0:
            self._service_preapproved[kind] -= 1
            return None
        title = f"{'run' if kind == 'execute' else 'write'} {summary}"
        decision = await self.opts.asker(PermissionAsk(self.label, key, title, None,
                                                       {"method": method, "what": summary}))
        if decision.kind == "allow_always":
            self.policy.remember(kind, "allow")
        elif decision.kind == "reject_always":
            self.policy.remember(kind, "deny")
        self.writer.append({"type": "permission", "title": title, "decision": decision.kind,
                            "reason": decision.reason, "via": method})
        if decision.kind.startswith("allow"):
            return None
        self._tell_refusal(kind, summary, decision.reason)
        return decision.reason or "refused"

    def _tell_refusal(self, kind: str, summary: str, reason: str) -> None:
        self._tell_permission(f"{kind} {summary}", "refused", reason)

    def _tell_permission(self, title: str, decision: str, reason: str) -> None:
        """A decision Crucible asked or made itself (not through the agent's ACP request)."""
        if self.on_permission is not None:
            self.on_permission(title, decision, reason)

    def chose(self, what: Literal["mode", "model"], value: str) -> None:
        """The person switched the agent's mode or model: saved, so a resume sets it again."""
        if getattr(self.writer.meta, what) != value:
            setattr(self.writer.meta, what, value)
            self.writer.save_meta()

    def warn(self, message: str) -> None:
        """Something the person should know that does not stop the session; saved with it."""
        self.warnings.append(message)
        self.writer.append({"type": "warning", "message": message})

    def cancel_defect_once(self) -> str | None:
        """After a cancelled turn: the agent build's known defect with cancels and its update
        (`acp_host.registry.known_defect`), the first time asked in this session; else None."""
        init = self.client.init if self.client is not None else None
        if self._cancel_defect_said or init is None or (defect := known_defect(init.agent_info)) is None:
            return None
        self._cancel_defect_said = True
        return defect

    def bridge_read_only(self, tool: str) -> bool:
        """Kiln tools by name; upstream and plugin tools as the bridge knows them."""
        known = self.bridge.tool_read_only(tool) if self.bridge is not None else None
        return known if known is not None else tool in READ_ONLY_BRIDGE_TOOLS

    def bridge_policy(self, tool: str) -> str:
        return self.policy.decide(ToolKey(tool, bridge=True, read_only=self.bridge_read_only(tool))).rule

    async def elicit_upstream(self, server: str, params: Any) -> Any:
        """An upstream MCP server asks the person (elicitation/create) during a tool call."""
        import mcp_types  # the MCP types with the bridge, after the agent is spawned

        url = getattr(params, "url", None)
        ask = ElicitationAsk(self.label, server, str(params.message)[:2000],
                             getattr(params, "requested_schema", None), url)
        answer = await self.opts.elicitor(ask)
        self.writer.append({"type": "elicitation", "server": server, "action": answer.action,
                            "reason": answer.note})
        if self.on_notice is not None:
            self.on_notice(f"[elicitation] {server}: {answer.action}" + (f" ({answer.note})" if answer.note else ""))
        return mcp_types.ElicitResult(action=answer.action, content=answer.content if answer.action == "accept" else None)

    async def bridge_ask(self, tool: str, arguments: dict[str, Any]) -> bool:
        """The bridge asks for an `ask` tool the agent called without asking us first."""
        if self._preapproved.get(tool, 0) > 0:
            self._preapproved[tool] -= 1
            return True
        key = ToolKey(tool, bridge=True, read_only=self.bridge_read_only(tool), summary=_args_summary(arguments))
        decision = await self.opts.asker(PermissionAsk(self.label, key, tool, None, arguments))
        if decision.kind == "allow_always":
            self.policy.remember(tool, "allow")
        elif decision.kind == "reject_always":
            self.policy.remember(tool, "deny")
        self.writer.append({"type": "permission", "title": tool, "decision": decision.kind,
                            "reason": decision.reason, "via": "bridge"})
        self._tell_permission(tool, decision.kind, f"{decision.reason}; asked by the bridge")
        return decision.kind.startswith("allow")

    def terminal_output(self, terminal_id: str) -> str | None:
        """What a terminal of this session printed so far (None when there is no such terminal)."""
        services = self.acp.services if self.acp is not None else None
        return services.output_so_far(terminal_id) if services is not None else None

    def on_bridge_event(self, event: Any) -> None:
        if event.kind == "list":
            self.bridge_listed.set()

    # -- turns ---------------------------------------------------------------------------
    def prompt_blocks(self, text: str, extra_blocks: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """The card's body goes first in the first prompt, so the agent's prompt cache can reuse it."""
        blocks: list[dict[str, Any]] = []
        if self.preamble_pending:
            preamble = self._preamble()
            if preamble:
                blocks.append({"type": "text", "text": preamble})
        blocks.append({"type": "text", "text": text})
        blocks.extend(extra_blocks or [])
        return blocks

    def _preamble(self) -> str:
        parts = []
        card = self.opts.card
        if card is not None and card.body:
            parts.append(f"<instructions card=\"{card.name}\">\n{card.body}\n</instructions>")
        if self.opts.resume and self.opts.store is not None and not self.resumed_natively:
            history = self.opts.store.history_as_context(self.opts.resume)
            if history:
                parts.append(f"<previous_conversation>\n{history}\n</previous_conversation>")
        return "\n\n".join(parts)

    async def prompt(self, text: str, extra_blocks: list[dict[str, Any]] | None = None) -> TurnEnded:
        assert self.acp is not None
        blocks = self.prompt_blocks(text, extra_blocks)
        self.preamble_pending = False
        self.failure = None
        self.writer.append({"type": "user_message", "text": text})
        if not self.writer.meta.title and text.strip():
            self.writer.meta.title = clean_title(text.strip().splitlines()[0])[:80]
            self.writer.meta.title_source = "prompt"
        try:
            return await self.acp.prompt(blocks)
        finally:
            self._service_preapproved.clear()  # an approval never outlives its turn
            # The turn is over: so are its children (not when this prompt was refused because
            # another turn is running: those children are that turn's).
            if self.delegation is not None and not self.acp.turn_running:
                with trio.CancelScope(shield=True):
                    await self.delegation.end_turn()

    def explain_turn_error(self, exc: JsonRpcError) -> str | None:
        """A failed turn's cause and fix, when it is a known failure (crucible/start_failures.py);
        kept in `failure` for `cru chat -p` and `cru acp`."""
        opts = self.opts
        tail = self.client.process.stderr_tail() if self.client is not None and self.client.process else ""
        state = self.acp.state if self.acp is not None else None
        # None: the agent offers no model choice; []: it offers a choice with nothing in it.
        values = [c.id for c in state.model_choices] if state and (state.models or state.agent_models) else None
        found = diagnose(Evidence(opts.agent.name, agent_kind(opts.agent), exc.message, exc.code, exc.data, tail,
                                  agent_env(opts.agent, opts.extra_env), values))
        self.failure = found
        return found.line() if found is not None else None

    async def cancel(self) -> None:
        if self.delegation is not None:
            self.delegation.cancel_all("the parent turn was cancelled")
        if self.acp is not None:
            await self.acp.cancel()

    async def events(self) -> AsyncIterator[Event]:
        """Every event of the session, in order, each recorded in the transcript; for a caller
        that wants them one at a time (`crucible.events.Pipeline` fans out whole batches)."""
        # crucible.events loads acp.schema: not before the agent is spawned (see `preload`).
        from crucible.events import batches

        async for batch in batches(self):
            for event in batch:
                yield event


def _args_summary(arguments: dict[str, Any]) -> str:
    for key in ("path", "query", "target"):
        if isinstance(arguments.get(key), str):
            return str(arguments[key])[:160]
    return ""


def _bridge_entry(client: AcpClient, url: str, token: str) -> dict[str, Any]:
    caps = client.capabilities
    mcp_caps = getattr(caps, "mcp_capabilities", None)
    if mcp_caps is not None and getattr(mcp_caps, "http", False):
        # Always send headers (gemini maps over it unguarded).
        return {"type": "http", "name": BRIDGE_NAME, "url": url,
                "headers": [{"name": "Authorization", "value": f"Bearer {token}"}]}
    # Never put "type": "stdio" on a stdio entry (claude-agent-acp reads any `type` as http);
    # always send args and env (SDK-based agents drop entries without them).
    return {"name": BRIDGE_NAME, "command": sys.executable,
            "args": ["-m", "crucible.cli", "mcp", "--connect", url],
            "env": [{"name": TOKEN_ENV, "value": token}]}


async def spawn_agent(nursery: trio.Nursery, opts: SessionOptions) -> AgentProcess:
    """Start the agent process now, before the heavy imports, so it boots while we import;
    hand it to `open_session(..., process=)`. Its owner is `nursery` until then."""
    try:
        return await AgentProcess.start(nursery, opts.agent.argv, extra_env={**opts.agent.env, **opts.extra_env},
                                        cwd=opts.cwd, name=opts.agent.name)
    except (AgentStartError, OSError) as exc:
        raise explain_start_failure(opts.agent, exc, extra_env=opts.extra_env) from None


def preload() -> None:
    """The modules a session needs (acp.schema, the mcp SDK, hypercorn): ~2 s of imports, run
    in a thread while the agent boots."""
    # Imported here, in that thread, not when this module is: that is the point.
    import hypercorn.trio  # noqa: F401

    import acp_host.client  # noqa: F401
    import crucible.delegation  # noqa: F401
    import crucible.events  # noqa: F401
    import crucible.kiln_mcp  # noqa: F401
    import crucible.renderers  # noqa: F401
    import mcp_bridge.server  # noqa: F401


def explain_start_failure(spec: AgentSpec, exc: BaseException, *, stderr: str = "",
                          extra_env: dict[str, str] | None = None) -> CrucibleError:
    """One clear message with the fix for an agent that cannot start or refuses us (secrets in
    the command or the agent's output redacted: it goes to terminals and editors)."""
    err = _explain_start_failure(spec, exc, stderr=stderr, extra_env=extra_env)
    return CrucibleError(redact(err.message), redact(err.fix) if err.fix else None)


def _explain_start_failure(spec: AgentSpec, exc: BaseException, *, stderr: str,
                           extra_env: dict[str, str] | None) -> CrucibleError:
    """A known failure (crucible/start_failures.py) by its cause, else the agent's own words."""
    code = exc.code if isinstance(exc, JsonRpcError) else None
    data = exc.data if isinstance(exc, JsonRpcError) else None
    message = exc.message if isinstance(exc, JsonRpcError) else str(exc)
    found = diagnose(Evidence(spec.name, agent_kind(spec), message, code, data, stderr,
                              agent_env(spec, extra_env)))
    if found is not None:
        return CrucibleError(found.cause, found.fix)
    from acp_host.session import (
        describe_rpc_error,  # acp.schema: an error path, the agent is running
    )

    text = describe_rpc_error(exc) if isinstance(exc, JsonRpcError) else str(exc)
    # Only when nothing could be started: an agent that ran and then said "not found" or "no
    # such file" (its own config, a method) is not missing, and its words are shown.
    if isinstance(exc, (FileNotFoundError, AgentNotFoundError)):
        return CrucibleError(f"the agent {spec.name} is not installed or not on PATH ({spec.display()})",
                             install_hint(spec.name))
    said = stderr_summary(stderr) if isinstance(exc, JsonRpcError) else ""
    return CrucibleError(f"the agent {spec.name} could not start a session: {text}"
                         + (f"; its stderr ends: {said}" if said else ""),
                         f"run `cru doctor` to check the agent; the command was `{spec.display()}`")


@asynccontextmanager
async def open_session(opts: SessionOptions, host: BridgeHost, *, process: AgentProcess | None = None,
                       parent: Delegation | None = None) -> AsyncIterator[CrucibleSession]:
    """Start the agent, its bridge and its ACP session; tear all of them down on exit.
    `process`: the agent already spawned by `spawn_agent` (it then belongs to this session).
    `parent`: the delegation of the session that delegates to this one."""
    # acp.schema, the mcp SDK and the kiln stack: imported once the agent is spawned (`preload`).
    from acp_host.client import connect_agent
    from crucible.delegation import Delegation
    from crucible.kiln_mcp import INSTRUCTIONS
    from mcp_bridge.gateway import file_root
    from mcp_bridge.server import BridgeServer, new_token

    assert host.app is not None, "BridgeHost must be running"
    store = opts.store or SessionStore()
    opts.store = store
    card_rules = opts.card.tools if opts.card else {}
    card_name = opts.card.name if opts.card else None
    if opts.parent_policy is not None:
        policy = opts.parent_policy.child(card_rules, card_name or opts.agent.name)
    else:
        label = f"{opts.agent.name} › {card_name}" if card_name else opts.agent.name
        policy = PermissionPolicy(card_rules=dict(card_rules), config_rules=dict(opts.config.permissions),
                                  card_name=card_name, label=label)
    meta = SessionMeta(id=new_session_id(), agent=opts.agent.name, created=time.time(), updated=time.time(),
                       cwd=str(opts.cwd), kiln=str(opts.kiln), card=card_name, parent=opts.parent_id,
                       agent_command=opts.agent.argv if opts.agent.source == "--agent-command" else None)
    previous: SessionMeta | None = None
    saved_apart = False
    if opts.resume:
        # The conversation goes on in its own entry (see crucible/session_store.py).
        previous = store.meta(opts.resume)
        writer, in_place = store.continue_conversation(opts.resume, meta)
        saved_apart = not in_place
    else:
        writer = store.create(meta)
    session = CrucibleSession(opts, policy, writer)
    session.previous = previous
    if saved_apart:
        session.warn(f"the conversation {previous.id if previous else ''} is open in another cru: this part "
                     f"is saved as {writer.meta.id}, listed with it")

    bridge = BridgeServer(host.backend(opts.kiln, opts.config), name=BRIDGE_NAME, instructions=INSTRUCTIONS,
                          policy=session.bridge_policy,  # type: ignore[arg-type]
                          ask=session.bridge_ask, observer=session.on_bridge_event,
                          extra={"session": session}, gateway=await host.gateway_for(opts.config),
                          tool_sources=[await host.plugins_for(opts.config)],
                          elicit=session.elicit_upstream, roots=[file_root(str(opts.kiln)), file_root(str(opts.cwd))])
    session.bridge = bridge
    delegation = Delegation.attach(session, host, open_child=open_session, parent=parent)
    token = new_token()
    remember_secret(token)  # never shown or saved in the clear (recordings, logs, errors)
    base = f"/s/{session.id}"
    async with trio.open_nursery() as nursery:
        session.nursery = nursery
        try:
            await host.mount(opts.kiln, bridge, token, base)
            session.unmount = partial(host.unmount, opts.kiln, bridge, base)
            try:
                client = await connect_agent(
                    nursery, opts.agent.argv, extra_env={**opts.agent.env, **opts.extra_env}, cwd=opts.cwd,
                    name=opts.agent.name, init_timeout=opts.init_timeout, record_to=opts.record, record_redact=redact,
                    record_held_length=held_length, process=process,
                )
            except (AgentStartError, OSError) as exc:
                raise explain_start_failure(opts.agent, exc, extra_env=opts.extra_env) from None
            session.client = client
            client.on_update = opts.on_update
            nursery.start_soon(_flush_transcript, writer)
            entry = _bridge_entry(client, host.url(base), token)
            session.bridge_transport = "http" if "url" in entry else "stdio"
            card_servers = opts.card.acp_mcp_servers(client.capabilities, opts.agent.name) if opts.card else []
            servers = [entry, *card_servers, *_unclaimed(session, opts.extra_mcp_servers, [entry, *card_servers])]
            acp = await _start_acp_session(session, client, servers)
            session.acp = acp
            acp.explain_error = session.explain_turn_error
            acp.service_gate = session.gate_service
            writer.meta.agent_session_id = acp.session_id
            writer.save_meta()
            await _apply_card_settings(session, acp)
            await _apply_saved_choices(session, acp)
            await _apply_requested_settings(session, acp)
            with trio.move_on_after(BRIDGE_GRACE):
                await session.bridge_listed.wait()
            if not session.bridge_listed.is_set():
                session.warn(f"the agent never listed the kiln tools on the crucible bridge "
                             f"({session.bridge_transport}); it will run without them")
            async with delegation.running():
                yield session
        except JsonRpcError as exc:
            agent = session.client.process if session.client is not None else None
            tail = agent.stderr_tail() if agent is not None else ""
            raise explain_start_failure(opts.agent, exc, stderr=tail, extra_env=opts.extra_env) from None
        finally:
            await session.aclose()  # every way out: the block's end, an error, a cancel


async def _flush_transcript(writer: SessionWriter) -> None:
    """Streamed text reaches the session's files within a second, even while nothing else comes
    (a crash then loses at most that second; see SessionWriter)."""
    while True:
        await trio.sleep(FLUSH_EVERY / 2)
        writer.flush_due()


def _unclaimed(session: CrucibleSession, extra: list[dict[str, Any]],
               ours: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The editor's MCP servers whose names the bridge or the card's servers do not take.
    Two servers of one name reach the agent as one (which, depends on the agent), so the
    editor's is left out, with a warning: most likely it is `cru mcp` on the same kiln."""
    taken = {s.get("name") for s in ours}
    kept = []
    for server in extra:
        name = server.get("name") if isinstance(server, dict) else None
        if name in taken:
            whose = "Crucible's kiln bridge" if name == BRIDGE_NAME else "an MCP server of the card"
            session.warn(f"left out the editor's MCP server {name!r}: {whose} has that name "
                         f"(rename it in the editor's settings to give the agent both)")
            continue
        kept.append(server)
    return kept


async def _apply_card_settings(session: CrucibleSession, acp: AcpSession) -> None:
    """The card's `mode` and `model`, when the agent offers them; a warning when it does not."""
    card = session.opts.card
    if card is None:
        return
    problems: list[str] = []
    if card.mode:
        problem = await set_mode(acp, card.mode)
        if problem:
            problems.append(f"card {card.name} asks for mode {card.mode!r}; {problem}")
    if card.model:
        problem = await set_model(acp, card.model)
        if problem:
            problems.append(f"card {card.name} asks for model {card.model!r}; {problem}")
    for problem in problems:
        session.warn(problem)


async def _apply_saved_choices(session: CrucibleSession, acp: AcpSession) -> None:
    """A resumed conversation goes on in the mode and with the model the person chose last (with
    the same agent); one it no longer offers is said, and the agent's own is kept."""
    old, opts = session.previous, session.opts
    if old is None or old.agent != opts.agent.name:
        return
    setters: tuple[tuple[Literal["mode", "model"], str | None, str | None, Any], ...] = (
        ("mode", old.mode, acp.state.mode_now, set_mode), ("model", old.model, acp.state.model_now, set_model))
    for what, value, now, setter in setters:
        if not value or getattr(opts, what) or value == now:
            continue
        problem = await setter(acp, value)
        if problem:
            session.warn(f"this conversation was in {what} {value!r}, which the agent no longer takes ({problem}); "
                         f"it goes on in the agent's own")
        else:
            session.chose(what, value)


async def _apply_requested_settings(session: CrucibleSession, acp: AcpSession) -> None:
    """--mode and --model: the person asked for them, so a value the agent lacks is an error."""
    opts = session.opts
    setters: tuple[tuple[Literal["mode", "model"], str | None, Any], ...] = (
        ("mode", opts.mode, set_mode), ("model", opts.model, set_model))
    for what, value, setter in setters:
        if value:
            problem = await setter(acp, value)
            if problem:
                raise CrucibleError(f"the agent {opts.agent.name} has no {what} {value!r}: {problem}",
                                    f"pass one of the values it offers with --{what}, or leave --{what} out")
            # as the agent names it (--model fake-model is fake/fake-model)
            session.chose(what, (acp.state.mode_now if what == "mode" else acp.state.model_now) or value)


async def set_mode(acp: AcpSession, wanted: str) -> str | None:
    """Switch the agent to mode `wanted` (its modes, else its config option of category mode;
    an id or the one mode of that name). None when done, else what went wrong, with what the
    agent offers."""
    choices = acp.state.mode_choices
    ids = [m.id for m in choices]
    chosen = _pick(wanted, ids, {m.id: m.name for m in choices})
    if chosen is None:
        return f"the agent offers: {', '.join(ids) or 'no modes'}"
    try:
        await acp.switch_mode(chosen)
    except JsonRpcError as exc:
        return f"the agent refused it: {exc.message}"
    return None


async def set_model(acp: AcpSession, wanted: str) -> str | None:
    """Switch the agent to model `wanted` (a value it offers, or a unique short form of one:
    `fake-model` for `fake/fake-model`, or its name). None when done, else what went wrong."""
    choices = acp.state.model_choices
    ids = [c.id for c in choices]
    chosen = _pick(wanted, ids, {c.id: c.name for c in choices})
    if chosen is None:
        return f"the agent offers: {', '.join(ids) or 'no model choice'}"
    try:
        await acp.switch_model(chosen)
    except JsonRpcError as exc:
        return f"the agent refused it: {exc.message}"
    return None


def _pick(wanted: str, values: list[str], names: dict[str, str]) -> str | None:
    """`wanted` if offered, else the one value it is a short form or the name of."""
    if wanted in values:
        return wanted
    lowered = wanted.lower()
    for candidates in ([v for v in values if v.rsplit("/", 1)[-1] == wanted],
                       [v for v, n in names.items() if n.lower() == lowered]):
        if len(candidates) == 1:
            return candidates[0]
    return None


def _has_history(session: CrucibleSession) -> bool:
    """The saved conversation a resumed session goes on from holds something said."""
    store, ref = session.opts.store, session.opts.resume
    try:
        return bool(store is not None and ref and store.conversation(ref).said)
    except (CrucibleError, OSError):
        return True  # unreadable: say what happened


async def _start_acp_session(session: CrucibleSession, client: AcpClient, servers: list[dict[str, Any]]) -> AcpSession:
    opts = session.opts
    kw: dict[str, Any] = {"policy": session.on_acp_permission, "inactivity_timeout": opts.inactivity_timeout,
                          "cancel_timeout": opts.cancel_timeout}
    old = session.previous
    if old is not None:
        caps = client.capabilities
        session_caps = getattr(caps, "session_capabilities", None)
        if old.agent_session_id and old.agent == opts.agent.name:
            try:
                if session_caps is not None and getattr(session_caps, "resume", None) is not None:
                    session.resumed_natively = True
                    return await client.resume_session(old.agent_session_id, opts.cwd, servers, **kw)
                if getattr(caps, "load_session", False):
                    session.resumed_natively = True
                    # The replay arrives before open_session yields, so nobody reads the events yet:
                    # an unbounded buffer keeps a long history (> the default 1024 events) from
                    # blocking the read loop, and with it the session/load answer (a deadlock).
                    return await client.load_session(old.agent_session_id, opts.cwd, servers,
                                                     **{**kw, "event_buffer": math.inf})
            except JsonRpcError as exc:
                # The agent lost its own copy (cleared storage, another machine): the conversation
                # still goes on, from Crucible's transcript handed over as context.
                session.resumed_natively = False
                from acp_host.session import (
                    rpc_error_reason,  # acp.schema: loaded by now, the session runs
                )

                reason = rpc_error_reason(exc)
                if _has_history(session):
                    session.warn(f"the agent could not reopen its session ({reason}); "
                                 f"started a new one with the saved conversation as context")
                else:  # nothing said yet (a client's `sessions new`, then its first prompt): nothing lost
                    logging.getLogger("crucible.sessions").info(
                        "the agent could not reopen its session of no turn (%s): a new one", reason)
    return await client.new_session(opts.cwd, servers, **kw)
