"""Pure parts of the session: tool-call merging, permission mapping, lenient update parsing."""

from __future__ import annotations

from typing import Any

from acp_host.session import (
    AcpSession,
    CommandsChanged,
    Decision,
    MessageChunk,
    ModeChanged,
    PermissionOption,
    PlanChanged,
    RawUpdate,
    ThoughtChunk,
    ToolCallEvent,
    ToolCallTracker,
    UsageChanged,
    choose_outcome,
    parse_options,
)


class _NoConnection:
    async def request(self, method: str, params: Any) -> Any:
        raise AssertionError("no I/O in these tests")

    async def notify(self, method: str, params: Any) -> None:
        raise AssertionError("no I/O in these tests")

    async def describe_exit(self, when: str = "") -> str:
        return ""


def test_tool_call_update_before_call_and_twice() -> None:
    tracker = ToolCallTracker()
    call, created = tracker.merge({"toolCallId": "t1", "status": "in_progress"}, announce=False)
    assert created and call.status == "in_progress" and call.title is None and not call.announced
    call, created = tracker.merge(
        {"toolCallId": "t1", "title": "Edit a.md", "kind": "edit", "status": "pending"}, announce=True
    )
    assert not created and call.title == "Edit a.md" and call.announced
    diff = {"type": "diff", "path": "/p/a.md", "oldText": "a", "newText": "b"}
    call, _ = tracker.merge({"toolCallId": "t1", "content": [diff]}, announce=False)
    call, _ = tracker.merge({"toolCallId": "t1", "rawInput": {"path": "a.md"}, "status": None}, announce=False)
    call, _ = tracker.merge({"toolCallId": "t1", "status": "completed"}, announce=False)
    call, _ = tracker.merge({"toolCallId": "t1", "status": "completed"}, announce=False)
    assert call.title == "Edit a.md" and call.kind == "edit" and call.status == "completed"
    assert call.raw_input == {"path": "a.md"} and call.diffs == [diff]
    assert list(tracker.calls) == ["t1"]


CLAUDE = parse_options(
    [
        {"optionId": "allow_always", "name": "Always Allow", "kind": "allow_always"},
        {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
        {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
    ]
)
GEMINI = parse_options(
    [
        {"optionId": "proceed_always", "name": "Always", "kind": "allow_always"},
        {"optionId": "proceed_once", "name": "Once", "kind": "allow_once"},
        {"optionId": "cancel", "name": "No", "kind": "reject_once"},
    ]
)


def _picked(decision: str, options: tuple[PermissionOption, ...]) -> Any:
    outcome, _ = choose_outcome(Decision(decision), options)  # type: ignore[arg-type]
    return outcome.get("optionId", outcome["outcome"])


def test_decisions_map_by_kind_not_by_id() -> None:
    assert [_picked(d, CLAUDE) for d in ("allow_once", "allow_always", "reject_once", "reject_always")] == [
        "allow",
        "allow_always",
        "reject",
        "reject",
    ]
    assert [_picked(d, GEMINI) for d in ("allow_once", "allow_always", "reject_once", "reject_always")] == [
        "proceed_once",
        "proceed_always",
        "cancel",
        "cancel",
    ]
    assert _picked("cancelled", CLAUDE) == "cancelled"


def test_decision_fallbacks_never_widen() -> None:
    once_only = parse_options([{"optionId": "y", "name": "Yes", "kind": "allow_once"}])
    always_only = parse_options(
        [
            {"optionId": "yy", "name": "Always", "kind": "allow_always"},
            {"optionId": "n", "name": "No", "kind": "reject_once"},
        ]
    )
    assert _picked("allow_always", once_only) == "y"
    assert _picked("reject_once", once_only) == "cancelled"  # no reject offered
    outcome, note = choose_outcome(Decision("allow_once"), always_only)
    assert outcome == {"outcome": "selected", "optionId": "n"} and "not offered" in note


async def test_updates_parse_leniently() -> None:
    session = AcpSession(_NoConnection(), "s")
    ev = session.parse_update({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}})
    assert ev == MessageChunk("hi", {"type": "text", "text": "hi"})
    ev = session.parse_update({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "hm"}})
    assert isinstance(ev, ThoughtChunk) and ev.text == "hm"
    # A newer variant the SDK does not know arrives raw.
    ev = session.parse_update({"sessionUpdate": "memory_update", "memories": [1]})
    assert isinstance(ev, RawUpdate) and "memory_update" in ev.reason
    # Claude's usage update with a null total: raw, not an exception.
    ev = session.parse_update({"sessionUpdate": "usage_update", "used": None, "size": 200000})
    assert isinstance(ev, RawUpdate) and "used" in ev.reason
    ev = session.parse_update({"sessionUpdate": "usage_update", "used": 10, "size": 100})
    assert ev == UsageChanged(10, 100) and session.state.usage == ev
    ev = session.parse_update({"sessionUpdate": "agent_message_chunk", "content": "not a block"})
    assert isinstance(ev, RawUpdate)
    assert isinstance(session.parse_update(["nope"]), RawUpdate)
    ev = session.parse_update(
        {"sessionUpdate": "plan", "entries": [{"content": "a", "priority": "high", "status": "pending"}]}
    )
    assert isinstance(ev, PlanChanged) and session.state.plan[0].content == "a"
    ev = session.parse_update({"sessionUpdate": "current_mode_update", "currentModeId": "plan"})
    assert ev == ModeChanged("plan") and session.state.current_mode == "plan"
    ev = session.parse_update(
        {"sessionUpdate": "available_commands_update", "availableCommands": [{"name": "init", "description": "x"}]}
    )
    assert isinstance(ev, CommandsChanged) and session.state.commands[0].name == "init"
    ev = session.parse_update({"sessionUpdate": "tool_call_update", "toolCallId": "t9", "status": "failed"})
    assert isinstance(ev, ToolCallEvent) and ev.created and ev.call.status == "failed"


async def test_session_result_sets_modes_and_models() -> None:
    session = AcpSession(_NoConnection(), "s")
    session.apply_session_result(
        {
            "sessionId": "s",
            "modes": {"currentModeId": "ask", "availableModes": [{"id": "ask", "name": "Ask"}, {"id": "code", "name": "Code"}]},
            "configOptions": [
                {
                    "id": "model",
                    "name": "Model",
                    "category": "model",
                    "type": "select",
                    "currentValue": "fast",
                    "options": [{"value": "fast", "name": "Fast"}, {"value": "smart", "name": "Smart"}],
                }
            ],
        }
    )
    assert session.state.current_mode == "ask" and [m.id for m in session.state.modes] == ["ask", "code"]
    assert [o.id for o in session.state.models] == ["model"]


KINDS = [
    "agent_message_chunk", "agent_thought_chunk", "user_message_chunk", "tool_call",
    "tool_call_update", "plan", "current_mode_update", "config_option_update",
    "available_commands_update", "usage_update", "session_info_update", "brand_new_kind",
]


def _json_values() -> Any:
    from hypothesis import strategies as st

    return st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
        max_leaves=20,
    )


async def test_no_update_shape_raises() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    session = AcpSession(_NoConnection(), "s")
    field_names = st.sampled_from(
        ["content", "toolCallId", "title", "status", "entries", "currentModeId", "configOptions",
         "availableCommands", "used", "size", "cost", "rawInput", "messageId", "locations", "x"]
    )

    @settings(max_examples=400, deadline=None)
    @given(st.sampled_from(KINDS), st.dictionaries(field_names, _json_values(), max_size=6))
    def check(kind: str, fields: dict[str, Any]) -> None:
        event = session.parse_update({"sessionUpdate": kind, **fields})
        assert event is not None

    check()
