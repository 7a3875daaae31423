"""Small kilns for the index/search tests (imported by conftest and the tests)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from crucible.kiln.index import KilnIndex

TINY_NOTES = {
    "Cooking/Pasta.md": (
        "---\ntags: [food, quick]\nstatus: draft\n---\n# Pasta night\n\n"
        "Boil plenty of salted water, then cook the spaghetti until al dente.\n\n"
        "## Sauce\n\nGarlic, olive oil and chili flakes warmed gently in a pan.\n\n"
        "## Serving\n\nFinish with parsley and grated cheese.\n"
    ),
    "Garden/Compost.md": (
        "---\ntags: [garden]\nstatus: done\n---\n# Compost heap\n\n"
        "Layer green kitchen scraps with brown leaves and turn the pile every week.\n"
    ),
    "Links.md": (
        "# Linking notes\n\nUse [[Cooking/Pasta|wikilinks]] to connect ideas across the kiln. #meta\n"
    ),
}


def write_notes(root: Path, notes: dict[str, str]) -> None:
    for rel, text in notes.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def stored_chunk_hashes(ix: KilnIndex, paths: Sequence[str]) -> dict[str, list[str]]:
    """The text hashes of these notes' chunks as the vector store holds them, in order: the
    truth the word-piece store's record is checked against."""
    got = ix.chroma.chunks.get(where={"path": {"$in": list(paths)}}, include=["metadatas"])
    rows: dict[str, list[tuple[int, str]]] = {}
    for m in got["metadatas"] or []:
        rows.setdefault(str(m["path"]), []).append((int(m.get("ordinal", 0)), str(m.get("hash", ""))))
    return {p: [h for _, h in sorted(r)] for p, r in rows.items()}
