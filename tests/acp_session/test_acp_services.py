"""fs/* and terminal/* services: real files, real subprocesses, confined to the session roots."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import trio

from acp_host.jsonrpc import JsonRpcError
from acp_host.services import SessionServices

SID = "s1"


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path, Path]:
    cwd = tmp_path / "project"
    extra = tmp_path / "notes"
    outside = tmp_path / "secret"
    for d in (cwd, extra, outside):
        d.mkdir()
    (outside / "key.txt").write_text("do not read\n")
    return cwd, extra, outside


async def test_read_with_line_and_limit(roots: tuple[Path, Path, Path]) -> None:
    cwd, _, _ = roots
    (cwd / "a.txt").write_text("one\ntwo\nthree\nfour\n")
    async with trio.open_nursery() as nursery:
        svc = SessionServices(nursery, cwd)
        path = str(cwd / "a.txt")
        assert await svc.handle("fs/read_text_file", {"sessionId": SID, "path": path}) == {
            "content": "one\ntwo\nthree\nfour\n"
        }
        got = await svc.handle("fs/read_text_file", {"sessionId": SID, "path": path, "line": 2, "limit": 2})
        assert got == {"content": "two\nthree\n"}
        got = await svc.handle("fs/read_text_file", {"sessionId": SID, "path": path, "line": 4})
        assert got == {"content": "four\n"}
        await svc.aclose()


async def test_missing_file_reads_as_empty(roots: tuple[Path, Path, Path]) -> None:
    cwd, _, _ = roots
    async with trio.open_nursery() as nursery:
        svc = SessionServices(nursery, cwd)
        got = await svc.handle("fs/read_text_file", {"sessionId": SID, "path": str(cwd / "new.md")})
        assert got == {"content": ""}
        await svc.aclose()


async def test_write_is_atomic_and_creates_folders(roots: tuple[Path, Path, Path]) -> None:
    cwd, extra, _ = roots
    async with trio.open_nursery() as nursery:
        svc = SessionServices(nursery, cwd, allowed_dirs=[extra])
        target = extra / "sub" / "n.md"
        assert await svc.handle(
            "fs/write_text_file", {"sessionId": SID, "path": str(target), "content": "héllo\n"}
        ) == {}
        assert target.read_text(encoding="utf-8") == "héllo\n"
        target.chmod(0o640)
        await svc.handle("fs/write_text_file", {"sessionId": SID, "path": str(target), "content": "v2"})
        assert target.read_text() == "v2"
        assert target.stat().st_mode & 0o777 == 0o640
        assert sorted(p.name for p in target.parent.iterdir()) == ["n.md"]  # no temp left
        await svc.aclose()


@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlink"])
async def test_paths_outside_the_roots_are_refused(roots: tuple[Path, Path, Path], how: str) -> None:
    cwd, _, outside = roots
    if how == "absolute":
        given = str(outside / "key.txt")
    elif how == "dotdot":
        given = str(cwd / ".." / "secret" / "key.txt")
    else:
        os.symlink(outside, cwd / "link")
        given = str(cwd / "link" / "key.txt")
    async with trio.open_nursery() as nursery:
        svc = SessionServices(nursery, cwd)
        for method, params in (
            ("fs/read_text_file", {"sessionId": SID, "path": given}),
            ("fs/write_text_file", {"sessionId": SID, "path": given, "content": "x"}),
            ("terminal/create", {"sessionId": SID, "command": "true", "cwd": given}),
        ):
            with pytest.raises(JsonRpcError) as err:
                await svc.handle(method, params)
            # The message repeats the path as given and names no other place on disk.
            assert given in err.value.message
            assert str(cwd) not in err.value.message.replace(given, "")
            assert "outside" in err.value.message
        assert (outside / "key.txt").read_text() == "do not read\n"
        await svc.aclose()


async def test_terminal_output_wait_and_truncation(roots: tuple[Path, Path, Path]) -> None:
    cwd, _, _ = roots
    async with trio.open_nursery() as nursery:
        svc = SessionServices(nursery, cwd)
        script = "import sys; sys.stdout.write('a' * 50 + 'é' + 'TAIL'); sys.stderr.write('ERR'); sys.exit(3)"
        created = await svc.handle(
            "terminal/create",
            {"sessionId": SID, "command": sys.executable, "args": ["-c", script], "outputByteLimit": 10},
        )
        tid = created["terminalId"]
        status = await svc.handle("terminal/wait_for_exit", {"sessionId": SID, "terminalId": tid})
        assert status == {"exitCode": 3, "signal": None}
        out = await svc.handle("terminal/output", {"sessionId": SID, "terminalId": tid})
        assert out["truncated"] is True
        assert out["output"].endswith("TAILERR") and len(out["output"].encode()) <= 10
        assert out["exitStatus"] == {"exitCode": 3, "signal": None}
        await svc.handle("terminal/release", {"sessionId": SID, "terminalId": tid})
        with pytest.raises(JsonRpcError):
            await svc.handle("terminal/output", {"sessionId": SID, "terminalId": tid})
        await svc.aclose()


async def test_terminal_truncation_keeps_characters_whole(roots: tuple[Path, Path, Path]) -> None:
    cwd, _, _ = roots
    async with trio.open_nursery() as nursery:
        svc = SessionServices(nursery, cwd)
        # 'é' is two bytes: a 5-byte window over "ééé" starts inside a character.
        created = await svc.handle(
            "terminal/create",
            {"sessionId": SID, "command": "printf", "args": ["ééé"], "outputByteLimit": 5},
        )
        tid = created["terminalId"]
        await svc.handle("terminal/wait_for_exit", {"sessionId": SID, "terminalId": tid})
        out = await svc.handle("terminal/output", {"sessionId": SID, "terminalId": tid})
        assert out == {"output": "éé", "truncated": True, "exitStatus": {"exitCode": 0, "signal": None}}
        await svc.aclose()


async def test_terminal_kill_and_shell_command(roots: tuple[Path, Path, Path]) -> None:
    cwd, _, _ = roots
    (cwd / "f.txt").write_text("x")
    fifo = cwd.parent / "ready.fifo"
    os.mkfifo(fifo)
    async with trio.open_nursery() as nursery:
        svc = SessionServices(nursery, cwd)
        created = await svc.handle(
            "terminal/create", {"sessionId": SID, "command": f"echo started; echo > {fifo}; exec sleep 60"}
        )
        tid = created["terminalId"]
        # The command says it is running (no polling): "started" is in the pipe by then.
        await trio.to_thread.run_sync(fifo.read_text)
        out = await svc.handle("terminal/output", {"sessionId": SID, "terminalId": tid})
        assert "exitStatus" not in out
        await svc.handle("terminal/kill", {"sessionId": SID, "terminalId": tid})
        status = await svc.handle("terminal/wait_for_exit", {"sessionId": SID, "terminalId": tid})
        assert status == {"exitCode": None, "signal": "SIGKILL"}
        out = await svc.handle("terminal/output", {"sessionId": SID, "terminalId": tid})
        assert out["output"] == "started\n"
        # A shell line runs in the session cwd, with extra env.
        created = await svc.handle(
            "terminal/create",
            {"sessionId": SID, "command": "ls; echo $GREETING", "env": [{"name": "GREETING", "value": "hi"}]},
        )
        tid2 = created["terminalId"]
        await svc.handle("terminal/wait_for_exit", {"sessionId": SID, "terminalId": tid2})
        out = await svc.handle("terminal/output", {"sessionId": SID, "terminalId": tid2})
        assert out["output"] == "f.txt\nhi\n"
        await svc.aclose()


async def test_close_kills_every_terminal(roots: tuple[Path, Path, Path]) -> None:
    cwd, _, _ = roots
    pids = []
    async with trio.open_nursery() as nursery:
        svc = SessionServices(nursery, cwd)
        for _ in range(3):
            created = await svc.handle(
                "terminal/create", {"sessionId": SID, "command": "sleep", "args": ["60"]}
            )
            pids.append(svc._terminals[created["terminalId"]].process.pid)
        await svc.aclose()
        with pytest.raises(JsonRpcError):
            await svc.handle("terminal/create", {"sessionId": SID, "command": "true"})
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
