"""`cru mcp` over stdio, driven by the mcp SDK's client: the note tools on a real kiln copy."""

from __future__ import annotations

import json
import subprocess
import warnings
from pathlib import Path

import mcp_types as types
import pytest
import trio
from conftest import LeakCheck, stdio_client, texts

from crucible.kiln.paths import iter_files, iter_markdown


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_note_lifecycle_over_stdio(cru_bin: str, mcp_kiln: Path, cru_env: dict[str, str],
                                         tmp_path: Path, mode: str) -> None:
    leak = LeakCheck(tmp_path, mcp_kiln)
    async with stdio_client(cru_bin, mcp_kiln, cru_env, mode=mode) as c:
        r = leak(await c.call_tool("create_note", {
            "path": "Inbox/New idea.md", "content": "# New idea\nPlant more tomatoes.\n",
            "frontmatter": {"status": "draft", "tags": ["garden"]}}))
        assert not r.is_error, texts(r)
        assert r.structured_content is not None
        assert r.structured_content["action"] == "created" and r.structured_content["path"] == "Inbox/New idea.md"
        on_disk = (mcp_kiln / "Inbox" / "New idea.md").read_text()
        assert on_disk.startswith("---\nstatus: draft\n") and "Plant more tomatoes." in on_disk

        r = leak(await c.call_tool("create_note", {"path": "Inbox/New idea.md", "content": "again"}))
        assert r.is_error and "already exists" in texts(r) and "overwrite=true" in texts(r)

        r = leak(await c.call_tool("read_note", {"path": "Inbox/New idea.md", "start_line": 5, "end_line": 6}))
        sc = r.structured_content
        assert sc is not None and not r.is_error
        assert sc["content"] == "---\n# New idea\n" and sc["start_line"] == 5 and sc["end_line"] == 6
        assert sc["total_lines"] == len(on_disk.splitlines())
        assert json.loads(texts(r)) == sc
        first_hash = sc["content_hash"]

        r = leak(await c.call_tool("read_metadata", {"path": "Inbox/New idea.md"}))
        assert r.structured_content is not None
        assert r.structured_content["frontmatter"] == {"status": "draft", "tags": ["garden"]}
        assert r.structured_content["title"] == "New idea" and "garden" in r.structured_content["tags"]

        r = leak(await c.call_tool("update_note", {"path": "Inbox/New idea.md", "frontmatter": {"status": "done"},
                                                   "expected_hash": first_hash}))
        assert not r.is_error, texts(r)
        text = (mcp_kiln / "Inbox" / "New idea.md").read_text()
        assert "status: done" in text and "Plant more tomatoes." in text
        # the old hash is stale now: refused, nothing written
        r = leak(await c.call_tool("update_note", {"path": "Inbox/New idea.md", "body": "gone",
                                                   "expected_hash": first_hash}))
        assert r.is_error and "changed since you read it" in texts(r)
        assert (mcp_kiln / "Inbox" / "New idea.md").read_text() == text
        r = leak(await c.call_tool("update_note", {"path": "Inbox/New idea.md", "body": "# Replaced\n",
                                                   "remove_keys": ["tags"]}))
        assert not r.is_error
        assert (mcp_kiln / "Inbox" / "New idea.md").read_text() == "---\nstatus: done\n---\n# Replaced\n"

        r = leak(await c.call_tool("delete_note", {"path": "Inbox/New idea.md"}))
        assert r.structured_content is not None and r.structured_content["action"] == "deleted"
        assert not (mcp_kiln / "Inbox" / "New idea.md").exists()
        r = leak(await c.call_tool("read_note", {"path": "Inbox/New idea.md"}))
        assert r.is_error and texts(r).startswith("Note not found: 'Inbox/New idea.md'")
    leak.check()


async def test_refusals_show_only_kiln_relative_paths(cru_bin: str, mcp_kiln: Path, cru_env: dict[str, str],
                                                      tmp_path: Path) -> None:
    leak = LeakCheck(tmp_path, mcp_kiln)
    outside = tmp_path / "outside" / "secret.md"
    before = sorted(iter_files(mcp_kiln))
    async with stdio_client(cru_bin, mcp_kiln, cru_env) as c:
        cases = {
            ("read_note", "../outside/secret.md"): "'..' is not allowed",
            ("read_note", str(outside)): "absolute paths are not allowed",
            ("read_note", "Escape.md"): "leads outside the kiln through a symbolic link",
            ("read_note", "Elsewhere/secret.md"): "leads outside the kiln through a symbolic link",
            ("read_note", ".crucible/agents/hidden.md"): ".crucible/ is reserved",
            ("create_note", "hook.sh"): "only markdown notes (.md) can be written",
            ("create_note", ".crucible/agents/evil.md"): ".crucible/ is reserved",
            ("create_note", "Elsewhere/planted.md"): "leads outside the kiln",
            ("delete_note", "attachments/diagram.txt"): "only markdown notes (.md) can be written",
            ("update_note", "Escape.md"): "leads outside the kiln",
        }
        for (tool, path), expected in cases.items():
            args: dict[str, object] = {"path": path}
            if tool == "update_note":
                args["body"] = "x"
            r = leak(await c.call_tool(tool, args))
            assert r.is_error, (tool, path)
            assert expected in texts(r), (tool, path, texts(r))
        r = leak(await c.call_tool("list_notes", {"folder": "Elsewhere"}))
        assert r.is_error and "outside the kiln" in texts(r)
        r = leak(await c.call_tool("list_notes", {"folder": "No such folder"}))
        assert r.is_error and "No folder 'No such folder'" in texts(r)
        r = leak(await c.call_tool("read_note", {"path": "Nope.md"}))
        assert r.is_error and "Note not found: 'Nope.md'" in texts(r)
        # the absolute path in an argument is not echoed back
        assert str(outside) not in texts(leak(await c.call_tool("read_note", {"path": str(outside)})))
    leak.check()
    assert sorted(iter_files(mcp_kiln)) == before
    assert not (tmp_path / "outside" / "planted.md").exists()
    assert not (mcp_kiln / ".crucible" / "agents" / "evil.md").exists()


async def test_list_info_stats_roots(cru_bin: str, mcp_kiln: Path, cru_env: dict[str, str], tmp_path: Path) -> None:
    leak = LeakCheck(tmp_path, mcp_kiln)
    notes = list(iter_markdown(mcp_kiln))
    files = list(iter_files(mcp_kiln))
    async with stdio_client(cru_bin, mcp_kiln, cru_env) as c:
        seen: list[str] = []
        cursor = None
        while True:
            args: dict[str, object] = {"folder": "null", "limit": 10}
            if cursor:
                args["cursor"] = cursor
            r = leak(await c.call_tool("list_notes", args))
            assert r.structured_content is not None
            seen += [n["path"] for n in r.structured_content["notes"]]
            cursor = r.structured_content["next_cursor"]
            if cursor is None:
                break
        assert seen == notes and "Escape.md" not in seen
        r = leak(await c.call_tool("list_notes", {"folder": "Cooking", "pattern": "*dal*"}))
        assert r.structured_content is not None
        assert [n["path"] for n in r.structured_content["notes"]] == ["Cooking/Weeknight dal.md"]

        r = leak(await c.call_tool("get_kiln_info", {}))
        assert r.structured_content == {
            "name": "kiln", "total_files": len(files), "markdown_files": len(notes),
            "total_size_bytes": sum((mcp_kiln / f).stat().st_size for f in files)}
        r = leak(await c.call_tool("get_kiln_roots", {}))
        assert r.structured_content == {"roots": [{"uri": "kiln://notes/", "name": "kiln"}]}
        r = leak(await c.call_tool("get_kiln_stats", {}))
        assert r.structured_content is not None
        assert r.structured_content["markdown_files"] == len(notes)
        # no search yet: the index is still opening (it starts with cru mcp; the store comes last)
        assert r.structured_content["index"] == {"opened": False, "phase": "opening"}
    leak.check()


async def test_resources_list_read_and_change_notifications(cru_bin: str, mcp_kiln: Path,
                                                            cru_env: dict[str, str]) -> None:
    updated: list[str] = []
    got = trio.Event()

    async def on_message(message: object) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updated.append(message.params.uri)
            got.set()

    async with stdio_client(cru_bin, mcp_kiln, cru_env, mode="legacy", message_handler=on_message) as c:
        listed = (await c.list_resources()).resources
        uris = {r.uri for r in listed}
        assert len(uris) == len(list(iter_markdown(mcp_kiln)))
        uri = "kiln://notes/Cooking/Weeknight%20dal.md"
        assert uri in uris
        read = await c.read_resource(uri)
        content = read.contents[0]
        assert isinstance(content, types.TextResourceContents)
        assert content.text == (mcp_kiln / "Cooking" / "Weeknight dal.md").read_text()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            await c.subscribe_resource(uri)
        # an editor (not the tools) changes the note on disk: the watcher tells the subscriber
        with (mcp_kiln / "Cooking" / "Weeknight dal.md").open("a") as f:
            f.write("\nMore cumin.\n")
        with trio.fail_after(20):
            await got.wait()
        assert updated[0] == uri
        with pytest.raises(Exception, match="Note not found"):
            await c.read_resource("kiln://notes/Nope.md")


async def test_listen_stream_hears_note_changes(cru_bin: str, mcp_kiln: Path, cru_env: dict[str, str]) -> None:
    uri = "kiln://notes/Inbox.md"
    async with stdio_client(cru_bin, mcp_kiln, cru_env, mode="auto") as c:
        assert c.protocol_version == "2026-07-28"
        async with c.listen(resource_subscriptions=[uri]) as sub:
            (mcp_kiln / "Inbox.md").write_text("# Inbox\nchanged\n")
            with trio.fail_after(20):
                async for event in sub:
                    assert getattr(event, "uri", None) == uri
                    break


async def test_unknown_methods_get_method_not_found_at_once(cru_bin: str, mcp_kiln: Path,
                                                            cru_env: dict[str, str]) -> None:
    proc = await trio.lowlevel.open_process(
        [cru_bin, "mcp", "--kiln", str(mcp_kiln)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, env=cru_env)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        # mcp 2.x clients probe with server/discover first: any prompt answer lets them go on
        msgs = [{"jsonrpc": "2.0", "id": "d", "method": "server/discover", "params": {}},
                {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "0"}}},
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                {"jsonrpc": "2.0", "id": "x", "method": "no/such/method", "params": {}},
                {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}]
        await proc.stdin.send_all(b"".join(json.dumps(m).encode() + b"\n" for m in msgs))
        buf = b""
        replies: dict[object, dict[str, object]] = {}
        with trio.fail_after(20):
            while len(replies) < 4:
                buf += await proc.stdout.receive_some(65536)
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if line.strip():
                        m = json.loads(line)
                        if "id" in m:
                            replies[m["id"]] = m
        assert replies["x"]["error"]["code"] == -32601  # type: ignore[index]
        assert "result" in replies["d"] or replies["d"]["error"]["code"] == -32601  # type: ignore[index]
        assert len(replies[3]["result"]["tools"]) == 12 + 5  # type: ignore[index]  # kiln + built-in plugins
    finally:
        await proc.stdin.aclose()
        proc.terminate()
        await proc.wait()
