"""17.9 and 17.11 through a real `cru mcp`: `.git/` and `.obsidian/` are reserved like
`.crucible/` (read, write, delete, resources, listings), and an over-long note name is refused
with a clear message — no traceback, no absolute path, no "Internal server error"."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
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
