"""Pieces of delegation that need no agent: the per-tool timeout, reply shaping, the handoff
text, path redaction, and the [child …] lines of `cru chat -p`."""

from __future__ import annotations

import io
import json
from pathlib import Path

import trio
from pydantic import BaseModel

from acp_host.session import MessageChunk, TurnEnded
from crucible.config import Config
from crucible.delegation import (
    ChildEvent,
    ChildStatus,
    Delegation,
    Handoff,
    handoff_text,
    redact_paths,
    shape_reply,
)
from crucible.renderers import child_event_printer
from mcp_bridge.server import BridgeServer
from mcp_bridge.tools import NoArgs, ToolContext, ToolSpec


class Slept(BaseModel):
    seconds: float


async def _sleep_40(ctx: ToolContext, args: NoArgs) -> Slept:
    await trio.sleep(40)
    return Slept(seconds=40)


async def test_a_tool_with_its_own_timeout_outlives_the_servers(autojump_clock: trio.testing.MockClock) -> None:
    plain = ToolSpec("plain", "sleeps", NoArgs, Slept, _sleep_40, read_only=True)
    long = ToolSpec("long", "sleeps", NoArgs, Slept, _sleep_40, read_only=True, timeout=330)
    bridge = BridgeServer(None, tools=[plain, long], tool_timeout=30)
    cut = await bridge.call_tool("plain", {})
    assert cut.is_error and "timed out after 30 seconds" in cut.content[0].text  # type: ignore[union-attr]
    ok = await bridge.call_tool("long", {})
    assert not ok.is_error and ok.structured_content == {"seconds": 40}


def test_delegation_tools_get_the_delegation_timeout_plus_the_margin() -> None:
    config = Config.model_validate({"delegation": {"timeout_secs": 120}})

    class FakeSession:
        opts = type("Opts", (), {"config": config, "card": None})()

    specs = {s.name: s for s in Delegation(FakeSession(), None, None).tool_specs()}  # type: ignore[arg-type]
    assert specs["delegate_session"].timeout == 150 and specs["get_job_result"].timeout == 150
    assert specs["list_jobs"].timeout is None and specs["cancel_job"].timeout is None


def test_shape_reply_cuts_on_a_character_boundary_and_says_so() -> None:
    assert shape_reply("short", 10) == ("short", False)
    text, cut = shape_reply("ab€cd", 4)  # € is 3 bytes: it cannot be split
    assert cut and text.startswith("ab\n[truncated: the child's reply was 7 bytes; the first 4 are shown")


def test_handoff_is_the_summary_and_note_paths_then_the_task() -> None:
    assert handoff_text("claude", None, "do it") == "do it"
    assert handoff_text("claude", Handoff(), "do it") == "do it"
    text = handoff_text("claude", Handoff(summary="We chose SQLite.", notes=["Projects/Lantern.md"]), "Review it")
    assert text.startswith('<handoff from="claude">') and text.endswith("\n\nReview it")
    assert "We chose SQLite." in text and "- Projects/Lantern.md" in text


def test_redact_paths_leaves_no_absolute_path() -> None:
    kiln = Path("/home/ann/notes")
    text = ("the agent /home/ann/.local/bin/claude-agent-acp failed in /home/ann/notes/x.md "
            "(see http://127.0.0.1:4000/v1/x and ~/y)")
    out = redact_paths(text, [(kiln, "<kiln>"), (Path("/home/ann"), "~")])
    assert "/home/ann" not in out
    assert "~/.local/bin/claude-agent-acp" in out and "<kiln>/x.md" in out
    assert "http://127.0.0.1:4000/v1/x" in out
    assert redact_paths("exited: /usr/lib/node/x.js:12", []) == "exited: …/x.js:12"


def chunk(text: str) -> MessageChunk:
    return MessageChunk(text, {"type": "text", "text": text})


def test_child_lines_for_chat_p() -> None:
    out, err = io.StringIO(), io.StringIO()
    show = child_event_printer("text", out, err)
    label = "claude › reviewer"
    for event in (ChildStatus("queued"), ChildStatus("started", "claude"), chunk("Two \x1b[31mthings"),
                  chunk(":\n- one\n- tw"), chunk("o"), TurnEnded("end_turn"),
                  ChildStatus("finished", "completed")):
        show(ChildEvent(label, "job-1", "s1", 1, event))
    assert out.getvalue() == ""
    assert err.getvalue().splitlines() == [
        "[child claude › reviewer] started: claude",
        "[child claude › reviewer] Two ^[[31mthings:",
        "[child claude › reviewer] - one",
        "[child claude › reviewer] - two",
        "[child claude › reviewer] finished: completed",
    ]
    out, err = io.StringIO(), io.StringIO()
    child_event_printer("json", out, err)(ChildEvent(label, "job-1", "s1", 1, chunk("hi")))
    line = json.loads(out.getvalue())
    assert line["type"] == "child_event" and line["label"] == label and line["event"]["type"] == "message_chunk"
    assert err.getvalue() == ""
