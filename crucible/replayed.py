"""What an agent replays of a resumed conversation (session/load) as the person's messages that
is not the person's words, and what to show in its place: the chat (`tui.feed`) and the editors
of `cru acp` (`acp_forward`) show the same.

Light on purpose (`re` alone): `cru acp` imports it before it answers initialize.
"""

from __future__ import annotations

import re

# What Gemini CLI replays of a tool's result, which its record keeps in a message of the person's
# ("[Function Response: mcp_crucible_semantic_search]", at times run on after their next prompt;
# the call itself is replayed as a tool call).
_TOOL_PLACEHOLDER = re.compile(r"\[Function (?:Response|Call): [^\]\n]{0,200}\]")


def shown_user_text(text: str) -> str:
    """A replayed part of the person's message as it is shown: the agent's own context (Gemini
    CLI stores the date, the OS and the working folder's tree as a `<session_context>` part of
    the first message, and replays it) is one line in its place; a part that stands for a tool's
    result is left out ("" if that is all it is)."""
    body = text.strip()
    if body.startswith("<session_context>") and body.endswith("</session_context>"):
        return f"(the agent's session context, {body.count(chr(10)) + 1} lines, not shown)\n"
    if "[Function " in text:
        text = _TOOL_PLACEHOLDER.sub("", text)
        return text if text.strip() else ""
    return text
