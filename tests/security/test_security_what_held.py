"""Issue 17's "What held", kept held: the attacks that failed, as regression tests against the
real `cru mcp` (stdio and HTTP), `cru acp` and `cru chat -p`. (Held items already covered
elsewhere: fs/* outside the roots — tests/acp_session/test_acp_services.py; permission answers
after a turn or a cancel — tests/acp_session, tests/acp_agent; an agent that never answers
initialize — tests/acp_session/test_acp_session_agent.py; an interrupted index resumes and two
indexers: the second waits — tests/index/test_index_build.py, and here with real processes.)"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import RawAcp, script_file, scripted_command
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

SECRET = "SECRET-OUTSIDE-THE-KILN-91c2"

HOSTILE_PATHS = [
    "../outside/secret.md", "a/../../outside/secret.md", "/etc/passwd", "OUTSIDE_ABS", "~/secret.md",
    "~root/x.md", "note\x00.md", "%2e%2e/outside/secret.md", "..%2foutside%2fsecret.md",
    "..\\outside\\secret.md", "a\\..\\..\\outside\\secret.md", "\u2024\u2024/outside/secret.md",
    "\uff0e\uff0e/outside/secret.md", "Escape.md", "Elsewhere/secret.md", "C:/Windows/x.md",
]


def _kiln(tmp: Path) -> tuple[Path, Path]:
    kiln, outside = tmp / "kiln", tmp / "outside"
    kiln.mkdir()
    outside.mkdir()
    (outside / "secret.md").write_text(f"# Secret\n{SECRET}\n")
    (kiln / "Note.md").write_text("# Note\ninside\n")
    (kiln / "Escape.md").symlink_to(outside / "secret.md")
    (kiln / "Elsewhere").symlink_to(outside, target_is_directory=True)
    return kiln, outside


def _texts(result: Any) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content) + json.dumps(result.structured_content or {})


async def test_path_escapes_through_every_tool(cru_bin: str, clean_env: dict[str, str], tmp_path: Path) -> None:
    kiln, outside = _kiln(tmp_path)
    before = sorted(p.name for p in outside.iterdir())
    params = StdioServerParameters(command=cru_bin, args=["mcp", "--kiln", str(kiln)], env=clean_env)
    shown: list[str] = []
    async with Client(params) as client:
        for raw in HOSTILE_PATHS:
            path = str(outside / "secret.md") if raw == "OUTSIDE_ABS" else raw
            for tool, args in [("read_note", {"path": path}), ("read_metadata", {"path": path}),
                               ("create_note", {"path": path, "content": "x", "overwrite": True}),
                               ("update_note", {"path": path, "body": "x"}),
                               ("delete_note", {"path": path}), ("list_notes", {"folder": path})]:
                result = await client.call_tool(tool, args)
                shown.append(_texts(result))
            try:
                read = await client.read_resource(f"kiln://notes/{path}")
                shown.append(json.dumps([getattr(c, "text", "") for c in read.contents]))
            except Exception as exc:  # refused: what matters is that nothing leaked
                shown.append(str(exc))
    leaked = [s for s in shown if SECRET in s or str(tmp_path) in s]
    assert not leaked, leaked[:3]
    assert sorted(p.name for p in outside.iterdir()) == before
    assert (outside / "secret.md").read_text() == f"# Secret\n{SECRET}\n"


@pytest.fixture
def http_bridge(cru_bin: str, clean_env: dict[str, str], tmp_path: Path) -> Iterator[tuple[str, str, int]]:
    kiln, _ = _kiln(tmp_path)
    proc = subprocess.Popen([cru_bin, "mcp", "--kiln", str(kiln), "--http", "--port", "0"], env=clean_env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        text = ""
        deadline = time.monotonic() + 60
        while not re.search(r"token: \S+", text):
            line = proc.stderr.readline()
            assert line and time.monotonic() < deadline, f"cru mcp --http did not start: {text}"
            text += line
        url = re.search(r"(http://127\.0\.0\.1:(\d+)/\S+)", text)
        token = re.search(r"token: (\S+)", text)
        assert url and token
        yield url.group(1), token.group(1), int(url.group(2))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def test_http_bridge_auth_host_origin(http_bridge: tuple[str, str, int]) -> None:
    url, token, _ = http_bridge
    with httpx.Client(timeout=10) as http:
        assert http.post(url, json=INIT, headers=HEADERS).status_code == 401
        wrong = "x" * len(token)  # same length: only the constant-time compare tells them apart
        assert http.post(url, json=INIT, headers={**HEADERS, "Authorization": f"Bearer {wrong}"}).status_code == 401
        auth = {**HEADERS, "Authorization": f"Bearer {token}"}
        assert http.post(url, json=INIT, headers={**auth, "Host": "evil.example:80"}).status_code == 403
        assert http.post(url, json=INIT, headers={**auth, "Origin": "http://evil.example"}).status_code == 403
        assert http.post(url, json=INIT, headers=auth).status_code == 200


def _outward_ip() -> str | None:
    """An address of this machine that is not loopback (none: the check is moot)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET: no packet is sent by a UDP connect
            ip: str = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


def test_http_bridge_listens_on_loopback_only(http_bridge: tuple[str, str, int]) -> None:
    _, _, port = http_bridge
    ip = _outward_ip()
    if ip is None:
        return  # no other interface: nothing else could reach it anyway
    with pytest.raises(OSError):
        socket.create_connection((ip, port), timeout=5).close()


def test_http_bridge_refuses_a_huge_body_without_reading_it(http_bridge: tuple[str, str, int]) -> None:
    url, token, port = http_bridge
    path = url.split(str(port), 1)[1]
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
                f"Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n"
                f"Content-Length: {200 * 1024 * 1024}\r\n\r\n")
        s.sendall(head.encode() + b"{" + b" " * 65536)  # a start; the other 200 MB never come
        started = time.monotonic()
        answer = s.recv(4096).decode("latin-1")
        took = time.monotonic() - started
    assert re.match(r"HTTP/1\.1 4\d\d", answer), answer[:200]
    assert took < 10, f"waited {took:.1f} s for a body it should refuse"


def test_http_bridge_answers_a_hundred_parallel_requests(http_bridge: tuple[str, str, int]) -> None:
    url, token, _ = http_bridge
    codes: list[int] = []
    lock = threading.Lock()

    def one() -> None:
        with httpx.Client(timeout=60) as http:
            code = http.post(url, json=INIT, headers={**HEADERS, "Authorization": f"Bearer {token}"}).status_code
        with lock:
            codes.append(code)

    threads = [threading.Thread(target=one) for _ in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert codes == [200] * 100


def test_http_bridge_drops_a_slow_drip_client(http_bridge: tuple[str, str, int]) -> None:
    """A client that sends its request a byte at a time, forever, is disconnected: it cannot
    hold a connection (and a worker) open."""
    _, _, port = http_bridge
    dropped_after: float | None = None
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        started = time.monotonic()
        request = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Drip: " + b"a" * 10_000
        for byte in request:
            try:
                s.sendall(bytes([byte]))
                s.settimeout(1.0)
                if s.recv(1, socket.MSG_PEEK) == b"":
                    dropped_after = time.monotonic() - started
                    break
            except TimeoutError:
                continue  # still connected: drip on
            except OSError:
                dropped_after = time.monotonic() - started
                break
            if time.monotonic() - started > 120:
                break
    assert dropped_after is not None, "a slow-drip client kept its connection for 2 minutes"


def test_cru_acp_survives_deep_and_oversized_frames_and_exits_on_eof(cru_bin: str, clean_env: dict[str, str],
                                                                      kiln: Path, tmp_path: Path) -> None:
    script = script_file(tmp_path, {})
    editor = RawAcp([cru_bin, "acp", "--agent-command", scripted_command(script), "--kiln", str(kiln)],
                    clean_env, tmp_path, tmp_path / "acp.err")
    try:
        editor.send(b"[" * 100_000)  # deeper than any JSON parser recurses
        editor.send(b'{"jsonrpc":"2.0","method":"x","params":{"pad":"' + b"y" * (65 * 1024 * 1024) + b'"}}')
        editor.send(b"\xff\xfe not utf-8")
        answer = editor.initialize()
        assert answer["result"]["protocolVersion"] == 1
    finally:
        code = editor.close()
    assert code == 0  # EOF on stdin ended it cleanly
    assert "Traceback" not in editor.stderr()


def test_a_100_mb_stderr_flood_neither_blocks_nor_bloats_a_turn(chat: Any) -> None:
    flood = (f"{sys.executable} -c \"import os,subprocess,sys; "
             f"[os.write(2, b'x' * 1048576) for _ in range(100)]; "
             f"os.execv(sys.executable, [sys.executable, {str(chat.agent_command(None).split()[1])!r}, "
             f"{str(chat.tmp / 'script.json')!r}])\"")
    argv = [chat.cru, "chat", "--agent-command", flood, "--kiln", str(chat.kiln), "-p", "hello"]
    done = subprocess.run(argv, env=chat.env, capture_output=True, text=True, timeout=300, cwd=chat.tmp)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "echo: hello"
    assert len(done.stderr) < 100_000  # the agent's stderr is drained, not echoed


@pytest.mark.slow
def test_a_second_indexer_waits_and_a_killed_one_resumes(cru_bin: str, clean_env: dict[str, str],
                                                         tmp_path: Path) -> None:
    """With real processes: while `cru kiln index` embeds, a second one waits for it, saying so
    (no traceback, no second writer: issue 15 made it wait rather than refuse); kill -9 of the
    first lets the waiting one take over, and the index it leaves is complete."""
    kiln = tmp_path / "kiln"
    kiln.mkdir()
    notes = 120  # 240 chunks
    for i in range(notes):
        (kiln / f"n{i}.md").write_text(f"# Note {i}\n\n{' '.join(f'word{j}' for j in range(80))}\n\n"
                                       f"## Part\n\nquokka{i} marmalade\n")
    argv = [cru_bin, "kiln", "index", "--kiln", str(kiln)]
    first = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=clean_env,
                             start_new_session=True)
    second: subprocess.Popen[str] | None = None
    try:
        assert first.stderr is not None
        for line in first.stderr:  # progress lines (stderr is not a terminal)
            if line.startswith(f"index: scanned {notes}/{notes}"):
                break  # the store is open and locked: embedding starts
        # Frozen where it is (lock held, embedding under way), so the second indexer meets it
        # however fast either of them runs; then killed there.
        os.kill(first.pid, signal.SIGSTOP)
        second = subprocess.Popen([*argv, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=clean_env, start_new_session=True)
        assert second.stderr is not None
        waited = ""
        for line in second.stderr:
            waited += line
            if line.startswith("index: waiting for another cru"):
                break
        assert first.poll() is None and second.poll() is None
        first.kill()
        assert first.wait(10) == -9
        out, err = second.communicate(timeout=300)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert second.returncode == 0 and "Traceback" not in waited + err, waited + err
    report = json.loads(out)
    assert report["notes_seen"] == notes and report["notes_indexed"] + report["notes_unchanged"] == notes
    again = subprocess.run([*argv, "--json"], capture_output=True, text=True, env=clean_env, timeout=300)
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["notes_seen"] == notes and report["notes_indexed"] + report["notes_unchanged"] == notes
    info = subprocess.run([cru_bin, "kiln", "info", "--json", "--kiln", str(kiln)], capture_output=True, text=True,
                          env=clean_env, timeout=120)
    index = json.loads(info.stdout)["index"]
    assert index["status"] == "up to date" and index["notes"] == notes and index["stale"] == 0, index
    found = subprocess.run([cru_bin, "kiln", "search", f"quokka{notes - 1} marmalade", "--mode", "text", "--json",
                            "--kiln", str(kiln)], capture_output=True, text=True, env=clean_env, timeout=120)
    assert f"n{notes - 1}.md" in found.stdout, found.stderr
