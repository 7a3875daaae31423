"""Why an agent would not start (or failed its first turn), and the fix: one place for every
known failure of the real agents, read from the agent's error (message, code, `error.data`),
its stderr tail and the environment it ran in.

Known failures (found by running the real adapters; see /work/shared/FIELD-NOTES.md):
- claude as root: the bundled Claude Code CLI exits at once unless `IS_SANDBOX=1` exactly,
  while the adapter (claude-agent-acp) asks it for `--dangerously-skip-permissions` whenever
  IS_SANDBOX is set at all; the adapter then answers session/new with a bare -32603 whose data
  says "Query closed before response received". Unset, the adapter refuses only a
  `permissions.defaultMode` of bypassPermissions in the person's Claude settings.
- a missing key or login: claude answers the first prompt with -32000 "Authentication
  required", gemini refuses session/new with -32000 "Gemini API key is missing…".
- opencode without a usable model (a provider with no key, an unknown model): its model list
  is empty and the prompt fails with -32603 "OpenCode service failure" (data: service session).
- an API that cannot be reached: claude fails the prompt with "Unable to connect to API".

Used for session start (`explain_start_failure` in crucible/sessions.py), for a failed turn
(the session's `explain_error` hook), and by `cru doctor` (`sandbox_problem`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from acp_host.registry import BUILTINS, AgentSpec, auth_hint
from crucible.redaction import redact

# How much of the agent's own words a message quotes.
QUOTE_MAX = 200


@dataclass(frozen=True)
class Failure:
    """What went wrong, and what to do about it (one line each)."""

    cause: str
    fix: str

    def line(self) -> str:
        return f"{self.cause} — fix: {self.fix}"


@dataclass(frozen=True)
class Evidence:
    """What is known of a failure."""

    agent: str  # the agent's name (built-in, profile, or its program)
    kind: str | None  # which known agent it is: claude, opencode, gemini, codex
    message: str  # the agent's error message, or the start error's text
    code: int | None = None
    data: Any = None
    stderr: str = ""
    env: Mapping[str, str] | None = None  # the environment the agent ran in
    model_values: Sequence[str] | None = None  # the models it offered (None: not known)

    @property
    def text(self) -> str:
        """Message, data and stderr, lower-cased: what the rules look for."""
        data = self.data if isinstance(self.data, str) else json.dumps(self.data, default=str) if self.data else ""
        return f"{self.message}\n{data}\n{self.stderr}".lower()


_KIND_MARKERS = (("claude-agent-acp", "claude"), ("claude-code-acp", "claude"), ("opencode", "opencode"),
                 ("gemini", "gemini"), ("codex-acp", "codex"))


def agent_kind(spec: AgentSpec) -> str | None:
    """Which known agent `spec` runs: by its name, the built-in its profile extends, or its command."""
    if spec.name in BUILTINS:
        return spec.name
    extends = re.search(r"extends (\w+)", spec.source)
    if extends and extends.group(1) in BUILTINS:
        return extends.group(1)
    argv = " ".join(spec.argv).lower()
    return next((kind for marker, kind in _KIND_MARKERS if marker in argv), None)


def agent_env(spec: AgentSpec, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment the agent runs in: ours, its profile's, then the session's."""
    return {**os.environ, **spec.env, **(extra or {})}


def _quote(text: str) -> str:
    # Redacted before it is cut: a secret cut in two no longer matches, and its start was shown.
    text = " ".join(redact(str(text)).split())
    text = "".join(c for c in text if c.isprintable())
    return text if len(text) <= QUOTE_MAX else text[:QUOTE_MAX] + "…"


def _said(ev: Evidence) -> str:
    code = f", code {ev.code}" if ev.code is not None else ""
    return f"{_quote(ev.message)}{code}"


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def sandbox_problem(env: Mapping[str, str], home: Path | None = None) -> Failure | None:
    """Claude Code as root: a problem before anything runs (for `cru doctor` and the rules)."""
    if not _is_root():
        return None
    value = env.get("IS_SANDBOX")
    fix = ("set IS_SANDBOX=1 (exactly 1) in the agent's environment when this machine is a container or VM "
           "(export IS_SANDBOX=1, or env = { IS_SANDBOX = \"1\" } under [agents.claude]); else run cru as a "
           "normal user")
    if value and value != "1":
        return Failure(f"Claude Code refuses to start as root with IS_SANDBOX={value} (only IS_SANDBOX=1 "
                       "lets it run as root)", fix)
    if not value and _claude_settings_bypass(home or Path(env.get("HOME") or Path.home())):
        return Failure("Claude Code refuses bypassPermissions mode as root (your Claude settings ask for it: "
                       "permissions.defaultMode)", fix.replace("; else", "; or change permissions.defaultMode "
                                                                "in ~/.claude/settings.json; or"))
    return None


def _claude_settings_bypass(home: Path) -> bool:
    try:
        settings = json.loads((home / ".claude" / "settings.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    mode = settings.get("permissions", {}).get("defaultMode") if isinstance(settings, dict) else None
    return isinstance(mode, str) and mode.strip().lower() in ("bypasspermissions", "bypass")


def _claude_root(ev: Evidence) -> Failure | None:
    if ev.kind != "claude":
        return None
    text = ev.text
    if not ("query closed before response received" in text or "not available when running as root" in text
            or "cannot be used with root" in text):
        return None
    found = sandbox_problem(ev.env or {})
    if found is not None:
        return found
    if "query closed before response received" in text:
        return Failure(f"the agent {ev.agent}: Claude Code exited while the session started ({_said(ev)})",
                       "run `claude` by hand to see why (a broken ~/.claude/settings.json, an old Node.js); "
                       "setting CLAUDE_CODE_EXECUTABLE to a script that logs its stderr shows the cause")
    return None


_AUTH = re.compile(r"authentication required|not authenticated|api key is missing|invalid api key|"
                   r"invalid x-api-key|login required|please log ?in|unauthori[sz]ed|api key not valid|"
                   r"no api key|missing api key|auth(entication)? failed")


def _auth(ev: Evidence) -> Failure | None:
    text = ev.text
    if not (_AUTH.search(text) or (ev.code == -32000 and "auth" in text)):
        return None
    return Failure(f"the agent {ev.agent} needs you to log in ({_said(ev)})", auth_hint(ev.kind or ev.agent))


def _opencode_model(ev: Evidence) -> Failure | None:
    if ev.kind != "opencode":
        return None
    text = ev.text
    service = ev.data.get("service") if isinstance(ev.data, dict) else None
    if ev.model_values is not None and not ev.model_values:
        return Failure(f"the agent {ev.agent} has no model it can use (its model list is empty; it said: "
                       f"{_said(ev)})",
                       "run `opencode auth login` for a provider, or set that provider's API key (e.g. "
                       "ANTHROPIC_API_KEY), or pick a model it has in opencode's config (\"model\")")
    if "opencode service failure" in text:
        logs = "$XDG_DATA_HOME/opencode/log/ (~/.local/share/opencode/log/)"
        return Failure(f"the agent {ev.agent}: OpenCode's {service or 'internal'} service failed ({_said(ev)})",
                       f"the newest file in {logs} says why; `opencode` run by hand in the same folder "
                       "shows it too")
    return None


def _unreachable(ev: Evidence) -> Failure | None:
    text = ev.text
    if not ("unable to connect to api" in text or "cannot connect to api" in text or "econnrefused" in text
            or "fetch failed" in text or "getaddrinfo" in text):
        return None
    where = {"claude": "ANTHROPIC_BASE_URL", "gemini": "GOOGLE_GEMINI_BASE_URL"}.get(ev.kind or "")
    hint = f" (and {where}, if set)" if where else ""
    return Failure(f"the agent {ev.agent} could not reach its model's API ({_said(ev)})",
                   f"check the network and any proxy settings{hint}, then try again")


def _node_too_old(ev: Evidence) -> Failure | None:
    text = ev.text
    if not re.search(r"requires node|node\.js (v?\d+|version)|unsupported engine|syntaxerror: unexpected token", text):
        return None
    return Failure(f"the agent {ev.agent} needs a newer Node.js ({_quote(_last_line(ev.stderr) or ev.message)})",
                   "install Node.js 20 or newer (https://nodejs.org or your package manager)")


RULES = (_claude_root, _auth, _opencode_model, _unreachable, _node_too_old)


def diagnose(ev: Evidence) -> Failure | None:
    """The known failure `ev` shows, if any."""
    for rule in RULES:
        found = rule(ev)
        if found is not None:
            return found
    return None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def stderr_summary(stderr: str) -> str:
    """The last line of an agent's stderr worth showing (quoted, bounded), or ''."""
    line = _last_line(stderr)
    return _quote(line) if line and line not in ("}", "{") else ""
