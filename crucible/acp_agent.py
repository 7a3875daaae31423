"""`cru acp`: Crucible as an ACP agent on stdio, driven by an editor (Zed, Neovim, JetBrains, acpx).

Each editor session is one Crucible session (`crucible.sessions.open_session`): the backend
agent process, its kiln bridge, card, policy and transcript. This module only maps the
editor's side onto it:

* `initialize` is answered at once, before any backend starts; the heavy imports (acp.schema,
  mcp, the kiln stack) happen after the answer, in a thread, or when first needed.
* The backend's `session/update` frames are forwarded as they are (unknown variants too):
  the raw line, with only the sessionId replaced by the editor's (re-encoded when that
  cannot be done safely on the bytes); Crucible's card option and slash commands are
  spliced into `config_option_update` / `available_commands_update` (crucible/acp_forward.py).
  The typed events of the session go through the one pipeline (crucible/events.py) into its
  transcript.
* The backend's requests go to the editor: `session/request_permission` after Crucible's own
  policy (card, config, remembered answers) had its say; `fs/*` and `terminal/*` when the
  editor advertised them (it has the unsaved buffers), else the session serves them itself.
* `session/load|resume|list|close` are served from Crucible's own transcripts; a backend
  that can load or resume natively does so (the session layer picks it).
* EOF on stdin, SIGTERM or SIGHUP ends every session and its backend process.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from acp_host.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    ConnectionClosed,
    JsonRpcError,
    JsonRpcPeer,
    Response,
)
from crucible import __version__, hard_stop
from crucible.acp_forward import CoalescingSendStream, UpdateForwarder
from crucible.errors import CrucibleError
from crucible.kiln_calls import kiln_search_text
from crucible.permissions import GATED_KINDS
from crucible.redaction import redact

if TYPE_CHECKING:
    from acp_host.services import SessionServices
    from acp_host.session import Decision, TurnEnded
    from crucible.cards import Card
    from crucible.sessions import (
        BridgeHost,
        CrucibleSession,
        ElicitAnswer,
        ElicitationAsk,
        PermissionAsk,
        SessionOptions,
    )

logger = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
CARD_OPTION = "crucible_card"
NO_CARD = "none"
# How long a turn the editor gave up on ($/cancel_request) may take to end after session/cancel.
_CANCEL_WAIT = 35.0
_KNOWN_IMAGE_AGENTS = ("claude", "gemini", "opencode", "codex")
_PERMISSION_OPTIONS = [
    {"optionId": "allow_once", "name": "Allow once", "kind": "allow_once"},
    {"optionId": "allow_always", "name": "Always allow", "kind": "allow_always"},
    {"optionId": "reject_once", "name": "Reject", "kind": "reject_once"},
    {"optionId": "reject_always", "name": "Always reject", "kind": "reject_always"},
]
CRUCIBLE_COMMANDS: list[dict[str, Any]] = [
    {"name": "card", "description": "Switch the Crucible card (instructions and tool rules) for this session",
     "input": {"hint": "card name, or none"}},
    {"name": "kiln-search", "description": "Search the notes in your kiln",
     "input": {"hint": "what to look for"}},
]
_COMMAND_NAMES = {c["name"] for c in CRUCIBLE_COMMANDS}
# The editor is told the kiln is being indexed when at least this many notes wait for their
# vectors at a turn's start (a few seconds of work or more); a small kiln's build ends unseen.
INDEX_NOTICE_NOTES = 100
# The methods served here, refused until `initialize` (an unknown one is -32601 either way).
_AFTER_INITIALIZE = frozenset({"session/new", "session/load", "session/resume", "session/list", "session/close",
                               "session/prompt", "session/set_config_option", "session/set_mode", "session/set_model",
                               "authenticate"})


def cmd_acp(args: argparse.Namespace) -> int:
    """`cru acp`: serve ACP on stdin/stdout until the editor closes the pipe."""
    in_fd, out_fd = os.dup(0), os.dup(1)
    # Nothing else may write into the protocol stream or read the editor's bytes: stray
    # prints go to stderr, children inherit /dev/null as stdin.
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    if not logging.getLogger().handlers:
        logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="cru acp: %(message)s")
    trio.run(serve, args, in_fd, out_fd)
    return 0


async def serve(args: argparse.Namespace, in_fd: int, out_fd: int) -> None:
    receive = trio.lowlevel.FdStream(in_fd)
    send = CoalescingSendStream(trio.lowlevel.FdStream(out_fd))
    server = AcpAgentServer(args)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(send.run)
        await server.run(send, receive)
        nursery.cancel_scope.cancel()


@dataclass(eq=False)
class ProxySession:
    """One editor session and the Crucible session behind it."""

    id: str  # the editor's sessionId (the Crucible session id, or the one it loaded)
    cs: CrucibleSession
    cards: dict[str, Card]
    card: str
    backend_commands: list[Any] = field(default_factory=list)
    backend_options: list[Any] = field(default_factory=list)
    commands_sent: bool = False
    warnings_told: int = 0  # how many of the session's warnings the editor has been shown
    index_told: str = ""  # what the editor was told of the kiln's index: "", "indexing", "ready", "failed"
    close_requested: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)

    @property
    def backend_id(self) -> str:
        assert self.cs.acp is not None
        return self.cs.acp.session_id

    def card_option(self, category: bool) -> dict[str, Any]:
        values = [{"value": NO_CARD, "name": "No card", "description": "the backend agent as it is"}]
        values += [{"value": c.name, "name": c.name, "description": c.description}
                   for c in sorted(self.cards.values(), key=lambda c: c.name)]
        option: dict[str, Any] = {"id": CARD_OPTION, "name": "Crucible card", "type": "select",
                                  "description": "instructions and tool rules Crucible adds to the agent",
                                  "currentValue": self.card, "options": values}
        if category:
            option["category"] = "mode"
        return option

    def config_options(self) -> list[Any]:
        # Our card selector is the editor's mode picker unless the backend has one of its own.
        backend_has_mode = any(isinstance(o, dict) and o.get("category") == "mode" for o in self.backend_options)
        has_modes = self.cs.acp is not None and bool(self.cs.acp.state.modes)
        return [self.card_option(not (backend_has_mode or has_modes)), *self.backend_options]

    def commands(self) -> list[Any]:
        return [*self.backend_commands, *CRUCIBLE_COMMANDS]

    def splice(self, update: dict[str, Any]) -> dict[str, Any]:
        """The backend's commands or config options with Crucible's put in (and kept for later)."""
        kind = update.get("sessionUpdate")
        if kind == "available_commands_update" and isinstance(update.get("availableCommands"), list):
            self.backend_commands = [c for c in update["availableCommands"]
                                     if not (isinstance(c, dict) and c.get("name") in _COMMAND_NAMES)]
            self.commands_sent = True
            return {**update, "availableCommands": self.commands()}
        if kind == "config_option_update" and isinstance(update.get("configOptions"), list):
            self.backend_options = list(update["configOptions"])
            return {**update, "configOptions": self.config_options()}
        return update


class EditorServices:
    """fs/* and terminal/* for a session: to the editor for what it advertised, else served
    here by the session's own services (sandboxed to its cwd)."""

    def __init__(self, local: SessionServices | None, peer: JsonRpcPeer, editor_id: str,
                 editor_methods: set[str]) -> None:
        self.local = local
        self.peer = peer
        self.editor_id = editor_id
        self.editor_methods = editor_methods

    def handles(self, method: str) -> bool:
        return method in self.editor_methods or (self.local is not None and self.local.handles(method))

    async def handle(self, method: str, params: Any) -> Any:
        if method in self.editor_methods:
            out = {**params, "sessionId": self.editor_id} if isinstance(params, dict) else params
            try:
                return await self.peer.request(method, out)
            except ConnectionClosed:
                raise JsonRpcError(INTERNAL_ERROR, "the editor closed the connection") from None
        if self.local is None:
            raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {method}")
        return await self.local.handle(method, params)

    async def aclose(self) -> None:
        if self.local is not None:
            await self.local.aclose()


def _editor_methods(caps: Any) -> set[str]:
    """The fs/terminal methods the editor said it serves (clientCapabilities)."""
    methods: set[str] = set()
    if not isinstance(caps, dict):
        return methods
    fs = caps.get("fs")
    if isinstance(fs, dict):
        if fs.get("readTextFile") is True:
            methods.add("fs/read_text_file")
        if fs.get("writeTextFile") is True:
            methods.add("fs/write_text_file")
    if caps.get("terminal") is True:
        methods.update({"terminal/create", "terminal/output", "terminal/wait_for_exit", "terminal/kill",
                        "terminal/release"})
    return methods


def _user_error(exc: BaseException) -> CrucibleError | ValueError | None:
    """The CrucibleError (or bad-input ValueError) inside `exc`, possibly in exception groups."""
    if isinstance(exc, CrucibleError | ValueError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _user_error(inner)
            if found is not None:
                return found
    return None


def _rpc_error(err: CrucibleError | ValueError) -> JsonRpcError:
    from crucible.redaction import redact  # what goes to the editor holds no secret

    if isinstance(err, CrucibleError):
        return JsonRpcError(INTERNAL_ERROR, redact(str(err)),
                            {"message": redact(err.message), "fix": redact(err.fix) if err.fix else None})
    return JsonRpcError(INVALID_PARAMS, redact(str(err)))


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _warm_imports() -> None:
    """What the first session/new needs, imported while the editor is still busy."""
    # Here, in a thread after the initialize answer, not when this module is: that is the point.
    import crucible.chat  # noqa: F401
    import crucible.events  # noqa: F401
    import crucible.kiln_mcp  # noqa: F401
    import crucible.sessions  # noqa: F401
    import mcp_bridge.server  # noqa: F401


class AcpAgentServer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.peer: JsonRpcPeer | None = None
        self.editor_caps: Any = {}
        self.editor_methods: set[str] = set()
        self.initialized = False
        self.sessions: dict[str, ProxySession] = {}
        self._host: BridgeHost | None = None
        self._host_lock = trio.Lock()
        self._nursery: trio.Nursery | None = None
        self._ask_ids = itertools.count(1)
        # (editor session, server) told that the editor cannot show that server's questions
        self._questions_told: set[tuple[str, str]] = set()
        self._warm: trio.Event | None = None
        self.out: CoalescingSendStream | None = None  # forwarded updates are queued on it

    # -- running ------------------------------------------------------------------------
    async def run(self, send: trio.abc.SendStream, receive: trio.abc.ReceiveStream) -> None:
        # Forwarded updates skip the peer's per-frame write lock (a checkpoint each): they are
        # queued straight on the same stream, so their order with the peer's frames holds.
        self.out = send if isinstance(send, CoalescingSendStream) else None
        peer = JsonRpcPeer(send, receive, name="editor", request_handler=self.on_request,
                           notification_handler=self.on_notification, on_invalid_line=self._on_invalid_line)
        self.peer = peer
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(hard_stop.stop_on_signals, nursery.cancel_scope)  # SIGTERM, SIGHUP
            nursery.start_soon(hard_stop.stop_when_orphaned, nursery.cancel_scope)  # the editor died
            await peer.run()
            # The editor closed the pipe: end every session and its backend.
            nursery.cancel_scope.cancel()
        with trio.CancelScope(shield=True):
            await peer.aclose()

    def _on_invalid_line(self, line: bytes, reason: str) -> None:
        # The peer answers invalid requests that carry an id; a line that is not JSON at all
        # gets JSON-RPC's parse error with a null id, so the editor sees why nothing happened.
        if self.peer is not None and reason.startswith("not JSON"):
            self.peer.reply_soon(Response(None, error=JsonRpcError(PARSE_ERROR, f"parse error: {reason}")))

    async def _bridge_host(self) -> BridgeHost:
        async with self._host_lock:
            if self._host is None:
                assert self._nursery is not None
                self._host = await self._nursery.start(self._run_host)
            return self._host

    async def _run_host(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        from crucible.sessions import (
            BridgeHost,  # the session stack: after initialize is answered (_warm_imports)
        )

        async with BridgeHost().running() as host:
            task_status.started(host)
            await trio.sleep_forever()

    async def _warm_up(self) -> None:
        if self._warm is not None:
            return
        self._warm = trio.Event()
        try:
            await trio.to_thread.run_sync(_warm_imports)
        except Exception:  # the first session/new reports it properly
            logger.debug("warm-up failed", exc_info=True)
        finally:
            self._warm.set()
        try:
            await self._bridge_host()
        except Exception:
            logger.debug("warm-up failed", exc_info=True)

    async def _warmed(self) -> None:
        # Importing the same modules on two threads at once can see one half-initialised.
        if self._warm is not None:
            await self._warm.wait()

    # -- editor -> us ---------------------------------------------------------------------
    async def on_request(self, method: str, params: Any) -> Any:
        p: dict[str, Any] = params if isinstance(params, dict) else {}
        if method == "initialize":
            return self.initialize(p)
        if not self.initialized and method in _AFTER_INITIALIZE:  # no backend starts before the hello
            raise JsonRpcError(INVALID_REQUEST, f"{method} before initialize: send initialize first")
        await self._warmed()
        if method == "session/new":
            return await self.new_session(p)
        if method in ("session/load", "session/resume"):
            return await self.load_session(p, replay=method == "session/load")
        if method == "session/list":
            return await self.list_sessions(p)
        if method == "session/close":
            return await self.close_session(p)
        if method == "session/prompt":
            return await self.prompt(p)
        if method == "session/set_config_option":
            return await self.set_config_option(p)
        if method in ("session/set_mode", "session/set_model"):
            proxy = self._proxy(p, method)
            assert proxy.cs.client is not None
            result = await proxy.cs.client.request(method, {**p, "sessionId": proxy.backend_id})
            if method == "session/set_model" and proxy.cs.acp is not None and isinstance(p.get("modelId"), str):
                proxy.cs.acp.state.current_model = p["modelId"]
            return result if result is not None else {}
        if method == "authenticate":
            return {}  # the backend agents use the person's own login or keys
        raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {method}")

    async def on_notification(self, method: str, params: Any) -> None:
        if method == "session/cancel" and self.initialized and isinstance(params, dict):
            proxy = self.sessions.get(params.get("sessionId"))  # type: ignore[arg-type]
            if proxy is not None and self.peer is not None:
                self.peer.start_soon(proxy.cs.cancel)

    def initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        self.initialized = True
        self.editor_caps = params.get("clientCapabilities") or {}
        self.editor_methods = _editor_methods(self.editor_caps)
        agent = getattr(self.args, "agent", None)
        # Images go through when the backend is expected to take them; others get a note instead.
        image = getattr(self.args, "agent_command", None) is None and (agent is None or agent in _KNOWN_IMAGE_AGENTS)
        if self.peer is not None:
            self.peer.start_soon(self._warm_up)
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": True,
                "promptCapabilities": {"image": image, "audio": False, "embeddedContext": True},
                "mcpCapabilities": {"http": True, "sse": True},
                "sessionCapabilities": {"list": {}, "resume": {}, "close": {}},
            },
            "agentInfo": {"name": "crucible", "title": "Crucible", "version": __version__},
            "authMethods": [],
        }

    def _proxy(self, params: dict[str, Any], method: str) -> ProxySession:
        sid = params.get("sessionId")
        proxy = self.sessions.get(sid) if isinstance(sid, str) else None
        if proxy is None:
            raise JsonRpcError(INVALID_PARAMS, f"{method}: unknown session {sid!r} (start one with session/new)")
        return proxy

    # -- sessions -------------------------------------------------------------------------
    def _options(self, params: dict[str, Any], resume: str | None = None,
                 card: str | None = None) -> SessionOptions:
        from crucible.chat import (
            build_options,  # the session stack: after initialize is answered (_warm_imports)
        )

        cwd = params.get("cwd")
        if not isinstance(cwd, str) or not os.path.isabs(cwd):
            raise JsonRpcError(INVALID_PARAMS, f"cwd must be an absolute path, got {cwd!r}")
        servers = params.get("mcpServers", [])
        if not isinstance(servers, list):
            raise JsonRpcError(INVALID_PARAMS, "mcpServers must be a list")
        ns = argparse.Namespace(**{**vars(self.args), "cwd": cwd, "resume": resume,
                                   "card": card if card is not None else getattr(self.args, "card", None)})
        try:
            opts: SessionOptions = build_options(ns)
        except CrucibleError as err:
            raise _rpc_error(err) from None
        opts.extra_mcp_servers = list(servers)
        return opts

    async def _open(self, opts: SessionOptions, editor_id: str | None) -> tuple[ProxySession, UpdateForwarder]:
        """Start a Crucible session for the editor; errors become JSON-RPC errors with the fix."""
        assert self.peer is not None
        fwd = UpdateForwarder(self.peer, self.out, editor_id)
        opts.on_update = fwd
        opts.asker = lambda ask: self.ask_editor(fwd, ask)
        opts.elicitor = lambda ask: self.elicit_editor(fwd, ask)
        host = await self._bridge_host()
        assert self._nursery is not None
        try:
            proxy: ProxySession = await self._nursery.start(self._session_task, opts, host, fwd)
        except JsonRpcError:
            raise
        except BaseException as exc:
            err = _user_error(exc)
            if err is None:
                raise
            raise _rpc_error(err) from None
        return proxy, fwd

    async def _session_task(self, opts: SessionOptions, host: BridgeHost, fwd: UpdateForwarder,
                            task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        # The session stack: after initialize is answered (_warm_imports).
        from crucible.cards import load_cards
        from crucible.sessions import open_session

        proxy: ProxySession | None = None
        try:
            async with open_session(opts, host) as cs:
                cards = await trio.to_thread.run_sync(load_cards, opts.kiln, opts.cwd)
                proxy = ProxySession(fwd.editor_id or cs.id, cs, cards, opts.card.name if opts.card else NO_CARD)
                assert cs.acp is not None and self.peer is not None
                proxy.backend_options = [_dump(o) for o in cs.acp.state.config_options]
                proxy.backend_commands = [_dump(c) for c in cs.acp.state.commands]
                cs.acp.services = EditorServices(  # type: ignore[assignment]
                    cs.acp.services, self.peer, proxy.id, self.editor_methods)
                fwd.attach(proxy)
                # What exists now (modules, the kiln index, the session) lives as long as the
                # session: the cyclic GC need not scan it again on each full collection, which a
                # flood of updates triggers (~25 ms each, ~7% of the proxy's CPU in bench/proxy.py).
                # Unfrozen when a session closes, so its garbage can be collected.
                gc.freeze()
                self.sessions[proxy.id] = proxy
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._drain_events, cs)
                    task_status.started(proxy)
                    await proxy.close_requested.wait()
                    nursery.cancel_scope.cancel()
        except Exception:
            if proxy is None:
                raise  # before started: nursery.start() hands it to session/new
            logger.exception("session %s failed", proxy.id)
        finally:
            if proxy is not None:
                gc.unfreeze()
                if self.sessions.get(proxy.id) is proxy:
                    del self.sessions[proxy.id]
                proxy.done.set()

    async def _drain_events(self, cs: CrucibleSession) -> None:
        """Keep the session's typed events flowing into its transcript (the editor already has
        them raw): the one pipeline, with no renderer."""
        from crucible.events import (
            Pipeline,  # the session stack: after initialize is answered (_warm_imports)
        )

        await Pipeline(cs, []).run()

    def _new_result(self, proxy: ProxySession) -> dict[str, Any]:
        acp = proxy.cs.acp
        assert acp is not None
        result: dict[str, Any] = {"sessionId": proxy.id, "configOptions": proxy.config_options()}
        if acp.state.modes:
            result["modes"] = {"currentModeId": acp.state.current_mode,
                               "availableModes": [_dump(m) for m in acp.state.modes]}
        if acp.state.agent_models:  # the older model state (Gemini CLI): the editor's picker reads it
            result["models"] = {"currentModelId": acp.state.current_model, "availableModels": [
                {"modelId": m.id, "name": m.name, **({"description": m.description} if m.description else {})}
                for m in acp.state.agent_models]}
        return result

    async def new_session(self, params: dict[str, Any]) -> dict[str, Any]:
        opts = self._options(params)
        proxy, fwd = await self._open(opts, None)
        result = self._new_result(proxy)
        # Last, with no checkpoint before our answer is written: held updates follow the answer.
        assert self.peer is not None
        self.peer.start_soon(fwd.go_live)
        return result

    async def load_session(self, params: dict[str, Any], *, replay: bool) -> dict[str, Any]:
        from crucible.session_store import (
            SessionStore,  # the session stack: after initialize is answered (_warm_imports)
        )

        sid = params.get("sessionId")
        if not isinstance(sid, str):
            raise JsonRpcError(INVALID_PARAMS, "sessionId missing")
        if sid in self.sessions:
            raise JsonRpcError(INVALID_PARAMS, f"session {sid} is already open (close it first)")
        store = SessionStore()
        try:
            meta = await trio.to_thread.run_sync(store.meta, sid)
        except CrucibleError as err:
            raise _rpc_error(err) from None
        opts = self._options(params, resume=meta.id, card=meta.card)
        opts.store = store
        proxy, fwd = await self._open(opts, sid)
        # A backend that loads natively replays its history itself (forwarded live, before our
        # answer); otherwise the editor gets it from Crucible's transcript.
        caps = proxy.cs.client.capabilities if proxy.cs.client is not None else None
        session_caps = getattr(caps, "session_capabilities", None)
        native_replay = (proxy.cs.resumed_natively and getattr(session_caps, "resume", None) is None
                         and bool(getattr(caps, "load_session", False)))
        if not replay:
            fwd.drop_replay()  # a backend that could only load it replayed it (Gemini CLI)
        await fwd.go_live()
        if replay and not native_replay:
            await self._replay(proxy, store, meta.id)
        return self._new_result(proxy)

    async def _replay(self, proxy: ProxySession, store: Any, sid: str) -> None:
        """The saved conversation to the editor, drawn by the renderer for editors."""
        # The session stack: after initialize is answered (_warm_imports).
        from crucible.events import saved_events
        from crucible.renderers import EditorReplay

        assert self.peer is not None
        replay = EditorReplay(proxy.id)
        replay.render(await trio.to_thread.run_sync(lambda: saved_events(store.events(sid))))
        for params in replay.updates:
            await self.peer.notify("session/update", params)

    async def list_sessions(self, params: dict[str, Any]) -> dict[str, Any]:
        from crucible.session_store import (
            SessionStore,  # the session stack: after initialize is answered (_warm_imports)
        )

        cwd = params.get("cwd")
        # One per conversation, none without a turn (crucible/session_store.py).
        convs = await trio.to_thread.run_sync(SessionStore().conversations)
        sessions = [{"sessionId": c.id, "cwd": c.latest.cwd, "title": c.title or None, "updatedAt": _iso(c.updated)}
                    for c in convs if not cwd or c.latest.cwd == cwd]
        return {"sessions": [{k: v for k, v in s.items() if v is not None} for s in sessions]}

    async def close_session(self, params: dict[str, Any]) -> dict[str, Any]:
        proxy = self._proxy(params, "session/close")
        proxy.close_requested.set()
        await proxy.done.wait()
        return {}

    # -- turns ----------------------------------------------------------------------------
    async def prompt(self, params: dict[str, Any]) -> dict[str, Any]:
        proxy = self._proxy(params, "session/prompt")
        blocks = params.get("prompt")
        if not isinstance(blocks, list) or not blocks:
            raise JsonRpcError(INVALID_PARAMS, "prompt must be a non-empty list of content blocks")
        texts = [b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
        first = texts[0].strip() if texts else ""
        if first.startswith("/"):
            name, _, arg = first[1:].partition(" ")
            if name in _COMMAND_NAMES:
                return await self.run_command(proxy, name, arg.strip())
        text, extra = self._split_blocks(proxy, blocks)
        if proxy.cs.acp is not None and proxy.cs.acp.turn_running:
            raise JsonRpcError(INVALID_PARAMS, "a turn is already running in this session; cancel it first")
        await self._tell_warnings(proxy)
        await self._tell_index(proxy)
        ended = await self._turn(proxy, text, extra)
        if ended.error is not None:
            failure = proxy.cs.failure  # a known cause: the editor gets it with the fix
            if failure is not None:
                raise _rpc_error(CrucibleError(failure.cause, failure.fix))
            raise JsonRpcError(INTERNAL_ERROR, ended.error)
        if ended.stop_reason == "cancelled" and (defect := proxy.cs.cancel_defect_once()) is not None:
            proxy.cs.warn(defect)  # told at the next prompt, before the answer it would make late
        result: dict[str, Any] = {"stopReason": ended.stop_reason}
        if ended.usage is not None:
            result["usage"] = _dump(ended.usage)
        return result

    async def _turn(self, proxy: ProxySession, text: str, extra: list[dict[str, Any]]) -> TurnEnded:
        """Run the turn outside this request's cancel scope: when the editor cancels the request
        (`$/cancel_request`) the backend gets a proper session/cancel and the turn ends in order."""
        done = trio.Event()
        box: list[TurnEnded | Exception] = []

        async def run() -> None:
            try:
                box.append(await proxy.cs.prompt(text, extra))
            except Exception as exc:
                box.append(exc)
            finally:
                done.set()

        assert self._nursery is not None
        self._nursery.start_soon(run)
        try:
            await done.wait()
        except trio.Cancelled:
            with trio.CancelScope(shield=True), trio.move_on_after(_CANCEL_WAIT):
                await proxy.cs.cancel()
                await done.wait()
            raise
        if not box:
            raise JsonRpcError(INTERNAL_ERROR, "the session ended during the turn")
        if isinstance(box[0], Exception):
            raise box[0]
        return box[0]

    def _split_blocks(self, proxy: ProxySession, blocks: list[Any]) -> tuple[str, list[dict[str, Any]]]:
        """The text, and the other blocks as the backend can take them (an embedded resource
        becomes text, an image a note, when the backend did not advertise them)."""
        caps = proxy.cs.client.capabilities.prompt_capabilities if proxy.cs.client is not None else None
        embedded = bool(getattr(caps, "embedded_context", False))
        texts: list[str] = []
        extra: list[dict[str, Any]] = []
        for b in blocks:
            if not isinstance(b, dict):
                continue
            kind = b.get("type")
            if kind == "text":
                texts.append(str(b.get("text", "")))
            elif kind == "resource" and not embedded:
                res: dict[str, Any] = b["resource"] if isinstance(b.get("resource"), dict) else {}
                if isinstance(res.get("text"), str):
                    extra.append({"type": "text", "text": f"<resource uri=\"{res.get('uri', '')}\">\n"
                                                          f"{res['text']}\n</resource>"})
                elif res.get("uri"):
                    extra.append({"type": "resource_link", "uri": res["uri"], "name": str(res["uri"])})
            elif kind in ("image", "audio") and not bool(getattr(caps, kind, False)):
                extra.append({"type": "text", "text": f"[{kind} omitted: the backend agent does not accept {kind}]"})
            else:
                extra.append(b)
        return "\n".join(texts), extra

    async def run_command(self, proxy: ProxySession, name: str, arg: str) -> dict[str, Any]:
        """A Crucible slash command: answered here, the backend never sees it."""
        if name == "card":
            try:
                await self.switch_card(proxy, arg or NO_CARD)
                text = f"Card: {proxy.card}" + ("" if proxy.card == NO_CARD else " (its instructions go with your next prompt)")
            except JsonRpcError as exc:
                text = exc.message
        else:
            text = await kiln_search_text(proxy.cs.bridge, arg)
        await self._say(proxy, text)
        return {"stopReason": "end_turn"}

    async def _tell_warnings(self, proxy: ProxySession) -> None:
        """The session's warnings not yet shown (a card mode the agent lacks, an editor MCP
        server left out, …), as the first lines of the turn: an editor shows session updates
        in the thread, and outside a turn some drop them."""
        new = proxy.cs.warnings[proxy.warnings_told:]
        if new:
            proxy.warnings_told += len(new)
            await self._say(proxy, "".join(f"⚠ Crucible: {w}\n\n" for w in new))

    async def _tell_index(self, proxy: ProxySession) -> None:
        """Like the warnings, at a turn's start: once that the kiln is still being indexed
        (searches match by words until then), or why it failed; once more when it is ready (a
        failed index is opened again once mended, BackgroundIndex._open)."""
        backend = proxy.cs.bridge.backend if proxy.cs.bridge is not None else None
        if backend is None or not hasattr(backend, "index_state") or proxy.index_told == "ready":
            return
        state = backend.index_state()
        text = ""
        if state.phase == "failed":
            if proxy.index_told != "failed":
                proxy.index_told = "failed"
                text = "⚠ Crucible: " + state.failure_text(backend.redact(state.problem or ""))
        elif proxy.index_told == "":
            left = round((1.0 - state.embedded) * state.notes)
            if state.phase in ("embedding", "waiting") and left >= INDEX_NOTICE_NOTES:
                proxy.index_told = "indexing"
                text = (f"Crucible: the kiln's {state.notes:,} notes are being indexed in the background "
                        f"({state.percent}% done); until then searching the kiln matches words "
                        "more than meaning")
        elif state.phase == "ready":
            proxy.index_told = "ready"
            text = f"Crucible: the kiln's index is ready: searching its {state.notes:,} notes matches meaning too"
        if text:
            await self._say(proxy, text + "\n\n")

    async def _say(self, proxy: ProxySession, text: str) -> None:
        assert self.peer is not None
        await self.peer.notify("session/update", {"sessionId": proxy.id, "update": {
            "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}})

    async def switch_card(self, proxy: ProxySession, name: str) -> None:
        if name != NO_CARD and name not in proxy.cards:
            known = ", ".join(sorted(proxy.cards)) or "none"
            raise JsonRpcError(INVALID_PARAMS, f"no card named {name!r} (known cards: {known}, or {NO_CARD})")
        card = proxy.cards.get(name)
        cs = proxy.cs
        cs.opts.card = card
        cs.policy.card_rules = dict(card.tools) if card else {}
        cs.policy.card_name = card.name if card else None
        cs.preamble_pending = True  # the new card's body goes first in the next prompt
        proxy.card = name
        cs.writer.append({"type": "card", "card": name})
        assert self.peer is not None
        await self.peer.notify("session/update", {"sessionId": proxy.id, "update": {
            "sessionUpdate": "config_option_update", "configOptions": proxy.config_options()}})

    async def set_config_option(self, params: dict[str, Any]) -> dict[str, Any]:
        proxy = self._proxy(params, "session/set_config_option")
        if params.get("configId") == CARD_OPTION:
            value = params.get("value")
            if not isinstance(value, str):
                raise JsonRpcError(INVALID_PARAMS, "the card option takes a card name")
            await self.switch_card(proxy, value)
            return {"configOptions": proxy.config_options()}
        assert proxy.cs.client is not None
        result = await proxy.cs.client.request("session/set_config_option", {**params, "sessionId": proxy.backend_id})
        if isinstance(result, dict) and isinstance(result.get("configOptions"), list):
            proxy.backend_options = list(result["configOptions"])
            return {**result, "configOptions": proxy.config_options()}
        return result if isinstance(result, dict) else {}

    # -- backend -> editor ----------------------------------------------------------------
    async def ask_editor(self, fwd: UpdateForwarder, ask: PermissionAsk) -> Decision:
        """The editor's person decides what Crucible's policy left to ask."""
        from acp_host.session import Decision  # acp.schema: after initialize is answered

        peer = self.peer
        editor_id = fwd.editor_id
        if peer is None or editor_id is None:
            return Decision("reject_once", "no editor to ask")
        raw = ask.request.raw if ask.request is not None else None
        if isinstance(raw, dict):
            params = {**raw, "sessionId": editor_id}
            options: list[Any] = raw["options"] if isinstance(raw.get("options"), list) else []
        else:
            # The bridge asks for its own tool (the agent did not ask over ACP).
            options = _PERMISSION_OPTIONS
            params = {"sessionId": editor_id, "options": options, "toolCall": {
                "toolCallId": f"crucible-ask-{next(self._ask_ids)}", "title": f"{ask.label}: {ask.title}",
                "kind": ask.key.name if ask.key.name in GATED_KINDS
                else "other" if ask.key.read_only else "edit", "status": "pending", "rawInput": ask.arguments}}
        try:
            result = await peer.request("session/request_permission", params)
        except ConnectionClosed:
            return Decision("cancelled", "the editor closed the connection")
        except JsonRpcError as exc:
            return Decision("reject_once", f"the editor could not ask: {exc.message}")
        outcome = result.get("outcome") if isinstance(result, dict) else None
        if isinstance(outcome, dict) and outcome.get("outcome") == "selected":
            chosen = outcome.get("optionId")
            for opt in options:
                if isinstance(opt, dict) and opt.get("optionId") == chosen:
                    kind = opt.get("kind")
                    if kind in ("allow_once", "allow_always", "reject_once", "reject_always"):
                        return Decision(kind, f"chosen in the editor ({opt.get('name', chosen)})")
            return Decision("reject_once", f"the editor chose an unknown option {chosen!r}")
        return Decision("cancelled", "cancelled in the editor")


    async def elicit_editor(self, fwd: UpdateForwarder, ask: ElicitationAsk) -> ElicitAnswer:
        """An upstream MCP server's question, asked in the editor (ACP `elicitation/create`)
        when the editor says it can; declined otherwise."""
        from crucible.sessions import (
            ElicitAnswer,  # sessions (and acp.schema) load once initialize is answered
        )

        caps = self.editor_caps.get("elicitation") if isinstance(self.editor_caps, dict) else None
        mode = "url" if ask.url is not None else "form"
        if self.peer is None or fwd.editor_id is None or not isinstance(caps, dict) or caps.get(mode) is None:
            await self._tell_question_declined(fwd, ask, mode)
            return ElicitAnswer("decline", note=f"the editor cannot answer questions ({mode} elicitation)")
        params: dict[str, Any] = {"sessionId": fwd.editor_id, "mode": mode,
                                  "message": f"[{ask.server}] {ask.message}"}
        if ask.url is not None:
            params |= {"url": ask.url, "elicitationId": f"crucible-{next(self._ask_ids)}"}
        else:
            params["requestedSchema"] = ask.schema or {"type": "object", "properties": {}}
        try:
            result = await self.peer.request("elicitation/create", params)
        except ConnectionClosed:
            return ElicitAnswer("cancel", note="the editor closed the connection")
        except JsonRpcError as exc:
            return ElicitAnswer("decline", note=f"the editor could not ask: {exc.message}")
        action = result.get("action") if isinstance(result, dict) else None
        if action == "accept":
            content = result.get("content")
            return ElicitAnswer("accept", content if isinstance(content, dict) else {}, note="answered in the editor")
        if action == "cancel":
            return ElicitAnswer("cancel", note="cancelled in the editor")
        return ElicitAnswer("decline", note="declined in the editor")

    async def _tell_question_declined(self, fwd: UpdateForwarder, ask: ElicitationAsk, mode: str) -> None:
        """Once per session and server: the person would otherwise see only the tool's "declined",
        never that a server asked them something the editor cannot show."""
        if self.peer is None or fwd.editor_id is None or (fwd.editor_id, ask.server) in self._questions_told:
            return
        self._questions_told.add((fwd.editor_id, ask.server))
        message = redact(" ".join(ask.message.split()))
        message = message[:200] + ("…" if len(message) > 200 else "")
        text = (f"⚠ Crucible: the MCP server {ask.server} asked you something (\u201c{message}\u201d); this editor "
                f"cannot show such questions ({mode} elicitation), so Crucible declined it. `cru chat` can answer "
                "them (`cru session resume` goes on with this conversation there).\n\n")
        await self.peer.notify("session/update", {"sessionId": fwd.editor_id, "update": {
            "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}})


def _dump(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    return value
