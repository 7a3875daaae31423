"""A Crucible session's events beyond the ACP ones of `acp_host.session`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from acp_host.session import Event


@dataclass(frozen=True)
class ChildStatus:
    """A child's life, as the parent sees it (not an ACP event)."""

    status: Literal["queued", "started", "finished", "notice"]
    detail: str = ""
    # With "started": what a terminal of the child printed so far, by terminal id, for as long
    # as the child runs (the TUI draws a child's terminal output from it).
    terminal_output: Callable[[str], str | None] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class ChildEvent:
    """One event of a delegated child (or grandchild), for the parent's `on_child_event`."""

    label: str  # the provenance chain, e.g. "claude › reviewer"
    job_id: str
    session_id: str | None  # the child's Crucible session id (None while it is queued)
    depth: int  # 1 for a child, 2 for a grandchild
    event: Event | ChildStatus


ChildEventHook = Callable[[ChildEvent], None]
