"""Finding, loading and serving the Lua plugins of a process.

Discovery, first found wins: each `$CRUCIBLE_PLUGIN_PATH` entry, the folders the config names
(`[plugins] paths = [...]`), `$XDG_CONFIG_HOME/crucible/plugins/`, and the plugins shipped
with Crucible (`crucible/plugins/builtin/`). A plugin is a `NAME.lua` file or a folder with a
`plugin.yaml` (name, version, main, description). Nothing is ever loaded from a kiln or a
project folder unless the config names that folder: cloning a repository must not run its code.

Each plugin returns its spec table; its tools are offered as `lua_<plugin>_<tool>` (unique
across plugins, and the prefix says where a tool comes from) with a JSON schema made from
`params`. `[plugins.NAME]` in the config is passed to the plugin's `setup()`; `enabled = false`
turns it off, `grant = ["io", "os", "require"]` lifts parts of the sandbox, `memory_mb` sets
its memory cap. A plugin that fails to load is kept with its reason (`cru plugins list`,
`cru doctor`); the others load.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import mcp_types as types
import trio

from crucible.plugins.runtime import (
    DEFAULT_MEMORY,
    ERROR_MAX,
    LuaPlugin,
    PluginError,
    PluginStopped,
)
from crucible.plugins.runtime import to_json as lua_to_json
from crucible.terminal import shown_path
from mcp_bridge.kiln_api import KilnError, NoteNotFoundError
from mcp_bridge.tools import ToolContext, ToolError

if TYPE_CHECKING:
    from crucible.config import Config

logger = logging.getLogger("crucible.plugins")

BUILTIN = Path(__file__).resolve().parent / "builtin"
PATH_ENV = "CRUCIBLE_PLUGIN_PATH"
TOOL_PREFIX = "lua_"
LOAD_TIMEOUT = 5.0  # seconds a plugin's main file and setup() may take
# How long a call that was stopped may take to give its runtime back; past it the plugin is
# stuck (a long C call, e.g. a pathological string pattern) and refuses calls.
STOP_GRACE = 2.0
GRANTS = frozenset({"io", "os", "require"})
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,39}$")
_PARAM_TYPES = {"string": "string", "number": "number", "integer": "integer", "boolean": "boolean",
                "array": "array", "list": "array", "object": "object", "table": "object"}
MANIFEST_MAX = 64 * 1024
MANIFEST_DEPTH = 8
SEARCH_LIMIT_MAX = 10_000  # hits crucible.search(query, limit) may ask for

PluginState = Literal["loaded", "failed", "disabled", "shadowed"]


@dataclass
class PluginInfo:
    """A plugin found on disk, loaded or not (what `cru plugins list|show` prints)."""

    name: str
    path: Path  # the .lua file or the plugin's folder
    source: str  # which search folder: "$CRUCIBLE_PLUGIN_PATH", "config", "user", "built-in"
    state: PluginState = "failed"
    reason: str | None = None
    version: str | None = None
    description: str | None = None
    main: Path | None = None
    tools: list[PluginTool] = field(default_factory=list)
    runtime: LuaPlugin | None = None
    load_seconds: float = 0.0

    def shown_path(self) -> str:
        """The path with the home folder as `~` (printed for the person, never to an agent)."""
        return shown_path(self.path)


@dataclass
class _Param:
    name: str
    type: str
    desc: str
    optional: bool


def search_folders(config: Config | None, env: Mapping[str, str] | None = None) -> list[tuple[Path, str]]:
    """The folders searched, in order, with what each is (for `cru plugins list`)."""
    e = os.environ if env is None else env
    out: list[tuple[Path, str]] = []
    for entry in (e.get(PATH_ENV) or "").split(os.pathsep):
        if entry.strip():
            folder = Path(entry).expanduser()
            out.append((folder / "plugins" if (folder / "plugins").is_dir() else folder, f"${PATH_ENV}"))
    for named in plugin_paths(config):
        out.append((named, "config"))
    base = e.get("XDG_CONFIG_HOME") or os.path.join(e.get("HOME") or os.path.expanduser("~"), ".config")
    out.append((Path(base).expanduser() / "crucible" / "plugins", "user"))
    out.append((BUILTIN, "built-in"))
    return out


def plugin_paths(config: Config | None) -> list[Path]:
    if config is None:
        return []
    paths = config.plugins.get("paths") or []
    base = config.source.parent if config.source is not None else Path.cwd()
    return [(base / Path(p).expanduser()) if not Path(p).expanduser().is_absolute() else Path(p).expanduser()
            for p in paths if isinstance(p, str)]


def settings(config: Config | None, name: str) -> dict[str, Any]:
    if config is None:
        return {}
    value = config.plugins.get(name)
    return dict(value) if isinstance(value, dict) else {}


def discover(config: Config | None, env: Mapping[str, str] | None = None) -> list[PluginInfo]:
    """Every plugin on the search path, first found of a name wins (later ones: shadowed)."""
    found: list[PluginInfo] = []
    seen: set[str] = set()
    for folder, source in search_folders(config, env):
        if not folder.is_dir():
            continue
        for entry in sorted(folder.iterdir()):
            info = _inspect(entry, source)
            if info is None:
                continue
            if info.name in seen:
                info.state, info.reason = "shadowed", "a plugin of the same name was found earlier on the path"
            elif info.reason is None and settings(config, info.name).get("enabled", True) is False:
                info.state, info.reason = "disabled", "enabled = false in the config"
            seen.add(info.name)
            found.append(info)
    return found


def _inspect(entry: Path, source: str) -> PluginInfo | None:
    if entry.name.startswith("."):
        return None
    if entry.is_file() and entry.suffix == ".lua":
        info = PluginInfo(entry.stem, entry, source, main=entry)
        if not _NAME.match(entry.stem):
            info.reason = f"{entry.name}: a plugin's name is a letter then letters, digits, '_' or '-'"
        return info
    if not entry.is_dir():
        return None
    manifest = entry / "plugin.yaml"
    info = PluginInfo(entry.name, entry, source)
    if not manifest.is_file():
        info.reason = "a plugin folder needs a plugin.yaml (name, version, main, description)"
        return info
    try:
        data = read_manifest(manifest)
    except ValueError as exc:
        info.reason = f"plugin.yaml: {exc}"
        return info
    name = data.get("name", entry.name)
    info.name = str(name)
    info.version = str(data["version"]) if data.get("version") is not None else None
    info.description = str(data["description"]) if data.get("description") is not None else None
    main = str(data.get("main") or f"{info.name}.lua")
    main_path = (entry / main).resolve()
    if not _NAME.match(info.name):
        info.reason = f"plugin.yaml: name {info.name!r}: a letter then letters, digits, '_' or '-'"
    elif not main_path.is_relative_to(entry.resolve()) or not main_path.is_file():
        info.reason = f"plugin.yaml: main {main!r} is not a Lua file inside the plugin's folder"
    else:
        info.main = main_path
    return info


def read_manifest(path: Path) -> dict[str, Any]:
    """plugin.yaml, bounded: at most 64 KiB, no anchors or aliases, nested at most 8 levels, a
    mapping at the top. Stricter than crucible.bounded_load (four plain fields need no alias);
    loaded with its bounded parser all the same."""
    # ruamel (~50 ms): a manifest is read only for a plugin folder
    from ruamel.yaml.error import YAMLError
    from ruamel.yaml.events import (
        AliasEvent,
        CollectionEndEvent,
        CollectionStartEvent,
    )

    raw = path.read_bytes()
    if len(raw) > MANIFEST_MAX:
        raise ValueError(f"larger than {MANIFEST_MAX // 1024} KiB")
    text = raw.decode("utf-8", "replace")
    from crucible.bounded_load import BoundedLoadError, bounded_yaml  # ruamel, as above

    yaml = bounded_yaml("safe")
    try:
        depth = 0
        for event in yaml.parse(text):
            if isinstance(event, AliasEvent) or getattr(event, "anchor", None):
                raise ValueError("anchors and aliases (& and *) are not allowed")
            if isinstance(event, CollectionStartEvent):
                depth += 1
                if depth > MANIFEST_DEPTH:
                    raise ValueError(f"nested more than {MANIFEST_DEPTH} levels")
            elif isinstance(event, CollectionEndEvent):
                depth -= 1
        data = yaml.load(text)
    except BoundedLoadError as exc:
        raise ValueError(str(exc)) from None
    except YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ValueError(f"not valid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise ValueError("expected a mapping (name: ..., version: ..., main: ..., description: ...)")
    return data


# --- loading ---------------------------------------------------------------------------------


def load_all(config: Config | None, env: Mapping[str, str] | None = None) -> PluginHost:
    """Discover and load every plugin (blocking: run it in a worker thread)."""
    host = PluginHost(discover(config, env))
    for info in host.plugins:
        if info.state == "failed" and info.reason is None and info.main is not None:
            _load(info, settings(config, info.name))
    host.index()
    return host


def _load(info: PluginInfo, conf: dict[str, Any]) -> None:
    started = time.perf_counter()
    grants = conf.get("grant") or []
    memory = int(conf.get("memory_mb") or DEFAULT_MEMORY // (1024 * 1024)) * 1024 * 1024
    folder = info.path if info.path.is_dir() else info.path.parent
    try:
        runtime = LuaPlugin(info.name, folder, memory=memory, grants=frozenset(g for g in grants if g in GRANTS),
                            host=_host_api(info), log=lambda text: logger.info("plugin %s: %s", info.name, text))
        info.runtime = runtime
        assert info.main is not None
        timer = threading.Timer(LOAD_TIMEOUT, runtime.stop)
        timer.start()
        try:
            with runtime.lock:
                spec = runtime.load(info.main)
                info.tools = _tools(info, spec)
                setup = spec["setup"] if _is_table(spec) else None
                if setup is not None:
                    plain = {k: v for k, v in conf.items() if k not in ("enabled", "grant", "memory_mb")}
                    runtime.call(setup, plain)
        finally:
            timer.cancel()
    except PluginStopped:
        info.reason = f"loading took more than {LOAD_TIMEOUT:g} s and was stopped"
    except PluginError as exc:
        info.reason = str(exc)
    except OSError as exc:
        info.reason = f"cannot read {info.main.name if info.main else info.path.name}: {exc.strerror or exc}"
    except UnicodeDecodeError as exc:  # its spec (a name, a key) holds text that is not UTF-8
        info.reason = (f"plugin '{info.name}': its spec holds text that is not UTF-8 (bad byte at offset "
                       f"{exc.start}); use UTF-8 text only")
    except Exception as exc:  # one plugin never takes the others (or the server) down with it
        logger.exception("plugin %s: loading failed", info.name)
        info.reason = f"plugin '{info.name}' could not be loaded: {type(exc).__name__}: {str(exc)[:ERROR_MAX]}"
    else:
        info.state, info.reason = "loaded", None
    if info.state != "loaded":
        info.tools = []
        info.runtime = None
    info.load_seconds = time.perf_counter() - started


def _is_table(value: Any) -> bool:
    from lupa import lua54  # Lua loads only when a plugin is found

    return lua54.lua_type(value) == "table"


def _tools(info: PluginInfo, spec: Any) -> list[PluginTool]:
    """The spec table's tools, checked: every problem names the plugin and the tool."""
    where = f"plugin '{info.name}'"
    if not _is_table(spec):
        raise PluginError(f"{where}: its main file must return a table "
                          "{name=..., tools={NAME={desc=..., params={...}, fn=function(args) ... end}}}")
    name = spec["name"]
    if name is not None and str(name) != info.name:
        raise PluginError(f"{where}: the spec's name {str(name)!r} differs from the plugin's name "
                          f"(the file or plugin.yaml): use {info.name!r}")
    tools = spec["tools"]
    if not _is_table(tools):
        raise PluginError(f"{where}: `tools` must be a table of NAME = {{desc=..., params=..., fn=...}}")
    out: list[PluginTool] = []
    for tool_name, tool in sorted(tools.items(), key=lambda kv: str(kv[0])):
        tool_name = str(tool_name)
        here = f"{where}, tool '{tool_name}'"
        if not _NAME.match(tool_name):
            raise PluginError(f"{here}: a tool's name is a letter then letters, digits, '_' or '-'")
        if not _is_table(tool):
            raise PluginError(f"{here}: must be a table {{desc=..., params=..., fn=...}}")
        from lupa import lua54  # Lua loads only when a plugin is found

        if lua54.lua_type(tool["fn"]) != "function":
            raise PluginError(f"{here}: `fn` must be a function(args)")
        params: list[_Param] = []
        seen: set[str] = set()
        raw_params = tool["params"]
        listed = [v for _, v in sorted(raw_params.items(), key=lambda kv: str(kv[0]).zfill(8))] \
            if _is_table(raw_params) else []
        for i, p in enumerate(listed, 1):
            if not _is_table(p) or not p["name"]:
                raise PluginError(f"{here}: params[{i}] must be {{name=..., type=..., desc=..., optional=...}}")
            param_name = str(p["name"])
            if not _NAME.match(param_name):
                raise PluginError(f"{here}: params[{i}] has the name {param_name[:60]!r}; a parameter's name is a "
                                  "letter then letters, digits, '_' or '-' (at most 40)")
            if param_name in seen:
                raise PluginError(f"{here}: two parameters are named '{param_name}'; give each its own name")
            seen.add(param_name)
            kind = str(p["type"] or "string")
            if kind not in _PARAM_TYPES:
                raise PluginError(f"{here}: param '{p['name']}' has type {kind!r}; use one of "
                                  f"{', '.join(sorted(_PARAM_TYPES))}")
            params.append(_Param(param_name, _PARAM_TYPES[kind], str(p["desc"] or ""), bool(p["optional"])))
        out.append(PluginTool(info, tool_name, str(tool["desc"] or ""), params, tool["fn"],
                              read_only=bool(tool["read_only"])))
    return out


# --- the host API ----------------------------------------------------------------------------

# The kiln of the call in progress, per plugin (set under the plugin's lock).
_CURRENT: dict[int, ToolContext] = {}


def _host_api(info: PluginInfo) -> dict[str, Any]:
    """`crucible.*` for a plugin: notes through the same kiln backend (path checks, atomic
    writes) as the MCP tools. Each returns (true, value) or (false, message)."""

    def kiln() -> Any:
        ctx = _CURRENT.get(id(info))
        if ctx is None or ctx.backend is None:
            raise KilnError("no kiln here (the host API works during a tool call on a kiln's bridge)")
        return ctx.backend

    def guarded(name: str, fn: Any) -> Any:
        def call(*args: Any) -> tuple[bool, Any]:
            try:
                value = fn(*args)
            except KilnError as exc:
                return (False, kiln_redact(str(exc)))
            except (TypeError, ValueError, OverflowError, PluginError) as exc:
                return (False, f"{name}: {str(exc)[:ERROR_MAX]}")
            except UnicodeDecodeError as exc:  # a table handed over holds text that is not UTF-8
                return (False, f"{name}: text that is not UTF-8 (bad byte at offset {exc.start}); "
                               "use UTF-8 text only")
            runtime = info.runtime
            return (True, runtime.to_lua(value) if runtime is not None else value)

        call.__name__ = fn.__name__
        return call

    def kiln_redact(text: str) -> str:
        ctx = _CURRENT.get(id(info))
        return ctx.backend.redact(text) if ctx is not None and ctx.backend is not None else text

    def _text(value: Any, what: str) -> str:
        if not isinstance(value, str):
            raise TypeError(f"{what} must be a string")
        return value

    def read_note(path: Any) -> dict[str, Any]:
        note = kiln().read_note(_text(path, "path"))
        return {"path": note.path, "content": note.text, "title": note.title, "frontmatter": note.frontmatter,
                "tags": note.tags, "links": note.links, "content_hash": note.content_hash}

    def note_exists(path: Any) -> bool:

        try:
            kiln().read_note(_text(path, "path"))
        except NoteNotFoundError:
            return False
        return True

    def list_notes(folder: Any = None) -> list[dict[str, Any]]:
        entries = kiln().list_notes("" if folder is None else _text(folder, "folder"))
        return [{"path": e.path, "size_bytes": e.size_bytes, "modified": e.modified} for e in entries]

    def search(query: Any, limit: Any = 10) -> list[dict[str, Any]]:
        if limit is None or (limit == 0 and not isinstance(limit, bool)):
            limit = 10  # as before: no limit (or 0) is 10
        if isinstance(limit, bool) or not isinstance(limit, int | float) or not math.isfinite(limit) \
                or limit != int(limit) or not 1 <= limit <= SEARCH_LIMIT_MAX:
            raise ValueError(f"limit must be a whole number from 1 to {SEARCH_LIMIT_MAX}, not {str(limit)[:40]}")
        hits = kiln().text_search(_text(query, "query"), int(limit), regex=False, case_sensitive=False)
        return [{"path": h.path, "title": h.title, "snippet": h.snippet, "score": h.score} for h in hits]

    def write_note(path: Any, content: Any, expected_hash: Any = None) -> dict[str, Any]:
        """Write a whole note (atomically). With `expected_hash` (from read_note), refuse when the
        note changed since it was read, so nothing the person wrote meanwhile is lost."""
        backend = kiln()
        if expected_hash is not None:
            current = backend.read_note(_text(path, "path")).content_hash
            if current != expected_hash:
                raise KilnError(f"'{path}' changed since it was read; nothing was written (read it again)")
        out = backend.create_note(_text(path, "path"), _text(content, "content"), None, overwrite=True)
        return {"path": out.path, "content_hash": out.content_hash, "size_bytes": out.size_bytes,
                "action": "overwritten" if out.replaced else "created"}

    def log(message: Any) -> bool:
        logger.info("plugin %s: %s", info.name, str(message)[:2000])
        return True

    def to_json(value: Any) -> str:
        return json.dumps(lua_to_json(value), ensure_ascii=False)

    api = {"read_note": read_note, "note_exists": note_exists, "list_notes": list_notes, "search": search,
           "write_note": write_note, "log": log, "json": to_json}
    return {name: guarded(name, fn) for name, fn in api.items()}


# --- tools -----------------------------------------------------------------------------------


@dataclass(eq=False)
class PluginTool:
    """A plugin's tool as the dispatcher sees it (`mcp_bridge.dispatch.Tool`)."""

    plugin: PluginInfo
    tool: str
    description: str
    params: list[_Param]
    fn: Any
    read_only: bool = False
    kind: str = "plugin"
    timeout: float | None = None  # the dispatcher's 30 s
    prepare: None = None
    _listed: types.Tool | None = None

    @property
    def name(self) -> str:
        return f"{TOOL_PREFIX}{self.plugin.name}_{self.tool}"

    def schema(self) -> dict[str, Any]:
        props = {p.name: {"type": p.type, **({"description": p.desc} if p.desc else {})} for p in self.params}
        required = [p.name for p in self.params if not p.optional]
        return {"type": "object", "properties": props, "additionalProperties": False,
                **({"required": required} if required else {})}

    def to_mcp(self) -> types.Tool:
        if self._listed is None:
            self._listed = types.Tool(
                name=self.name, description=self.description or f"{self.tool} (Lua plugin {self.plugin.name})",
                input_schema=self.schema(),
                annotations=types.ToolAnnotations(read_only_hint=self.read_only,
                                                  destructive_hint=None if self.read_only else False))
        return self._listed

    def validate(self, arguments: dict[str, Any] | None) -> dict[str, Any]:
        args = dict(arguments or {})
        known = {p.name: p for p in self.params}
        problems = []
        for name in args:
            if name not in known:
                problems.append(f"unknown argument {str(name)[:200]!r} (accepted: {', '.join(known) or 'none'})")
        for p in self.params:
            if p.name not in args or args[p.name] is None:
                if not p.optional:
                    problems.append(f"missing required argument '{p.name}': expected {_kind(p)}")
                continue
            if not _fits(p.type, args[p.name]):
                problems.append(f"argument '{p.name}': expected {_kind(p)}, got {json.dumps(args[p.name])[:60]}")
        if problems:
            raise ToolError(f"Invalid arguments for tool '{self.name}': " + "; ".join(problems))
        return args

    async def run(self, ctx: ToolContext, args: dict[str, Any]) -> types.CallToolResult:

        runtime = self.plugin.runtime
        if runtime is None:
            raise ToolError(f"plugin '{self.plugin.name}' is not loaded: {self.plugin.reason}")

        def work() -> Any:
            # One call at a time per runtime; a call that was stopped gives it back within STOP_GRACE.
            if not runtime.lock.acquire(timeout=STOP_GRACE):
                raise ToolError(f"plugin '{self.plugin.name}' is still busy with an earlier call that could not "
                                "be stopped (a long-running string operation?); try again later")
            try:
                _CURRENT[id(self.plugin)] = ctx
                try:
                    return runtime.call(self.fn, args)
                finally:
                    _CURRENT.pop(id(self.plugin), None)
            finally:
                runtime.lock.release()

        finished = False
        try:
            value = await trio.to_thread.run_sync(work, abandon_on_cancel=True)
            finished = True
        except PluginStopped:
            finished = True
            raise ToolError(f"plugin '{self.plugin.name}' was stopped") from None
        except PluginError as exc:
            finished = True
            raise ToolError(str(exc)) from None
        finally:
            if not finished:  # the time limit (or a cancel): stop the Lua side too
                runtime.stop()
        return _result(value)


def _kind(p: _Param) -> str:
    text = {"string": "a string", "number": "a number", "integer": "an integer", "boolean": "true or false",
            "array": "a list", "object": "an object"}[p.type]
    return f"{text} ({p.desc})" if p.desc else text


def _fits(kind: str, value: Any) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "array":
        return isinstance(value, list)
    return isinstance(value, dict)


def _result(value: Any) -> types.CallToolResult:
    if isinstance(value, str):
        return types.CallToolResult(content=[types.TextContent(text=value)])
    text = json.dumps(value, ensure_ascii=False)
    structured = value if isinstance(value, dict) else None
    return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=structured)


class PluginHost:
    """Every plugin of the process; the bridges' `ToolSource` for the plugin tools."""

    def __init__(self, plugins: Iterable[PluginInfo]) -> None:
        self.plugins = list(plugins)
        self._tools: dict[str, PluginTool] = {}

    def index(self) -> None:
        """The tools by name. `lua_<plugin>_<tool>` can come out the same for two plugins (`a` with
        `b_c`, `a_b` with `c`): the plugin found first (the search order) keeps its tools, the
        other is refused with the reason, so neither is silently replaced."""
        self._tools = {}
        for p in self.plugins:
            if p.state != "loaded":
                continue
            clash = next((t for t in p.tools if t.name in self._tools), None)
            if clash is not None:
                first = self._tools[clash.name]
                p.state = "failed"
                p.reason = (f"plugin '{p.name}': its tool '{clash.tool}' would be named {clash.name}, like tool "
                            f"'{first.tool}' of plugin '{first.plugin.name}' (found first, kept); rename one")
                logger.warning("plugin %s refused: %s", p.name, p.reason)
                p.tools, p.runtime = [], None
                continue
            self._tools.update((t.name, t) for t in p.tools)

    def tools(self) -> list[PluginTool]:
        return list(self._tools.values())

    def lookup(self, name: str) -> PluginTool | None:
        return self._tools.get(name)

    def get(self, name: str) -> PluginInfo | None:
        return next((p for p in self.plugins if p.name == name and p.state != "shadowed"), None)

    def failed(self) -> list[PluginInfo]:
        return [p for p in self.plugins if p.state == "failed"]
