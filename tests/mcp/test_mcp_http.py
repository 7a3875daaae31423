"""`cru mcp --http` / `--sse` as a real server process, driven by the SDK's HTTP clients and httpx;
and `BridgeHTTP` serving several bridges from one app."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import httpx2
import pytest
import trio
from conftest import FakeBackend, LeakCheck, cru_mcp_http, texts
from mcp.client.client import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

from mcp_bridge.server import BridgeHTTP, BridgeServer, serving_http


def _listening_addresses(port: int) -> set[str]:
    """Local addresses of the listening TCP sockets on `port` (from /proc/net/tcp{,6})."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            addr, hex_port = cols[1].split(":")
            if int(hex_port, 16) == port and cols[3] == "0A":  # 0A = LISTEN
                found.add(addr)
    return found


def _other_ip() -> str | None:
    """A non-loopback address of this machine, if it has one."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent for UDP connect
            ip = s.getsockname()[0]
    except OSError:
        return None
    return None if ip.startswith("127.") else ip


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_streamable_http_with_token(cru_bin: str, mcp_kiln: Path, cru_env: dict[str, str],
                                          tmp_path: Path, mode: str) -> None:
    leak = LeakCheck(tmp_path, mcp_kiln)
    async with cru_mcp_http(cru_bin, mcp_kiln, cru_env) as srv:
        assert srv.url.endswith("/mcp") and srv.stderr.count(srv.token) == 1
        leak.add(srv.stderr)
        assert _listening_addresses(srv.port) == {"0100007F"}  # 127.0.0.1 only
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {srv.token}"})
        async with Client(streamable_http_client(srv.url, http_client=http), mode=mode) as c:
            assert len((await c.list_tools()).tools) == 12 + 5  # kiln tools + the built-in Lua plugins
            r = leak(await c.call_tool("read_note", {"path": "Index.md", "end_line": 1}))
            assert r.structured_content is not None and r.structured_content["content"] == "---\n"
            r = leak(await c.call_tool("read_note", {"path": "../outside/secret.md"}))
            assert r.is_error and "'..' is not allowed" in texts(r)
    leak.check()


async def test_sse_transport(cru_bin: str, mcp_kiln: Path, cru_env: dict[str, str]) -> None:
    async with cru_mcp_http(cru_bin, mcp_kiln, cru_env, "--sse") as srv:
        assert srv.url.endswith("/sse")
        transport = sse_client(srv.url, headers={"Authorization": f"Bearer {srv.token}"})
        async with Client(transport, mode="legacy") as c:
            r = await c.call_tool("list_notes", {"folder": "Garden"})
            assert r.structured_content is not None
            assert [n["path"] for n in r.structured_content["notes"]] == [
                "Garden/Composting.md", "Garden/Tomato blight.md"]
        async with httpx.AsyncClient() as h:
            assert (await h.get(srv.url)).status_code == 401


async def test_auth_host_origin_and_oauth_probes(cru_bin: str, mcp_kiln: Path, cru_env: dict[str, str]) -> None:
    env = cru_env | {"CRUCIBLE_MCP_TOKEN": "chosen-token-123"}
    async with cru_mcp_http(cru_bin, mcp_kiln, env) as srv:
        assert srv.token == "chosen-token-123"
        base = srv.url.removesuffix("/mcp")
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
        accept = {"Accept": "application/json, text/event-stream"}
        good = {"Authorization": "Bearer chosen-token-123"} | accept
        async with httpx.AsyncClient(timeout=10) as h:
            r = await h.post(srv.url, json=init, headers=accept)
            assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
            r = await h.post(srv.url, json=init, headers={"Authorization": "Bearer wrong"} | accept)
            assert r.status_code == 401
            r = await h.post(srv.url, json=init, headers=good | {"Host": "evil.example:80"})
            assert r.status_code == 403
            r = await h.post(srv.url, json=init, headers=good | {"Origin": "https://evil.example"})
            assert r.status_code == 403
            for probe in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-authorization-server"):
                assert (await h.get(base + probe)).status_code == 404
            assert (await h.post(base + "/register", json={})).status_code == 404
            r = await h.post(srv.url, json=init, headers=good | {"Origin": f"http://localhost:{srv.port}"})
            assert r.status_code == 200 and "serverInfo" in r.text
        ip = _other_ip()
        if ip is not None:  # nothing answers on the machine's other address
            with pytest.raises(OSError):
                s = socket.create_connection((ip, srv.port), timeout=2)
                s.close()


async def test_many_bridges_on_one_app_keyed_by_path_and_token() -> None:
    a, b = FakeBackend({"A.md": "alpha"}), FakeBackend({"B.md": "beta"})
    async with BridgeHTTP() as app:
        await app.mount(BridgeServer(a), token="tok-a", base="/s/a")
        await app.mount(BridgeServer(b), token="tok-b", base="/s/b")
        async with serving_http(app, port=0) as port:
            url = f"http://127.0.0.1:{port}"
            for base, token, note in (("/s/a", "tok-a", "A.md"), ("/s/b", "tok-b", "B.md")):
                http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"})
                async with Client(streamable_http_client(url + base + "/mcp", http_client=http)) as c:
                    r = await c.call_tool("list_notes", {})
                    assert r.structured_content is not None
                    assert [n["path"] for n in r.structured_content["notes"]] == [note]
            async with httpx.AsyncClient(timeout=10) as h:
                resp = await h.post(url + "/s/b/mcp", json={}, headers={"Authorization": "Bearer tok-a"})
                assert resp.status_code == 401
                app.unmount("/s/b")
                resp = await h.post(url + "/s/b/mcp", json={}, headers={"Authorization": "Bearer tok-b"})
                assert resp.status_code == 404
                await trio.lowlevel.checkpoint()


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_connect_relays_stdio_to_the_http_bridge(cru_bin: str, mcp_kiln: Path, cru_env: dict[str, str],
                                                       mode: str) -> None:
    from mcp.client.stdio import StdioServerParameters

    async with cru_mcp_http(cru_bin, mcp_kiln, cru_env) as srv:
        params = StdioServerParameters(command=cru_bin, args=["mcp", "--connect", srv.url],
                                       env=cru_env | {"CRUCIBLE_BRIDGE_TOKEN": srv.token})
        async with Client(params, mode=mode) as c:
            assert len((await c.list_tools()).tools) == 12 + 5  # kiln tools + the built-in Lua plugins
            r = await c.call_tool("create_note", {"path": "Relayed.md", "content": "via the relay"})
            assert not r.is_error, texts(r)
        assert (mcp_kiln / "Relayed.md").read_text() == "via the relay"


async def test_connect_with_a_wrong_token_says_so(cru_bin: str, mcp_kiln: Path, cru_env: dict[str, str]) -> None:
    async with cru_mcp_http(cru_bin, mcp_kiln, cru_env) as srv:
        out = await trio.run_process(
            [cru_bin, "mcp", "--connect", srv.url], stdin=b"", capture_stdout=True, capture_stderr=True,
            env=cru_env | {"CRUCIBLE_BRIDGE_TOKEN": "wrong"}, check=False)
    err = out.stderr.decode()
    assert out.returncode == 1
    assert f"the bridge at {srv.url} refused the token (check $CRUCIBLE_BRIDGE_TOKEN)" in err
    assert "Traceback" not in err
