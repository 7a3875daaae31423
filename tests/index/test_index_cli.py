"""`cru kiln index | search | info` end to end, as a person runs them (real subprocesses)."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
from pathlib import Path

import pexpect
import pytest

QUERIES = json.loads((Path(__file__).parents[1] / "kiln_core" / "queries.json").read_text())


def cru(cru_bin: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([cru_bin, *args], env=env, capture_output=True, text=True, timeout=600)


def test_index_then_search_finds_the_paraphrased_note(
    cru_bin: str, clean_env: dict[str, str], tmp_kiln: Path
) -> None:
    done = cru(cru_bin, clean_env, "kiln", "index", "--kiln", str(tmp_kiln), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["notes_indexed"] == report["notes_seen"] == 33
    assert report["degraded"] == [{
        "path": "Scratch/Broken frontmatter.md",
        "reason": "frontmatter is not valid YAML: found unexpected end of stream (line 5)",
    }]
    assert "index: scanned 33/33 notes" in done.stderr  # plain progress lines: not a terminal
    assert str(tmp_kiln) not in done.stdout + done.stderr
    assert (tmp_kiln / ".crucible" / "lexical-kiln.idx").is_file()  # ready for the first search

    for pair in QUERIES[:3]:
        found = cru(cru_bin, clean_env, "kiln", "search", "--kiln", str(tmp_kiln), "--json", pair["query"])
        assert found.returncode == 0, found.stderr
        results = json.loads(found.stdout)["results"]
        assert results[0]["path"] == pair["expected"]
        assert {"path", "title", "score", "heading", "snippet"} <= set(results[0])

    # the kiln from $CRUCIBLE_KILN, text mode, human output
    env = {**clean_env, "CRUCIBLE_KILN": str(tmp_kiln)}
    text = cru(cru_bin, env, "kiln", "search", "--mode", "text", "--limit", "3", "sourdough")
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("1. ") and "line " in text.stdout

    info = cru(cru_bin, env, "kiln", "info", "--json")
    assert info.returncode == 0, info.stderr
    data = json.loads(info.stdout)
    assert data["name"] == "kiln" and data["markdown_files"] == 33 and data["total_files"] == 34
    assert data["total_size_bytes"] > 0
    assert data["index"]["status"] == "up to date" and data["index"]["notes"] == 33
    assert data["index"]["store"] == ".crucible/chroma" and data["index"]["stale"] == 0
    assert data["index"]["word_pieces"] == 33 and data["index"]["word_pieces_bytes"] > 100_000

    (tmp_kiln / "Inbox.md").write_text("# Inbox\n\nsomething new\n")
    info = cru(cru_bin, env, "kiln", "info")
    assert "1 note is not up to date in the index" in info.stdout and "cru kiln index" in info.stdout
    assert re.search(r"  word pieces: 33 notes, [\d.]+ (kB|MB) \(`\[index\] word_pieces = false` turns them off\)", info.stdout)

    again = cru(cru_bin, env, "kiln", "index")
    assert again.returncode == 0
    assert "indexed 1 notes (1 chunks embedded, 0 kept), 32 unchanged, 0 removed" in again.stdout
    assert "indexed with problems (1):\n  Scratch/Broken frontmatter.md: frontmatter" in again.stdout


def test_index_says_which_linked_notes_it_did_not_follow(
    cru_bin: str, clean_env: dict[str, str], tiny_kiln: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "Far.md").write_text("# Far\n\nA note kept outside the kiln.\n")
    (tiny_kiln / "Far.md").symlink_to(outside / "Far.md")
    (tiny_kiln / "Elsewhere").symlink_to(outside, target_is_directory=True)
    (tiny_kiln / "Loop.md").symlink_to("Loop.md")
    done = cru(cru_bin, clean_env, "kiln", "index", "--kiln", str(tiny_kiln), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["notes_indexed"] == 3
    assert [(s["path"], s["reason"].split(":")[0]) for s in report["skipped"]] == [
        ("Elsewhere/", "a link to a folder"), ("Far.md", "a link to a file outside the kiln"),
        ("Loop.md", "a link that leads back to itself")]
    assert str(tmp_path) not in done.stdout + done.stderr
    text = cru(cru_bin, clean_env, "kiln", "index", "--kiln", str(tiny_kiln))
    assert text.returncode == 0, text.stderr
    assert "skipped (3):\n  Elsewhere/: a link to a folder: not followed (move the folder into the kiln" in text.stdout
    found = cru(cru_bin, clean_env, "kiln", "search", "--kiln", str(tiny_kiln), "compost")
    assert found.returncode == 0 and "Garden/Compost.md" in found.stdout, found.stderr
    # `cru kiln info` counts them too, and says where they are listed
    info = cru(cru_bin, clean_env, "kiln", "info", "--kiln", str(tiny_kiln))
    assert "\n  3 links are not followed (to a folder, out of the kiln, or broken): `cru kiln index` lists them\n" \
        in info.stdout, info.stdout
    info = cru(cru_bin, clean_env, "kiln", "info", "--kiln", str(tiny_kiln), "--json")
    assert json.loads(info.stdout)["links_not_followed"] == 3


def test_a_note_of_thousands_of_headings_is_bounded_and_still_found(
    cru_bin: str, clean_env: dict[str, str], tiny_kiln: Path
) -> None:
    """A hostile (or generated) note: 2.3 MB of one-line sections made 200,000 chunks, hours of
    embedding. It is embedded up to its first 1,000 chunks, says so, and its last words are
    still found (by words)."""
    (tiny_kiln / "Log.md").write_text("".join(f"# entry {i}\nquiet day {i}\n" for i in range(20_000))
                                      + "# last entry\nthe word zeppelinfinale ends it\n")
    done = cru(cru_bin, clean_env, "kiln", "index", "--kiln", str(tiny_kiln), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["notes_indexed"] == 4
    assert report["chunks_embedded"] < 1010  # the log's 1,000 and the tiny kiln's few
    assert report["degraded"] == [{
        "path": "Log.md",
        "reason": "only its first 1000 chunks are searched by meaning (line 2002 on is found by its words)",
    }]
    found = cru(cru_bin, clean_env, "kiln", "search", "--kiln", str(tiny_kiln), "--json", "zeppelinfinale")
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["results"][0]["path"] == "Log.md"
    # a megabyte-long title and headings: one line of at most 200 characters wherever shown
    (tiny_kiln / "Long.md").write_text("# " + "lengthy " * 100_000 + "\n## " + "deep " * 20_000
                                       + "\nthe word quasarmarker is here\n")
    assert cru(cru_bin, clean_env, "kiln", "index", "--kiln", str(tiny_kiln)).returncode == 0
    for mode in ("hybrid", "semantic", "text"):
        found = cru(cru_bin, clean_env, "kiln", "search", "--kiln", str(tiny_kiln), "--json", "--mode", mode,
                    "quasarmarker" if mode == "text" else "quasarmarker lengthy deep")
        assert found.returncode == 0, found.stderr
        hit = json.loads(found.stdout)["results"][0]
        assert hit["path"] == "Long.md" and len(hit["title"]) == 200, mode
        assert len(hit["heading"] or "") <= 2 * 200 + 3 and len(found.stdout) < 5000, mode  # H1 > H2


def _mount_namespace() -> list[str] | None:
    """A command prefix that runs its command in a mount namespace of its own (root, or an
    unprivileged user namespace), or None where the machine allows neither."""
    for prefix in (["unshare", "--mount", "--propagation", "private"], ["unshare", "-Urm"]):
        try:
            if subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0:
                return prefix
        except (OSError, subprocess.TimeoutExpired):
            return None
    return None


def test_a_full_disk_says_to_free_space_and_what_was_embedded_is_kept(
    cru_bin: str, clean_env: dict[str, str], fixture_kiln_src: Path, tmp_path: Path
) -> None:
    """The kiln on a disk that fills up during the build (a real 4 MiB tmpfs, in a mount
    namespace of the test's own): Chroma's error says nothing of space, and the advice was
    `cru kiln index --rebuild` (which would throw away what was embedded, and needs more room).
    It says the disk is full and to free space; freed, `cru kiln index` finishes and keeps.
    (The filler leaves ~1.2 MiB: room for the first groups' vectors and word pieces, not all.)"""
    prefix = _mount_namespace()
    if prefix is None:
        pytest.skip("no mount namespace here (needs root or unprivileged user namespaces)")
    disk = tmp_path / "disk"
    disk.mkdir()
    run = """
        set -u
        mount -t tmpfs -o size=4m tmpfs "$DISK" || exit 90
        cp -r "$SRC" "$DISK/kiln" && rm -rf "$DISK/kiln/.crucible"
        dd if=/dev/zero of="$DISK/filler" bs=1k count=2800 status=none
        "$CRU" kiln index --kiln "$DISK/kiln" > "$OUT/first.out" 2> "$OUT/first.err"
        echo $? > "$OUT/first.rc"
        rm "$DISK/filler"
        "$CRU" kiln index --kiln "$DISK/kiln" > "$OUT/second.out" 2> "$OUT/second.err"
        echo $? > "$OUT/second.rc"
        "$CRU" kiln search --kiln "$DISK/kiln" --json "sourdough starter" > "$OUT/search.out"
        "$CRU" kiln info --kiln "$DISK/kiln" --json > "$OUT/info.out"
    """
    env = {**clean_env, "DISK": str(disk), "SRC": str(fixture_kiln_src), "CRU": cru_bin, "OUT": str(tmp_path)}
    done = subprocess.run([*prefix, "sh", "-c", run], env=env, capture_output=True, text=True, timeout=600)
    if done.returncode == 90:
        pytest.skip(f"tmpfs cannot be mounted here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    first = (tmp_path / "first.err").read_text()
    assert (tmp_path / "first.rc").read_text().strip() == "1", first
    assert "is full while updating it" in first and "free some space on that disk" in first, first
    assert "--rebuild" not in first and "damaged" not in first and str(disk) not in first
    second = (tmp_path / "second.out").read_text()
    assert (tmp_path / "second.rc").read_text().strip() == "0", (tmp_path / "second.err").read_text()
    # What the full disk let through was kept, not embedded again: whole groups of notes
    # (unchanged now), or chunks written before their note's row (kept)
    m = re.match(r"indexed \d+ notes \((\d+) chunks embedded, (\d+) kept\), (\d+) unchanged", second)
    assert m is not None, second
    embedded, kept, unchanged = map(int, m.groups())
    assert kept + unchanged > 0, second
    assert embedded < json.loads((tmp_path / "info.out").read_text())["index"]["chunks"], second
    results = json.loads((tmp_path / "search.out").read_text())["results"]
    assert results[0]["path"] == "Cooking/Sourdough starter.md"


def test_a_crucible_folder_that_is_a_link_is_not_written_through(
    cru_bin: str, clean_env: dict[str, str], tiny_kiln: Path, tmp_path: Path
) -> None:
    """A vault from elsewhere may bring `.crucible` (or `.crucible/chroma`) as a link to any
    folder: Crucible made it 0700, wrote the notes' text into it, and `--rebuild` would wipe a
    damaged store there. It refuses, says how to fix it, and leaves the folder as it was."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    elsewhere.chmod(0o755)
    (elsewhere / "keep.txt").write_text("not Crucible's\n")
    (tiny_kiln / ".crucible").symlink_to(elsewhere)
    for args in (["index"], ["index", "--rebuild"], ["search", "compost"], ["info"]):
        done = cru(cru_bin, clean_env, "kiln", *args, "--kiln", str(tiny_kiln))
        assert "the kiln's .crucible folder is a symbolic link" in done.stdout + done.stderr, args
        assert "remove the link (`rm .crucible` in the kiln's folder)" in done.stdout + done.stderr
        assert done.returncode == (0 if args == ["info"] else 1), args  # info says it, as it says "no index"
    info = json.loads(cru(cru_bin, clean_env, "kiln", "info", "--kiln", str(tiny_kiln), "--json").stdout)["index"]
    assert info["status"] == "unusable" and "symbolic link" in info["problem"]  # not "none": an index may be there
    (tiny_kiln / ".crucible").unlink()
    (tiny_kiln / ".crucible").mkdir()
    (tiny_kiln / ".crucible" / "chroma").symlink_to(elsewhere)
    for args in (["index"], ["index", "--rebuild"]):
        done = cru(cru_bin, clean_env, "kiln", *args, "--kiln", str(tiny_kiln))
        assert done.returncode == 1 and "the kiln's .crucible/chroma folder is a symbolic link" in done.stderr
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep.txt"]
    assert elsewhere.stat().st_mode & 0o777 == 0o755
    (tiny_kiln / ".crucible" / "chroma").unlink()
    done = cru(cru_bin, clean_env, "kiln", "index", "--kiln", str(tiny_kiln))
    assert done.returncode == 0, done.stderr
    for folder in (tiny_kiln / ".crucible", tiny_kiln / ".crucible" / "chroma"):
        assert folder.stat().st_mode & 0o777 == 0o700
    found = cru(cru_bin, clean_env, "kiln", "search", "--kiln", str(tiny_kiln), "compost")
    assert found.returncode == 0 and "Garden/Compost.md" in found.stdout, found.stderr


def test_links_inside_the_index_folder_are_not_written_through(
    cru_bin: str, clean_env: dict[str, str], tiny_kiln: Path, tmp_path: Path
) -> None:
    """SQLite follows a link: a vault from elsewhere holding `.crucible/chroma/chroma.sqlite3`
    linked to another database of the person's had Chroma's tables and the notes' text written
    into that database (seen by hand). The store's links are refused, `--rebuild` removes them
    (not what they lead to); a link beside the word-piece store is refused too, said once, and
    the search goes on without the pieces."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    other = elsewhere / "places.sqlite"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE visits (url TEXT)")
    db.execute("INSERT INTO visits VALUES ('https://example.org')")
    db.commit()
    db.close()
    wal = elsewhere / "notes.txt"
    wal.write_text("not Crucible's\n")
    before = {p.name: p.read_bytes() for p in elsewhere.iterdir()}
    store = tiny_kiln / ".crucible" / "chroma"
    store.mkdir(parents=True)
    (store / "chroma.sqlite3").symlink_to(other)
    (tiny_kiln / ".crucible" / "tokens-kiln.sqlite-wal").symlink_to(wal)
    done = cru(cru_bin, clean_env, "kiln", "index", "--kiln", str(tiny_kiln))
    assert done.returncode == 1, done.stdout
    assert "the index in .crucible/chroma holds a symbolic link (chroma.sqlite3)" in done.stderr
    assert "fix: cru kiln index --rebuild" in done.stderr
    done = cru(cru_bin, clean_env, "kiln", "index", "--rebuild", "--kiln", str(tiny_kiln))
    assert done.returncode == 0, done.stderr
    said = ".crucible/tokens-kiln.sqlite-wal is a symbolic link: Crucible does not write its word-piece store through a link"
    assert said in done.stderr and "`rm .crucible/tokens-kiln.sqlite-wal`" in done.stderr
    assert done.stderr.count(said) <= 2  # once for reading, once for writing: not at every step
    assert str(tmp_path) not in done.stderr
    assert {p.name: p.read_bytes() for p in elsewhere.iterdir()} == before
    assert not (store / "chroma.sqlite3").is_symlink()
    info_text = cru(cru_bin, clean_env, "kiln", "info", "--kiln", str(tiny_kiln)).stdout
    assert "  word pieces: not kept: " + said in info_text and "(fix: remove the link" in info_text
    found = cru(cru_bin, clean_env, "kiln", "search", "--kiln", str(tiny_kiln), "compost")
    assert found.returncode == 0 and "Garden/Compost.md" in found.stdout, found.stderr
    (tiny_kiln / ".crucible" / "tokens-kiln.sqlite-wal").unlink()
    done = cru(cru_bin, clean_env, "kiln", "index", "--kiln", str(tiny_kiln))
    assert done.returncode == 0 and "symbolic link" not in done.stderr, done.stderr
    info = json.loads(cru(cru_bin, clean_env, "kiln", "info", "--kiln", str(tiny_kiln), "--json").stdout)["index"]
    assert info["word_pieces"] == info["notes"] > 0  # the pieces kept again once the link is gone
    # a segment's file, one level down
    segment = next(p for p in store.iterdir() if p.is_dir())
    victim = next(p for p in segment.iterdir() if p.is_file())
    victim.unlink()
    victim.symlink_to(wal)
    done = cru(cru_bin, clean_env, "kiln", "search", "--kiln", str(tiny_kiln), "compost")
    # refused, and the search answers by words, with the link named and the fix
    assert done.returncode == 0 and done.stdout.startswith("1. Garden/Compost.md"), done.stderr
    assert f"holds a symbolic link ({segment.name}/{victim.name})" in done.stderr
    assert "(fix: cru kiln index --rebuild)" in done.stderr
    done = cru(cru_bin, clean_env, "kiln", "search", "--kiln", str(tiny_kiln), "--mode", "semantic", "compost")
    assert done.returncode == 1 and f"holds a symbolic link ({segment.name}/{victim.name})" in done.stderr
    assert {p.name: p.read_bytes() for p in elsewhere.iterdir()} == before


def test_the_index_files_are_the_persons_alone(cru_bin: str, clean_env: dict[str, str], tiny_kiln: Path) -> None:
    """The index holds the notes' text: Chroma wrote its database and segment files 0644 in
    0755 folders (the process's umask). Every file under .crucible is 0600 and every folder
    0700, after a build, a search, an update, and for an index an older version left open."""

    def opened_up() -> list[str]:
        out = []
        for folder, dirs, files in os.walk(tiny_kiln / ".crucible"):
            for name in dirs + files:
                path = Path(folder, name)
                if path.stat().st_mode & 0o077:
                    out.append(f"{oct(path.stat().st_mode & 0o777)} {path.relative_to(tiny_kiln)}")
        return out

    done = cru(cru_bin, clean_env, "kiln", "index", "--kiln", str(tiny_kiln))
    assert done.returncode == 0, done.stderr
    files = [p for p in (tiny_kiln / ".crucible" / "chroma").rglob("*") if p.is_file()]
    assert any(p.name == "chroma.sqlite3" for p in files) and any(p.suffix == ".bin" for p in files)
    assert opened_up() == []
    assert cru(cru_bin, clean_env, "kiln", "search", "--kiln", str(tiny_kiln), "compost").returncode == 0
    (tiny_kiln / "Garden" / "New.md").write_text("# New\n\nA note about worms in the compost.\n")
    assert cru(cru_bin, clean_env, "kiln", "index", "--kiln", str(tiny_kiln)).returncode == 0
    assert opened_up() == []
    for p in (tiny_kiln / ".crucible" / "chroma").rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)  # as the versions before this one left them
    assert cru(cru_bin, clean_env, "kiln", "search", "--kiln", str(tiny_kiln), "worms").returncode == 0
    assert opened_up() == []


def test_search_without_index_and_damaged_index(
    cru_bin: str, clean_env: dict[str, str], tiny_kiln: Path
) -> None:
    # A kiln never indexed: the notes by their words, said on stderr, as semantic_search does
    # before the index is built; by meaning alone there is nothing to search.
    done = cru(cru_bin, clean_env, "kiln", "search", "--kiln", str(tiny_kiln), "spaghetti sauce")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("1. Cooking/Pasta.md — Pasta night")
    assert "no index yet: the results are matched by their words only" in done.stderr
    assert "`cru kiln index` builds it" in done.stderr
    done = cru(cru_bin, clean_env, "kiln", "search", "--kiln", str(tiny_kiln), "pasta", "--json")
    assert json.loads(done.stdout)["index"] == {"embedded": 0.0, "notes": 3}
    assert json.loads(done.stdout)["results"][0]["path"] == "Cooking/Pasta.md"
    done = cru(cru_bin, clean_env, "kiln", "search", "--kiln", str(tiny_kiln), "pasta", "--mode", "semantic")
    assert done.returncode == 1
    assert "no index yet" in done.stderr and "fix: cru kiln index" in done.stderr
    assert not (tiny_kiln / ".crucible").exists()  # searching created nothing
    info = cru(cru_bin, clean_env, "kiln", "info", "--kiln", str(tiny_kiln), "--json")
    assert json.loads(info.stdout)["index"]["status"] == "none"
    assert not (tiny_kiln / ".crucible").exists()

    store = tiny_kiln / ".crucible" / "chroma"
    store.mkdir(parents=True)
    (store / "chroma.sqlite3").write_bytes(b"garbage" * 1000)
    done = cru(cru_bin, clean_env, "kiln", "index", "--kiln", str(tiny_kiln))
    assert done.returncode == 1
    assert "damaged" in done.stderr and "fix: cru kiln index --rebuild" in done.stderr
    assert "Traceback" not in done.stderr and str(tiny_kiln) not in done.stderr
    info = cru(cru_bin, clean_env, "kiln", "info", "--kiln", str(tiny_kiln), "--json")
    assert json.loads(info.stdout)["index"]["fix"] == "cru kiln index --rebuild"
    assert json.loads(info.stdout)["index"]["status"] == "unusable"
    # The default search still finds the notes by their words, and says why and the fix; by
    # meaning alone there is nothing to search.
    done = cru(cru_bin, clean_env, "kiln", "search", "--kiln", str(tiny_kiln), "spaghetti sauce")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("1. Cooking/Pasta.md — Pasta night")
    assert "damaged" in done.stderr and "the results are matched by their words only" in done.stderr
    assert "(fix: cru kiln index --rebuild)" in done.stderr and str(tiny_kiln) not in done.stderr
    share = json.loads(cru(cru_bin, clean_env, "kiln", "search", "--kiln", str(tiny_kiln), "pasta",
                           "--json").stdout)["index"]
    assert share["embedded"] == 0.0 and share["notes"] == 3 and share["fix"] == "cru kiln index --rebuild"
    done = cru(cru_bin, clean_env, "kiln", "search", "--kiln", str(tiny_kiln), "pasta", "--mode", "semantic")
    assert done.returncode == 1 and "fix: cru kiln index --rebuild" in done.stderr
    assert (store / "chroma.sqlite3").read_bytes() == b"garbage" * 1000  # searching changed nothing

    done = cru(cru_bin, clean_env, "kiln", "index", "--kiln", str(tiny_kiln), "--rebuild")
    assert done.returncode == 0, done.stderr
    assert "rebuilt the index" in done.stdout and "indexed 3 notes" in done.stdout
    found = cru(cru_bin, clean_env, "kiln", "search", "--kiln", str(tiny_kiln), "--json",
                "--mode", "semantic", "noodles for dinner")
    assert json.loads(found.stdout)["results"][0]["path"] == "Cooking/Pasta.md"


def test_property_search_cli(cru_bin: str, clean_env: dict[str, str], tiny_kiln: Path) -> None:
    done = cru(cru_bin, clean_env, "kiln", "search", "--kiln", str(tiny_kiln), "--mode", "property",
               "--json", "status:done")
    assert done.returncode == 0, done.stderr
    assert [r["path"] for r in json.loads(done.stdout)["results"]] == ["Garden/Compost.md"]
    done = cru(cru_bin, clean_env, "kiln", "search", "--kiln", str(tiny_kiln), "--json", "--regex",
               r"^## S\w+")
    results = json.loads(done.stdout)["results"]
    assert [(r["path"], [m["line"] for m in r["matches"]]) for r in results] == [("Cooking/Pasta.md", [9, 13])]
    done = cru(cru_bin, clean_env, "kiln", "search", "--kiln", str(tiny_kiln), "--json", "--mode", "text",
               "--case-sensitive", "GARLIC")
    assert json.loads(done.stdout)["results"] == []
    done = cru(cru_bin, clean_env, "kiln", "search", "--kiln", str(tiny_kiln), "--regex", "(oops")
    assert done.returncode == 1 and "invalid regular expression" in done.stderr


@pytest.mark.slow
def test_progress_bar_on_a_terminal(cru_bin: str, clean_env: dict[str, str], tiny_kiln: Path) -> None:
    child = pexpect.spawn(cru_bin, ["kiln", "index", "--kiln", str(tiny_kiln)], env=clean_env,
                          encoding="utf-8", timeout=300, dimensions=(24, 120))
    child.expect("indexing the kiln")
    child.expect("notes: ")
    child.expect("chunks: ")
    child.expect(r"indexed 3 notes \(5 chunks embedded")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_search_says_when_not_all_the_kiln_was_searched_by_meaning(
    cru_bin: str, clean_env: dict[str, str], tiny_kiln: Path
) -> None:
    import chromadb

    from crucible.kiln.store import INDEX_FORMAT

    def search(*extra: str) -> tuple[dict[str, object], str]:
        found = cru(cru_bin, clean_env, "kiln", "search", "--kiln", str(tiny_kiln), "--json", *extra, "pasta sauce")
        assert found.returncode == 0, found.stderr
        return json.loads(found.stdout), found.stderr

    assert cru(cru_bin, clean_env, "kiln", "index", "--kiln", str(tiny_kiln)).returncode == 0
    data, said = search()
    assert data["index"] == {"embedded": 1.0, "notes": 3} and said == ""
    (tiny_kiln / "Sauce.md").write_text("# Sauce\n\nA pasta sauce of tomatoes.\n")
    data, said = search()
    assert data["index"] == {"embedded": 0.75, "notes": 4}
    assert "Sauce.md" in [r["path"] for r in data["results"]]  # found by its words meanwhile
    assert said == ("index: 3 of the kiln's 4 notes are embedded; the rest were matched by their words only "
                    "(`cru kiln index` embeds them)\n")
    # an index an older Crucible wrote: searched by words until it is rebuilt, and said so
    assert cru(cru_bin, clean_env, "kiln", "index", "--kiln", str(tiny_kiln)).returncode == 0
    client = chromadb.PersistentClient(path=str(tiny_kiln / ".crucible" / "chroma"))
    notes = client.get_collection("kiln-notes", embedding_function=None)
    notes.modify(metadata={**(notes.metadata or {}), "format": INDEX_FORMAT - 1})
    del notes, client
    data, said = search()
    assert data["index"] == {"embedded": 0.0, "notes": 4} and data["results"]
    assert said.startswith(f"index: the index has format {INDEX_FORMAT - 1}, this version writes {INDEX_FORMAT}: "
                           "`cru kiln index` rebuilds it; until then the results are matched by their words only")
    refused = cru(cru_bin, clean_env, "kiln", "search", "--kiln", str(tiny_kiln), "--mode", "semantic", "pasta")
    assert refused.returncode == 1 and f"has format {INDEX_FORMAT - 1}" in refused.stderr
    assert "fix: cru kiln index" in refused.stderr  # by meaning alone there is nothing to answer with
    assert cru(cru_bin, clean_env, "kiln", "index", "--kiln", str(tiny_kiln)).returncode == 0
    data, said = search()
    assert data["index"] == {"embedded": 1.0, "notes": 4} and said == ""


def test_a_kiln_kept_in_git_shows_nothing_new_after_indexing(
    cru_bin: str, clean_env: dict[str, str], tiny_kiln: Path
) -> None:
    # A vault in git must not be offered a vector store of its notes' text to commit; a card the
    # person keeps in .crucible/agents/ stays theirs to commit.
    (tiny_kiln / ".crucible" / "agents").mkdir(parents=True)
    (tiny_kiln / ".crucible" / "agents" / "mine.md").write_text("---\nname: mine\n---\nBe brief.\n")

    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tiny_kiln,
                              capture_output=True, text=True, check=True).stdout

    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "notes")
    done = cru(cru_bin, clean_env, "kiln", "index", "--kiln", str(tiny_kiln))
    assert done.returncode == 0, done.stderr
    assert (tiny_kiln / ".crucible" / "chroma").is_dir()
    assert git("status", "--porcelain", "--untracked-files=all") == ""
    (tiny_kiln / ".crucible" / "agents" / "other.md").write_text("---\nname: other\n---\nBe kind.\n")
    assert git("status", "--porcelain", "--untracked-files=all") == "?? .crucible/agents/other.md\n"


def test_searching_a_kiln_without_notes_says_so_not_to_index_it(
    cru_bin: str, clean_env: dict[str, str], tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "todo.txt").write_text("not a note")
    assert cru(cru_bin, clean_env, "kiln", "index", "--kiln", str(empty)).returncode == 0
    found = cru(cru_bin, clean_env, "kiln", "search", "--kiln", str(empty), "anything")
    assert found.returncode == 1
    assert "the kiln has no notes: no markdown (.md) file in it" in found.stderr
    assert "cru kiln index" not in found.stderr  # it was just indexed: that is not the fix
