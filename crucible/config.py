"""config.toml (XDG path) -> pydantic models, with `{env:VAR}` interpolation.

Where things are: the config is `--config FILE`, else `$CRUCIBLE_CONFIG`, else
`$XDG_CONFIG_HOME/crucible/config.toml`; `mcps.toml` beside it adds upstream MCP servers.
Every error names the file, the dotted key and what is allowed there.
"""

from __future__ import annotations

import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from crucible.bounded_load import BoundedLoadError, load_toml
from crucible.errors import CrucibleError
from crucible.redaction import remember_secret

# Strict: TOML already has types, so "3" for an integer is a mistake worth reporting,
# not something to coerce silently.
_MODEL_CONFIG = ConfigDict(extra="forbid", strict=True)


class ConfigError(CrucibleError):
    """A config file that cannot be used: names the file, the key and what is allowed."""


class AgentProfile(BaseModel):
    model_config = _MODEL_CONFIG

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    extends: str | None = None


class IndexConfig(BaseModel):
    model_config = _MODEL_CONFIG

    url: str | None = None  # a Chroma server, e.g. http://127.0.0.1:8000; None = embedded store
    collection: str = "kiln"
    # Each chunk's word pieces kept beside the index (96 bytes each: 1.2x-1.6x the vector
    # store) and compared with the query's (crucible/kiln/late_interaction.py); false: not kept.
    word_pieces: bool = True
    # A session's build that stopped midway (the embedder down, its worker killed) is tried again
    # after this many seconds, twice as long after each that stops again (up to 30 min); 0: never
    # (`cru kiln index` embeds the rest).
    retry_secs: float = Field(default=60.0, ge=0)


class EmbedderConfig(BaseModel):
    model_config = _MODEL_CONFIG

    provider: Literal["builtin", "ollama", "openai"] = "builtin"
    model: str | None = None
    url: str | None = None
    api_key: str | None = None
    batch_size: int = 16
    # The built-in model's runtime: "auto" runs OpenVINO in bfloat16 where the CPU computes it
    # natively (avx512_bf16, AMX: about 2x onnxruntime's fp32, the same vectors to 0.9999 cosine),
    # else onnxruntime in fp32 (see crucible/kiln/embedder.py).
    runtime: Literal["auto", "onnxruntime", "openvino"] = "auto"


class DelegationConfig(BaseModel):
    model_config = _MODEL_CONFIG

    enabled: bool = True
    max_depth: int = 1
    allowed_targets: list[str] | None = None
    max_concurrent: int = 3
    result_max_bytes: int = 51200
    timeout_secs: int = 300
    queue: bool = True  # over max_concurrent: wait for a slot (true) or refuse at once (false)


class McpTransport(BaseModel):
    """How to reach an upstream MCP server: a program on stdio, or a URL (streamable HTTP / SSE)."""

    model_config = _MODEL_CONFIG

    type: Literal["stdio", "http", "sse"]
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: Path | None = Field(default=None, strict=False)
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)


class McpServerConfig(BaseModel):
    """One `[[mcp.servers]]` entry: an upstream MCP server behind every session's bridge."""

    model_config = _MODEL_CONFIG

    name: str
    prefix: str | None = None  # default "<name>_"
    transport: McpTransport
    allowed_tools: list[str] | None = None
    blocked_tools: list[str] | None = None
    auto_reconnect: bool = True
    timeout_secs: float | None = Field(default=None, strict=False)  # None: the dispatcher's 30 s
    # Values that came from `{env:VAR}` (value -> "{env:VAR}"), plus every header and env value:
    # redacted wherever the gateway shows or saves text. Filled by the loader, never from the file.
    _secrets: dict[str, str] = PrivateAttr(default_factory=dict)
    _where: str = PrivateAttr(default="")  # "FILE: [[mcp.servers]] 'NAME'" for error messages

    @property
    def secrets(self) -> dict[str, str]:
        return self._secrets

    @property
    def where(self) -> str:
        return self._where or f"[[mcp.servers]] {self.name!r}"

    @property
    def tool_prefix(self) -> str:
        return self.prefix if self.prefix is not None else f"{self.name}_"


class McpConfig(BaseModel):
    model_config = _MODEL_CONFIG

    servers: list[McpServerConfig] = Field(default_factory=list)
    # Past this many bytes of upstream tool definitions (JSON), the bridge lists discover_tools /
    # get_tool_schema / invoke_tool instead of every upstream tool. 0: always list them all.
    schema_budget_bytes: int = 0
    # How long a session's first tools/list waits for the upstreams to start (the rest arrive
    # later with notifications/tools/list_changed).
    startup_wait_secs: float = Field(default=5.0, strict=False)


class Config(BaseModel):
    model_config = _MODEL_CONFIG

    kiln: Path | None = Field(default=None, strict=False)
    default_agent: str = "claude"
    agents: dict[str, AgentProfile] = Field(default_factory=dict)
    index: IndexConfig = Field(default_factory=IndexConfig)
    embedder: EmbedderConfig = Field(default_factory=EmbedderConfig)
    permissions: dict[str, Literal["allow", "ask", "deny"]] = Field(default_factory=dict)
    delegation: DelegationConfig = Field(default_factory=DelegationConfig)
    # `[plugins] paths = [...]` (more folders to find plugins in) and `[plugins.NAME]` tables
    # (passed to the plugin's setup(); enabled, grant, memory_mb are Crucible's).
    plugins: dict[str, Any] = Field(default_factory=dict)
    mcp: McpConfig = Field(default_factory=McpConfig)
    # Where the config was loaded from (None = defaults). Never read from the file itself.
    source: Path | None = Field(default=None, exclude=True, strict=False)


# Keys that the file may not set although they are fields of the model.
_NOT_FROM_FILE = {"source"}


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def _expand(p: str | Path) -> Path:
    return Path(os.path.expanduser(str(p)))


def config_path(explicit: str | Path | None = None, env: Mapping[str, str] | None = None) -> Path:
    """`--config`, else `$CRUCIBLE_CONFIG`, else `$XDG_CONFIG_HOME/crucible/config.toml`."""
    e = _env(env)
    if explicit:
        return _expand(explicit)
    if e.get("CRUCIBLE_CONFIG"):
        return _expand(e["CRUCIBLE_CONFIG"])
    base = e.get("XDG_CONFIG_HOME") or os.path.join(e.get("HOME") or os.path.expanduser("~"), ".config")
    return _expand(base) / "crucible" / "config.toml"


def data_dir(env: Mapping[str, str] | None = None) -> Path:
    """`$XDG_DATA_HOME/crucible` (`~/.local/share/crucible`): sessions and other state."""
    e = _env(env)
    base = e.get("XDG_DATA_HOME") or os.path.join(
        e.get("HOME") or os.path.expanduser("~"), ".local", "share"
    )
    return _expand(base) / "crucible"


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """`$XDG_CACHE_HOME/crucible` (`~/.cache/crucible`): what can be rebuilt (the embedder's graph)."""
    e = _env(env)
    base = e.get("XDG_CACHE_HOME") or os.path.join(e.get("HOME") or os.path.expanduser("~"), ".cache")
    return _expand(base) / "crucible"


# ---------------------------------------------------------------------------------------------
# Loading


_ENV_REF = re.compile(r"\{env:([^}]*)\}")


def _dotted(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _interpolate(value: Any, loc: tuple[int | str, ...], env: Mapping[str, str], file: Path,
                 owner: str = "") -> Any:
    """Replace `{env:VAR}` in every string value (keys are left alone). `owner` names what the
    value belongs to in the error (an MCP server: the key alone is a list index)."""
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            name = m.group(1)
            if name not in env:
                raise ConfigError(
                    f"{file}: {owner}{_dotted(loc)} refers to the environment variable {name}, "
                    "which is not set",
                    fix=f"set {name} in the environment, or change {_dotted(loc)} in {file}",
                )
            remember_secret(env[name])  # shown or saved from now on as ***
            return env[name]

        return _ENV_REF.sub(sub, value)
    if isinstance(value, dict):
        return {k: _interpolate(v, (*loc, k), env, file, _server_owner(loc, k, v) or owner)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, (*loc, i), env, file, _server_owner(loc, i, v) or owner)
                for i, v in enumerate(value)]
    return value


def _server_owner(loc: tuple[int | str, ...], key: int | str, value: Any) -> str:
    """"[[mcp.servers]] 'NAME' " when `value` is one MCP server entry (named), else ""."""
    if isinstance(key, int) and loc[-1:] == ("servers",) and isinstance(value, dict):
        name = value.get("name")
        return f"[[mcp.servers]] {name!r}: " if isinstance(name, str) else ""
    return ""


def _unwrap_optional(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _type_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> Any:
    """The annotation reached by walking `loc` from `model` (None when it cannot be followed)."""
    tp: Any = model
    for part in loc:
        tp = _unwrap_optional(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = tp.model_fields.get(str(part))
            if field is None:
                return None
            tp = field.annotation
            continue
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if origin is dict and len(args) == 2:
            tp = args[1]
        elif origin is list and args:
            tp = args[0]
        else:
            return None
    return tp


def _describe(tp: Any) -> str:
    if tp is None:
        return "a different value"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "a table"
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    text = tp.__name__ if isinstance(tp, type) else str(tp)
    text = text.replace("typing.", "").replace("pathlib.", "")
    names = {"str": "a string", "int": "an integer", "bool": "true or false",
             "float": "a number", "Path": "a path string"}
    if text in names:
        return names[text]
    text = text.replace("dict[str, Any]", "a table").replace("Path", "str")
    return f"a value of type {text}"


def _allowed_keys(model: type[BaseModel], section: tuple[int | str, ...]) -> list[str]:
    tp = _unwrap_optional(_type_at(model, section))
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        keys = list(tp.model_fields)
        if tp is Config:
            keys = [k for k in keys if k not in _NOT_FROM_FILE]
        return keys
    return []


def _raw_at(raw: Any, loc: tuple[int | str, ...]) -> Any:
    for part in loc:
        try:
            raw = raw[part]
        except (KeyError, IndexError, TypeError):
            return None
    return raw


def _error_from_validation(
    exc: ValidationError,
    model: type[BaseModel],
    file: Path,
    prefix: tuple[int | str, ...] = (),
    raw: Any = None,
) -> ConfigError:
    lines: list[str] = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = _dotted((*prefix, *loc))
        if err["type"] == "extra_forbidden":
            section = loc[:-1]
            allowed = _allowed_keys(model, section)
            where = f"[{_dotted((*prefix, *section))}]" if (prefix or section) else "the top level"
            lines.append(
                f"unknown key {key}; allowed keys in {where}: "
                + (", ".join(allowed) if allowed else "(none)")
            )
        elif err["type"] == "missing":
            lines.append(f"{key} is required ({_describe(_type_at(model, loc))})")
        else:
            got = err.get("input")
            before = _raw_at(raw, loc)
            if isinstance(before, str) and _ENV_REF.search(before):
                # the value came from the environment: it may be a secret, so don't echo it
                got_text = f" got {type(got).__name__} from {before!r}"
            elif isinstance(got, dict):
                got_text = " got a table"
            else:
                got_text = f" got {type(got).__name__} {got!r}"
            lines.append(f"{key}: expected {_describe(_type_at(model, loc))};{got_text}")
    head = f"{file}: " + lines[0] if lines else f"{file}: invalid config"
    more = "".join(f"\n  {line}" for line in lines[1:])
    return ConfigError(head + more, fix=f"edit {file}")


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config: {e.strerror or e}",
                          fix="check the file's permissions") from e
    try:
        return load_toml(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text", fix="save the file as UTF-8") from e
    except BoundedLoadError as e:
        raise ConfigError(f"{path}: refused: {e.reason}",
                          fix=f"write {path} as plain tables and values, nested at most a few levels") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}", fix=f"fix the syntax in {path}") from e


def parse_config(raw: Mapping[str, Any], file: Path, env: Mapping[str, str] | None = None) -> Config:
    """Validate a config table already read from `file` (interpolating `{env:VAR}`)."""
    e = _env(env)
    for key in _NOT_FROM_FILE:
        if key in raw:
            allowed = _allowed_keys(Config, ())
            raise ConfigError(
                f"{file}: unknown key {key}; allowed keys in the top level: {', '.join(allowed)}",
                fix=f"remove {key} from {file}",
            )
    data = _interpolate(dict(raw), (), e, file)
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise _error_from_validation(exc, Config, file, raw=raw) from None
    if config.kiln is not None:
        kiln = _expand(config.kiln)
        if not kiln.is_absolute():
            kiln = file.parent / kiln  # relative to the config file, not to wherever cru runs
        config.kiln = kiln
    _check_plugins(config, file)
    raw_mcp = raw.get("mcp")
    _finish_mcp_servers(config.mcp.servers, raw_mcp.get("servers", []) if isinstance(raw_mcp, dict) else [],
                        file, e)
    return config


def _merge_mcps(config: Config, mcps_file: Path, env: Mapping[str, str]) -> None:
    raw = _read_toml(mcps_file)
    # mcps.toml uses the same `[[mcp.servers]]` tables as config.toml; a bare `[[servers]]` also works.
    prefix: tuple[int | str, ...]
    if "mcp" in raw:
        extra = [k for k in raw if k != "mcp"]
        if extra:
            raise ConfigError(f"{mcps_file}: unknown key {extra[0]}; allowed keys in the top level: mcp",
                              fix=f"mcps.toml holds only [[mcp.servers]] tables; move {extra[0]} to config.toml")
        section, prefix = raw["mcp"], ("mcp",)
    else:
        section, prefix = raw, ()
    data = _interpolate(section, prefix, env, mcps_file)
    try:
        extra_cfg = McpConfig.model_validate(data)
    except ValidationError as exc:
        raise _error_from_validation(exc, McpConfig, mcps_file, prefix, raw=section) from None
    _finish_mcp_servers(extra_cfg.servers, section.get("servers", []) if isinstance(section, dict) else [],
                        mcps_file, env)
    config.mcp.servers.extend(extra_cfg.servers)
    defaults = McpConfig()
    for key in ("schema_budget_bytes", "startup_wait_secs"):
        if key in section:
            if getattr(config.mcp, key) != getattr(defaults, key):
                raise ConfigError(f"{mcps_file}: mcp.{key} is set in config.toml too",
                                  fix=f"keep mcp.{key} in one of the two files")
            setattr(config.mcp, key, getattr(extra_cfg, key))


# An MCP server's name and prefix: letters, digits, `_` and `-` (agents build tool names from them).
_SERVER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,39}$")
_PREFIX = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,39}_$")
# A tool-name glob: tool-name characters plus fnmatch's `*`, `?` and `[...]` classes.
_GLOB = re.compile(r"^(?:[A-Za-z0-9_.\-/*?]|\[!?[A-Za-z0-9_.\-]+\])+$")
# Prefixes the bridge keeps for its own tools (`lua_` is the Lua plugin tools').
RESERVED_PREFIXES = ("lua_",)


def _env_refs(value: Any) -> list[str]:
    if isinstance(value, str):
        return _ENV_REF.findall(value)
    if isinstance(value, dict):
        return [n for v in value.values() for n in _env_refs(v)]
    if isinstance(value, list):
        return [n for v in value for n in _env_refs(v)]
    return []


def _finish_mcp_servers(servers: list[McpServerConfig], raw_servers: Any, file: Path,
                        env: Mapping[str, str]) -> None:
    """Check what pydantic cannot (transport fields, prefixes, globs) and note each server's
    secrets. Every error names the file, the server and the field."""
    raws = raw_servers if isinstance(raw_servers, list) else []
    for i, server in enumerate(servers):
        raw = raws[i] if i < len(raws) and isinstance(raws[i], dict) else {}
        where = f"{file}: [[mcp.servers]] {server.name!r}"
        server._where = where

        def bad(field: str, problem: str, fix: str, where: str = where) -> ConfigError:
            return ConfigError(f"{where}: {field}: {problem}", fix=fix)

        if not _SERVER_NAME.match(server.name):
            raise bad("name", f"{server.name!r} is not a usable name",
                      "use letters, digits, '_' and '-' (at most 40), starting with a letter or digit")
        prefix = server.tool_prefix
        if not _PREFIX.match(prefix):
            raise bad("prefix", f"{prefix!r} must start with a letter, hold only letters, digits, '_' and '-', "
                      "and end in '_'", f"e.g. prefix = \"{server.name.replace('-', '_')}_\"")
        if prefix.startswith(RESERVED_PREFIXES):  # `lua_bomb_` would pass its tools off as a plugin's
            reserved = next(r for r in RESERVED_PREFIXES if prefix.startswith(r))
            example = prefix[len(reserved):] or "srv_"
            raise bad("prefix", f"{prefix!r} starts with {reserved!r}, which is reserved for Crucible's Lua plugin "
                      f"tools (its tools would pass for a plugin's, and fall under a card's \"{reserved}*\" rules)",
                      f"choose a prefix that does not start with {reserved!r}, e.g. prefix = \"{example}\"")
        t = server.transport
        if t.type == "stdio":
            if not t.command:
                raise bad("transport.command", "a stdio server needs the program to run",
                          'add command = "..." (and args = [...]) under [mcp.servers.transport]')
            for key in ("url", "headers"):
                if getattr(t, key):
                    raise bad(f"transport.{key}", "only for type = \"http\" or \"sse\"",
                              f"remove {key}, or set type = \"http\"")
        else:
            if not t.url:
                raise bad("transport.url", f"a {t.type} server needs its URL", 'add url = "http://..."')
            if not re.match(r"^https?://[^/\s]+", t.url):
                shown = t.url if not _env_refs(raw.get("transport", {}).get("url")) else "(from the environment)"
                raise bad("transport.url", f"{shown} is not an http:// or https:// URL", "fix the URL")
            for key in ("command", "args", "env", "cwd"):
                if getattr(t, key):
                    raise bad(f"transport.{key}", "only for type = \"stdio\"",
                              f"remove {key}, or set type = \"stdio\"")
        for key in ("allowed_tools", "blocked_tools"):
            for pattern in getattr(server, key) or []:
                if not _GLOB.match(pattern):
                    raise bad(key, f"{pattern!r} is not a tool-name glob",
                              "use tool-name characters with * ? and [abc] (e.g. \"get_*\")")
        if server.timeout_secs is not None and not 0 < server.timeout_secs <= 3600:
            raise bad("timeout_secs", f"{server.timeout_secs:g} is out of range", "use 1 to 3600 seconds")
        secrets: dict[str, str] = {}
        for name in _env_refs(raw):
            value = env.get(name, "")
            if len(value) >= 4:  # shorter values would redact ordinary text
                secrets[value] = f"{{env:{name}}}"
        for key, value in (*t.env.items(), *t.headers.items()):
            if len(value) >= 4 and value not in secrets:
                secrets[value] = f"<{key}>"
            # `Authorization: Bearer TOKEN`: the token alone must go too.
            token = value.split(None, 1)[-1]
            if len(token) >= 8 and token not in secrets:
                secrets[token] = f"<{key}>"
        server._secrets = secrets


PLUGIN_GRANTS = ("io", "os", "require")


def _check_plugins(config: Config, file: Path) -> None:
    """`[plugins]`: `paths` is a list of folders; every other key is one plugin's table."""
    for key, value in config.plugins.items():
        if key == "paths":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{file}: plugins.paths: expected a list of folder paths",
                                  fix='e.g. paths = ["~/notes/.crucible/plugins"]')
            continue
        if not isinstance(value, dict):
            raise ConfigError(f"{file}: plugins.{key}: expected a table [plugins.{key}] (its settings), "
                              f"got {type(value).__name__}", fix=f"make it a [plugins.{key}] table")
        enabled = value.get("enabled", True)
        if not isinstance(enabled, bool):
            raise ConfigError(f"{file}: plugins.{key}.enabled: expected true or false", fix=f"edit {file}")
        grant = value.get("grant", [])
        if not isinstance(grant, list) or any(g not in PLUGIN_GRANTS for g in grant):
            raise ConfigError(f"{file}: plugins.{key}.grant: expected a list of {', '.join(PLUGIN_GRANTS)}",
                              fix=f'e.g. grant = ["io"] (each lifts part of the sandbox for {key} alone)')
        memory = value.get("memory_mb", 64)
        if not isinstance(memory, int) or isinstance(memory, bool) or not 1 <= memory <= 4096:
            raise ConfigError(f"{file}: plugins.{key}.memory_mb: expected an integer from 1 to 4096",
                              fix=f"edit {file}")


def _check_mcp_names(config: Config, files: str) -> None:
    seen: dict[str, McpServerConfig] = {}
    prefixes: dict[str, McpServerConfig] = {}
    for server in config.mcp.servers:
        if server.name in seen:
            raise ConfigError(f"{files}: two MCP servers are named {server.name!r}",
                              fix="give each [[mcp.servers]] entry a unique name")
        seen[server.name] = server
        other = prefixes.get(server.tool_prefix)
        if other is not None:
            raise ConfigError(f"{server.where}: prefix: {server.tool_prefix!r} is already the prefix of "
                              f"server {other.name!r}", fix="give each server its own prefix")
        prefixes[server.tool_prefix] = server


def load_config(explicit: str | Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Load the config; a missing default file gives the defaults, a missing named file is an error."""
    e = _env(env)
    path = config_path(explicit, e)
    named = bool(explicit) or bool(e.get("CRUCIBLE_CONFIG"))
    if path.is_file():
        config = parse_config(_read_toml(path), path, e)
        config.source = path
    elif path.exists():
        raise ConfigError(f"{path}: the config is not a file", fix="point --config at a config.toml file")
    elif named:
        how = "--config" if explicit else "$CRUCIBLE_CONFIG"
        raise ConfigError(f"{path}: no such config file (from {how})",
                          fix=f"create it, or fix {how}")
    else:
        config = Config()
    mcps = path.parent / "mcps.toml"
    if mcps.is_file():
        _merge_mcps(config, mcps, e)
        _check_mcp_names(config, f"{path} + {mcps}")
    else:
        _check_mcp_names(config, str(path))
    return config


def _too_wide_for_a_kiln(folder: Path) -> str:
    """What `folder` is when it is the home folder or the filesystem's root, else ""."""
    if folder == Path(folder.anchor):
        return "the filesystem's root"
    try:
        home = Path.home().resolve()
    except (RuntimeError, KeyError):  # no home to compare with
        return ""
    return "your home folder" if folder == home else ""


def resolve_kiln(cli_kiln: str | None, config: Config, env: Mapping[str, str] | None = None) -> Path:
    """`--kiln`, else `$CRUCIBLE_KILN`, else the config's `kiln`, else the current directory (not
    the home folder or the root: asked for by name, they are taken)."""
    e = _env(env)
    if cli_kiln:
        raw, how = _expand(cli_kiln), "--kiln"
    elif e.get("CRUCIBLE_KILN"):
        raw, how = _expand(e["CRUCIBLE_KILN"]), "$CRUCIBLE_KILN"
    elif config.kiln is not None:
        raw, how = _expand(config.kiln), f"kiln in {config.source}" if config.source else "the config's kiln"
    else:
        raw, how = Path.cwd(), "the current directory"
        where = _too_wide_for_a_kiln(raw.resolve())
        if where:
            # Never a guess that indexes every markdown file of the machine or of the person's home.
            raise CrucibleError(f"no kiln chosen, and the current folder is {where}: Crucible will not take "
                                "all of it as your notes",
                                fix="pass --kiln ~/notes (the folder of your notes), set $CRUCIBLE_KILN, or put "
                                    'kiln = "~/notes" in the config (cru doctor says where it is)')
    path = raw.resolve()
    if not path.exists():
        raise CrucibleError(
            f"the kiln folder {path} does not exist (from {how})",
            fix=f"create it (mkdir -p {path}) or choose another with --kiln DIR",
        )
    if not path.is_dir():
        raise CrucibleError(f"the kiln {path} is not a folder (from {how})",
                            fix="point --kiln at the folder that holds your notes")
    return path
