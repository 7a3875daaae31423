"""Fixtures for the gateway tests: real upstream MCP servers (server-everything from npm over
stdio; an mcp-SDK server over streamable HTTP or SSE on 127.0.0.1) and bridges in front of them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
import trio

REPO = Path(__file__).resolve().parents[2]
UPSTREAM = Path(__file__).resolve().parent / "gateway_upstream.py"
SECRET = "s3cr3t-gateway-token-9f8e7d"  # an {env:VAR} value that must never be shown or saved
sys.path.insert(0, str(REPO / "fixtures"))

import agent_env  # noqa: E402

from mcp_bridge.gateway import Gateway, UpstreamSpec  # noqa: E402


def everything_js() -> Path:
    """server-everything's entry point, from the npm packages the tests install."""
    reason = agent_env.ensure_npm()
    if reason is not None:
        pytest.skip(reason)
    modules = agent_env.npm_modules_dir()
    assert modules is not None
    js = modules / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
    assert js.is_file(), js
    return js


@pytest.fixture(scope="session")
def everything() -> list[str]:
    """argv of server-everything over stdio."""
    return ["node", str(everything_js()), "stdio"]


def everything_spec(argv: list[str], **kw: Any) -> UpstreamSpec:
    spec: dict[str, Any] = {"name": "everything", "prefix": "everything_", "transport": "stdio",
                            "command": argv[0], "args": tuple(argv[1:])}
    spec.update(kw)
    return UpstreamSpec(**spec)


@dataclass
class HttpUpstream:
    url: str
    proc: subprocess.Popen[str]

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


@asynccontextmanager
async def http_upstream(transport: str = "http", token: str | None = None) -> AsyncIterator[HttpUpstream]:
    """gateway_upstream.py serving `transport` on 127.0.0.1, stopped (by its pid) at the end."""
    env = dict(os.environ)
    if token:
        env["UPSTREAM_TOKEN"] = token
    proc = subprocess.Popen([sys.executable, str(UPSTREAM), transport], stdout=subprocess.PIPE,  # noqa: ASYNC220
                            stderr=subprocess.DEVNULL, text=True, env=env, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = await trio.to_thread.run_sync(proc.stdout.readline)
        m = re.match(r"listening on (\d+)", line)
        assert m, f"the upstream did not start: {line!r}"
        path = "/sse" if transport == "sse" else "/mcp"
        yield HttpUpstream(f"http://127.0.0.1:{m.group(1)}{path}", proc)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def http_spec(up: HttpUpstream, transport: str = "http", **kw: Any) -> UpstreamSpec:
    spec: dict[str, Any] = {"name": "web", "prefix": "web_", "transport": transport, "url": up.url}
    spec.update(kw)
    return UpstreamSpec(**spec)


@asynccontextmanager
async def running(*specs: UpstreamSpec, **kw: Any) -> AsyncIterator[Gateway]:
    gateway = Gateway(specs, **kw)
    async with gateway.running():
        yield gateway


def texts(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


def children_of(pid: int) -> list[int]:
    """Direct children of a process (Linux /proc), to find an upstream the gateway spawned."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            out.append(int(entry.name))
    return out


def cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def upstream_pid(parent: int, marker: str) -> int:
    found = [p for p in children_of(parent) if marker in cmdline(p)]
    assert len(found) == 1, (found, [cmdline(p) for p in children_of(parent)])
    return found[0]


async def wait_for(predicate: Any, bound: float = 30, what: str = "condition") -> None:
    """Wait (bounded) for a condition that another task or process makes true (the gateway's
    state has no event of its own to wait on)."""
    with trio.fail_after(bound):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.02)


def write_config(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.toml"
    path.write_text(text)
    return path


def everything_toml(argv: list[str], name: str = "everything", extra: str = "") -> str:
    args = ", ".join(f'"{a}"' for a in argv[1:])
    return (f'[[mcp.servers]]\nname = "{name}"\n{extra}\n[mcp.servers.transport]\ntype = "stdio"\n'
            f'command = "{argv[0]}"\nargs = [{args}]\n[mcp.servers.transport.env]\nGATEWAY_TOKEN = "{{env:GATEWAY_TOKEN}}"\n')


@pytest.fixture
def gw_env(clean_env: dict[str, str]) -> dict[str, str]:
    env = dict(clean_env)
    env["GATEWAY_TOKEN"] = SECRET
    env.pop("CRUCIBLE_MCP_TOKEN", None)
    return env


def stop_group(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_file(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture
def cleanup() -> Iterator[list[subprocess.Popen[Any]]]:
    procs: list[subprocess.Popen[Any]] = []
    yield procs
    for p in procs:
        stop_group(p)
