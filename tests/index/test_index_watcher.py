"""The watcher keeps the index fresh on real file edits (watchfiles on trio)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from crucible.config import Config
from crucible.kiln.index import KilnIndex
from crucible.kiln.search import hybrid_search
from crucible.kiln.watcher import watch_kiln


@pytest.fixture
def index(tiny_kiln: Path) -> Iterator[KilnIndex]:
    ix = KilnIndex.open(tiny_kiln, Config())
    ix.update()
    yield ix
    ix.close()


class Batches:
    """Collects on_change batches; `wait_for` blocks (bounded) until a path has been indexed."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []
        self._changed = trio.Event()

    async def __call__(self, paths: list[str]) -> None:
        self.seen.append(paths)
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, path: str, times: int = 1) -> None:
        with trio.fail_after(30):
            while sum(path in batch for batch in self.seen) < times:
                await self._changed.wait()


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


async def test_watcher_indexes_new_edited_and_deleted_notes(tiny_kiln: Path, index: KilnIndex) -> None:
    batches = Batches()
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: watch_kiln(
            tiny_kiln, index, on_change=batches, debounce_ms=50, task_status=task_status))

        write(tiny_kiln / "Bikes/Chain.md", "# Bicycle chain\n\nDegrease the chain, then oil every link.\n")
        await batches.wait_for("Bikes/Chain.md")
        hits = await trio.to_thread.run_sync(hybrid_search, index, "lubricate my bike", 1)
        assert hits[0].path == "Bikes/Chain.md"

        write(tiny_kiln / "Links.md", "# Linking notes\n\nTelescopes gather starlight for astronomers.\n")
        await batches.wait_for("Links.md")
        hits = await trio.to_thread.run_sync(hybrid_search, index, "observing stars", 1)
        assert hits[0].path == "Links.md"

        (tiny_kiln / "Garden/Compost.md").unlink()
        await batches.wait_for("Garden/Compost.md")
        assert "Garden/Compost.md" not in index.manifest()

        # files the index does not hold never reach it
        write(tiny_kiln / ".crucible/scratch.md", "# hidden\n")
        write(tiny_kiln / "notes.txt", "not markdown\n")
        write(tiny_kiln / "Last.md", "# Last\n\nA sentinel note.\n")
        await batches.wait_for("Last.md")
        nursery.cancel_scope.cancel()

    flat = [p for batch in batches.seen for p in batch]
    assert ".crucible/scratch.md" not in flat and "notes.txt" not in flat
    assert sorted(index.manifest()) == ["Bikes/Chain.md", "Cooking/Pasta.md", "Last.md", "Links.md"]


async def test_watcher_folders_moved_in_and_deleted(tmp_path: Path) -> None:
    # The kiln sits under a dot-folder: only dot-folders inside the kiln are ignored.
    root = tmp_path / ".hidden-parent" / "kiln"
    write(root / "Start.md", "# Start\n\nFirst note.\n")
    ix = KilnIndex.open(root, Config())
    ix.update()
    batches = Batches()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: watch_kiln(
                root, ix, on_change=batches, debounce_ms=50, task_status=task_status))
            # a folder made outside, with its notes, then moved in: no event for the notes
            outside = tmp_path / "staging" / "Trips"
            write(outside / "Alps.md", "# Alps\n\nHiking between mountain huts in July.\n")
            outside.rename(root / "Trips")
            await batches.wait_for("Trips/Alps.md")
            assert "Trips/Alps.md" in ix.manifest()
            hits = await trio.to_thread.run_sync(hybrid_search, ix, "walking in the mountains", 1)
            assert hits[0].path == "Trips/Alps.md"
            # the folder deleted: its notes leave the index
            (root / "Trips" / "Alps.md").unlink()
            (root / "Trips").rmdir()
            await batches.wait_for("Trips/Alps.md", times=2)
            nursery.cancel_scope.cancel()
        assert sorted(ix.manifest()) == ["Start.md"]
    finally:
        ix.close()
