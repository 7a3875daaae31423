"""`cru agents` and `cru doctor`: what is installed, what speaks ACP, what is wrong and the fix."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import trio

from acp_host.process import AgentStartError
from acp_host.registry import (
    BUILTINS,
    AgentRegistryError,
    auth_hint,
    fetch_on_run,
    install_hint,
    known_defect,
    known_names,
    resolve_agent,
)
from crucible.agent_install import cmd_agents_registry
from crucible.config import Config, config_path, load_config, resolve_kiln
from crucible.errors import CrucibleError
from crucible.start_failures import agent_env, agent_kind, sandbox_problem
from crucible.terminal import counted

PROBE_TIMEOUT = 20.0


@dataclass
class AgentReport:
    name: str
    found: bool
    command: str
    source: str
    version: str | None = None
    speaks_acp: bool | None = None  # None: not probed (not found)
    agent_info: str | None = None
    auth_methods: list[str] | None = None
    logged_in: bool | None = None  # None: cannot tell from here
    problem: str | None = None
    fix: str | None = None
    # What running the command would download first (an npx/uvx command): such an agent is
    # never started by `cru agents` / `cru doctor`, which inspect and never install.
    would_fetch: str | None = None
    # What `cru agents` and `cru doctor` print for it: ok (and only with no problem), login,
    # broken, missing or "not run".
    state: str = "ok"
    # A defect of this build that a person meets in use, and the update that has it fixed (the
    # agent still works: no problem, the state unchanged)
    note: str | None = None


# Where each agent keeps a login, or the variable that stands for one. A best guess: the
# agent itself is the authority (it answers "Authentication required" at the first prompt).
_CREDENTIALS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "claude": (("ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN"), ("~/.claude/.credentials.json",)),
    "gemini": (("GEMINI_API_KEY", "GOOGLE_API_KEY"), ("~/.gemini/oauth_creds.json",)),
    # OpenCode has free hosted models and reads keys from its own config: only a login file or an
    # inline config tells (else: cannot tell, never "no login").
    "opencode": (("OPENCODE_CONFIG_CONTENT",), ("~/.local/share/opencode/auth.json",)),
    "codex": (("OPENAI_API_KEY",), ("~/.codex/auth.json",)),
}


def logged_in(name: str, env: dict[str, str] | None = None) -> bool | None:
    env = dict(os.environ) if env is None else env
    if name not in _CREDENTIALS:
        return None
    variables, files = _CREDENTIALS[name]
    if any(env.get(v) for v in variables):
        return True
    if any(Path(f).expanduser().exists() for f in files):
        return True
    return None if name == "opencode" else False


async def probe_agent(spec: Any, init_timeout: float = PROBE_TIMEOUT) -> AgentReport:
    """Start the agent, send initialize, and stop it: does it speak ACP?"""
    from acp_host.client import connect_agent  # acp.schema (~0.5 s): only when an agent is probed

    report = AgentReport(spec.name, spec.found, spec.display(), spec.source)
    if not spec.found:
        report.problem = "not installed (not on PATH)"
        report.fix = install_hint(spec.name)
        report.state = "missing"
        return report
    if (fetch := fetch_on_run(spec.argv)) is not None:
        report.would_fetch = fetch
        report.problem = (f"`{spec.display()}` would first download the {fetch} and its "
                          "dependencies (often hundreds of MB), so it was not started")
        run_once = f"run `{spec.display()}` once yourself to download it"
        report.fix = f"{install_hint(spec.name)} (or {run_once})" if spec.name in BUILTINS else run_once
        report.state = "not run"
        return report
    async with trio.open_nursery() as nursery:
        try:
            client = await connect_agent(nursery, spec.argv, extra_env=spec.env, init_timeout=init_timeout,
                                         name=spec.name)
        except (AgentStartError, OSError) as exc:
            report.speaks_acp = False
            report.problem = str(exc).strip().splitlines()[0][:300]
            report.fix = "check that the command runs by hand; for a built-in agent: " + install_hint(spec.name)
            report.state = "broken"
            return report
        try:
            init = client.init
            report.speaks_acp = True
            if init is not None and init.agent_info is not None:
                report.agent_info = f"{init.agent_info.name} {init.agent_info.version}"
                report.version = init.agent_info.version
                report.note = known_defect(init.agent_info)
            if init is not None and init.auth_methods:
                report.auth_methods = [m.id for m in init.auth_methods]
            env = agent_env(spec)
            kind = agent_kind(spec)
            report.logged_in = logged_in(kind or spec.name, env)
            refused = sandbox_problem(env) if kind == "claude" else None
            if refused is not None:  # before the login: it would fail even logged in
                report.problem, report.fix, report.state = refused.cause, refused.fix, "broken"
            elif report.logged_in is False:
                report.problem = "no login or API key found"
                report.fix = auth_hint(kind or spec.name)
                report.state = "login"
        finally:
            await client.aclose()
    return report


def _specs(args: argparse.Namespace, *, defaults: bool = False) -> list[Any]:

    config = Config() if defaults else load_config(getattr(args, "config", None))
    specs = []
    for name in known_names(config.agents):
        try:
            specs.append(resolve_agent(name, profiles=config.agents))
        except AgentRegistryError as exc:
            raise CrucibleError(exc.message, exc.fix) from None
    return specs


async def _probe_all(specs: list[Any]) -> list[AgentReport]:
    reports: list[AgentReport | None] = [None] * len(specs)

    async def one(i: int) -> None:
        reports[i] = await probe_agent(specs[i])

    async with trio.open_nursery() as nursery:
        for i in range(len(specs)):
            nursery.start_soon(one, i)
    return [r for r in reports if r is not None]


def _print_agents(reports: list[AgentReport]) -> None:
    for r in reports:
        print(f"{r.name:<10} {r.state:<8} {r.agent_info or '':<32} {r.command}")
        if r.problem:
            print(f"{'':<10} problem: {r.problem}")
        if r.fix:
            print(f"{'':<10} fix:     {r.fix}")
        if r.note:
            print(f"{'':<10} note:    {r.note}")


def cmd_agents(args: argparse.Namespace) -> int:
    if getattr(args, "registry", None):  # the ACP registry's agents, not the ones configured here

        return cmd_agents_registry(args)
    reports = trio.run(_probe_all, _specs(args))
    _print_agents(reports)
    return 0


@dataclass
class Check:
    what: str
    ok: bool
    detail: str
    fix: str | None = None


def _tool_version(command: str) -> str | None:
    exe = shutil.which(command)
    if exe is None:
        return None
    try:
        return subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _checks(args: argparse.Namespace) -> list[Check]:

    checks: list[Check] = []
    path = config_path(getattr(args, "config", None))
    try:
        config = load_config(getattr(args, "config", None))
        checks.append(Check("config", True, f"{path}" + ("" if path.exists() else " (not present: defaults)")))
    except CrucibleError as exc:
        checks.append(Check("config", False, exc.message, exc.fix or f"edit {path}"))
        return checks
    for tool, fix in (("node", "install Node.js 20 or newer (https://nodejs.org or your package manager)"),
                      ("npm", "npm comes with Node.js")):
        version = _tool_version(tool)
        checks.append(Check(tool, version is not None, version or "not found", None if version else fix))
    try:
        kiln = resolve_kiln(getattr(args, "kiln", None), config)
    except CrucibleError as exc:
        checks.append(Check("kiln", False, exc.message, exc.fix))
        return checks
    notes = sum(1 for _ in kiln.rglob("*.md"))
    checks.append(Check("kiln", notes > 0, f"{kiln.name}: {counted(notes, 'note')}",
                        None if notes else "point --kiln (or $CRUCIBLE_KILN, or `kiln =` in the config) at your notes"))
    store = kiln / ".crucible" / "chroma"
    if config.index.url:
        checks.append(Check("index", True, f"Chroma server {config.index.url}"))
    else:
        # Not built yet is not a problem: a chat, `cru acp` and `cru mcp` build it in the
        # background when they start, and search by the notes' words meanwhile.
        indexed = store.is_dir()
        checks.append(Check("index", True, ".crucible/chroma" if indexed else (
            "not built yet: a chat, `cru acp` or `cru mcp` builds it in the background (searching by "
            f"words meanwhile); `cru kiln index --kiln {kiln}` builds it now")))
    if config.embedder.provider == "builtin":
        # The embedder's own check: one place knows where the weights are and how to install them.
        from crucible.kiln.embedder import model_dir

        try:
            model_dir()
            checks.append(Check("embedder", True, "built-in all-MiniLM-L6-v2"))
        except CrucibleError as exc:
            checks.append(Check("embedder", False, exc.message, exc.fix))
    else:
        checks.append(Check("embedder", True, f"{config.embedder.provider} {config.embedder.url or ''}".strip()))
    return checks


def _mcp_checks(args: argparse.Namespace) -> list[Check]:
    """Each upstream MCP server of the config, started: up with its tools, or why not."""
    from crucible.mcp_gateway import (
        probe,  # the mcp SDK's clients: only when servers are configured
    )

    try:
        config = load_config(getattr(args, "config", None))
    except CrucibleError:
        return []  # the config check already says what is wrong
    if not config.mcp.servers:
        return []
    checks = []
    for status in trio.run(probe, config):
        what = f"mcp {status.name}"
        if status.state == "up":
            checks.append(Check(what, True, f"{counted(status.tools, 'tool')} as {status.prefix}* ({status.target})"))
            continue
        tail = f"; stderr: {' | '.join(status.stderr_tail[-3:])}" if status.stderr_tail else ""
        fix = (f"run `{status.target}` by hand to see why"
               if status.transport == "stdio" else f"check that the server at {status.target} is running")
        checks.append(Check(what, False, f"{status.state}: {status.last_error or 'no answer'}{tail}", fix))
    return checks


def _plugin_checks(args: argparse.Namespace) -> list[Check]:
    """Each Lua plugin: loaded with its tools, or why it failed."""
    from crucible.plugins.host import load_all  # lupa and the mcp types: only for the plugins check

    try:
        config = load_config(getattr(args, "config", None))
    except CrucibleError:
        return []
    checks = []
    for p in load_all(config).plugins:
        if p.state == "loaded":
            checks.append(Check(f"plugin {p.name}", True, f"{counted(len(p.tools), 'tool')} ({p.source})"))
        elif p.state == "failed":
            checks.append(Check(f"plugin {p.name}", False, p.reason or "failed",
                                f"fix {p.shown_path()}, or turn it off: [plugins.{p.name}] enabled = false"))
    return checks


def cmd_doctor(args: argparse.Namespace) -> int:
    checks = _checks(args)
    checks += _mcp_checks(args)
    checks += _plugin_checks(args)
    try:
        specs = _specs(args)
    except CrucibleError:  # a broken config is reported above; the built-in agents are still probed
        specs = _specs(args, defaults=True)
    reports = trio.run(_probe_all, specs)
    if getattr(args, "json", False):
        print(json.dumps({"checks": [asdict(c) for c in checks], "agents": [asdict(r) for r in reports]}, indent=2))
    else:
        for c in checks:
            print(f"{'ok ' if c.ok else 'FIX'} {c.what:<9} {c.detail}")
            if c.fix:
                print(f"    {'':<9} fix: {c.fix}")
        print()
        _print_agents(reports)
    usable = any(r.state in ("ok", "login") for r in reports)
    if not usable:
        print("\nno agent speaks ACP here: install one of the above (the fix lines say how)", file=sys.stderr)
    return 0 if all(c.ok for c in checks) and usable else 1
