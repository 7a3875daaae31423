"""Terminal safety: agent text never drives the person's terminal.

`sanitize` (secrets redacted, then acp_host.safe_text: control characters and bidi controls
made visible) is applied to every agent-, note-, card- or server-derived string before it reaches a terminal:
messages, tool titles, errors, notices, and — through `install_log_handler` — every log line
of the `cru` process, whichever module logs it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from acp_host.safe_text import json_safe, line_safe, terminal_safe, without_escapes
from crucible.redaction import redact

__all__ = ["SafeFormatter", "SafeStream", "counted", "human_size", "install_log_handler", "json_safe", "log_lines_to",
           "sanitize", "sanitize_line", "shown_path", "without_escapes"]



def shown_path(path: Path | str) -> str:
    """`path` with the home folder as `~`, for messages to the person (never to an agent)."""
    home, shown = Path.home(), Path(path)
    if str(home) in ("", "/"):
        return str(shown)
    try:
        rel = shown.relative_to(home)
    except ValueError:
        return str(shown)
    return "~" if rel == Path(".") else f"~/{rel}"


def counted(n: int, word: str) -> str:
    """`n` and `word`, plural unless one: 1 note, 4 tools."""
    return f"{n} {word}" + ("" if n == 1 else "s")


def human_size(n: int) -> str:
    """A size in bytes as a person reads it: 68 bytes, 12 kB, 83.5 MB."""
    if n < 1000:
        return counted(n, "byte")
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def sanitize(text: str) -> str:
    """`text` safe for a terminal: secrets redacted, control and bidi characters made visible."""
    return terminal_safe(redact(text))


def sanitize_line(text: str) -> str:
    """`sanitize` for one line: newlines and tabs made visible too (see `line_safe`)."""
    return line_safe(redact(text))


class SafeFormatter(logging.Formatter):
    """Formats as usual (traceback included), then makes the whole line terminal-safe."""

    def format(self, record: logging.LogRecord) -> str:
        return sanitize(super().format(record))


def install_log_handler(fmt: str = "cru: %(message)s", level: int = logging.WARNING) -> None:
    """Log records of `level` and above go to stderr formatted by `fmt`, sanitized (the root
    logger's one handler; a second call changes nothing)."""
    root = logging.getLogger()
    if any(isinstance(h.formatter, SafeFormatter) for h in root.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(SafeFormatter(fmt))
    root.addHandler(handler)
    if root.level == logging.NOTSET or root.level > level:
        root.setLevel(level)


class _LineSink(logging.Handler):
    def __init__(self, show: Callable[[str], None]) -> None:
        super().__init__()
        self.show = show

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.show(self.format(record))
        except Exception:  # a log line must never break its caller
            self.handleError(record)


@contextmanager
def log_lines_to(show: Callable[[str], None]) -> Iterator[None]:
    """While a full-screen application owns the terminal, the log lines (formatted and
    sanitized as on stderr) and Python's warnings go to `show` instead: written to stderr they
    would draw over its screen. `show` may be called from any thread."""
    root = logging.getLogger()
    ours = [h for h in root.handlers if isinstance(h.formatter, SafeFormatter)]
    sink = _LineSink(show)
    sink.setFormatter(ours[0].formatter if ours else SafeFormatter("cru: %(message)s"))
    for handler in ours:
        root.removeHandler(handler)
    root.addHandler(sink)
    logging.captureWarnings(True)
    try:
        yield
    finally:
        logging.captureWarnings(False)
        root.removeHandler(sink)
        for handler in ours:
            root.addHandler(handler)


class SafeStream:
    """A text stream (stdout) whose writes are made safe for a terminal: DEL, C1 and bidi
    controls as `\\uXXXX` (so JSON printed through it keeps its value), other control
    characters but newline and tab in caret notation. For commands that print note, card or
    session text (`cru kiln search`, `cru session show`, `cru cards list`, …)."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner

    def write(self, text: str) -> int:
        self.inner.write(sanitize(json_safe(text)))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
