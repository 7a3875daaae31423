"""Which ACP agent to run, and how: built-in agents, discovery on PATH, config profiles.

Built-ins (`BUILTINS`): claude (`claude-agent-acp`, else `npx -y @agentclientprotocol/claude-agent-acp`),
opencode (`opencode acp`), gemini (`gemini --acp`), codex (`codex-acp`, else
`npx -y @agentclientprotocol/codex-acp`).

Profiles come from the host's config as a mapping name -> profile, where a profile is a dict
or any object with `command`, `args`, `env`, `extends` (a pydantic model works: only the
fields it was given count as set). Resolution rules:

* `extends` names another profile or a built-in; every field the profile sets replaces the
  base's (`command`, `args`), except `env`, which is merged over the base's.
* A profile named like a built-in without `extends` extends that built-in, and
  `extends = "<its own name>"` means the built-in too (so `[agents.claude] env = {...}` works).
* A loop (`a -> b -> a`) is an error naming the chain.
* `--agent-command "CMD ARGS"` (split like a shell would) runs any ACP agent.

This module knows nothing of Crucible; errors are `AgentRegistryError(message, fix)`.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "BUILTINS",
    "DISTRIBUTION_KINDS",
    "REGISTRY_URL",
    "AgentRegistryError",
    "AgentSpec",
    "BuiltinAgent",
    "ProfileLike",
    "Profiles",
    "RegistryAgent",
    "RegistryLaunch",
    "auth_hint",
    "current_platform",
    "fetch_on_run",
    "install_hint",
    "known_names",
    "parse_registry",
    "program_name",
    "registry_launches",
    "resolve_agent",
]


class AgentRegistryError(Exception):
    """An agent name or profile that cannot be resolved, with what to do about it."""

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix


class ProfileLike(Protocol):
    """What a profile object offers (read-only, so a config model with `args: list[str]` fits)."""

    @property
    def command(self) -> str | None: ...
    @property
    def args(self) -> Sequence[str] | None: ...
    @property
    def env(self) -> Mapping[str, str] | None: ...
    @property
    def extends(self) -> str | None: ...


Profiles = Mapping[str, ProfileLike | Mapping[str, Any]]


@dataclass(frozen=True)
class AgentSpec:
    """How to launch one agent. `source` says where it came from, for `cru agents` and errors."""

    name: str
    command: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    source: str = ""
    # False when the command was not found (a built-in missing from PATH with no npx fallback).
    found: bool = True

    @property
    def argv(self) -> list[str]:
        return [self.command, *self.args]

    def display(self) -> str:
        return shlex.join(self.argv)


@dataclass(frozen=True)
class BuiltinAgent:
    name: str
    executable: str
    args: tuple[str, ...]
    npm_package: str
    npx_fallback: bool
    auth: str


# The adapters' npm packages moved from @zed-industries to @agentclientprotocol; the old names
# stay on npm at old versions (claude-agent-acp 0.23.1 answers the prompt after a cancel with
# the cancelled turn's stale end, then stays one answer behind: claude-agent-acp#551).
BUILTINS: dict[str, BuiltinAgent] = {
    b.name: b
    for b in (
        BuiltinAgent("claude", "claude-agent-acp", (), "@agentclientprotocol/claude-agent-acp", True,
                     "run `claude /login` (the Claude Code CLI: npm install -g @anthropic-ai/claude-code), "
                     "or set ANTHROPIC_API_KEY"),
        BuiltinAgent("opencode", "opencode", ("acp",), "opencode-ai", False,
                     "run `opencode auth login`"),
        BuiltinAgent("gemini", "gemini", ("--acp",), "@google/gemini-cli", False,
                     "set GEMINI_API_KEY (a key from https://aistudio.google.com/apikey), "
                     "or run `gemini` once and log in with Google"),
        BuiltinAgent("codex", "codex-acp", (), "@agentclientprotocol/codex-acp", True,
                     "run `codex login`, or set OPENAI_API_KEY"),
    )
}

# Package runners that download the package they run when it is not in their cache: running
# such a command can mean hundreds of MB from a registry, so inspecting it (`cru doctor`,
# `cru agents`) must not run it. runner -> the registry it fetches from.
_PACKAGE_RUNNERS = {"npx": "npm", "bunx": "npm", "pnpx": "npm", "uvx": "PyPI"}
# Options of those runners that take a value (so the value is not mistaken for the package).
_RUNNER_VALUE_OPTIONS = {"-p", "--package", "--from", "--with", "--python", "--index", "--index-url",
                         "-c", "--call", "--registry", "--cache", "--userconfig"}


def fetch_on_run(argv: Sequence[str]) -> str | None:
    """What running `argv` would download first, e.g. "npm package @scope/pkg", when argv is a
    package runner (npx, bunx, pnpx, uvx); None for a plain command."""
    if not argv:
        return None
    runner = Path(argv[0]).name
    if runner not in _PACKAGE_RUNNERS:
        return None
    args = list(argv[1:])
    package: str | None = None
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-p", "--package", "--from") and i + 1 < len(args):
            package = args[i + 1]
            break
        if a.startswith(("--package=", "--from=")):
            package = a.split("=", 1)[1]
            break
        if a in _RUNNER_VALUE_OPTIONS:
            i += 2
            continue
        if a.startswith("-"):
            i += 1
            continue
        package = a
        break
    return f"{_PACKAGE_RUNNERS[runner]} package {package or '(unknown)'}"


# Where npm, bun and the agents' own installers put executables; a host started from a
# desktop launcher often has a PATH without them (then installed agents look missing).
_EXTRA_BIN_DIRS = ("~/.local/bin", "~/.npm-global/bin", "~/.bun/bin", "~/.opencode/bin",
                   "~/.volta/bin", "/usr/local/bin", "/opt/homebrew/bin")


def known_names(profiles: Profiles | None = None) -> list[str]:
    """Built-in names first, then the profiles' own names."""
    return [*BUILTINS, *sorted(n for n in (profiles or {}) if n not in BUILTINS)]


# Agent builds, by the name they give at initialize, with a defect a person meets in use.
_KNOWN_DEFECTS: dict[str, str] = {
    # Stuck at 0.23.1 since the package moved; seen by hand in `cru chat` and through acpx.
    "@zed-industries/claude-agent-acp": (
        "after a cancelled turn every answer comes one prompt late (claude-agent-acp#551, fixed in the "
        "package's new name): npm install -g @agentclientprotocol/claude-agent-acp"),
}


def known_defect(agent_info: Any) -> str | None:
    """The known defect of the agent build that said `agent_info` (ACP's Implementation) at
    initialize, with the update that has it fixed; None for any other."""
    return _KNOWN_DEFECTS.get(str(getattr(agent_info, "name", "")))


def install_hint(name: str) -> str:
    """The command that installs agent `name`, or how to run an agent Crucible does not know."""
    b = BUILTINS.get(name)
    if b is None:
        return ("install the agent and give its command in a profile ([agents.NAME] command = ...) "
                "or with --agent-command \"CMD ARGS\"")
    return f"npm install -g {b.npm_package}"


def auth_hint(name: str) -> str:
    """How to log agent `name` in (for an "Authentication required" answer)."""
    b = BUILTINS.get(name)
    return b.auth if b else f"log in to {name} the way its documentation says, then try again"


def _which(executable: str, path: str | None) -> str | None:
    found = shutil.which(executable, path=path)
    if found is None and path is None:
        extra = os.pathsep.join(str(Path(d).expanduser()) for d in _EXTRA_BIN_DIRS)
        found = shutil.which(executable, path=extra)
    return found


def _builtin_spec(b: BuiltinAgent, path: str | None) -> AgentSpec:
    if exe := _which(b.executable, path):
        return AgentSpec(b.name, exe, list(b.args), {}, f"built-in: {exe}")
    if b.npx_fallback and (npx := _which("npx", path)):
        return AgentSpec(b.name, npx, ["-y", b.npm_package, *b.args], {},
                         f"built-in via npx ({b.executable} is not on PATH)")
    return AgentSpec(b.name, b.executable, list(b.args), {},
                     f"built-in ({b.executable} is not on PATH)", found=False)


def _get(profile: Any, key: str) -> tuple[bool, Any]:
    """(was it set, value) for a dict or an object profile; a pydantic model's defaults do not
    count as set."""
    if isinstance(profile, Mapping):
        return (key in profile and profile[key] is not None), profile.get(key)
    value = getattr(profile, key, None)
    fields_set = getattr(profile, "model_fields_set", None)
    if isinstance(fields_set, (set, frozenset)):
        return (key in fields_set and value is not None), value
    return value is not None, value


def _check_profile(name: str, profile: Any) -> tuple[str | None, list[str] | None, dict[str, str], str | None]:
    has_cmd, command = _get(profile, "command")
    has_args, args = _get(profile, "args")
    _, env = _get(profile, "env")
    has_ext, extends = _get(profile, "extends")
    where = f"[agents.{name}]"
    if has_cmd and (not isinstance(command, str) or not command.strip()):
        raise AgentRegistryError(f"{where} command must be a non-empty string", 'command = "my-agent"')
    if has_args and (not isinstance(args, (list, tuple)) or not all(isinstance(a, str) for a in args)):
        raise AgentRegistryError(f"{where} args must be a list of strings", 'args = ["--acp"]')
    if env is not None and (not isinstance(env, Mapping)
                            or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise AgentRegistryError(f"{where} env must be a table of strings", 'env = { KEY = "value" }')
    if has_ext and not isinstance(extends, str):
        raise AgentRegistryError(f"{where} extends must be an agent name", 'extends = "claude"')
    return (command if has_cmd else None, list(args) if has_args else None, dict(env or {}),
            extends if has_ext else None)


def _resolve(name: str, profiles: Profiles, path: str | None, chain: list[str]) -> AgentSpec:
    if name not in profiles:
        if name in BUILTINS:
            return _builtin_spec(BUILTINS[name], path)
        if chain:
            raise AgentRegistryError(
                f"[agents.{chain[-1]}] extends {name!r}, which is neither a built-in agent nor a profile",
                f"use one of: {', '.join(known_names(profiles))}")
        raise AgentRegistryError(
            f"unknown agent {name!r}; known agents: {', '.join(known_names(profiles))}",
            f"pass one of those, add an [agents.{name}] profile to the config, "
            "or run any ACP agent with --agent-command \"CMD ARGS\"")
    if name in chain:
        loop = " -> ".join([*chain[chain.index(name):], name])
        raise AgentRegistryError(f"agent profiles extend each other in a loop: {loop}",
                                 "remove `extends` from one of these profiles")
    command, args, env, extends = _check_profile(name, profiles[name])
    if extends is None and name in BUILTINS:
        extends = name  # a profile named like a built-in refines it
    if extends is None:
        if command is None:
            raise AgentRegistryError(f"[agents.{name}] has neither command nor extends",
                                     f'set command = "..." or extends = "claude" under [agents.{name}]')
        return AgentSpec(name, command, args or [], env, f"profile {name}")
    if extends == name:
        if name not in BUILTINS:
            raise AgentRegistryError(f"agent profiles extend each other in a loop: {name} -> {name}",
                                     f"remove `extends` from [agents.{name}]")
        base = _builtin_spec(BUILTINS[name], path)
    else:
        base = _resolve(extends, profiles, path, [*chain, name])
    return AgentSpec(
        name,
        command if command is not None else base.command,
        args if args is not None else list(base.args),
        {**base.env, **env},
        f"profile {name} (extends {base.name}: {base.source})",
        found=base.found if command is None else True,
    )


# Programs that run another program (the one that speaks ACP), and their options that take a value.
_LAUNCHERS: dict[str, frozenset[str]] = {
    "env": frozenset({"-u", "--unset", "-C", "--chdir", "-S"}),
    "node": frozenset({"-r", "--require", "--import", "--loader", "-e", "--eval"}),
    "bun": frozenset(), "deno": frozenset(), "tsx": frozenset(), "ts-node": frozenset(),
    "npx": frozenset({"-p", "--package", "-c", "--call"}), "bunx": frozenset({"-p", "--package"}),
    "pnpx": frozenset(), "pnpm": frozenset(), "yarn": frozenset(), "uvx": frozenset({"--from", "--with"}),
    "uv": frozenset({"--with", "--project", "--directory", "--python", "-p"}),
    "python": frozenset({"-W", "-X", "-c"}), "pypy3": frozenset({"-W", "-X"}),
    "sh": frozenset(), "bash": frozenset(), "exec": frozenset(),
}
# Words of a launcher's command line that are not the program (`npx exec`, `uv run`, `deno run`).
_SUBCOMMANDS = frozenset({"exec", "run", "dlx", "x", "tool"})
# File names that say nothing of the program: its folder names it (`claude-agent-acp/dist/index.js`).
_GENERIC_FILES = frozenset({"index", "main", "cli", "__main__", "bin", "run", "start", "server", "agent"})
_GENERIC_DIRS = frozenset({"dist", "bin", "build", "lib", "src", "bundle", "out", "node_modules", "scripts"})


def _launcher(word: str) -> str | None:
    base = Path(word).name
    for suffix in (".exe", ".cmd"):
        base = base.removesuffix(suffix)
    if base.startswith("python"):
        return "python"
    return base if base in _LAUNCHERS else None


def program_name(argv: Sequence[str]) -> str:
    """A name for the agent `argv` runs: the program that speaks ACP, not its interpreter
    (`python3 agents/my_agent.py` → my_agent, `npx -y @zed-industries/claude-agent-acp` →
    claude-agent-acp, `node .../gemini-cli/bundle/gemini.js` → gemini)."""
    words = list(argv)
    i = 0
    while i < len(words):
        launcher = _launcher(words[i])
        if launcher is None:
            break
        i += 1
        while i < len(words):
            word = words[i]
            if word == "-m" and launcher == "python" and i + 1 < len(words):
                return words[i + 1]
            if word in _LAUNCHERS[launcher]:
                i += 2
            elif word.startswith("-") or (launcher == "env" and "=" in word) or word in _SUBCOMMANDS:
                i += 1
            else:
                break
    if i >= len(words):
        return Path(words[0]).name if words else "agent"
    target = words[i]
    if target.startswith("@") or ("/" not in target and "@" in target[1:]):  # an npm package, maybe @version
        return target.rsplit("/", 1)[-1].split("@", 1)[0] or target
    path = Path(target)
    name = path.stem if path.suffix in (".py", ".js", ".mjs", ".cjs", ".ts", ".exe", ".sh") else path.name
    if name in _GENERIC_FILES:
        for parent in reversed(path.parent.parts):
            if parent not in _GENERIC_DIRS and parent not in ("/", ".", ".."):
                return parent
    return name


def resolve_agent(
    name: str | None,
    *,
    agent_command: str | None = None,
    profiles: Profiles | None = None,
    path: str | None = None,
) -> AgentSpec:
    """The launch spec for agent `name` (a built-in or a profile), or for `agent_command`.

    `path` is the PATH to search (default: the process's, plus the usual install dirs).
    Raises AgentRegistryError with a fix for unknown names, bad profiles and loops.
    """
    profiles = profiles or {}
    if agent_command is not None:
        try:
            argv = shlex.split(agent_command)
        except ValueError as e:
            raise AgentRegistryError(f"cannot split --agent-command {agent_command!r}: {e}",
                                     'quote it like a shell command: --agent-command "my-agent --acp"') from None
        if not argv:
            raise AgentRegistryError("--agent-command is empty", '--agent-command "my-agent --acp"')
        spec_name = name or program_name(argv)
        return AgentSpec(spec_name, argv[0], argv[1:], {}, "--agent-command")
    if not name:
        raise AgentRegistryError("no agent given", f"pass -a with one of: {', '.join(known_names(profiles))}")
    return _resolve(name, profiles, path, [])


# ---------------------------------------------------------------------------------------------
# The ACP agent registry (agentclientprotocol/registry): agents an editor or host can install.
# A registry file is {"version", "agents": [agent, ...], "extensions": [...]}; an agent is
# {"id", "name", "version", "description", "distribution": {"npx"|"uvx": {"package", "args",
# "env", "cmd"?}, "binary": {PLATFORM: {"archive", "cmd", "args", "env"}}}, ...}. A single
# agent.json is read as a registry of one.

REGISTRY_URL = "https://cdn.agentclientprotocol.com/registry/v1/latest/registry.json"
DISTRIBUTION_KINDS = ("npx", "uvx", "binary")


@dataclass(frozen=True)
class RegistryAgent:
    id: str
    name: str
    version: str
    description: str
    distribution: Mapping[str, Any]
    repository: str | None = None


@dataclass(frozen=True)
class RegistryLaunch:
    """How to run a registry agent through one of its distributions, and what that costs."""

    kind: str  # "npx" | "uvx" | "binary"
    command: str
    args: list[str]
    env: dict[str, str]
    fetches: str  # what the first run (or the person, for a binary) downloads
    install: str  # how to install it ahead of time


def _strings(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise AgentRegistryError(f"{where} must be a list of strings")
    return list(value)


def _env(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in value.items()):
        raise AgentRegistryError(f"{where} must be an object of strings")
    return dict(value)


def parse_registry(data: Any, source: str = "the registry") -> list[RegistryAgent]:
    """The agents of a registry document (or of one agent.json); AgentRegistryError naming the
    first entry that is not in the registry's format."""
    if isinstance(data, Mapping) and "id" in data and "agents" not in data:
        entries: Any = [data]
    elif isinstance(data, Mapping) and isinstance(data.get("agents"), list):
        entries = data["agents"]
    else:
        raise AgentRegistryError(f"{source} is not an ACP registry (no \"agents\" list, no agent \"id\")",
                                 f"give a registry.json or an agent.json (the official one: {REGISTRY_URL})")
    agents: list[RegistryAgent] = []
    for i, entry in enumerate(entries):
        where = f"{source}: agents[{i}]"
        if not isinstance(entry, Mapping):
            raise AgentRegistryError(f"{where} is not an object")
        missing = [k for k in ("id", "name", "version", "description", "distribution") if k not in entry]
        if missing:
            raise AgentRegistryError(f"{where} lacks {', '.join(missing)}")
        for key in ("id", "name", "version", "description"):
            if not isinstance(entry[key], str) or not entry[key]:
                raise AgentRegistryError(f"{where}.{key} must be a non-empty string")
        dist = entry["distribution"]
        if not isinstance(dist, Mapping) or not dist or any(k not in DISTRIBUTION_KINDS for k in dist):
            raise AgentRegistryError(f"{where} ({entry['id']}): distribution must hold npx, uvx or binary")
        repo = entry.get("repository")
        agents.append(RegistryAgent(entry["id"], entry["name"], entry["version"], entry["description"],
                                    dist, repo if isinstance(repo, str) else None))
    return agents


def current_platform() -> str:
    """This machine in the registry's platform names (linux-x86_64, darwin-aarch64, …)."""
    import platform  # only the registry listing asks which machine this is

    system = {"linux": "linux", "darwin": "darwin", "win32": "windows"}.get(sys.platform, sys.platform)
    machine = platform.machine().lower()
    arch = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    return f"{system}-{arch}"


def registry_launches(agent: RegistryAgent, platform: str | None = None) -> list[RegistryLaunch]:
    """Every way to run `agent` here, in the registry's order of preference (npx, uvx, binary
    for this platform)."""
    launches: list[RegistryLaunch] = []
    where = f"{agent.id}: distribution"
    dist = agent.distribution
    for kind in ("npx", "uvx"):
        spec = dist.get(kind)
        if spec is None:
            continue
        if not isinstance(spec, Mapping) or not isinstance(spec.get("package"), str) or not spec["package"]:
            raise AgentRegistryError(f"{where}.{kind} needs a \"package\"")
        package = spec["package"]
        args = _strings(spec.get("args"), f"{where}.{kind}.args")
        env = _env(spec.get("env"), f"{where}.{kind}.env")
        cmd = spec.get("cmd") if isinstance(spec.get("cmd"), str) else None
        if kind == "npx":
            argv = ["-y", "--package", package, cmd, *args] if cmd else ["-y", package, *args]
            launches.append(RegistryLaunch("npx", "npx", argv, env, f"npm package {package}",
                                           f"npm install -g {package}"))
        else:
            argv = ["--from", package, cmd, *args] if cmd else [package, *args]
            launches.append(RegistryLaunch("uvx", "uvx", argv, env, f"PyPI package {package}",
                                           f"uv tool install {package}"))
    binary = dist.get("binary")
    if isinstance(binary, Mapping):
        target = binary.get(platform or current_platform())
        if isinstance(target, Mapping) and isinstance(target.get("archive"), str) \
                and isinstance(target.get("cmd"), str):
            exe = Path(target["cmd"]).name
            launches.append(RegistryLaunch(
                "binary", exe, _strings(target.get("args"), f"{where}.binary.args"),
                _env(target.get("env"), f"{where}.binary.env"), f"archive {target['archive']}",
                f"download {target['archive']}, unpack it and put {exe} on your PATH "
                "(or set the profile's command to its full path)"))
    return launches
