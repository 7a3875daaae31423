"""The status bar (state, agent, card, mode, model, context, tokens, cost, a short flash), the
usage behind it (and `/usage`), and the agent's plan shown above the input."""

from __future__ import annotations

import time
from typing import Any

from prompt_toolkit.formatted_text import StyleAndTextTuples
from prompt_toolkit.layout.dimension import Dimension

from acp_host.session import PlanChanged, TurnEnded, UsageChanged
from crucible.terminal import sanitize


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

    # -- what changes it ----------------------------------------------------------------
    def set_flash(self, text: str, seconds: float) -> None:
        self.flash = text
        self.flash_until = time.monotonic() + seconds

    def turn_started(self) -> None:
        self.state = "running"
        self.turn_start_cost = self.cost[0] if self.cost is not None else 0.0

    def plan_changed(self, event: PlanChanged) -> None:
        self.plan = event.entries

    def usage(self, event: UsageChanged) -> None:
        self.context = (event.used, event.size)
        if event.cost is not None:
            self.cost = (event.cost.amount, event.cost.currency)

    def turn_ended(self, event: TurnEnded) -> None:
        self.turns += 1
        if event.usage is not None:
            self.turn_tokens = event.usage.total_tokens
            self.session_tokens += event.usage.total_tokens

    # -- drawing ------------------------------------------------------------------------
    def text(self, acp: Any, waiting: bool) -> StyleAndTextTuples:
        """The bar; `acp`: the session's ACP session (mode, model), if any."""
        parts = ["waiting for your answer" if waiting else self.state, self.label]
        if acp is not None:
            st = acp.state
            if st.current_mode:
                parts.append(f"mode: {sanitize(st.current_mode)}")
            for option in st.models[:1]:
                parts.append(f"model: {sanitize(str(getattr(option, 'current_value', '')))}")
        if self.context is not None:
            parts.append(f"ctx {fmt_tokens(self.context[0])}/{fmt_tokens(self.context[1])}")
        if self.session_tokens:
            parts.append(f"{fmt_tokens(self.session_tokens)} tok")
        if self.cost is not None:
            parts.append(f"{self.cost[0]:.4f} {self.cost[1]}")
        text = " " + " │ ".join(parts)
        if self.flash and time.monotonic() < self.flash_until:
            return [("class:status.flash", f" {self.flash} "), ("class:status", text)]
        return [("class:status", text)]

    def usage_text(self) -> str:
        lines = []
        if self.turn_tokens is not None:
            lines.append(f"last turn: {self.turn_tokens} tokens")
        lines.append(f"this session: {self.session_tokens} tokens over {self.turns} turns")
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
        for entry in self.plan[:5]:
            status = getattr(entry, "status", "pending")
            mark, style = {"completed": ("[x]", "class:plan.done"),
                           "in_progress": ("[>]", "class:plan.active")}.get(status, ("[ ]", "class:plan"))
            out.append((style, f" {mark} {sanitize(str(getattr(entry, 'content', '')))}\n"))
        if len(self.plan) > 5:
            out.append(("class:plan", f"  … {len(self.plan) - 5} more\n"))
        return out
