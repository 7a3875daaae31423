"""The recorder's file as a connection ends: every frame tapped before the close is written,
none after, and closing never races a write under way."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

import trio

from acp_host.jsonrpc import Notification
from acp_host.recording import Recorder


class _GatedFile(io.StringIO):
    """A file whose first write waits until the test lets it go (a slow disk, a busy machine)."""

    def __init__(self) -> None:
        super().__init__()
        self.writing = threading.Event()
        self.go = threading.Event()
        self.text = ""

    def write(self, s: str) -> int:
        self.writing.set()
        self.go.wait(10)
        return super().write(s)

    def close(self) -> None:
        self.text = self.getvalue()
        super().close()


def _frames(text: str) -> list[str]:
    return [json.loads(line)["frame"]["method"] for line in text.splitlines()]


async def test_closing_while_a_write_is_under_way_waits_for_it(tmp_path: Path) -> None:
    file = _GatedFile()
    recorder = Recorder(file, tmp_path / "rec.jsonl", agent="agent")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(recorder.run)
        recorder.tap("in", Notification("first", None))
        await trio.to_thread.run_sync(file.writing.wait, 10)  # `run` is inside its write
        nursery.start_soon(recorder.aclose)
        await trio.sleep(0.2)
        assert not file.closed  # closing waits for the write under way
        file.go.set()
    # Without waiting, the close came first and the write raised "I/O operation on closed file".
    assert file.closed
    assert _frames(file.text) == ["first"]


async def test_a_frame_tapped_after_the_close_is_not_written_and_ends_nothing(tmp_path: Path) -> None:
    file = _GatedFile()
    file.go.set()
    recorder = Recorder(file, tmp_path / "rec.jsonl", agent="agent")
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(recorder.run)
            recorder.tap("out", Notification("before", None))
            await recorder.aclose()
            recorder.tap("in", Notification("after", None))  # the peer still reading as it ends
    assert _frames(file.text) == ["before"]
