"""Text from an agent (or a file, a card, an MCP server) made safe to show in a terminal.

Control characters (ESC sequences such as OSC 0 window titles, OSC 52 clipboard writes,
`ESC[2J`; BEL, backspace, carriage returns that overwrite a line; the C1 range, which some
terminals obey as 8-bit escapes) and Unicode bidi overrides/isolates (which make text read
differently than it is) are made visible instead of being interpreted. Newlines and tabs pass.

It lives here, in the host library, because a host's own log lines (a skipped line from an
agent) carry agent text too; `crucible.terminal` re-exports it for the application.
"""

from __future__ import annotations

import re

__all__ = ["json_safe", "line_safe", "terminal_safe", "without_escapes"]

_BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
_UNSAFE = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}]")
# The same for one line (a title, a label): newline and tab are made visible too.
_UNSAFE_IN_LINE = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}]")
# What json.dumps(ensure_ascii=False) leaves raw but a terminal may still obey or reorder.
_JSON_UNSAFE = re.compile(f"[\x7f-\x9f{_BIDI}]")
# A terminal escape sequence, whole: CSI (ESC [ or C1 0x9b, parameters, one final byte), OSC /
# DCS / APC / PM / SOS strings up to BEL or ST (or the end), and two-byte ESC sequences. Each
# branch is one pass with no nested repetition, so matching stays linear in the text's length.
_ESCAPE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[\]P_^X]|[\x90\x9d\x9e\x9f\x98])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -~]?"
)


def _visible(match: re.Match[str]) -> str:
    ch = match.group()
    code = ord(ch)
    if code < 0x20:
        return "^" + chr(code + 0x40)  # caret notation, as `cat -v`
    return f"<U+{code:04X}>"


def terminal_safe(text: str) -> str:
    """`text` with every control character but newline and tab, and every bidi control, made
    visible (`^[` for ESC, `<U+202E>` for RLO)."""
    return _UNSAFE.sub(_visible, text)


def line_safe(text: str) -> str:
    """`terminal_safe` for text shown as one line (a tool's title, a permission's label):
    its newlines and tabs made visible too (`^J`), so it cannot draw lines of its own, such as a
    forged row of keys under a permission question or a forged `[permission]` line."""
    return _UNSAFE_IN_LINE.sub(_visible, text)


def json_safe(line: str) -> str:
    """A line of JSON (from json.dumps with ensure_ascii=False, which escapes C0 already) with
    DEL, the C1 range and bidi controls escaped as \\uXXXX: the same JSON value, safe to print."""
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", line)


def without_escapes(text: str) -> str:
    """`text` with its escape sequences removed whole (not only their ESC, which leaves "[31m"):
    for a short label such as a title, where showing them (`terminal_safe`) is only noise."""
    return _ESCAPE.sub("", text)
