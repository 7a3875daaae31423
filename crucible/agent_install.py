"""`cru agents --registry FILE|URL` and `cru agents add ID`: agents from the ACP registry.

Listing reads the registry (a file, or a URL the person named) and downloads nothing else;
`add` writes an `[agents.ID]` profile that runs the agent through its npx / uvx / binary
distribution. What that command downloads on its first run is said, never done here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

from acp_host.registry import (
    BUILTINS,
    REGISTRY_URL,
    AgentRegistryError,
    RegistryAgent,
    RegistryLaunch,
    current_platform,
    parse_registry,
    registry_launches,
    resolve_agent,
)
from crucible.config import config_path, load_config
from crucible.errors import CrucibleError
from crucible.kiln.atomic import atomic_write_text

_PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
MAX_REGISTRY_BYTES = 10 * 1024 * 1024  # the official registry is ~100 kB


def load_registry(source: str) -> list[RegistryAgent]:
    """The agents in a registry file or at a registry URL."""
    if source.startswith(("http://", "https://")):
        import httpx  # only a registry URL needs the HTTP client

        try:
            r = httpx.get(source, timeout=30, follow_redirects=True)
        except httpx.HTTPError as exc:
            raise CrucibleError(f"could not read the ACP registry at {source}: {exc or type(exc).__name__}",
                                "check the network or the URL, or give a downloaded registry.json with "
                                "--registry FILE") from None
        if r.status_code != 200:
            raise CrucibleError(f"the ACP registry at {source} answered HTTP {r.status_code}",
                                f"check the URL (the official one: {REGISTRY_URL})")
        raw = r.content
    else:
        path = Path(source).expanduser()
        try:
            if path.stat().st_size > MAX_REGISTRY_BYTES:
                raise CrucibleError(f"{source} is larger than a registry can be", "give a registry.json")
            raw = path.read_bytes()
        except OSError as exc:
            raise CrucibleError(f"cannot read the registry file {source}: {exc.strerror}",
                                "give the path of a registry.json or agent.json") from None
    if len(raw) > MAX_REGISTRY_BYTES:
        raise CrucibleError(f"{source} is larger than a registry can be", "give a registry.json")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise CrucibleError(f"{source} is not JSON ({exc})", "give a registry.json or agent.json") from None
    try:
        return parse_registry(data, source)
    except AgentRegistryError as exc:
        raise CrucibleError(exc.message, exc.fix) from None


def _launches(agent: RegistryAgent) -> list[RegistryLaunch]:
    try:
        return registry_launches(agent)
    except AgentRegistryError as exc:
        raise CrucibleError(exc.message, exc.fix) from None


def _one_line(text: str, limit: int = 100) -> str:
    """A registry string made safe for a terminal line: no control characters, bounded."""
    clean = "".join(ch if ch.isprintable() else " " for ch in text)
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"


def cmd_agents_registry(args: argparse.Namespace) -> int:
    source = args.registry
    agents = load_registry(source)
    profiles = load_config(getattr(args, "config", None)).agents
    print(f"{len(agents)} agent(s) in {source}:")
    for agent in agents:
        mark = "  (a profile already)" if agent.id in profiles else ""
        print(f"\n{_one_line(agent.id, 30):<16} {_one_line(agent.name, 40)} {_one_line(agent.version, 20)}"
              f" — {_one_line(agent.description)}{mark}")
        launches = _launches(agent)
        if not launches:
            kinds = ", ".join(agent.distribution)
            print(f"{'':<16} no way to run it here ({current_platform()}); it has: {kinds}")
            continue
        best = launches[0]
        when = ("once you have it (install, below)" if best.kind == "binary"
                else f"its first run downloads the {_one_line(best.fetches, 120)}")
        print(f"{'':<16} run:     {_one_line(shlex.join([best.command, *best.args]), 160)}   ({when})")
        print(f"{'':<16} install: {_one_line(best.install, 200)}")
        print(f"{'':<16} add:     cru agents add {agent.id}"
              + (f" --registry {shlex.quote(source)}" if source != REGISTRY_URL else "")
              + (f"   (also: --via {' / '.join(x.kind for x in launches[1:])})" if len(launches) > 1 else ""))
    return 0


def cmd_agents_add(args: argparse.Namespace) -> int:
    # tomlkit keeps the config's comments; only writing a profile needs it
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    source = getattr(args, "registry", None) or REGISTRY_URL
    agents = {a.id: a for a in load_registry(source)}
    agent = agents.get(args.id)
    if agent is None:
        raise CrucibleError(f"no agent {args.id!r} in {source}",
                            f"one of: {', '.join(sorted(agents)) or '(none)'}")
    launches = _launches(agent)
    if args.via:
        launches = [x for x in launches if x.kind == args.via]
    if not launches:
        raise CrucibleError(
            f"{agent.id} has no {args.via + ' ' if args.via else ''}distribution that runs here "
            f"({current_platform()}; it has {', '.join(agent.distribution)})",
            "pick another --via, or install the agent by hand and give its command in a profile")
    launch = launches[0]
    name = args.as_name or agent.id
    if not _PROFILE_NAME.match(name):
        raise CrucibleError(f"{name!r} cannot name a profile", "use letters, digits, - and _ (--as NAME)")

    path = config_path(getattr(args, "config", None))
    config = load_config(getattr(args, "config", None))  # refuse to touch a config that does not load
    if name in config.agents and not args.force:
        raise CrucibleError(f"{path.name} already has [agents.{name}]",
                            "pass --force to replace it, or --as OTHER-NAME to add it beside")
    before = path.read_text(encoding="utf-8") if path.exists() else None
    try:
        doc = tomlkit.parse(before) if before is not None else tomlkit.document()
    except TOMLKitError as exc:
        raise CrucibleError(f"{path.name} is not valid TOML ({exc})", f"fix {path}") from None
    if "agents" not in doc:
        doc["agents"] = tomlkit.table(is_super_table=True)
    section: Any = doc["agents"]
    profile = tomlkit.table()
    profile.comment(f"{_one_line(agent.name, 60)} {_one_line(agent.version, 20)} from the ACP registry ({launch.kind})")
    profile["command"] = launch.command
    profile["args"] = launch.args
    if launch.env:
        env_table = tomlkit.inline_table()
        env_table.update(launch.env)
        profile["env"] = env_table
    section[name] = profile
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write_text(path, tomlkit.dumps(doc))
    os.chmod(path, 0o600)
    try:  # the profile must resolve as written, else the file is put back as it was
        resolve_agent(name, profiles=load_config(getattr(args, "config", None)).agents)
    except (CrucibleError, AgentRegistryError) as exc:
        if before is None:
            path.unlink()
        else:
            atomic_write_text(path, before)
        raise CrucibleError(f"the profile for {agent.id} did not resolve ({exc}); {path.name} is unchanged",
                            "report it with the registry entry") from None
    print(f"added [agents.{name}] to {path}: {shlex.join([launch.command, *launch.args])}")
    if name in BUILTINS:
        print(f"note: it replaces how the built-in `{name}` starts; --as OTHER-NAME keeps both")
    if launch.kind == "binary":
        print(f"before the first `cru chat -a {name}`: {launch.install}")
    else:
        print(f"the first `cru chat -a {name}` downloads the {launch.fetches} (nothing is downloaded now); "
              f"to install it ahead of time: {launch.install}")
    return 0
