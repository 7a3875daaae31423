"""Property-based fuzz of inbound frames: the peer never crashes and still answers."""

from __future__ import annotations

import json
from typing import Any

import trio
import trio.testing
from acp_core_helpers import peer_with_raw_end
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from acp_host.jsonrpc import METHOD_NOT_FOUND, JsonRpcError

json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
ids = (
    st.integers(-(2**63), 2**63)
    | st.text(max_size=6)
    | st.none()
    | st.booleans()
    | st.floats(allow_nan=False)
    | st.just([1])
)
methods = (
    st.sampled_from(["echo", "$/cancel_request", "session/update", "", "nope"])
    | st.text(max_size=10)
    | json_values
)


@st.composite
def rpc_shaped(draw: st.DrawFn) -> dict[str, Any]:
    frame: dict[str, Any] = {}
    for key, strategy in (
        ("jsonrpc", st.sampled_from(["2.0", "1.0", 2])),
        ("id", ids),
        ("method", methods),
        ("params", json_values | st.fixed_dictionaries({"requestId": ids})),
        ("result", json_values),
        (
            "error",
            json_values
            | st.fixed_dictionaries(
                {"code": st.integers(), "message": json_values, "data": json_values}
            ),
        ),
    ):
        if draw(st.booleans()):
            frame[key] = draw(strategy)
    return frame


lines = st.lists(
    st.binary(max_size=80).map(lambda b: b.replace(b"\n", b""))
    | json_values.map(lambda v: json.dumps(v).encode())
    | rpc_shaped().map(lambda d: json.dumps(d).encode()),
    max_size=12,
)


async def handler(method: str, params: Any) -> Any:
    if method == "echo":
        return params
    if method == "crash":
        raise RuntimeError("bug")
    raise JsonRpcError(METHOD_NOT_FOUND, f"method not found: {method}")


async def note_handler(method: str, params: Any) -> None:
    if method == "session/update" and params == {}:
        raise ValueError("a handler bug must not kill the connection")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames=lines, cuts=st.lists(st.integers(0, 4000), max_size=6), small_cap=st.booleans())
def test_fuzzed_frames_never_crash_the_peer(
    frames: list[bytes], cuts: list[int], small_cap: bool
) -> None:
    stream = b"\n".join(frames)

    async def main() -> None:
        peer, raw = peer_with_raw_end(
            request_handler=handler,
            notification_handler=note_handler,
            max_line_bytes=100 if small_cap else 64 * 1024 * 1024,
        )
        # a safety net so a hang fails the test instead of stalling the suite
        with trio.fail_after(30):
            await exchange(peer, raw)

    async def exchange(peer: Any, raw: Any) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(peer.run)
            outcome: list[Any] = []

            async def outbound() -> None:
                # a request of ours is pending while the garbage arrives: it may get any answer
                try:
                    outcome.append(await peer.request("ours", {}))
                except JsonRpcError as exc:
                    outcome.append(exc)

            nursery.start_soon(outbound)
            await raw.read_frame()  # our request went out
            last = 0
            for cut in sorted(c for c in cuts if c < len(stream)):
                await raw.write(stream[last:cut])
                last = cut
            await raw.write(stream[last:])
            final = b'\n{"jsonrpc":"2.0","id":"final-check","method":"echo","params":["alive"]}\n'
            await raw.write(final)
            while True:
                frame = await raw.read_frame()
                assert isinstance(frame, dict) and frame.get("jsonrpc") == "2.0"
                if frame.get("id") == "final-check" and "result" in frame:
                    assert frame["result"] == ["alive"]
                    break
            assert not peer.closed.is_set()
            nursery.cancel_scope.cancel()

    trio.run(main)
