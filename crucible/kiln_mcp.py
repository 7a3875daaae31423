"""`cru mcp`: the kiln tools over MCP, and the `KilnBackend` that implements them with
`crucible.kiln`.

Startup stays light so `initialize` and `tools/list` answer at once: the index (Chroma, the
embedder), the fused search and the watcher are imported on first use only.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import trio

from crucible import hard_stop
from crucible.config import Config, load_config, resolve_kiln
from crucible.errors import CrucibleError
from crucible.kiln import filesearch
from crucible.kiln.atomic import ConcurrentEditError, atomic_write_text, remove_file
from crucible.kiln.builder import BackgroundIndex, IndexState, StateFn
from crucible.kiln.notes import check_note_text, merge_frontmatter, read_note, replace_body
from crucible.kiln.paths import (
    KilnNotFoundError,
    iter_markdown,
    kiln_sizes,
    resolve_in_kiln,
    shown_rel,
    to_rel,
)
from crucible.mcp_gateway import build_gateway
from crucible.permissions import PermissionPolicy, ToolKey
from crucible.plugins.host import load_all
from mcp_bridge.gateway import file_root
from mcp_bridge.kiln_api import (
    ChangeFn,
    EditConflictError,
    IndexShare,
    KilnError,
    KilnInfo,
    KilnRoot,
    KilnStats,
    NoteData,
    NoteEntry,
    NoteNotFoundError,
    ProgressFn,
    RankedResults,
    SearchHit,
    WriteOutcome,
)
from mcp_bridge.server import (
    BridgeHTTP,
    BridgeServer,
    RelayError,
    new_token,
    relay_stdio,
    serving_http,
)
from mcp_bridge.tools import log_to_stderr

T = TypeVar("T")

TOKEN_ENV = "CRUCIBLE_MCP_TOKEN"
# From this embedded share on, a search waits for the query embedder to load (once per process).
DENSE_WAIT_SHARE = 0.5
# Seconds between a search answered without the query model and the start of its load.
MODEL_LOAD_DELAY = 1.0
INSTRUCTIONS = (
    "Tools for the person's notes (the kiln): search them (semantic_search, text_search, "
    "property_search), read them (read_note, read_metadata, list_notes) and change them "
    "(create_note, update_note, delete_note). Paths are relative to the kiln and end in .md."
)


def _iso(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _message(exc: CrucibleError) -> str:
    """The error as a tool result says it: its message, then its fix as a sentence (a fix that
    is a command is quoted: "Cru kiln index --rebuild." read as prose and misspelt it)."""
    if not exc.fix:
        return exc.message
    fix = f"run `{exc.fix}`" if exc.fix.startswith("cru ") else exc.fix
    return f"{exc.message}. {fix[0].upper()}{fix[1:]}."


def _exists(path: str) -> KilnError:
    return KilnError(f"{shown_rel(path)} already exists; use update_note to change it, "
                     "or create_note with overwrite=true to replace it")


def _not_found(path: str) -> NoteNotFoundError:
    return NoteNotFoundError(
        f"Note not found: {shown_rel(path)} (it may have been moved or deleted; "
        "search or list the notes again for its current path)"
    )


class CrucibleKilnBackend:
    """`mcp_bridge.kiln_api.KilnBackend` over a kiln folder on disk."""

    def __init__(self, root: Path, config: Config | None = None) -> None:
        self.root = root.resolve()
        self.config = config
        self._background: BackgroundIndex | None = None
        self._index_lock = threading.Lock()
        self._secrets = sorted({str(root), str(self.root), str(Path.home())}, key=len, reverse=True)

    @property
    def name(self) -> str:
        return self.root.name

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text and secret not in ("", "/"):
                text = text.replace(secret, "<kiln>" if secret != str(Path.home()) else "~")
        return text

    def _call(self, path: str, func: Callable[[], T]) -> T:
        """Run `func`, turning crucible's errors into the protocol's (kiln-relative) ones."""

        try:
            return func()
        except (KilnNotFoundError, FileNotFoundError):
            raise _not_found(path) from None
        except ConcurrentEditError as exc:
            raise EditConflictError(
                f"'{path}' changed since you read it; nothing was written. "
                "Read it again and apply your change to its current content"
            ) from exc
        except CrucibleError as exc:
            raise KilnError(self.redact(_message(exc))) from None
        except IsADirectoryError:
            raise KilnError(f"'{path}' is a folder, not a note") from None
        except PermissionError:
            raise KilnError(f"'{path}': permission denied") from None

    # --- notes ----------------------------------------------------------------------------

    def _note_data(self, path: str) -> NoteData:
        note = read_note(self.root, path)
        st = resolve_in_kiln(self.root, path, must_exist=True).stat()
        return NoteData(
            path=note.path,
            text=note.text,
            frontmatter=note.frontmatter,
            title=note.title,
            tags=note.tags,
            links=[link.target for link in note.links],
            headings=[h.text for h in note.headings],
            content_hash=note.content_hash,
            size_bytes=st.st_size,
            modified=_iso(st.st_mtime),
            problems=note.problems,
        )

    def read_note(self, path: str) -> NoteData:
        return self._call(path, lambda: self._note_data(path))

    def _written(self, target: Path, digest: str | None, *, replaced: bool = False) -> WriteOutcome:
        size = target.stat().st_size if target.exists() else 0
        return WriteOutcome(path=to_rel(self.root, target), content_hash=digest, size_bytes=size, replaced=replaced)

    def create_note(
        self, path: str, body: str, frontmatter: dict[str, Any] | None, *, overwrite: bool
    ) -> WriteOutcome:
        def create() -> WriteOutcome:
            target = resolve_in_kiln(self.root, path, for_write=True)
            existed = target.exists()
            if existed and not overwrite:
                raise _exists(path)
            text = merge_frontmatter(body, frontmatter) if frontmatter else body
            check_note_text(text, to_rel(self.root, target))
            try:
                digest = atomic_write_text(target, text, root=self.root, make_folders=True, exclusive=not overwrite)
            except FileExistsError:  # another writer made it since the check above
                raise _exists(path) from None
            return self._written(target, digest, replaced=existed)

        return self._call(path, create)

    def update_note(
        self,
        path: str,
        *,
        frontmatter: dict[str, Any] | None,
        remove_keys: list[str],
        body: str | None,
        expected_hash: str | None,
    ) -> WriteOutcome:
        def update() -> WriteOutcome:
            target = resolve_in_kiln(self.root, path, for_write=True, must_exist=True)
            note = read_note(self.root, path)
            if expected_hash is not None and expected_hash != note.content_hash:
                raise EditConflictError(
                    f"'{path}' changed since you read it (its content_hash is now "
                    f"{note.content_hash}); nothing was written. Read it again and retry"
                )
            text = note.text
            if frontmatter or remove_keys:
                text = merge_frontmatter(text, frontmatter or {}, remove_keys)
            if body is not None:
                text = replace_body(text, body)
            check_note_text(text, to_rel(self.root, target))
            # Guard with the hash of what we read, so an edit that lands meanwhile is never lost.
            return self._written(target, atomic_write_text(target, text, expected_hash=note.content_hash,
                                                           root=self.root))

        return self._call(path, update)

    def delete_note(self, path: str, *, expected_hash: str | None) -> WriteOutcome:
        def delete() -> WriteOutcome:
            target = resolve_in_kiln(self.root, path, for_write=True, must_exist=True)
            rel = to_rel(self.root, target)
            try:
                size = remove_file(target, root=self.root, expected_hash=expected_hash)
            except ConcurrentEditError:
                raise EditConflictError(
                    f"'{path}' changed since you read it; it was not deleted. Read it again first"
                ) from None
            return WriteOutcome(path=rel, content_hash=None, size_bytes=size)

        return self._call(path, delete)

    def list_notes(self, folder: str) -> list[NoteEntry]:
        def listing() -> list[NoteEntry]:
            entries = []
            for rel in iter_markdown(self.root, folder):
                try:
                    st = (self.root / rel).stat()
                except OSError:
                    continue  # deleted while listing
                entries.append(NoteEntry(path=rel, size_bytes=st.st_size, modified=_iso(st.st_mtime)))
            return entries

        try:
            return self._call(folder, listing)
        except NoteNotFoundError:
            raise KilnError(f"No folder {shown_rel(folder)} in the kiln; list_notes without a folder shows them all") from None

    # --- search ---------------------------------------------------------------------------

    # The index lives in a BackgroundIndex: opened and brought up to date in the background
    # from `start_indexing` (called when `cru mcp`, `cru chat` or `cru acp` start) or the first
    # search, whichever comes first.

    def _indexer(self) -> BackgroundIndex:
        with self._index_lock:
            if self._background is None:
                self._background = BackgroundIndex(self.root, self.config or Config())
            return self._background

    def start_indexing(self) -> None:
        """Open the kiln's index and embed what is missing, in the background (returns at once)."""
        self._indexer().start()

    def index_state(self) -> IndexState:
        """Where the index is: phase ("opening", "embedding", "waiting", "ready", "failed"...),
        `embedded` (0..1) and `notes`: what a status bar shows (`indexing 34%`)."""
        return self._indexer().state()

    def on_index_state(self, fn: StateFn) -> Callable[[], None]:
        """Call `fn(state)` at each change of `index_state()` (from the indexing thread, at most
        every ~0.5 s while embedding); returns the function that unsubscribes."""
        return self._indexer().subscribe(fn)

    def close(self) -> None:
        """Stop indexing (what was embedded stays) and close the index; bounded (~2 s)."""
        with self._index_lock:
            background, self._background = self._background, None
        if background is not None:
            background.close()

    @property
    def _index(self) -> Any:
        return self._background.index if self._background is not None else None

    def index_ready(self) -> bool:
        # A kiln never indexed is searched by words while its index opens (see semantic_search)
        return self._index is not None or self._indexer().answers_by_words()

    def open_index(self, progress: ProgressFn) -> None:
        def opened() -> None:
            background = self._indexer()
            try:
                background.open_index()
            except CrucibleError:
                if background.words() is None:
                    raise
                # the search answers by the notes' words and says this problem (semantic_search)

        self._call("", opened)

    def _redacted(self, hits: list[SearchHit]) -> list[SearchHit]:
        """Snippets quote notes, which may hold the machine's paths: the last safety net."""
        for hit in hits:
            hit.snippet = self.redact(hit.snippet)
        return hits

    def semantic_search(self, query: str, limit: int) -> RankedResults:
        # numpy and the note parser: loaded by the first search, not at start (chromadb and the
        # embedder come with the index, in its thread)
        from crucible.kiln import search

        def ranked() -> RankedResults:
            background = self._indexer()
            with background.words_only() as words:
                if words is not None:  # never indexed, the vector store still opening: by words now
                    hits = self._redacted(search.words_search(words, query, limit))
                    return RankedResults(results=hits, index=IndexShare(embedded=0.0, notes=len(words)))
            # A store that cannot be opened or read (damaged, a link in it, its server down) still
            # has the notes' words: the agent gets those, and the problem with its fix.
            try:
                index = background.open_index()
            except CrucibleError as exc:
                return self._by_words(background, query, limit, exc)
            # Dense retrieval alone lost to BM25 on this kind of kiln; the fused ranking won.
            # A kiln mostly not embedded yet is searched by words at once while the query model
            # is not loaded (seconds): its few vectors are not worth the wait. The model loads
            # in the background after this answer, for the next search.
            by_meaning = background.query_embedder_ready() or self._share().embedded >= DENSE_WAIT_SHARE
            search.check_query(query, limit)  # the query's own error stays an error
            try:
                hits = self._redacted(search.hybrid_search(index, query, limit, by_meaning=by_meaning))
            except CrucibleError as exc:  # the store failed since it was opened
                background.search_failed(exc)
                return self._by_words(background, query, limit, exc)
            background.search_read()
            # The search caught up with other processes' writes: the share as of it, without reading
            # the store's generation a second time (~0.5 ms of a ~8 ms search)
            share = self._share(follow=False)
            if (state := background.state()).phase == "failed" and state.problem:  # a build that stopped midway
                share.stopped = self.redact(state.problem)
                if (wait := background.retry_due_in()) is not None:
                    share.retry_in = max(1, round(wait))  # (due now: the try is starting)
            if not by_meaning and share.embedded > 0:
                background.load_query_embedder(after=MODEL_LOAD_DELAY)
            return RankedResults(results=hits, index=share)

        return self._call(query, ranked)

    def _by_words(self, background: BackgroundIndex, query: str, limit: int,
                  problem: CrucibleError) -> RankedResults:
        """`semantic_search`'s answer by the notes' words alone (the lexical index, which never
        reads the vector store), with why the index could not be searched by meaning; the
        `problem` itself when the words were never read."""
        from crucible.kiln import search  # (loaded by the search that calls this)

        if (words := background.words()) is None:
            raise problem
        hits = self._redacted(search.words_search(words, query, limit))
        return RankedResults(results=hits, index=IndexShare(
            embedded=0.0, notes=len(words), problem=self.redact(_message(problem))))

    def _share(self, *, follow: bool = True) -> IndexShare:
        embedded, notes = self._indexer().current_share(follow=follow)
        return IndexShare(embedded=embedded, notes=notes)

    def text_search(self, query: str, limit: int, *, regex: bool, case_sensitive: bool) -> list[SearchHit]:
        return self._call(
            query, lambda: self._redacted(filesearch.text_search(self.root, query, limit, regex, case_sensitive))
        )

    def property_search(
        self, query: str | None, *, key: str | None, value: str | None, tag: str | None, limit: int
    ) -> list[SearchHit]:
        return self._call(
            query or "",
            lambda: self._redacted(
                filesearch.property_search(self.root, query, key=key, value=value, tag=tag, limit=limit)
            ),
        )

    # --- the kiln -------------------------------------------------------------------------

    def kiln_info(self) -> KilnInfo:
        sizes = kiln_sizes(self.root)
        return KilnInfo(name=self.name, total_files=sizes.files, markdown_files=sizes.markdown_files,
                        total_size_bytes=sizes.total_bytes)

    def kiln_roots(self) -> list[KilnRoot]:
        return [KilnRoot(uri="kiln://notes/", name=self.name)]

    def kiln_stats(self) -> KilnStats:
        sizes = kiln_sizes(self.root)
        tags: set[str] = set()
        links = 0
        newest: float | None = None
        folders: set[str] = set()
        for rel in iter_markdown(self.root):
            if "/" in rel:
                parts = rel.split("/")[:-1]
                folders.update("/".join(parts[: i + 1]) for i in range(len(parts)))
            try:
                note = read_note(self.root, rel)
                mtime = (self.root / rel).stat().st_mtime
            except (CrucibleError, OSError):
                continue
            tags.update(note.tags)
            links += len(note.links)
            newest = mtime if newest is None else max(newest, mtime)
        return KilnStats(
            name=self.name,
            markdown_files=sizes.markdown_files,
            other_files=sizes.files - sizes.markdown_files,
            folders=len(folders),
            total_size_bytes=sizes.total_bytes,
            markdown_size_bytes=sizes.markdown_bytes,
            tags=len(tags),
            links=links,
            last_modified=_iso(newest) if newest is not None else None,
            index=self._index_state(),
        )

    def _index_state(self) -> dict[str, Any]:
        index = self._index
        if index is None:
            if self._background is None:  # not started: nothing asked for it yet
                return {"opened": False}
            state = self.index_state()  # opening, or waiting for another cru (say whom)
            return {"opened": False, "phase": state.phase,
                    **({"problem": self.redact(state.problem)} if state.problem else {})}
        state = self.index_state()
        try:
            status = index.status()
            share = self._share()
        except CrucibleError as exc:
            return {"opened": True, "phase": state.phase, "error": self.redact(_message(exc))}
        return {"opened": True, "phase": state.phase, "embedded": share.embedded, "notes": status.notes,
                "chunks": status.chunks, "stale": status.stale,
                **({"problem": self.redact(state.problem)} if state.problem else {})}

    # --- changes --------------------------------------------------------------------------

    async def watch_changes(self, on_change: ChangeFn, on_armed: Callable[[], None] | None = None) -> None:
        """Changed notes, as the kiln's one watcher sees them; the index (once open) is
        updated before `on_change` hears of them."""

        # watchfiles (~0.15 s): only a session that watches the kiln needs it
        from crucible.kiln.watcher import watch_kiln

        async with trio.open_nursery() as nursery:
            await nursery.start(partial(watch_kiln, self.root, lambda: self._index, on_change=on_change))
            if on_armed is not None:
                on_armed()


# --- the command ----------------------------------------------------------------------------


def build_bridge(root: Path, config: Config | None = None, gateway: Any = None, plugins: Any = None) -> Any:
    """`cru mcp`'s bridge: the kiln tools, the Lua plugins' tools, the upstreams of `gateway`. The config's
    `[permissions]` deny rules hide tools here too; `ask` is left to the MCP client, which asks
    its own person."""

    policy = None
    if config is not None and config.permissions:
        rules = PermissionPolicy(config_rules=dict(config.permissions))

        def policy(name: str) -> Any:
            return "deny" if rules.decide(ToolKey(name, bridge=True, read_only=True)).rule == "deny" else "allow"

    return BridgeServer(CrucibleKilnBackend(root, config), name="crucible", instructions=INSTRUCTIONS,
                        policy=policy, gateway=gateway, roots=[file_root(str(root))],
                        tool_sources=[plugins] if plugins is not None else [])


def cmd_mcp(args: argparse.Namespace) -> int:
    """`cru mcp [--kiln DIR] [--http | --sse] [--port N]`."""

    if getattr(args, "print_config", None):  # a client's config snippet, not a server
        # only --print-config writes a client's snippet
        from crucible.mcp_clients import print_config

        return print_config(args)
    log_to_stderr()
    if getattr(args, "connect", None):
        token = os.environ.get("CRUCIBLE_BRIDGE_TOKEN", "")
        try:
            trio.run(hard_stop.run_stoppable, relay_stdio, args.connect, token)
        except RelayError as exc:
            raise CrucibleError(str(exc), "check that the session is running and its bridge URL") from None
        return 0
    config = load_config(getattr(args, "config", None))
    root = resolve_kiln(args.kiln, config)
    # SIGTERM/SIGHUP stop at once; over stdio the parent's death does too (an HTTP server
    # started by hand is its own master).
    stdio = not (args.http or args.sse)
    trio.run(partial(hard_stop.run_stoppable, orphan_check=stdio), _serve, root, config, args)
    return 0


async def _serve(root: Path, config: Config, args: argparse.Namespace) -> None:
    gateway = build_gateway(config)
    plugins = await trio.to_thread.run_sync(load_all, config)
    for failed in plugins.failed():
        print(f"cru mcp: plugin {failed.name} not loaded: {failed.reason}", file=sys.stderr)
    async with gateway.running():
        bridge = build_bridge(root, config, gateway, plugins)
        # The index opens and builds in the background from the start: the first search answers
        # at once (by words), not after a build.
        bridge.backend.start_indexing()
        try:
            if args.http or args.sse:
                await _serve_http(bridge, args.port, "sse" if args.sse else "http")
            else:
                await bridge.serve_stdio()
        finally:
            bridge.backend.close()  # bounded (~2 s): stops the build, what was embedded stays


async def _serve_http(bridge: Any, port: int, transport: str) -> None:
    token = os.environ.get(TOKEN_ENV) or new_token()
    async with BridgeHTTP() as app:
        await app.mount(bridge, token=token)
        async with serving_http(app, port=port) as actual:
            path = "/sse" if transport == "sse" else "/mcp"
            kind = "HTTP+SSE" if transport == "sse" else "streamable HTTP"
            print(f"cru mcp: serving the kiln '{bridge.backend.name}' over {kind} at "
                  f"http://127.0.0.1:{actual}{path}", file=sys.stderr)
            print(f"cru mcp: token: {token}  (send `Authorization: Bearer <token>`; "
                  f"set ${TOKEN_ENV} to choose it)", file=sys.stderr, flush=True)
            await trio.sleep_forever()
