"""Safe kiln paths: every refusal case, messages without absolute paths, and listings."""

from __future__ import annotations

from pathlib import Path

import pytest

from crucible.kiln.paths import (
    LINK_BROKEN,
    LINK_LOOP,
    LINK_OUTSIDE,
    LINKED_FOLDER,
    RESERVED_DIR,
    KilnNotFoundError,
    KilnPathError,
    iter_files,
    iter_markdown,
    normalize_folder,
    resolve_in_kiln,
    to_rel,
)


@pytest.fixture
def kiln(tmp_path: Path) -> Path:
    root = tmp_path / "kiln"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "deep.md").write_text("# deep")
    (root / "top.md").write_text("# top")
    (root / "a" / "Upper.MD").write_text("# upper")
    (root / "a" / "image.png").write_bytes(b"\x89PNG")
    (root / ".crucible").mkdir()
    (root / ".crucible" / "index.md").write_text("secret")
    return root


def refused(root: Path, rel: str, **kw: bool) -> KilnPathError:
    with pytest.raises(KilnPathError) as ei:
        resolve_in_kiln(root, rel, **kw)
    err = ei.value
    text = str(err)
    # never an absolute path of this machine in what the agent sees
    assert str(root) not in text and str(root.parent) not in text, text
    return err


def test_plain_paths_resolve(kiln: Path) -> None:
    assert resolve_in_kiln(kiln, "top.md") == kiln.resolve() / "top.md"
    assert resolve_in_kiln(kiln, "a/b/deep.md", must_exist=True) == kiln.resolve() / "a/b/deep.md"
    assert resolve_in_kiln(kiln, "./a//b/deep.md") == kiln.resolve() / "a/b/deep.md"
    assert resolve_in_kiln(kiln, "a\\b\\deep.md") == kiln.resolve() / "a/b/deep.md"
    assert resolve_in_kiln(kiln, "new/folder/note.md", for_write=True) == kiln.resolve() / "new/folder/note.md"
    assert resolve_in_kiln(kiln, "") == kiln.resolve()
    assert resolve_in_kiln(kiln, "a/Upper.MD", for_write=True).name == "Upper.MD"
    assert resolve_in_kiln(kiln, "Q: questions.md", for_write=True).name == "Q: questions.md"


@pytest.mark.parametrize("rel", ["../outside.md", "a/../../outside.md", "a/../top.md", "..",
                                 "a\\..\\..\\outside.md", "a/b/../../../x.md"])
def test_dotdot_is_refused(kiln: Path, rel: str) -> None:
    err = refused(kiln, rel)
    assert "'..' is not allowed" in err.message


@pytest.mark.parametrize("rel", ["/etc/passwd", "C:/Windows/win.ini", "c:\\notes\\x.md", "\\\\server\\share\\x.md"])
def test_absolute_is_refused(kiln: Path, rel: str) -> None:
    err = refused(kiln, rel)
    assert "absolute paths are not allowed" in err.message
    assert rel not in str(err)


def test_absolute_path_inside_the_kiln_suggests_the_relative_one(kiln: Path) -> None:
    err = refused(kiln, str(kiln / "a" / "b" / "deep.md"))
    assert err.fix == "use 'a/b/deep.md'"


@pytest.mark.parametrize("rel", ["~/notes.md", "~root/x.md", "~"])
def test_tilde_is_refused(kiln: Path, rel: str) -> None:
    assert "'~' is not allowed" in refused(kiln, rel).message


def test_nul_is_refused(kiln: Path) -> None:
    assert "NUL" in refused(kiln, "top.md\x00.txt").message


@pytest.mark.parametrize("rel", [".crucible/index.md", ".crucible", "./.crucible/x.md",
                                 ".Crucible/index.md", ".crucible\\chroma.sqlite3"])
def test_reserved_dir_is_refused(kiln: Path, rel: str) -> None:
    assert f"{RESERVED_DIR}/ is reserved" in refused(kiln, rel).message


def test_for_write_allows_only_markdown(kiln: Path) -> None:
    for rel in ("a/image.png", "notes.txt", "a/b", "noext"):
        assert "only markdown notes (.md)" in refused(kiln, rel, for_write=True).message
    (kiln / "folder.md").mkdir()
    assert "is a folder" in refused(kiln, "folder.md", for_write=True).message


def test_must_exist(kiln: Path) -> None:
    with pytest.raises(KilnNotFoundError) as ei:
        resolve_in_kiln(kiln, "a/missing.md", must_exist=True)
    assert "'a/missing.md': no such file in the kiln" in ei.value.message
    assert resolve_in_kiln(kiln, "a/missing.md") == kiln.resolve() / "a/missing.md"


def test_symlinked_file_leaving_the_kiln_is_refused(kiln: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.md"
    secret.write_text("private")
    (kiln / "a" / "evil.md").symlink_to(secret)
    err = refused(kiln, "a/evil.md")
    assert "'a/evil.md': leads outside the kiln through a symbolic link" in err.message
    assert "secret" not in str(err)
    refused(kiln, "a/evil.md", for_write=True)


def test_symlinked_parent_leaving_the_kiln_is_refused(kiln: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "x.md").write_text("x")
    (kiln / "portal").symlink_to(outside, target_is_directory=True)
    assert "leads outside the kiln" in refused(kiln, "portal/x.md").message
    assert "leads outside the kiln" in refused(kiln, "portal/new.md", for_write=True).message
    # a relative link that climbs out is the same
    (kiln / "a" / "up").symlink_to("../..", target_is_directory=True)
    assert "leads outside the kiln" in refused(kiln, "a/up/anything.md").message


def test_symlink_into_reserved_dir_is_refused(kiln: Path) -> None:
    (kiln / "sneaky.md").symlink_to(kiln / ".crucible" / "index.md")
    assert "leads into .crucible/" in refused(kiln, "sneaky.md").message


def test_symlink_loop_is_refused(kiln: Path) -> None:
    (kiln / "loop.md").symlink_to("loop.md")
    refused(kiln, "loop.md")


def test_symlink_inside_the_kiln_is_followed(kiln: Path) -> None:
    (kiln / "alias.md").symlink_to("a/b/deep.md")
    assert resolve_in_kiln(kiln, "alias.md", for_write=True) == kiln.resolve() / "a/b/deep.md"


def test_kiln_root_given_through_a_symlink(kiln: Path, tmp_path: Path) -> None:
    link = tmp_path / "kiln-link"
    link.symlink_to(kiln, target_is_directory=True)
    assert resolve_in_kiln(link, "top.md") == kiln.resolve() / "top.md"
    assert list(iter_markdown(link)) == list(iter_markdown(kiln))


def test_to_rel(kiln: Path) -> None:
    assert to_rel(kiln, kiln / "a" / "b" / "deep.md") == "a/b/deep.md"
    assert to_rel(kiln, kiln.resolve() / "top.md") == "top.md"
    assert to_rel(kiln, kiln) == ""
    with pytest.raises(KilnPathError) as ei:
        to_rel(kiln, kiln.parent / "x.md")
    assert str(kiln.parent) not in str(ei.value)


@pytest.mark.parametrize("folder,expected", [(None, ""), ("null", ""), ("", ""), (".", ""), ("/", ""),
                                             ("./", ""), ("a/", "a"), ("./a/b", "a/b"), ("a\\b", "a/b")])
def test_normalize_folder(folder: str | None, expected: str) -> None:
    assert normalize_folder(folder) == expected


def test_iter_markdown_lists_notes_sorted_and_skips_hidden(kiln: Path, tmp_path: Path) -> None:
    for d in (".git", ".obsidian", ".trash", "node_modules", ".hidden"):
        (kiln / d).mkdir()
        (kiln / d / "x.md").write_text("x")
    (kiln / ".note.md.1a2b.tmp").write_text("temp of an atomic write")
    (kiln / ".draft.md").write_text("hidden")
    (kiln / "notes.txt").write_text("not markdown")
    outside = tmp_path / "out.md"
    outside.write_text("outside")
    (kiln / "link-out.md").symlink_to(outside)
    (kiln / "link-in.md").symlink_to("top.md")
    (kiln / "dirlink").symlink_to(kiln / "a", target_is_directory=True)  # not followed: no duplicates
    assert list(iter_markdown(kiln)) == ["a/Upper.MD", "a/b/deep.md", "link-in.md", "top.md"]


def test_iter_markdown_in_a_folder(kiln: Path) -> None:
    assert list(iter_markdown(kiln, "a")) == ["a/Upper.MD", "a/b/deep.md"]
    assert list(iter_markdown(kiln, "./a/b/")) == ["a/b/deep.md"]
    assert list(iter_markdown(kiln, "null")) == list(iter_markdown(kiln))
    with pytest.raises(KilnNotFoundError):
        list(iter_markdown(kiln, "nope"))
    with pytest.raises(KilnPathError, match="reserved"):
        list(iter_markdown(kiln, ".crucible"))
    with pytest.raises(KilnPathError, match=r"'\.\.' is not allowed"):
        list(iter_markdown(kiln, ".."))
    with pytest.raises(KilnPathError, match="not a folder"):
        list(iter_markdown(kiln, "top.md"))


def test_iter_files_lists_every_file(kiln: Path) -> None:
    (kiln / ".git").mkdir()
    (kiln / ".git" / "HEAD").write_text("ref")
    assert list(iter_files(kiln)) == ["a/Upper.MD", "a/b/deep.md", "a/image.png", "top.md"]


def test_fixture_kiln_listing(fixture_kiln_src: Path) -> None:
    notes = list(iter_markdown(fixture_kiln_src))
    assert len(notes) == 33
    assert "attachments/diagram.txt" not in notes
    assert "attachments/diagram.txt" in list(iter_files(fixture_kiln_src))
    assert notes == sorted(notes)


def test_iter_markdown_says_which_links_it_did_not_follow(kiln: Path, tmp_path: Path) -> None:
    """A link it does not follow is not a note lost in silence: `cru kiln index` says why. A
    link to itself (which Python 3.11 raises RuntimeError for, not OSError) broke every listing."""
    outside = tmp_path / "out.md"
    outside.write_text("outside")
    (kiln / "link-out.md").symlink_to(outside)
    (kiln / "link-in.md").symlink_to("top.md")
    (kiln / "dirlink").symlink_to(kiln / "a", target_is_directory=True)
    (kiln / "a" / "loop.md").symlink_to("loop.md")
    (kiln / "gone.md").symlink_to("nothing.md")
    (kiln / "loop.txt").symlink_to("loop.txt")  # not a note: listed by iter_files, and not followed
    notes = ["a/Upper.MD", "a/b/deep.md", "link-in.md", "top.md"]
    unfollowed: list[tuple[str, str]] = []
    assert list(iter_markdown(kiln, unfollowed=unfollowed)) == notes
    assert unfollowed == [("a/loop.md", LINK_LOOP), ("dirlink/", LINKED_FOLDER), ("gone.md", LINK_BROKEN),
                          ("link-out.md", LINK_OUTSIDE)]
    assert str(tmp_path) not in repr(unfollowed)
    assert list(iter_markdown(kiln)) == notes
    assert list(iter_markdown(kiln, "a")) == ["a/Upper.MD", "a/b/deep.md"]
    assert "loop.txt" not in list(iter_files(kiln))
    err = refused(kiln, "a/loop.md")
    assert err.message == "'a/loop.md': a symbolic link in it leads back to itself"
    assert err.fix == "fix or remove the symbolic link"
    refused(kiln, str(kiln / "a" / "loop.md"))  # an absolute path through the loop: refused, not a crash
    assert to_rel(kiln, kiln / "a" / "loop.md") == "a/loop.md"
