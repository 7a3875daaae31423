"""17.9 and 17.11 through a real `cru mcp`: `.git/` and `.obsidian/` are reserved like
`.crucible/` (read, write, delete, resources, listings), and an over-long note name is refused
with a clear message — no traceback, no absolute path, no "Internal server error"."""

from __future__ import annotations

import os
import shlex
import stat
import warnings
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

CREDENTIAL = "https://alice:ghp_SECRETTOKEN@example.com/repo.git"


def _texts(result: Any) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content)


def _kiln(tmp_path: Path) -> Path:
    kiln = tmp_path / "kiln"
    (kiln / ".git" / "hooks").mkdir(parents=True)
    (kiln / ".git" / "config").write_text(f'[remote "origin"]\n\turl = {CREDENTIAL}\n')
    (kiln / ".git" / "notes.md").write_text("# git's own\n")
    (kiln / "sub" / ".git").mkdir(parents=True)
    (kiln / "sub" / ".git" / "HEAD.md").write_text("# nested repo\n")
    (kiln / ".obsidian").mkdir()
    (kiln / ".obsidian" / "workspace.json").write_text('{"api_key": "sk-obsidian-plugin"}')
    (kiln / ".obsidian" / "plugin.md").write_text("# settings\n")
    (kiln / "Link to git.md").symlink_to(kiln / ".git" / "notes.md")
    (kiln / "Real.md").write_text("# real\n")
    return kiln


def _server(cru_bin: str, kiln: Path, env: dict[str, str], errlog: Path) -> StdioServerParameters:
    # The server's stderr goes to a file, so the test can read what it logged.
    command = f"exec {shlex.quote(cru_bin)} mcp --kiln {shlex.quote(str(kiln))} 2>{shlex.quote(str(errlog))}"
    return StdioServerParameters(command="/bin/sh", args=["-c", command], env=env)


async def test_git_and_obsidian_folders_are_reserved(cru_bin: str, clean_env: dict[str, str], tmp_path: Path) -> None:
    kiln = _kiln(tmp_path)
    errlog = tmp_path / "server.err"
    seen: list[str] = []
    async with Client(_server(cru_bin, kiln, clean_env, errlog)) as client:
        for tool, args in [
            ("read_note", {"path": ".git/config"}),
            ("read_note", {"path": ".GIT/config"}),
            ("read_note", {"path": "sub/.git/HEAD.md"}),
            ("read_note", {"path": ".obsidian/workspace.json"}),
            ("read_note", {"path": "Link to git.md"}),
            ("read_metadata", {"path": ".git/notes.md"}),
            ("create_note", {"path": ".git/hooks/pre-commit.md", "content": "#!/bin/sh\n"}),
            ("create_note", {"path": ".obsidian/new.md", "content": "x"}),
            ("update_note", {"path": ".git/notes.md", "body": "changed"}),
            ("delete_note", {"path": ".git/notes.md"}),
            ("delete_note", {"path": ".obsidian/plugin.md"}),
            ("list_notes", {"folder": ".git"}),
        ]:
            result = await client.call_tool(tool, args)
            text = _texts(result)
            seen.append(text)
            assert result.is_error, (tool, args, text)
            assert "is not part of the notes" in text, (tool, args, text)
        with pytest.raises(Exception, match="is not part of the notes"):
            await client.read_resource("kiln://notes/.git/config")
        listed = _texts(await client.call_tool("list_notes", {}))
        resources = {str(r.uri) for r in (await client.list_resources()).resources}
    assert not any(CREDENTIAL in t or "sk-obsidian" in t for t in seen)
    assert "Real.md" in listed and ".git" not in listed and ".obsidian" not in listed
    assert "Link to git" not in listed and not any(".git" in uri or ".obsidian" in uri for uri in resources)
    assert (kiln / ".git" / "notes.md").read_text() == "# git's own\n"
    assert (kiln / ".obsidian" / "plugin.md").exists() and not (kiln / ".git" / "hooks" / "pre-commit.md").exists()
    assert "Traceback" not in errlog.read_text()


async def test_an_over_long_note_name_is_refused_clearly(cru_bin: str, clean_env: dict[str, str],
                                                         tmp_path: Path) -> None:
    kiln = _kiln(tmp_path)
    errlog = tmp_path / "server.err"
    name = "n" * 300 + ".md"
    async with Client(_server(cru_bin, kiln, clean_env, errlog)) as client:
        for tool, args in [("create_note", {"path": name, "content": "x"}), ("read_note", {"path": name}),
                           ("read_note", {"path": f"folder/{name}"}), ("delete_note", {"path": name}),
                           ("create_note", {"path": "/".join(["d" * 200] * 6) + "/x.md", "content": "x"})]:
            result = await client.call_tool(tool, args)
            text = _texts(result)
            assert result.is_error and ("longer than 255 bytes" in text or "longer than 1024 bytes" in text), text
            assert str(tmp_path) not in text and "Errno" not in text
        with pytest.raises(Exception, match="longer than 255 bytes") as err:
            await client.read_resource(f"kiln://notes/{name}")
        assert "Internal" not in str(err.value)
    log = errlog.read_text()
    assert "Traceback" not in log and str(tmp_path) not in log and "Errno 36" not in log


async def test_a_new_notes_name_with_control_direction_or_trailing_characters_is_refused(
        cru_bin: str, clean_env: dict[str, str], tmp_path: Path) -> None:
    kiln = _kiln(tmp_path)
    (kiln / "odd name .md").write_text("# made elsewhere\n")  # a name cru would not make: still editable
    errlog = tmp_path / "server.err"
    async with Client(_server(cru_bin, kiln, clean_env, errlog)) as client:
        for name, says in [("W/ctl\x1b[31mred.md", "U+001B"), ("W/nl\nname.md", "U+000A"), ("W/c1\x9bx.md", "U+009B"),
                           ("W/rlo\u202egpj.md", "U+202E"), ("W/zw\u200b.md", "U+200B"), ("W/.md", "no name"),
                           ("W/ lead.md", "begins with a space"), ("W/folder./x.md", "ends with a dot"),
                           (".crucible /x.md", "ends with a dot or a space")]:
            result = await client.call_tool("create_note", {"path": name, "content": "x"})
            text = _texts(result)
            assert result.is_error and says in text, (name, text)
            assert "\x1b" not in text and "\x9b" not in text and "\u202e" not in text, text  # shown escaped
        assert sorted(p.name for p in kiln.rglob("*.md") if ".git" not in p.parts and ".obsidian" not in p.parts) == [
            "Link to git.md", "Real.md", "odd name .md"]
        updated = await client.call_tool("update_note", {"path": "odd name .md", "body": "changed"})
        assert not updated.is_error, _texts(updated)
        # What the client sent, quoted back in errors, never carries a live escape sequence.
        for tool, args in [("read_note", {"path": "\x1b[2Jx.md"}), ("list_notes", {"folder": "\x1b]0;owned\x07"}),
                           ("\x1b[2Jevil", {}), ("read_note", {"path": "Real.md", "\x1b[31mkey": 1})]:
            result = await client.call_tool(tool, args)
            text = _texts(result)
            assert result.is_error and "\\x1b" in text and "\x1b" not in text, (tool, text)
        # Messages that say what happened: a note used as a folder, an empty path, a subscription
        # outside the kiln (once accepted and kept).
        inside = await client.call_tool("create_note", {"path": "Real.md/x.md", "content": "x"})
        assert "'Real.md' is a file, not a folder" in _texts(inside) and "symbolic link" not in _texts(inside)
        empty = await client.call_tool("read_note", {"path": ""})
        assert "the path is empty" in _texts(empty) and "list_notes shows them" in _texts(empty)
    async with Client(_server(cru_bin, kiln, clean_env, errlog), mode="legacy") as legacy:  # its subscribe
        with warnings.catch_warnings(), pytest.raises(Exception, match="without '..'"):
            warnings.simplefilter("ignore")  # the legacy era's subscribe is deprecated in the SDK
            await legacy.subscribe_resource("kiln://notes/../../etc/passwd")
    assert "Traceback" not in errlog.read_text()


async def test_concurrent_creates_of_one_note_leave_one_writer_told_created(
        cru_bin: str, clean_env: dict[str, str], tmp_path: Path) -> None:
    import anyio

    kiln = _kiln(tmp_path)
    results: dict[int, Any] = {}
    async with Client(_server(cru_bin, kiln, clean_env, tmp_path / "server.err")) as client:
        async def create(i: int) -> None:
            results[i] = await client.call_tool("create_note", {"path": "W/race.md", "content": f"writer {i}\n"})

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(create, i)
    created = [i for i, r in results.items() if not r.is_error]
    assert len(created) == 1, {i: _texts(r) for i, r in results.items()}
    assert all("already exists" in _texts(r) for i, r in results.items() if i not in created)
    assert (kiln / "W" / "race.md").read_text() == f"writer {created[0]}\n"  # the one told "created" is kept
    assert [p.name for p in (kiln / "W").iterdir()] == ["race.md"]  # no temp file left


async def test_a_write_the_note_could_not_be_read_back_from_is_refused(
        cru_bin: str, clean_env: dict[str, str], tmp_path: Path) -> None:
    kiln = _kiln(tmp_path)
    async with Client(_server(cru_bin, kiln, clean_env, tmp_path / "server.err")) as client:
        nul = await client.call_tool("create_note", {"path": "W/nul.md", "content": "a\x00b"})
        assert nul.is_error and "NUL character" in _texts(nul) and "nothing was written" in _texts(nul)
        huge = await client.call_tool("create_note", {"path": "W/huge.md", "content": "z" * (11 * 1024 * 1024)})
        assert huge.is_error and "would be 11.0 MiB; notes up to 10 MiB are read" in _texts(huge), _texts(huge)
        assert not (kiln / "W").exists()
        edit = await client.call_tool("update_note", {"path": "Real.md", "body": "x\x00y"})
        assert edit.is_error and "NUL character" in _texts(edit)
        read = await client.call_tool("read_note", {"path": "Real.md"})
        assert not read.is_error and "# real" in _texts(read)
    assert (kiln / "Real.md").read_text() == "# real\n"


# trio runs at most 40 worker threads at once (its default limiter): more calls than that on a
# named pipe took every one of them when each blocked in open() (the audit's 45 calls).
MORE_THAN_THE_WORKER_THREADS = 45
NOT_REGULAR = "'W/fifo2.md': not a regular file (a named pipe); notes are regular files"


async def test_a_named_pipe_called_a_note_is_refused_never_opened(
    cru_bin: str, clean_env: dict[str, str], tmp_path: Path
) -> None:
    """A FIFO named `*.md` blocked each reader in open() for good (until a writer came): read_note
    and its like are refused with a message, listings and searches pass it by, and the server
    answers everything else afterwards."""
    kiln = tmp_path / "kiln"
    (kiln / "W").mkdir(parents=True)
    (kiln / "W" / "real.md").write_text("---\nstatus: draft\n---\n# Real\n\npipes and fifo words\n")
    os.mkfifo(kiln / "W" / "fifo2.md")
    errlog = tmp_path / "server.err"
    async with Client(_server(cru_bin, kiln, clean_env, errlog)) as client:
        results: list[Any] = []

        async def read_pipe() -> None:
            results.append(await client.call_tool("read_note", {"path": "W/fifo2.md"}))

        async with trio.open_nursery() as nursery:
            for _ in range(MORE_THAN_THE_WORKER_THREADS):
                nursery.start_soon(read_pipe)
        assert len(results) == MORE_THAN_THE_WORKER_THREADS
        for result in results:
            assert result.is_error and NOT_REGULAR in _texts(result), _texts(result)
        for tool, args in [
            ("read_metadata", {"path": "W/fifo2.md"}),
            ("update_note", {"path": "W/fifo2.md", "body": "# written\n"}),
            ("update_note", {"path": "W/fifo2.md", "frontmatter": {"status": "done"}}),
            ("delete_note", {"path": "W/fifo2.md", "expected_hash": "0" * 64}),
        ]:
            result = await client.call_tool(tool, args)
            assert result.is_error and NOT_REGULAR in _texts(result), (tool, _texts(result))
            assert str(tmp_path) not in _texts(result)
        with pytest.raises(Exception, match="not a regular file"):
            await client.read_resource("kiln://notes/W/fifo2.md")

        info = await client.call_tool("get_kiln_info", {})  # the server still answers
        assert not info.is_error, _texts(info)
        listed = await client.call_tool("list_notes", {})
        assert "W/real.md" in _texts(listed) and "fifo2" not in _texts(listed)
        for query, regex in [("fifo", False), ("pipe|fifo", True), ("^", True)]:
            found = await client.call_tool("text_search", {"query": query, "regex": regex})
            assert not found.is_error, _texts(found)
            assert found.structured_content is not None
            assert [h["path"] for h in found.structured_content["results"]] == ["W/real.md"]
        found = await client.call_tool("property_search", {"query": "status:draft"})
        assert not found.is_error and "W/real.md" in _texts(found) and "fifo2" not in _texts(found)
    assert stat.S_ISFIFO((kiln / "W" / "fifo2.md").lstat().st_mode)  # left as it was
    assert "Traceback" not in errlog.read_text()
