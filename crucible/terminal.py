"""Terminal safety: agent text never drives the person's terminal.

Control characters (ESC sequences, BEL, backspace, carriage returns that overwrite a line)
and Unicode bidi overrides/isolates (which can make text read differently than it is) are
made visible instead of being interpreted. Newlines and tabs pass through.
"""

from __future__ import annotations

import re

_BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
_UNSAFE = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}]")


def _visible(match: re.Match[str]) -> str:
    ch = match.group()
    code = ord(ch)
    if code < 0x20:
        return "^" + chr(code + 0x40)  # caret notation, as `cat -v`
    return f"<U+{code:04X}>"


def sanitize(text: str) -> str:
    return _UNSAFE.sub(_visible, text)
