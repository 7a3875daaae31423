"""Small kilns for the index/search tests (imported by conftest and the tests)."""

from __future__ import annotations

from pathlib import Path

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
