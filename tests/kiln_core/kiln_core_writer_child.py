"""Child process for the kill -9 test: rewrites one note in a loop until it is killed.

usage: kiln_core_writer_child.py PATH atomic|naive SIZE
Prints the version number after each completed write, so the parent knows writes happen.
"""

from __future__ import annotations

import sys
from pathlib import Path


def version_text(i: int, size: int) -> str:
    """The full content of version i: a header naming i, then `size` bytes of one letter."""
    letter = chr(ord("a") + i % 26)
    return f"---\nversion: {i}\n---\n" + letter * size + "\nEND\n"


def main() -> None:
    path, mode, size = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    from crucible.kiln.atomic import atomic_write_text

    i = 1
    while True:
        text = version_text(i, size)
        if mode == "atomic":
            atomic_write_text(path, text)
        else:  # the naive way, to show that the test can see a torn file
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        print(i, flush=True)
        i += 1


if __name__ == "__main__":
    main()
