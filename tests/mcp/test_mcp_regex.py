"""A regular expression that backtracks for ages must not freeze `cru mcp` for its other clients
(issue 17, item 1): a real `cru mcp --http` process, two real MCP clients."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
from conftest import cru_mcp_http, stdio_client, texts
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

pytestmark = pytest.mark.slow  # the second pattern runs until the search's time budget (10 s)


async def _pinged_while(slow: Any, other: Client) -> tuple[Any, int]:
    """Run `slow()`; meanwhile the other client keeps calling a tool, each call answered within
    a bound. Returns slow()'s result and how many calls the other client got answered."""
    answered = 0
    done = trio.Event()
    result: list[Any] = []

    async def run_slow() -> None:
        result.append(await slow())
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_slow)
        with trio.fail_after(60):
            while not done.is_set():
                with trio.fail_after(10):  # a frozen server never answers this
                    r = await other.call_tool("get_kiln_info", {})
                assert not r.is_error, texts(r)
                answered += 1
    return result[0], answered


async def test_a_runaway_regex_does_not_freeze_the_server(
    cru_bin: str, mcp_kiln: Path, cru_env: dict[str, str]
) -> None:
    (mcp_kiln / "Trap.md").write_text("# Trap\n\n" + "a" * 40 + "!\n")
    async with cru_mcp_http(cru_bin, mcp_kiln, cru_env) as srv:
        def client() -> Client:
            # a short HTTP timeout: on a frozen server the clients' teardown waits for it
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {srv.token}"}, timeout=40)
            return Client(streamable_http_client(srv.url, http_client=http), mode="legacy")

        async with client() as attacker, client() as other:
            # The pattern: exponential on Python's re; the regex engine answers at once.
            r, answered = await _pinged_while(
                lambda: attacker.call_tool("text_search", {"query": "(a+)+$", "regex": True}), other)
            assert not r.is_error, texts(r)
            assert r.structured_content is not None
            assert "Trap.md" not in [h["path"] for h in r.structured_content["results"]]
            assert answered >= 1

            # A pattern that backtracks on any engine with backtracking: stopped at its budget,
            # with a message saying what to do, while the other client is served throughout.
            r, answered = await _pinged_while(
                lambda: attacker.call_tool("text_search", {"query": "(a|aa)+$", "regex": True}), other)
            assert r.is_error
            assert "took more than 10 s to match" in texts(r) and "Simplify it" in texts(r)
            assert answered >= 1

            # and the server still searches normally afterwards
            r = await attacker.call_tool("text_search", {"query": "a{40}!", "regex": True})
            assert not r.is_error and r.structured_content is not None
            assert [h["path"] for h in r.structured_content["results"]] == ["Trap.md"]


async def test_a_regex_bomb_is_refused_before_it_is_compiled(
    cru_bin: str, mcp_kiln: Path, cru_env: dict[str, str]
) -> None:
    """x{99999999} made `cru mcp` compile 15 GB of pattern until the kernel killed it: refused
    before compiling, with what to do instead; and matching that needs a note's whole text is
    stopped at the budget too (it overran on a busy machine: the regex module's timeout counts
    processor time)."""
    (mcp_kiln / "Slow.md").write_text("x" + "a" * 400 + "\n")
    async with stdio_client(cru_bin, mcp_kiln, cru_env) as c:
        for query, said in [
            ("x{99999999}", "repeats something 99,999,999 times; a search allows at most 1,000"),
            ("(a{1000}){1000}", "too large once its repeats are multiplied out (1,002,001 items"),
            ("((a{100}){100}){100}", "too large once its repeats are multiplied out"),
        ]:
            r = await c.call_tool("text_search", {"query": query, "regex": True})
            assert r.is_error and said in texts(r), texts(r)
            assert "nested counts multiply" in texts(r) and str(mcp_kiln) not in texts(r)
            info = await c.call_tool("get_kiln_info", {})  # still there, and answering
            assert not info.is_error, texts(info)

        r = await c.call_tool("text_search", {"query": "(.*a){25}x", "regex": True})
        assert r.is_error and "took more than 10 s to match" in texts(r), texts(r)
        r = await c.call_tool("text_search", {"query": "(a{10}){10}!", "regex": True})
        assert not r.is_error, texts(r)
