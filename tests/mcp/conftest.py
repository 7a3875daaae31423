"""Fixtures for the MCP bridge tests: a kiln copy with traps, `cru mcp` clients, a fake backend."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
import trio
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

from mcp_bridge.kiln_api import (
    ChangeFn,
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

SECRET = "TOP-SECRET-OUTSIDE-THE-KILN"


def make_kiln(src: Path, base: Path) -> Path:
    """A copy of the sample kiln, plus things a tool must refuse: a symlinked note and folder
    leading outside, a `.crucible/` note, and a file outside the kiln."""
    kiln = base / "kiln"
    shutil.copytree(src, kiln, ignore=shutil.ignore_patterns(".crucible"))
    outside = base / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text(f"# Secret\n{SECRET}\n")
    (kiln / "Escape.md").symlink_to(outside / "secret.md")
    (kiln / "Elsewhere").symlink_to(outside, target_is_directory=True)
    (kiln / ".crucible" / "agents").mkdir(parents=True)
    (kiln / ".crucible" / "agents" / "hidden.md").write_text("# hidden\n")
    return kiln


@pytest.fixture
def mcp_kiln(tmp_path: Path, fixture_kiln_src: Path) -> Path:
    return make_kiln(fixture_kiln_src, tmp_path)


@pytest.fixture
def cru_env(clean_env: dict[str, str]) -> dict[str, str]:
    env = dict(clean_env)
    env.pop("CRUCIBLE_MCP_TOKEN", None)
    return env


@asynccontextmanager
async def stdio_client(
    cru_bin: str, kiln: Path, env: dict[str, str], *, mode: str = "auto", **kwargs: Any
) -> AsyncIterator[Client]:
    params = StdioServerParameters(command=cru_bin, args=["mcp", "--kiln", str(kiln)], env=env)
    async with Client(params, mode=mode, **kwargs) as client:
        yield client


def texts(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


class LeakCheck:
    """Collects every text a client saw; `check()` fails if an absolute path leaked."""

    def __init__(self, *paths: Path) -> None:
        self.forbidden = {str(p) for p in paths} | {str(p.resolve()) for p in paths}
        self.seen: list[str] = []

    def __call__(self, result: types.CallToolResult) -> types.CallToolResult:
        self.seen.append(texts(result))
        if result.structured_content is not None:
            self.seen.append(json.dumps(result.structured_content))
        return result

    def add(self, text: str) -> None:
        self.seen.append(text)

    def check(self) -> None:
        assert self.seen, "nothing was checked"
        for text in self.seen:
            for bad in self.forbidden:
                assert bad not in text, f"absolute path {bad!r} leaked in: {text[:300]}"
            assert SECRET not in text


# --- HTTP server as a subprocess ------------------------------------------------------------


@dataclass
class HttpServer:
    url: str
    token: str
    port: int
    proc: trio.Process
    stderr: str


@asynccontextmanager
async def cru_mcp_http(
    cru_bin: str, kiln: Path, env: dict[str, str], flag: str = "--http"
) -> AsyncIterator[HttpServer]:
    proc = await trio.lowlevel.open_process(
        [cru_bin, "mcp", "--kiln", str(kiln), flag, "--port", "0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stderr is not None
        buf = b""
        with trio.fail_after(60):
            while not re.search(rb"token: \S+.*\n", buf):
                chunk = await proc.stderr.receive_some(4096)
                if not chunk:
                    raise AssertionError(f"cru mcp {flag} exited: {buf.decode(errors='replace')}")
                buf += chunk
        text = buf.decode()
        m_url = re.search(r"(http://127\.0\.0\.1:(\d+)/\S+)", text)
        m_token = re.search(r"token: (\S+)", text)
        assert m_url and m_token, text
        yield HttpServer(m_url.group(1), m_token.group(1), int(m_url.group(2)), proc, text)
    finally:
        proc.terminate()
        with trio.move_on_after(10):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


# --- a fake backend for unit tests of the tool layer --------------------------------------


class FakeBackend:
    """In-memory notes; `block` makes every call wait on an Event (for the timeout test)."""

    def __init__(self, notes: dict[str, str] | None = None, *, secret_root: str = "/home/someone/notes") -> None:
        self.notes = dict(notes or {"A.md": "# A\nalpha\n", "Folder/B.md": "---\ntags: [x]\n---\n# B\nbeta\n"})
        self.secret_root = secret_root
        self.block: threading.Event | None = None
        self.opened = False
        self.calls: list[str] = []

    def _wait(self) -> None:
        if self.block is not None:
            self.block.wait(timeout=30)

    @property
    def name(self) -> str:
        return "fake"

    def redact(self, text: str) -> str:
        return text.replace(self.secret_root, "<kiln>")

    def read_note(self, path: str) -> NoteData:
        self._wait()
        self.calls.append(f"read:{path}")
        if path == "boom.md":
            raise RuntimeError(f"disk error at {self.secret_root}/boom.md")
        if path not in self.notes:
            raise NoteNotFoundError(f"Note not found: '{path}'")
        text = self.notes[path]
        return NoteData(path=path, text=text, frontmatter={}, title=path, tags=[], links=[], headings=[],
                        content_hash=str(hash(text)), size_bytes=len(text), modified="2024-01-01T00:00:00Z")

    def create_note(self, path: str, body: str, frontmatter: dict[str, Any] | None, *, overwrite: bool) -> WriteOutcome:
        if not path.endswith(".md"):
            raise KilnError(f"'{path}': only markdown notes (.md) can be written")
        replaced = path in self.notes
        self.notes[path] = body
        return WriteOutcome(path=path, content_hash="h", size_bytes=len(body), replaced=replaced)

    def update_note(self, path: str, *, frontmatter: dict[str, Any] | None, remove_keys: list[str],
                    body: str | None, expected_hash: str | None) -> WriteOutcome:
        if body is not None:
            self.notes[path] = body
        return WriteOutcome(path=path, content_hash="h2", size_bytes=len(self.notes[path]))

    def delete_note(self, path: str, *, expected_hash: str | None) -> WriteOutcome:
        text = self.notes.pop(path)
        return WriteOutcome(path=path, content_hash=None, size_bytes=len(text))

    def list_notes(self, folder: str) -> list[NoteEntry]:
        self.calls.append(f"list:{folder!r}")
        prefix = folder + "/" if folder else ""
        return [NoteEntry(path=p, size_bytes=len(t), modified="2024-01-01T00:00:00Z")
                for p, t in sorted(self.notes.items()) if p.startswith(prefix)]

    def index_ready(self) -> bool:
        return self.opened

    def open_index(self, progress: ProgressFn) -> None:
        progress(1, 2, "loading")
        self.opened = True

    def semantic_search(self, query: str, limit: int) -> RankedResults:
        return RankedResults(
            results=[SearchHit(path=p, title=p, score=1.0, heading=None, snippet=t[:20])
                     for p, t in list(self.notes.items())[:limit]],
            index=IndexShare(embedded=1.0, notes=len(self.notes)))

    def text_search(self, query: str, limit: int, *, regex: bool, case_sensitive: bool) -> list[SearchHit]:
        return [SearchHit(path=p, title=p, score=1.0, snippet=query) for p, t in self.notes.items() if query in t]

    def property_search(self, query: str | None, *, key: str | None, value: str | None, tag: str | None,
                        limit: int) -> list[SearchHit]:
        return []

    def kiln_info(self) -> KilnInfo:
        self._wait()
        return KilnInfo(name="fake", total_files=len(self.notes), markdown_files=len(self.notes),
                        total_size_bytes=sum(len(t) for t in self.notes.values()))

    def kiln_roots(self) -> list[KilnRoot]:
        return [KilnRoot(uri="kiln://notes/", name="fake")]

    def kiln_stats(self) -> KilnStats:
        return KilnStats(name="fake", markdown_files=len(self.notes), other_files=0, folders=1,
                         total_size_bytes=0, markdown_size_bytes=0, tags=0, links=0, last_modified=None,
                         index={"opened": self.opened})

    async def watch_changes(self, on_change: ChangeFn, on_armed: Any = None) -> None:
        if on_armed is not None:
            on_armed()
        await trio.sleep_forever()


def npm_bin_or_skip() -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from fixtures.agent_env import ensure_npm, npm_bin_dir

    reason = ensure_npm()
    if reason is not None:
        pytest.skip(reason)
    bin_dir = npm_bin_dir()
    assert bin_dir is not None
    return bin_dir


def all_texts(results: Iterable[types.CallToolResult]) -> list[str]:
    return [texts(r) for r in results]


def env_without(env: dict[str, str], *names: str) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in names} | {"PATH": os.environ.get("PATH", "")}
