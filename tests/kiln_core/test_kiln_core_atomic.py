"""Atomic writes: expected-hash check, mode kept, no temp files, and kill -9 never tears a note."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crucible.kiln import atomic
from crucible.kiln.atomic import (
    ConcurrentEditError,
    atomic_write_bytes,
    atomic_write_text,
    content_hash,
    file_hash,
)
from crucible.kiln.paths import iter_files, iter_markdown

CHILD = Path(__file__).with_name("kiln_core_writer_child.py")
sys.path.insert(0, str(CHILD.parent))
from kiln_core_writer_child import version_text  # noqa: E402


def test_content_hash_is_sha256_of_utf8() -> None:
    assert content_hash("é") == content_hash("é".encode())
    assert content_hash("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def test_write_new_file_returns_hash_and_leaves_no_temp(tmp_path: Path) -> None:
    p = tmp_path / "n.md"
    h = atomic_write_text(p, "# Hi\n")
    assert p.read_text() == "# Hi\n"
    assert h == content_hash("# Hi\n") == file_hash(p)
    assert sorted(os.listdir(tmp_path)) == ["n.md"]


def test_replace_keeps_mode(tmp_path: Path) -> None:
    p = tmp_path / "n.md"
    p.write_text("old")
    os.chmod(p, 0o640)
    atomic_write_text(p, "new")
    assert p.read_text() == "new"
    assert stat.S_IMODE(p.stat().st_mode) == 0o640


def test_expected_hash_match_writes(tmp_path: Path) -> None:
    p = tmp_path / "n.md"
    p.write_text("v1")
    h2 = atomic_write_text(p, "v2", expected_hash=content_hash("v1"))
    assert p.read_text() == "v2" and h2 == content_hash("v2")


def test_expected_hash_mismatch_writes_nothing(tmp_path: Path) -> None:
    p = tmp_path / "n.md"
    p.write_text("v1")
    stale = content_hash("v1")
    p.write_text("edited in another editor")
    with pytest.raises(ConcurrentEditError) as ei:
        atomic_write_text(p, "agent's version", expected_hash=stale)
    assert p.read_text() == "edited in another editor"
    assert ei.value.current_hash == content_hash("edited in another editor")
    assert "read the note again" in (ei.value.fix or "")
    assert str(tmp_path) not in str(ei.value)
    assert sorted(os.listdir(tmp_path)) == ["n.md"]


def test_expected_hash_on_deleted_file_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "gone.md"
    with pytest.raises(ConcurrentEditError, match="deleted"):
        atomic_write_text(p, "x", expected_hash=content_hash("x"))
    assert not p.exists()


def test_write_through_symlink_keeps_the_link(tmp_path: Path) -> None:
    target = tmp_path / "real.md"
    target.write_text("old")
    link = tmp_path / "link.md"
    link.symlink_to("real.md")
    atomic_write_text(link, "new")
    assert link.is_symlink() and target.read_text() == "new"


def test_failed_write_keeps_old_and_removes_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "n.md"
    p.write_text("old")

    def broken_write(fd: int, data: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "write", broken_write)
    with pytest.raises(OSError, match="No space"):
        atomic_write_bytes(p, b"new content")
    monkeypatch.undo()
    assert p.read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["n.md"]


def _wait_until_mid_write(kiln: Path, note: Path, mode: str, full_size: int) -> None:
    """Busy-poll (no sleep) until the child is visibly inside a write: its temp file exists
    (atomic) or the note is shorter than a complete version (naive)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if mode == "atomic":
            if any(name.endswith(".tmp") for name in os.listdir(kiln)):
                return
        else:
            try:
                if note.stat().st_size < full_size:
                    return
            except FileNotFoundError:
                pass
    raise AssertionError("never saw the writer child in the middle of a write")


def _kill_mid_write(tmp_path: Path, mode: str, trials: int, size: int) -> list[tuple[str, str, bool]]:
    """Run the writer child and kill -9 it, half the time right after a completed write and
    half the time while it is seen inside a write; return (state, when, temp_left) per trial."""
    results = []
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2]) + os.pathsep + env.get("PYTHONPATH", "")
    for trial in range(trials):
        kiln = tmp_path / f"{mode}-{trial}"
        kiln.mkdir()
        note = kiln / "note.md"
        note.write_text(version_text(0, size))
        when = "after-write" if trial % 2 == 0 else "mid-write"
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(note), mode, str(size)],
            stdout=subprocess.PIPE, text=True, env=env,
        )
        last = 0
        try:
            assert proc.stdout is not None
            for _ in range(1 + trial % 3):  # blocks until the child has finished that many writes
                line = proc.stdout.readline()
                assert line, "the writer child died before writing"
                last = int(line)
            if when == "mid-write":
                _wait_until_mid_write(kiln, note, mode, len(version_text(0, size)))
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
            if proc.stdout:
                proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL
        text = note.read_text()
        state = "torn"
        if text.startswith("---\nversion: "):
            version = int(text.split("\n", 2)[1].split(": ")[1])
            if version >= last and text == version_text(version, size):
                state = "complete"
        temp_left = any(name != "note.md" for name in os.listdir(kiln))
        if mode == "atomic":
            # whatever was left behind is invisible to the listings
            assert list(iter_markdown(kiln)) == ["note.md"]
            assert list(iter_files(kiln)) == ["note.md"]
        results.append((state, when, temp_left))
    return results


@pytest.mark.slow
def test_kill_9_mid_write_never_tears_the_note(tmp_path: Path) -> None:
    results = _kill_mid_write(tmp_path, "atomic", trials=12, size=4 * 1024 * 1024)
    assert all(state == "complete" for state, _, _ in results), results
    # the kills seen mid-write really landed there: their temp files were left behind
    assert any(temp_left for _, when, temp_left in results if when == "mid-write"), results


@pytest.mark.slow
def test_kill_9_harness_detects_a_torn_naive_write(tmp_path: Path) -> None:
    """Control: the same harness sees torn files when writing in place, so it can fail."""
    results = _kill_mid_write(tmp_path, "naive", trials=12, size=4 * 1024 * 1024)
    assert any(state == "torn" for state, _, _ in results), results


def test_creates_racing_for_one_new_note_leave_one_winner(tmp_path: Path) -> None:
    # create_note without overwrite, from 16 threads released at once: the check for an existing
    # note and the write were two steps, and several callers were told "created" (one kept).
    import threading

    from crucible.kiln_mcp import CrucibleKilnBackend
    from mcp_bridge.kiln_api import KilnError

    backend = CrucibleKilnBackend(tmp_path)
    start = threading.Barrier(16)
    told: dict[int, str] = {}

    def create(i: int) -> None:
        start.wait()
        try:
            backend.create_note("race.md", f"writer {i}\n", None, overwrite=False)
            told[i] = "created"
        except KilnError as exc:
            told[i] = str(exc)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, said in told.items() if said == "created"]
    assert len(winners) == 1, told
    assert all("already exists" in said for said in told.values() if said != "created")
    assert (tmp_path / "race.md").read_text() == f"writer {winners[0]}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["race.md"]
