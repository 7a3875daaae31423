"""The three searches through `cru mcp` over stdio, on the real index (Chroma + the ONNX embedder)."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import mcp_types as types
import pytest
import trio
from conftest import LeakCheck, stdio_client, texts
from mcp.client.client import Client

from crucible.kiln.index import GROUP_NOTES, group_notes
from mcp_bridge.kiln_api import shown_duration, shown_percent

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures"))
from gated_embedder import GatedEmbedder  # noqa: E402

HIT_KEYS = {"path", "title", "score", "heading", "snippet"}

pytestmark = pytest.mark.slow  # the first search builds the index of the sample kiln


async def test_searches_on_the_real_index(cru_bin: str, mcp_kiln: Path, cru_env: dict[str, str],
                                          tmp_path: Path) -> None:
    leak = LeakCheck(tmp_path, mcp_kiln)
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with stdio_client(cru_bin, mcp_kiln, cru_env) as c:
        # The index builds in the background from the start: wait (bounded) until it is done,
        # so this test sees the full hybrid ranking (tests/index has the partial one).
        with trio.fail_after(300):
            while True:
                r = leak(await c.call_tool("get_kiln_stats", {}))
                assert r.structured_content is not None
                index = r.structured_content["index"]
                if index.get("phase") == "ready":
                    break
                await trio.sleep(0.2)  # polling a tool: the state is only seen through it
        assert index["embedded"] == 1.0

        # a paraphrase that shares few words with the note
        r = leak(await c.call_tool("semantic_search", {
            "query": "the collector process kept using more and more RAM until the Pi was swapping",
            "limit": 3}, progress_callback=on_progress))
        assert not r.is_error, texts(r)
        sc = r.structured_content
        assert sc is not None and json.loads(texts(r)) == sc  # complete: no extra line
        assert set(sc) == {"results", "index"} and 1 <= len(sc["results"]) <= 3
        assert sc["index"]["embedded"] == 1.0 and sc["index"]["notes"] >= 30
        assert all(set(hit) == HIT_KEYS for hit in sc["results"])
        assert sc["results"][0]["path"] == "Projects/Lantern/Bugs/Memory leak in the sensor poller.md"
        assert sc["results"][0]["title"] == "Memory leak in the sensor poller"
        assert seen == []  # the index was open already: nothing to wait for

        r = leak(await c.call_tool("text_search", {"query": "sqlite", "limit": 5}))
        sc = r.structured_content
        assert sc is not None and json.loads(texts(r)) == sc
        assert all(set(hit) == HIT_KEYS for hit in sc["results"])
        paths = [h["path"] for h in sc["results"]]
        assert "Projects/Lantern/Decisions/ADR-001 Use SQLite for readings.md" in paths
        r = leak(await c.call_tool("text_search", {"query": "SQL(ite)? ", "case_sensitive": True, "regex": True,
                                                   "limit": 50}))
        assert r.structured_content is not None and r.structured_content["results"]
        assert all("SQL" in h["snippet"] for h in r.structured_content["results"])
        r = leak(await c.call_tool("text_search", {"query": "([unclosed", "regex": True}))
        assert r.is_error and "invalid regular expression" in texts(r)

        r = leak(await c.call_tool("property_search", {"query": "tag:project", "limit": 10}))
        sc = r.structured_content
        assert sc is not None and json.loads(texts(r)) == sc
        assert "Projects/Lantern/Overview.md" in [h["path"] for h in sc["results"]]
        assert all(set(hit) == HIT_KEYS for hit in sc["results"])
        r = leak(await c.call_tool("property_search", {"tag": "bread", "limit": 10}))
        assert r.structured_content is not None
        assert "Cooking/Sourdough starter.md" in [h["path"] for h in r.structured_content["results"]]
        r = leak(await c.call_tool("property_search", {"limit": 3}))
        assert r.is_error and "give 'query', or at least one of 'key', 'value', 'tag'" in texts(r)

        # a note deleted between the search and the read
        r = leak(await c.call_tool("semantic_search", {"query": "sourdough starter feeding", "limit": 1}))
        assert r.structured_content is not None
        found = r.structured_content["results"][0]["path"]
        (mcp_kiln / found).unlink()
        r = leak(await c.call_tool("read_note", {"path": found}))
        assert r.is_error and texts(r).startswith(f"Note not found: '{found}'")

        r = leak(await c.call_tool("get_kiln_stats", {}))
        assert r.structured_content is not None
        index = r.structured_content["index"]
        assert index["opened"] is True and index["notes"] >= 30 and index["chunks"] > index["notes"]
    leak.check()


def _index_worker_pids(kiln: Path) -> list[int]:
    """The pids of the index workers (`python -m crucible.kiln.builder --kiln KILN`) on `kiln`."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"crucible.kiln.builder" in argv and str(kiln).encode() in argv:
            pids.append(int(proc.name))
    return pids


@asynccontextmanager
async def gated_cru_mcp(cru_bin: str, kiln: Path, cru_env: dict[str, str], query: str, *, batch_size: int,
                        more: str = "") -> AsyncIterator[tuple[Client, GatedEmbedder]]:
    """`cru mcp` on `kiln` with the gated HTTP embedder (`query` answered at once, the build's
    requests held), once the build's first request reached it."""
    with GatedEmbedder(answer_at_once=lambda texts: texts == [query]) as embedder:
        config = Path(cru_env["XDG_CONFIG_HOME"]) / "crucible" / "config.toml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(embedder.config_toml(batch_size=batch_size) + ("\n" + more if more else ""))
        async with stdio_client(cru_bin, kiln, cru_env) as c:
            assert await trio.to_thread.run_sync(embedder.requested.wait, 60)
            yield c, embedder


async def test_a_build_stopped_midway_is_searched_as_far_as_it_got_and_says_so(
        cru_bin: str, mcp_kiln: Path, cru_env: dict[str, str], tmp_path: Path) -> None:
    """The index worker killed (kill -9, as the OOM killer does) once some notes are embedded:
    `semantic_search` searches those by meaning and the rest by words, and says where the build
    stopped and why (not that the index builds in the background, nor that it cannot be used).
    `cru kiln index` in another terminal then embeds the rest, and the session takes it on."""
    query = "feeding the sourdough starter"
    leak = LeakCheck(tmp_path, mcp_kiln)
    async with gated_cru_mcp(cru_bin, mcp_kiln, cru_env, query, batch_size=4) as (c, embedder):
        with trio.fail_after(120):
            while True:  # a request at a time, until some are written
                embedder.pace()
                r = leak(await c.call_tool("semantic_search", {"query": query, "limit": 3}))
                sc = r.structured_content
                assert sc is not None and "stopped" not in sc["index"], sc
                if sc["index"]["embedded"] > 0:
                    break
                await trio.sleep(0.3)
        workers = _index_worker_pids(mcp_kiln)
        assert len(workers) == 1, workers
        os.kill(workers[0], signal.SIGKILL)
        with trio.fail_after(60):
            while "stopped" not in (sc := r.structured_content or {})["index"]:
                await trio.sleep(0.3)
                r = leak(await c.call_tool("semantic_search", {"query": query, "limit": 3}))
        assert not r.is_error and sc["results"], texts(r)
        index = sc["index"]
        assert 0 < index["embedded"] < 1 and "problem" not in index, index
        assert index["stopped"] == "the indexing worker was killed by SIGKILL, as when memory runs out", index
        # tried again by itself after `[index] retry_secs` (60 s by default), and said so
        assert 1 <= index["retry_in"] <= 60, index
        assert sc["notice"] == (f"Index: {shown_percent(index['embedded'])}% of the kiln's {index['notes']} notes are "
                                f"embedded; the index's build stopped ({index['stopped']}): the others were "
                                "matched by their words only (this session tries the build again in "
                                f"{shown_duration(index['retry_in'])}, or `cru kiln index` embeds them).")
        assert [b.text for b in r.content if isinstance(b, types.TextContent)][1] == sc["notice"]
        # The rest embedded by `cru kiln index` in another terminal: the session takes it on.
        embedder.open()
        done = await trio.run_process([cru_bin, "kiln", "index", "--kiln", str(mcp_kiln)],
                                      env=cru_env, capture_stdout=True, capture_stderr=True)
        assert done.returncode == 0, done.stderr
        with trio.fail_after(60):
            while (sc := r.structured_content or {})["index"] != {"embedded": 1.0, "notes": index["notes"]}:
                await trio.sleep(0.3)
                r = leak(await c.call_tool("semantic_search", {"query": query, "limit": 3}))
        assert "notice" not in sc and sc["results"][0]["path"] == "Cooking/Sourdough starter.md", sc
    leak.check()


async def test_a_note_written_while_the_index_builds_is_counted_before_the_build_ends(
        cru_bin: str, mcp_kiln: Path, cru_env: dict[str, str], tmp_path: Path) -> None:
    """A note written during the build is found by its words at once; the share counted it only
    once the build ended ("0% of the kiln's 122 notes" listed the 123rd): it is counted at the
    build's next step, as not embedded yet, then embedded after the build."""
    query = "quayside lamplighter rota"
    leak = LeakCheck(tmp_path, mcp_kiln)
    async with gated_cru_mcp(cru_bin, mcp_kiln, cru_env, query, batch_size=4) as (c, embedder):
        r = leak(await c.call_tool("semantic_search", {"query": query, "limit": 3}))
        assert r.structured_content is not None
        before = r.structured_content["index"]["notes"]
        (mcp_kiln / "Harbor rota.md").write_text("# Harbor rota\n\nThe quayside lamplighter rota for winter.\n")
        with trio.fail_after(60):  # the session's watcher reads it
            while True:
                sc = leak(await c.call_tool("semantic_search", {"query": query, "limit": 3})).structured_content or {}
                if "Harbor rota.md" in [hit["path"] for hit in sc["results"]]:
                    break
                await trio.sleep(0.3)
        assert sc["index"] == {"embedded": 0.0, "notes": before}, sc  # the build's count, until its next step
        with trio.fail_after(120):  # the build goes on, a request at a time
            while sc["index"]["notes"] != before + 1:
                embedder.pace()
                await trio.sleep(0.3)
                r = leak(await c.call_tool("semantic_search", {"query": query, "limit": 3}))
                sc = r.structured_content or {}
        assert sc["index"]["embedded"] < 1, sc  # still building: counted by the build's step
        assert sc["notice"].startswith(f"Index: {shown_percent(sc['index']['embedded'])}% of the kiln's "
                                       f"{before + 1} notes are embedded so far"), sc["notice"]
        embedder.open()
        with trio.move_on_after(120):
            while (sc := r.structured_content or {})["index"] != {"embedded": 1.0, "notes": before + 1}:
                await trio.sleep(0.3)
                r = leak(await c.call_tool("semantic_search", {"query": query, "limit": 3}))
        assert sc["index"] == {"embedded": 1.0, "notes": before + 1}, sc
        assert sc["results"][0]["path"] == "Harbor rota.md", sc
    leak.check()


async def test_a_build_the_embedder_stopped_goes_on_by_itself_once_the_embedder_is_back(
        cru_bin: str, cru_env: dict[str, str], tmp_path: Path) -> None:
    """The embedder answering errors midway (an Ollama restarted, a server overloaded) stops
    the build: said as stopped; the session tries it again by itself (`[index] retry_secs`,
    twice as long after each try that stops again), and once the embedder answers the build
    ends with no `cru kiln index`, embedding only what was missing, and the searches say so."""
    kiln = tmp_path / "kiln"
    notes = 2 * GROUP_NOTES + 16  # one chunk each, embedded and written `size` at a time
    for i in range(notes):
        path = kiln / f"part-{i // 50}" / f"note-{i:03d}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# Note {i}\n\nAbout the lantern and the word uniqueword{i}.\n")
    size = group_notes(notes)
    query = "lantern uniqueword7"
    leak = LeakCheck(tmp_path, kiln)
    async with gated_cru_mcp(cru_bin, kiln, cru_env, query, batch_size=32,
                             more="[index]\nretry_secs = 2\n") as (c, embedder):
        with trio.fail_after(120):
            while True:  # a request at a time, until some are written
                embedder.pace()
                r = leak(await c.call_tool("semantic_search", {"query": query, "limit": 3}))
                if (r.structured_content or {})["index"]["embedded"] > 0:
                    break
                await trio.sleep(0.3)
        # The rest fails (searches by meaning go on: their queries are answered).
        embedder.fail(503, '{"error": "model is loading"}', queries_too=False)
        with trio.fail_after(60):
            while "stopped" not in (sc := r.structured_content or {})["index"]:
                await trio.sleep(0.3)
                r = leak(await c.call_tool("semantic_search", {"query": query, "limit": 3}))
        assert "HTTP 503" in sc["index"]["stopped"] and 0 < sc["index"]["embedded"] < 1, sc["index"]
        # (2 s after the first stop, twice that after each next: seen at the first, or a later one on a slow machine)
        assert 1 <= sc["index"]["retry_in"] <= 8 and "tries the build again in" in sc["notice"], sc
        missing = notes - round(sc["index"]["embedded"] * notes)
        assert missing % size == 0 or missing < size, (missing, size)  # groups written whole
        tries = embedder.requests
        await trio.sleep(5)  # tried again meanwhile (after 2 s, then 4 s): stopped again, still said so
        r = leak(await c.call_tool("semantic_search", {"query": query, "limit": 3}))
        assert embedder.requests > tries and "stopped" in (r.structured_content or {})["index"]
        texts_before = embedder.texts
        embedder.mend()
        embedder.open()
        with trio.fail_after(90):  # the next try (8 s at most after the last) embeds the rest
            while (sc := r.structured_content or {})["index"] != {"embedded": 1.0, "notes": notes}:
                await trio.sleep(0.5)
                r = leak(await c.call_tool("semantic_search", {"query": query, "limit": 3}))
        assert "notice" not in sc and sc["results"][0]["path"] == "part-0/note-007.md", sc
        # Only what was missing was embedded again (the failed tries asked one batch each).
        assert embedder.texts - texts_before <= missing + 32, (embedder.texts, texts_before, missing)
    leak.check()


async def test_a_store_that_cannot_be_opened_is_searched_by_words_with_its_fix(
        cru_bin: str, mcp_kiln: Path, cru_env: dict[str, str], tmp_path: Path) -> None:
    """A damaged vector store (or a link in it, or its server down) left `semantic_search` an
    error while the notes' words could answer: the agent gets those, and the problem with its fix
    in the result (structured, and the line after the JSON)."""
    store = mcp_kiln / ".crucible" / "chroma"
    store.mkdir(parents=True)
    (store / "chroma.sqlite3").write_bytes(b"garbage" * 1000)
    leak = LeakCheck(tmp_path, mcp_kiln)
    seen: list[str | None] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(message)

    async with stdio_client(cru_bin, mcp_kiln, cru_env) as c:
        with trio.fail_after(120):
            r = leak(await c.call_tool("semantic_search", {"query": "feeding the sourdough starter", "limit": 3},
                                       progress_callback=on_progress))
        assert not r.is_error, texts(r)
        # the client that shows progress is not told the index is ready
        assert seen and seen[-1] == "The search index cannot be opened: searching by the notes' words", seen
        sc = r.structured_content
        assert sc is not None and sc["results"][0]["path"] == "Cooking/Sourdough starter.md"
        assert sc["index"]["embedded"] == 0.0 and sc["index"]["notes"] >= 30
        assert "damaged" in sc["index"]["problem"] and "Run `cru kiln index --rebuild`." in sc["index"]["problem"]
        assert sc["notice"].startswith("Index: the kiln's index cannot be searched by meaning: ")
        assert sc["notice"].endswith("Until then these notes were matched by their words only.")
        assert [b.text for b in r.content if isinstance(b, types.TextContent)][1] == sc["notice"]
        r = leak(await c.call_tool("semantic_search", {"query": "", "limit": 3}))
        assert r.is_error  # a query error stays an error
        assert (store / "chroma.sqlite3").read_bytes() == b"garbage" * 1000
        # The fix, run in another terminal while the session serves: the session takes it
        # without a restart (it opens the store again once its files changed and no one writes).
        fixed = await trio.run_process([cru_bin, "kiln", "index", "--rebuild", "--kiln", str(mcp_kiln)],
                                       env=cru_env, capture_stdout=True, capture_stderr=True)
        assert b"rebuilt the index" in fixed.stdout, fixed.stderr
        with trio.fail_after(60):
            while True:
                r = leak(await c.call_tool("semantic_search", {"query": "feeding the sourdough starter", "limit": 3}))
                sc = r.structured_content
                assert sc is not None, texts(r)
                if "problem" not in sc["index"]:
                    break
                await trio.sleep(0.2)  # the session looks at the store once a second
        assert sc["index"] == {"embedded": 1.0, "notes": sc["index"]["notes"]} and "notice" not in sc
        assert sc["results"][0]["path"] == "Cooking/Sourdough starter.md"
    leak.check()


async def test_a_store_damaged_under_a_session_is_searched_by_words_until_the_fix(
        cru_bin: str, mcp_kiln: Path, cru_env: dict[str, str], tmp_path: Path) -> None:
    """The store breaks while `cru mcp` has it open (a disk error, a sync tool writing over it):
    the searches answer by words with the problem; once `cru kiln index --rebuild` has run in
    another terminal, by meaning again (the session had kept its broken view of the store)."""
    built = await trio.run_process([cru_bin, "kiln", "index", "--kiln", str(mcp_kiln)], env=cru_env,
                                   capture_stdout=True, capture_stderr=True)
    assert built.returncode == 0, built.stderr
    query = {"query": "feeding the sourdough starter", "limit": 3}
    database = mcp_kiln / ".crucible" / "chroma" / "chroma.sqlite3"
    leak = LeakCheck(tmp_path, mcp_kiln)
    async with stdio_client(cru_bin, mcp_kiln, cru_env) as c:
        r = leak(await c.call_tool("semantic_search", query))
        assert r.structured_content is not None and r.structured_content["index"]["embedded"] == 1.0, texts(r)
        with trio.fail_after(60):  # the session's check that nothing is left to embed, done
            while True:
                stats = leak(await c.call_tool("get_kiln_stats", {})).structured_content
                if stats is not None and stats["index"]["phase"] == "ready":
                    break
                await trio.sleep(0.2)  # polling a tool: the state is only seen through it
        database.write_bytes(b"garbage" * 1000)
        r = leak(await c.call_tool("semantic_search", query))
        sc = r.structured_content
        assert not r.is_error and sc is not None, texts(r)
        assert sc["results"][0]["path"] == "Cooking/Sourdough starter.md"
        assert "damaged or unreadable" in sc["index"]["problem"] and sc["index"]["embedded"] == 0.0
        assert sc["notice"].startswith("Index: the kiln's index cannot be searched by meaning: ")
        # and the index says so where the person looks (the status bar, cru acp's notice)
        r = leak(await c.call_tool("get_kiln_stats", {}))
        assert r.structured_content is not None and r.structured_content["index"]["phase"] == "failed"
        assert "damaged or unreadable" in r.structured_content["index"]["error"]
        fixed = await trio.run_process([cru_bin, "kiln", "index", "--rebuild", "--kiln", str(mcp_kiln)],
                                       env=cru_env, capture_stdout=True, capture_stderr=True)
        assert b"rebuilt the index" in fixed.stdout, fixed.stderr
        r = leak(await c.call_tool("semantic_search", query))
        sc = r.structured_content
        assert sc is not None and sc["index"] == {"embedded": 1.0, "notes": sc["index"]["notes"]}, texts(r)
        assert "notice" not in sc and sc["results"][0]["path"] == "Cooking/Sourdough starter.md"
        r = leak(await c.call_tool("get_kiln_stats", {}))
        assert r.structured_content is not None and r.structured_content["index"]["phase"] == "ready"
        assert "problem" not in r.structured_content["index"]
    leak.check()
