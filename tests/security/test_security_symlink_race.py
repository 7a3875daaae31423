"""17.4: a kiln folder swapped for a symlink to an outside folder while `cru mcp` writes, reads
or deletes a note under it never lets the write, the temp file, the read or the delete
reach outside the kiln (every step is taken relative to an opened folder, O_NOFOLLOW)."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

SECRET = "OUTSIDE-SECRET-7d1f"
ROUNDS = 400


class Swapper:
    """Swaps `kiln/race` between the real folder and a symlink to `outside`, as fast as it can,
    in a thread of the test process, while the server (another process) works under it."""

    def __init__(self, kiln: Path, outside: Path) -> None:
        self.race, self.real, self.outside = kiln / "race", kiln / "race-real", outside
        self.stop = threading.Event()
        self.swaps = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                os.rename(self.race, self.real)
                os.symlink(self.outside, self.race)
                os.unlink(self.race)
                os.rename(self.real, self.race)
                self.swaps += 1
            except OSError:
                self._restore()

    def _restore(self) -> None:
        """The real folder back in place (the server may have made a new `race` meanwhile)."""
        while self.real.exists():
            try:
                if self.race.is_symlink():
                    self.race.unlink()
                elif self.race.is_dir():
                    shutil.rmtree(self.race)
                os.rename(self.real, self.race)
            except OSError:
                continue

    def __enter__(self) -> Swapper:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self._restore()


def _setup(tmp_path: Path) -> tuple[Path, Path]:
    kiln, outside = tmp_path / "kiln", tmp_path / "outside"
    (kiln / "race").mkdir(parents=True)
    outside.mkdir()
    (kiln / "race" / "keep.md").write_text("# keep\n")
    (outside / "keep.md").write_text(f"# not yours\n{SECRET}\n")
    for i in range(ROUNDS):
        (kiln / "race" / f"del{i}.md").write_text("# delete me\n")
        (outside / f"del{i}.md").write_text("# never delete me\n")
    return kiln, outside


async def test_create_read_delete_never_leave_the_kiln_while_a_folder_is_swapped(
        cru_bin: str, clean_env: dict[str, str], tmp_path: Path) -> None:
    kiln, outside = _setup(tmp_path)
    before = sorted(p.name for p in outside.iterdir())
    params = StdioServerParameters(command=cru_bin, args=["mcp", "--kiln", str(kiln)], env=clean_env)
    read_back: list[str] = []
    errors: list[str] = []
    async with Client(params) as client:
        await client.call_tool("list_notes", {})
        with Swapper(kiln, outside) as swapper:
            for i in range(ROUNDS):
                made = await client.call_tool("create_note", {"path": f"race/x{i}.md", "content": "# mine\n",
                                                              "overwrite": True})
                if made.is_error:
                    errors.extend(getattr(c, "text", "") for c in made.content)
                read = await client.call_tool("read_note", {"path": "race/keep.md"})
                read_back.extend(getattr(c, "text", "") for c in read.content)
                await client.call_tool("delete_note", {"path": f"race/del{i}.md"})
        assert swapper.swaps > ROUNDS // 10  # the race was really run
    assert sorted(p.name for p in outside.iterdir()) == before  # nothing written, nothing deleted
    assert not any(SECRET in text for text in read_back)
    # Refusals say what happened; none is an internal error or an OS error with a path.
    # (A folder removed and made again by the swapper mid-call is "not found": also honest.)
    odd = {e for e in errors if "symbolic link" not in e and not e.startswith("Note not found")}
    assert not odd, odd


def test_writes_and_deletes_refuse_a_folder_already_swapped_for_a_link(tmp_path: Path) -> None:
    """The same, without the race: the path was checked, then `a` became a link to outside."""
    from crucible.kiln.atomic import atomic_write_text, file_hash, remove_file
    from crucible.kiln.notes import read_note
    from crucible.kiln.paths import KilnPathError, resolve_in_kiln

    kiln, outside = tmp_path / "kiln", tmp_path / "outside"
    (kiln / "a").mkdir(parents=True)
    outside.mkdir()
    (kiln / "a" / "n.md").write_text("# inside\n")
    (outside / "n.md").write_text(f"# outside\n{SECRET}\n")
    checked = resolve_in_kiln(kiln, "a/n.md", for_write=True)
    (kiln / "a").rename(kiln / "a-real")
    (kiln / "a").symlink_to(outside, target_is_directory=True)
    for attempt in (lambda: atomic_write_text(checked, "# mine\n", root=kiln),
                    lambda: atomic_write_text(kiln.resolve() / "a" / "new" / "m.md", "x", root=kiln, make_folders=True),
                    lambda: remove_file(checked, root=kiln),
                    lambda: file_hash(checked, root=kiln)):
        try:
            attempt()
        except KilnPathError as exc:
            assert "'a': was replaced by a symbolic link" in exc.message
        else:
            raise AssertionError("followed the link")
    assert sorted(p.name for p in outside.iterdir()) == ["n.md"]
    assert (outside / "n.md").read_text().endswith(f"{SECRET}\n")
    # A read resolved again now sees the link and refuses it as before.
    try:
        read_note(kiln, "a/n.md")
    except KilnPathError as exc:
        assert "outside the kiln" in exc.message
    else:
        raise AssertionError("read through the link")
