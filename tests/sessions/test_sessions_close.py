"""`CrucibleSession.aclose`: every way out of `open_session` (its block's end, an error, a cancel,
an early explicit close) ends the session the same way, once: the bridge unmounted, the agent's
process group gone, the transcript written out. A real scripted agent in this process's trio."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import httpx
import pytest
import trio

from acp_host.registry import resolve_agent
from crucible.config import Config
from crucible.session_store import SessionStore
from crucible.sessions import BridgeHost, CrucibleSession, SessionOptions, open_session

REPO = Path(__file__).resolve().parents[2]
SCRIPTED = REPO / "fixtures" / "scripted_agent.py"


def options(tmp_path: Path, kiln: Path) -> SessionOptions:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"new_session": {"list_mcp_tools": True}, "prompts": [[{"text": "hi"}]]}))
    spec = resolve_agent(None, agent_command=f"{sys.executable} {SCRIPTED} {script}")
    return SessionOptions(agent=spec, kiln=kiln, cwd=tmp_path, config=Config(),
                          store=SessionStore(tmp_path / "sessions"))


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("way_out", ["end", "error", "cancel", "closed early"])
async def test_every_way_out_closes_the_session_once(tmp_path: Path, kiln: Path, way_out: str) -> None:
    opts = options(tmp_path, kiln)
    seen: list[CrucibleSession] = []
    async with BridgeHost().running() as host:
        url = ""
        with trio.CancelScope() as scope:
            try:
                async with open_session(opts, host) as session:
                    seen.append(session)
                    url = host.url(f"/s/{session.id}")
                    assert session.client is not None and session.client.process is not None
                    assert group_alive(session.client.process.pgid)
                    session.warn("written before the end")  # buffered until the transcript closes
                    if way_out == "error":
                        raise RuntimeError("the caller failed")
                    if way_out == "cancel":
                        scope.cancel()
                        await trio.sleep_forever()
                    if way_out == "closed early":
                        await session.aclose()
                        assert session.closed
            except BaseException as exc:  # a nursery wraps the caller's error in a group
                if way_out != "error":
                    raise
                assert "the caller failed" in repr(exc)
        assert scope.cancelled_caught == (way_out == "cancel")
        [session] = seen
        assert session.closed and session.client is not None and session.client.process is not None
        process = session.client.process
        assert process.returncode is not None and not group_alive(process.pgid)
        # The bridge is gone from the host (which still serves): the agent's token opens nothing.
        async with httpx.AsyncClient() as http:
            answer = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert answer.status_code == 404
        # The transcript was written out.
        assert opts.store is not None
        records = list(opts.store.events(session.id))
        assert any(r.get("type") == "warning" and r.get("message") == "written before the end" for r in records)
        await session.aclose()  # a second close does nothing
