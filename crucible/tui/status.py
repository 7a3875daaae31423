"""The status bar (state, agent, card, mode, model, context, tokens, cost, a short flash), the
usage behind it (and `/usage`), and the agent's plan shown above the input.

While a turn runs the state shows a spinner and the time since the prompt was sent, so a
long tool call (a slow search) still shows the turn is alive. A turn's plan is pinned above
the input until the next prompt is sent: then it goes into the transcript as it finished, and
the next turn starts with none.

While the session's kiln is being embedded the bar ends with `indexing 34%` (gone when the
index is ready; `index failed: why` if it cannot be built). The index's state is read at each
draw (a lock, no I/O); the indexing thread only asks for a redraw when it changes."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from prompt_toolkit.formatted_text import StyleAndTextTuples
from prompt_toolkit.layout.dimension import Dimension
from prompt_toolkit.utils import get_cwidth

from acp_host.session import PlanChanged, TurnEnded, UsageChanged
from crucible.terminal import counted, sanitize

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
TICK = 0.125  # seconds between two frames of the spinner
INDEX_PROBLEM_CHARS = 60  # of a failed index's reason in the bar (`cru kiln info` has it whole)


def fmt_tokens(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


class StatusBar:
    def __init__(self, label: str) -> None:
        self.label = label  # the agent, and its card
        self.state = "starting"
        self.flash = ""
        self.flash_until = 0.0
        self.plan: tuple[Any, ...] = ()
        self.context: tuple[int, int] | None = None
        self.cost: tuple[float, str] | None = None
        self.turn_start_cost = 0.0
        self.turn_tokens: int | None = None
        self.session_tokens = 0
        self.turns = 0
        self.turn_started_at: float | None = None  # while a turn runs
        self._index_backend: Any = None  # the kiln backend whose index the bar shows
        self._index_failure_told: str | None = None  # the failure said in the chat (its reason)

    # -- what changes it ----------------------------------------------------------------
    def set_flash(self, text: str, seconds: float) -> None:
        self.flash = text
        self.flash_until = time.monotonic() + seconds

    def clear_flash(self) -> None:
        self.flash = ""
        self.flash_until = 0.0

    def turn_started(self) -> None:
        self.state = "running"
        self.turn_started_at = time.monotonic()
        self.plan = ()  # a new turn starts with no plan (the last one is in the transcript)
        self.turn_start_cost = self.cost[0] if self.cost is not None else 0.0

    def turn_stopped(self) -> None:
        self.turn_started_at = None

    def plan_changed(self, event: PlanChanged) -> None:
        self.plan = event.entries

    def usage(self, event: UsageChanged) -> None:
        self.context = (event.used, event.size)
        if event.cost is not None:
            self.cost = (event.cost.amount, event.cost.currency)

    def turn_ended(self, event: TurnEnded) -> None:
        self.turn_started_at = None
        self.turns += 1
        if event.usage is not None:
            self.turn_tokens = event.usage.total_tokens
            self.session_tokens += event.usage.total_tokens

    def follow_index(self, backend: Any, wake: Callable[[], None]) -> None:
        """Show `backend`'s kiln index while it builds. `wake` is called (from the indexing
        thread: it must be thread-safe) at each change of its state, at most every ~0.5 s.
        The backend outlives a /restart (one per kiln per process): followed once."""
        if backend is self._index_backend or not hasattr(backend, "index_state"):
            return
        self._index_backend = backend
        backend.on_index_state(lambda _state: wake())
        wake()  # a state reached before this (a build failed at once) is not sent again

    def index_failure_notice(self) -> str | None:
        """Once each failure of the index's build: the whole reason and what it means for
        searching, for the chat (the bar has room for a short reason only). A build tried again
        that stops for the same reason is not said again until the index was ready between."""
        if self._index_backend is None:
            return None
        state = self._index_backend.index_state()
        if state.phase == "ready":
            self._index_failure_told = None
        if state.phase != "failed" or state.problem == self._index_failure_told:
            return None
        self._index_failure_told = state.problem
        return str(state.failure_text(sanitize(self._index_backend.redact(state.problem or "see cru kiln info"))))

    def index_text(self) -> str | None:
        """`indexing 34%` while the kiln's notes are being embedded, `index failed: why`, or
        None (ready, or nothing to show yet: while it opens it is not known to be incomplete)."""
        texts = self.index_texts()
        return None if texts is None else texts[0]

    def index_texts(self) -> tuple[str, str] | None:
        """`index_text`, and it short (without the why: the chat has said it whole, and the bar
        shortens it first when it does not fit), from one read of the index's state."""
        if self._index_backend is None:
            return None
        state = self._index_backend.index_state()
        if state.phase == "failed":
            # The embedder's URL says little here and takes the room of the reason.
            # Paths made kiln-relative as in the chat's notice (`redact`), secrets by `sanitize`.
            problem = sanitize(self._index_backend.redact(state.problem or "see cru kiln info"))
            problem = re.sub(r" at https?://\S+", "", problem)
            if len(problem) > INDEX_PROBLEM_CHARS:
                problem = problem[:INDEX_PROBLEM_CHARS - 1] + "…"
            shown = f"indexing stopped at {state.percent}%" if state.stopped_midway else "index failed"
            return f"{shown}: {problem}", shown
        if state.phase in ("embedding", "waiting") and state.embedded < 1.0:
            percent = state.percent
            if state.phase != "waiting":
                text = f"indexing {percent}%"
            elif state.stopped_writer is not None:  # it never goes on by itself: say how
                text = f"indexing {percent}% (another cru, stopped: kill -CONT {state.stopped_writer})"
            else:
                text = f"indexing {percent}% (another cru)"
            return text, text
        return None

    # -- drawing ------------------------------------------------------------------------
    def text(self, acp: Any, waiting: bool, scrolled: bool = False, width: int | None = None) -> StyleAndTextTuples:
        """The bar; `acp`: the session's ACP session (mode, model), if any; `scrolled`: the
        transcript is scrolled up (newer rows below are out of sight); `width`: the screen's,
        which a bar too wide is fitted to by leaving out what is said whole elsewhere: the
        index's reason (said in the chat), then the usage figures (/usage), the newest first."""
        state = self.state
        if self.turn_started_at is not None and state in ("running", "cancelling"):
            elapsed = time.monotonic() - self.turn_started_at
            state = f"{SPINNER[int(elapsed / TICK) % len(SPINNER)]} {state} {elapsed:.1f} s"
        parts = ["waiting for your answer" if waiting else state, self.label]
        if scrolled:
            parts.insert(1, "scrolled up: PageDown for newer")
        if acp is not None:
            st = acp.state
            if st.mode_now:
                parts.append(f"mode: {sanitize(st.mode_now)}")
            if st.model_now:
                parts.append(f"model: {sanitize(st.model_now)}")
        usage = []
        if self.context is not None:
            usage.append(f"ctx {fmt_tokens(self.context[0])}/{fmt_tokens(self.context[1])}")
        if self.session_tokens:
            usage.append(f"{fmt_tokens(self.session_tokens)} tok")
        if self.cost is not None:
            usage.append(f"{self.cost[0]:.4f} {self.cost[1]}")
        # The index last: the session's own state comes first on a narrow screen.
        index, short = self.index_texts() or (None, None)
        flash = f" {self.flash} " if self.flash and time.monotonic() < self.flash_until else ""

        def joined() -> str:
            return " " + " │ ".join(parts + usage + ([index] if index is not None else []))

        text = joined()
        while width is not None and get_cwidth(flash + text) > width:
            if index != short:
                index = short
            elif usage:
                usage.pop()
            else:
                break  # the session's own state: cut by the screen
            text = joined()
        if flash:
            return [("class:status.flash", flash), ("class:status", text)]
        return [("class:status", text)]

    def usage_text(self) -> str:
        lines = []
        if self.turn_tokens is not None:
            lines.append(f"last turn: {self.turn_tokens} tokens")
        lines.append(f"this session: {self.session_tokens} tokens over {counted(self.turns, 'turn')}")
        if self.cost is not None:
            lines.append(f"cost: {self.cost[0] - self.turn_start_cost:.4f} {self.cost[1]} last turn, "
                         f"{self.cost[0]:.4f} {self.cost[1]} this session")
        if self.context is not None:
            lines.append(f"context: {self.context[0]} of {self.context[1]} tokens")
        if len(lines) == 1 and not self.session_tokens:
            lines.append("(the agent has not reported usage yet)")
        return "\n".join(lines)

    def plan_height(self) -> Dimension:
        return Dimension.exact(min(6, len(self.plan) + 1))

    def plan_text(self) -> StyleAndTextTuples:
        out: StyleAndTextTuples = [("class:plan", "Plan\n")]
        for line in plan_lines(self.plan[:5]):
            out.extend(line)
            out.append(("", "\n"))
        if len(self.plan) > 5:
            out.append(("class:plan", f"  … {len(self.plan) - 5} more\n"))
        return out


def plan_lines(entries: Any) -> list[list[tuple[str, str]]]:
    """A plan's entries as `[x] done`, `[>] doing`, `[ ] to do` lines."""
    out = []
    for entry in entries:
        status = getattr(entry, "status", "pending")
        mark, style = {"completed": ("[x]", "class:plan.done"),
                       "in_progress": ("[>]", "class:plan.active")}.get(status, ("[ ]", "class:plan"))
        out.append([(style, f" {mark} {sanitize(str(getattr(entry, 'content', '')))}")])
    return out
