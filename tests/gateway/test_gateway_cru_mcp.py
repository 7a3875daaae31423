"""Upstreams through `cru mcp` (stdio and --http) with the mcp SDK's client, and how
`cru mcp servers` and `cru doctor` show them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
import trio
from conftest import SECRET, UPSTREAM, everything_toml, texts, write_config
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared._httpx_utils import create_mcp_http_client

UP_TOML = (f'[[mcp.servers]]\nname = "up"\n[mcp.servers.transport]\ntype = "stdio"\n'
           f'command = "{sys.executable}"\nargs = ["{UPSTREAM}", "stdio"]\n')


def config_dir(env: dict[str, str]) -> Path:
    return Path(env["XDG_CONFIG_HOME"]) / "crucible"


async def test_cru_mcp_stdio_serves_upstreams_beside_the_kiln(cru_bin: str, gw_env: dict[str, str], kiln: Path,
                                                             everything: list[str]) -> None:
    write_config(config_dir(gw_env), everything_toml(everything) + UP_TOML)
    asked: list[str] = []

    async def person(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"name": "Lin"})

    params = StdioServerParameters(command=cru_bin, args=["mcp", "--kiln", str(kiln)], env=gw_env)
    async with Client(params, mode="legacy", elicitation_callback=person) as c:
        names = {t.name for t in (await c.list_tools()).tools}
        assert {"read_note", "everything_echo", "up_add"} <= names
        assert texts(await c.call_tool("everything_echo", {"message": "via cru mcp"})) == "Echo: via cru mcp"
        env_text = texts(await c.call_tool("everything_get-env", {}))
        assert "{env:GATEWAY_TOKEN}" in env_text and SECRET not in env_text
        # the upstream's question goes to cru mcp's own client, marked with the server's name
        assert texts(await c.call_tool("up_elicit_name", {})) == "action=accept content={'name': 'Lin'}"
        assert asked == ["[up] What is your name?"]
        r = await c.call_tool("up_ask_sampling", {})
        assert "sampling refused" in texts(r)


@asynccontextmanager
async def cru_mcp_http(cru_bin: str, kiln: Path, env: dict[str, str]) -> AsyncIterator[tuple[str, str]]:
    proc = await trio.lowlevel.open_process([cru_bin, "mcp", "--kiln", str(kiln), "--http", "--port", "0"],
                                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.PIPE, env=env)
    try:
        assert proc.stderr is not None
        buf = b""
        with trio.fail_after(60):
            while not re.search(rb"token: \S+", buf):
                chunk = await proc.stderr.receive_some(4096)
                assert chunk, buf.decode(errors="replace")
                buf += chunk
        text = buf.decode()
        url = re.search(r"(http://127\.0\.0\.1:\d+/mcp)", text)
        token = re.search(r"token: (\S+)", text)
        assert url and token, text
        yield url.group(1), token.group(1)
    finally:
        proc.terminate()
        with trio.move_on_after(10):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_cru_mcp_http_serves_upstreams_and_forwards_list_changed(cru_bin: str, gw_env: dict[str, str],
                                                                      kiln: Path) -> None:
    write_config(config_dir(gw_env), UP_TOML)
    changed = trio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async with cru_mcp_http(cru_bin, kiln, gw_env) as (url, token):
        from mcp.client.streamable_http import streamable_http_client

        async with (create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http,
                    Client(streamable_http_client(url, http_client=http), mode="legacy",
                           message_handler=on_message) as c):
            names = {t.name for t in (await c.list_tools()).tools}
            assert {"up_add", "up_grow", "read_note"} <= names and "up_extra" not in names
            assert texts(await c.call_tool("up_add", {"a": 40, "b": 2})) == "42"
            assert texts(await c.call_tool("up_grow", {})) == "grown"
            with trio.fail_after(10):
                await changed.wait()
            assert "up_extra" in {t.name for t in (await c.list_tools(cache_mode="bypass")).tools}


def test_cru_mcp_servers_shows_each_upstream(cru_bin: str, gw_env: dict[str, str], everything: list[str]) -> None:
    folder = config_dir(gw_env)
    write_config(folder, everything_toml(everything))
    (folder / "mcps.toml").write_text(
        '[[mcp.servers]]\nname = "broken"\nauto_reconnect = false\n[mcp.servers.transport]\ntype = "stdio"\n'
        'command = "no-such-mcp-program"\n')
    res = subprocess.run([cru_bin, "mcp", "servers"], env=gw_env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stderr  # one is down
    lines = {line.split()[0]: line for line in res.stdout.splitlines() if line and not line.startswith(" ")}
    assert lines["everything"].split()[1] == "up" and re.search(r"\b\d+ tools\b", lines["everything"])
    assert "everything_*" in lines["everything"]
    assert lines["broken"].split()[1] == "stopped"
    assert "last error: could not start `no-such-mcp-program`: not found" in res.stdout
    res = subprocess.run([cru_bin, "mcp", "servers", "--json"], env=gw_env, capture_output=True, text=True,
                         timeout=120)
    data = {s["name"]: s for s in json.loads(res.stdout)}
    assert data["everything"]["state"] == "up" and data["everything"]["tools"] > 10
    assert SECRET not in res.stdout + res.stderr


def test_doctor_reports_upstreams_and_config_errors(cru_bin: str, gw_env: dict[str, str], everything: list[str],
                                                    tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    node = shutil.which("node")
    assert node is not None
    os.symlink(node, bin_dir / "node")
    env = {**gw_env, "PATH": str(bin_dir)}  # node for the upstream; no agents, so none is probed long
    folder = config_dir(gw_env)
    path = write_config(folder, everything_toml(everything))
    res = subprocess.run([cru_bin, "doctor"], env=env, capture_output=True, text=True, timeout=180)
    assert re.search(r"^ok\s+mcp everything\s+\d+ tools as everything_\*", res.stdout, re.M), res.stdout
    assert SECRET not in res.stdout + res.stderr
    write_config(folder, everything_toml(everything, extra='blocked_tools = ["get env"]'))
    res = subprocess.run([cru_bin, "doctor"], env=env, capture_output=True, text=True, timeout=180)
    assert f"FIX config    {path}: [[mcp.servers]] 'everything': blocked_tools: 'get env' is not a tool-name glob" \
        in res.stdout, res.stdout
    write_config(folder, everything_toml(everything).replace("GATEWAY_TOKEN}", "NOT_SET_ANYWHERE}"))
    res = subprocess.run([cru_bin, "doctor"], env=env, capture_output=True, text=True, timeout=180)
    assert (f"{path}: [[mcp.servers]] 'everything': mcp.servers[0].transport.env.GATEWAY_TOKEN refers to the "
            "environment variable NOT_SET_ANYWHERE, which is not set") in res.stdout, res.stdout
