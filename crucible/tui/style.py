"""The chat's colours, by the style classes the other parts use."""

from __future__ import annotations

from prompt_toolkit.styles import Style, merge_styles

from crucible.tui.markdown import code_style_rules

_OWN = Style.from_dict({
    "agent": "",
    "thought": "italic #8a8a8a",
    "user": "bold #5fafff",
    "notice": "#8a8a8a",
    "error": "bold #ff5f5f",
    "warning": "#d7af00",
    "dim": "#8a8a8a",
    "md.heading": "bold underline",
    "md.bold": "bold",
    "md.italic": "italic",
    "md.code": "#d7af5f",
    "md.fence": "#6c6c6c",
    "md.bullet": "#5fafff",
    "md.quote": "italic #a8a8a8",
    "tool.title": "bold",
    "tool.ok": "#5fd75f",
    "tool.failed": "#ff5f5f",
    "tool.running": "#d7d75f",
    "tool.pending": "#a8a8a8",
    "tool.output": "#bcbcbc",
    "terminal": "#bcbcbc",
    "diff.add": "#5fd75f",
    "diff.del": "#ff5f5f",
    "diff.hunk": "#5fafd7",
    "diff.file": "bold",
    "plan": "#a8a8a8",
    "plan.active": "bold #d7d75f",
    "plan.done": "#5fd75f",
    "dialog": "bg:#262626",
    "dialog.title": "bold #ffaf00",
    "dialog.key": "bold reverse",
    "separator": "#4e4e4e",
    "status": "reverse",
    "status.flash": "reverse bold",
    "history": "#6c6c6c",
    "child.head": "bold #87afd7",
    "child.bar": "#5f87af",
    "md.table": "#6c6c6c",
    "tool.path": "#5fafff",
    "focus": "bold #ffaf00",
    "queue": "#a8a8a8",
    "queue.head": "italic #8a8a8a",
})

# Later rules win: highlighted code over md.code's colour, history's dim over everything.
STYLE = merge_styles([_OWN, Style(code_style_rules()), Style.from_dict({"history": "#6c6c6c"})])
