"""Issue 15: `cru acp` tells the editor once that the kiln is being indexed (as the session's
other notices: the first lines of a turn), and once more when the index is ready.

The embedder is a real HTTP server (fixtures/gated_embedder.py) that the test lets answer, so
the build (in its real worker process) waits until the test lets it go on."""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from acp.schema import InitializeResponse, TextContentBlock
from acp_agent_driver import AcpSetup, Editor, drive, pids_with
from gated_embedder import GatedEmbedder

from crucible.kiln.index import group_notes

NOTES = 200
INDEXING = ("Crucible: the kiln's 200 notes are being indexed in the background (0% done); until then "
            "searching the kiln matches words more than meaning\n\n")
READY = "Crucible: the kiln's index is ready: searching its 200 notes matches meaning too\n\n"


@pytest.fixture
def big(tmp_path: Path, clean_env: dict[str, str], cru_bin: str) -> AcpSetup:
    kiln = tmp_path / "kiln"
    for i in range(NOTES):
        path = kiln / f"part-{i // 50}" / f"note-{i:03d}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# Note {i}\n\nAbout the lantern and the word uniqueword{i}.\n")
    setup = AcpSetup(tmp_path, clean_env, kiln, cru_bin)
    setup.script({"new_session": {"list_mcp_tools": True}})  # the echo agent, with the kiln tools
    return setup


def text(prompt: str) -> list[TextContentBlock]:
    return [TextContentBlock(type="text", text=prompt)]


def use_embedder(setup: AcpSetup, embedder: GatedEmbedder) -> None:
    config = Path(setup.env["XDG_CONFIG_HOME"]) / "crucible" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(embedder.config_toml())


async def poll_until(conn: Any, editor: Editor, sid: str, said: str, seconds: float = 60) -> None:
    """Prompt the session (each turn's start looks at the index) until the editor was told `said`."""
    deadline = time.monotonic() + seconds
    while said not in editor.text(sid):
        assert time.monotonic() < deadline, editor.text(sid)
        await conn.prompt(session_id=sid, prompt=text("poll"))
        await asyncio.sleep(0.2)


def test_the_editor_is_told_once_that_the_kiln_is_indexed_and_once_that_it_is_ready(big: AcpSetup) -> None:
    editor = Editor()
    with GatedEmbedder() as embedder:
        use_embedder(big, embedder)

        async def body(conn: Any, init: InitializeResponse) -> str:
            new = await conn.new_session(cwd=str(big.work), mcp_servers=[])
            sid = str(new.session_id)
            # The session's background build is embedding (held by the embedder).
            assert await asyncio.to_thread(embedder.requested.wait, 60)
            for words in ("one", "two"):
                resp = await conn.prompt(session_id=sid, prompt=text(words))
                assert resp.stop_reason == "end_turn"
            assert editor.text(sid) == INDEXING + "echo: one" + "echo: two"  # told once, first
            embedder.open()
            # Ready soon: each turn's start looks (bounded); the editor hears it once.
            deadline = time.monotonic() + 120
            turns = 0
            while READY not in editor.text(sid):
                assert time.monotonic() < deadline, editor.text(sid)
                turns += 1
                await conn.prompt(session_id=sid, prompt=text(f"poll {turns}"))
                await asyncio.sleep(0.2)
            await conn.prompt(session_id=sid, prompt=text("after"))
            return sid

        with open(big.stderr_path, "ab") as err:
            sid, code = asyncio.run(drive(big.argv(), big.env, editor, err.fileno(), body, body_seconds=240))
    assert code == 0, big.stderr()[-3000:]
    assert not pids_with(str(big.script_path)), "a backend agent outlived cru acp"
    said = editor.text(sid)
    assert said.count("being indexed") == 1 and said.count("index is ready") == 1, said
    assert said.endswith(READY + f"echo: poll {said.count('echo: poll')}" + "echo: after"), said


def test_the_editor_is_told_how_far_indexing_got_when_it_stops_midway(big: AcpSetup) -> None:
    """The embedder fails once every group of notes but the last is embedded: what was embedded
    is searched by meaning, so the editor is told where indexing stopped and why, not that the
    index cannot be used."""
    size = group_notes(NOTES)
    requests = [-(-min(size, NOTES - at) // 32) for at in range(0, NOTES, size)]  # per group (one chunk a note)
    editor = Editor()
    with GatedEmbedder() as embedder:
        use_embedder(big, embedder)

        async def body(conn: Any, init: InitializeResponse) -> str:
            sid = str((await conn.new_session(cwd=str(big.work), mcp_servers=[])).session_id)
            assert await asyncio.to_thread(embedder.requested.wait, 60)
            embedder.allow(sum(requests[:-1]))
            deadline = time.monotonic() + 60
            while embedder.answered < sum(requests[:-1]):
                assert time.monotonic() < deadline, embedder.answered
                await asyncio.sleep(0.1)
            await asyncio.sleep(3)  # those groups written (the last one's request held meanwhile)
            embedder.fail(500, '{"error": "model gated is not loaded"}')
            await poll_until(conn, editor, sid, "stopped at")
            return sid

        with open(big.stderr_path, "ab") as err:
            sid, code = asyncio.run(drive(big.argv(), big.env, editor, err.fileno(), body, body_seconds=240))
    assert code == 0, big.stderr()[-3000:]
    said = editor.text(sid)
    stopped = re.search(r"⚠ Crucible: indexing the kiln stopped at (\d+)% \(the openai embedder at \S+ answered HTTP 500.*?\); "
                        r"searching the kiln matches the notes embedded so far by meaning too, the others by "
                        r"words only\. It is tried again in 1 minute, or `cru kiln index` embeds the rest", said)
    assert stopped is not None and 0 < int(stopped.group(1)) < 100, said
    assert said.count("stopped at") == 1 and "cannot be used" not in said, said


def test_the_editor_is_told_when_the_index_cannot_be_opened_and_when_it_is_mended(big: AcpSetup) -> None:
    store = big.kiln / ".crucible" / "chroma"
    store.mkdir(parents=True)
    (store / "chroma.sqlite3").write_bytes(b"garbage" * 1000)
    editor = Editor()
    with GatedEmbedder() as embedder:
        embedder.open()
        use_embedder(big, embedder)

        async def body(conn: Any, init: InitializeResponse) -> str:
            sid = str((await conn.new_session(cwd=str(big.work), mcp_servers=[])).session_id)
            await poll_until(conn, editor, sid, "index cannot be used")  # the opening fails within seconds
            # The fix, in another terminal while the session serves.
            fixed = await asyncio.to_thread(
                subprocess.run, [big.cru, "kiln", "index", "--rebuild", "--kiln", str(big.kiln)],
                env=big.env, capture_output=True, text=True, timeout=240)
            assert fixed.returncode == 0, fixed.stderr
            await poll_until(conn, editor, sid, READY)
            return sid

        with open(big.stderr_path, "ab") as err:
            sid, code = asyncio.run(drive(big.argv(), big.env, editor, err.fileno(), body, body_seconds=360))
    assert code == 0, big.stderr()[-3000:]
    said = editor.text(sid)
    assert said.count("index cannot be used") == 1 and said.count("index is ready") == 1, said
    assert ("⚠ Crucible: the kiln's index cannot be used (the index in .crucible/chroma is damaged or "
            "unreadable while opening it") in said
    assert "`cru kiln index` says how to mend it, and this session takes the mended index" in said
    assert str(big.kiln) not in said
