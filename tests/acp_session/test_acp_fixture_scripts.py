"""Every ready-made script in fixtures/scripts runs against the client and gives what its
`_expect` says (those scripts are what later UI and CLI tests use)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import trio
from acp_session_helpers import REPO, SCRIPTED_AGENT, run_turn, texts

from acp_host.client import connect_agent
from acp_host.session import Decision, MessageChunk, PermissionRequest

SCRIPTS = sorted((REPO / "fixtures" / "scripts").glob("*.json"))
EXPECT = {p: json.loads(p.read_text())["_expect"] for p in SCRIPTS}


async def allow_once(request: PermissionRequest) -> Decision:
    return Decision("allow_once")


def test_there_are_scripts() -> None:
    assert len(SCRIPTS) >= 8


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
async def test_fixture_script(script: Path, tmp_path: Path) -> None:
    expect = EXPECT[script]
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            client = await connect_agent(nursery, [sys.executable, str(SCRIPTED_AGENT), str(script)])
            session = await client.new_session(tmp_path, policy=allow_once, inactivity_timeout=1)
            result, events = await run_turn(session, "hello")
            await client.aclose()
    text = texts(events, MessageChunk)
    if "stop" in expect:
        assert result.stop_reason == expect["stop"], result
    if "error_contains" in expect:
        assert result.error is not None and expect["error_contains"] in result.error
    if "text" in expect:
        assert text == expect["text"]
    if "text_contains" in expect:
        assert expect["text_contains"] in text
    if "text_length" in expect:
        assert len(text) == expect["text_length"]
    for name, content in expect.get("files", {}).items():
        assert await trio.Path(tmp_path / name).read_text() == content
