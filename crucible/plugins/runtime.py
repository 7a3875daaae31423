"""One Lua plugin in its own sandboxed Lua 5.4 runtime (lupa).

The sandbox: the plugin's code runs with an environment table of its own holding only safe
parts of the standard library (no `io`, `debug`, `load`, `dofile`, `loadfile`; `os` only for
time and dates; `require` only for Lua files inside the plugin's own folder) plus the host
API `crucible.*` (notes through the kiln backend the MCP tools use: the same path checks and
atomic writes). The config may grant a plugin `io`, `os` or an unrestricted `require`.

Limits: the runtime's memory is capped (`max_memory`), and an instruction-count hook checks,
every `HOOK_EVERY` instructions, whether the call must stop (its time is up or it was
cancelled) and raises an error the plugin cannot catch (`pcall`, `xpcall` and coroutines
re-raise it). Calls run in a worker thread (lupa releases the GIL while Lua runs), one at a
time per plugin, so the server keeps serving while a plugin loops.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lupa import lua54

# The error value the stop hook raises; re-raised by the sandbox's pcall/xpcall/coroutines.
STOP = "__crucible_plugin_stopped__"
HOOK_EVERY = 100_000  # instructions between checks (~1 ms of a tight loop)
DEFAULT_MEMORY = 64 * 1024 * 1024
RESULT_DEPTH_MAX = 64
RESULT_ITEMS_MAX = 100_000
# The most text (bytes of strings, keys included, each time a string is referred to) a tool's
# result may hold. Lua shares one string however often a table refers to it; the conversion to
# Python copies it each time, so without a bound in bytes a 20 MiB string referred to 2000 times
# becomes 40 GB in the server while the plugin stays under its memory cap. 8 MiB is chosen a
# priori: about 2 million tokens, more than any agent's context window holds, so no useful
# result is refused; and it keeps what one call costs the server to a few copies of 8 MiB.
RESULT_BYTES_MAX = 8 * 1024 * 1024
# The longest error message a plugin's error becomes (the rest is cut): an error reaches the
# agent as the tool's result, and the person's terminal in `cru plugins list`.
ERROR_MAX = 1000
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
# "daily/daily.lua:12: message" (the chunk names we give) -> file, line, message
_LOCATION = re.compile(r"^([^:\s]+\.lua):(\d+): (.*)$", re.S)
# A position in Crucible's own Lua glue (a host function's error after a tail call): no use to anyone.
_GLUE = re.compile(r'^\[string "[^"]*"\]:\d+: ')


class PluginError(Exception):
    """A plugin failed: the message names the plugin, the file and the line when known."""


class PluginStopped(PluginError):
    """The call was stopped (its time was up, or it was cancelled)."""


class PluginMemoryError(PluginError):
    """The plugin used more memory than its cap."""


def _deny_attributes(obj: Any, name: Any, is_setting: bool) -> Any:
    # Python objects handed to Lua (the host functions) are called, never looked into:
    # `f.__globals__` and the like would lead out of the sandbox.
    raise AttributeError("Python attributes are not reachable from a plugin")


# Built in Lua, in the runtime, once: the sandbox's environment and the guarded primitives.
_SANDBOX = r"""
local STOP, should_stop, grants, host, log = ...
local raw_pcall, raw_xpcall, raw_error = pcall, xpcall, error
local co_resume, co_wrap, co_create = coroutine.resume, coroutine.wrap, coroutine.create
local unpack, pack, select, type = table.unpack, table.pack, select, type

local function rethrow_stop(ok, ...)
  if not ok and select(1, ...) == STOP then raw_error(STOP, 0) end
  return ok, ...
end

local env = {
  assert = assert, error = error, ipairs = ipairs, next = next, pairs = pairs, select = select,
  tonumber = tonumber, tostring = tostring, type = type, rawequal = rawequal, rawget = rawget,
  rawlen = rawlen, rawset = rawset, setmetatable = setmetatable, getmetatable = getmetatable,
  _VERSION = _VERSION,
  math = {}, string = {}, table = {}, utf8 = {}, coroutine = {},
  os = { time = os.time, date = os.date, clock = os.clock, difftime = os.difftime },
}
for k, v in pairs(math) do env.math[k] = v end
for k, v in pairs(string) do if k ~= "dump" then env.string[k] = v end end
-- Methods on strings (s:upper()) go through the strings' metatable: make it the sandbox's
-- string table, and take dump out of the real one too (getmetatable("").__index.dump).
string.dump = nil
getmetatable("").__index = env.string
for k, v in pairs(table) do env.table[k] = v end
for k, v in pairs(utf8) do env.utf8[k] = v end
for k, v in pairs(coroutine) do env.coroutine[k] = v end

env.pcall = function(f, ...) return rethrow_stop(raw_pcall(f, ...)) end
env.xpcall = function(f, handler, ...)
  return rethrow_stop(raw_xpcall(f, function(e) if e == STOP then return STOP end return handler(e) end, ...))
end
-- The stop hook: every so many instructions, ask whether to stop. A hook is per coroutine
-- (its Lua function is kept per thread), so every coroutine gets it too.
local sethook = debug.sethook
local hook = function() if should_stop() then raw_error(STOP, 0) end end
sethook(hook, "", %(every)d)
local function create(f)
  local co = co_create(f)
  sethook(co, hook, "", %(every)d)
  return co
end
env.coroutine.create = create
env.coroutine.resume = function(co, ...) return rethrow_stop(co_resume(co, ...)) end
env.coroutine.wrap = function(f)
  local co = create(f)
  return function(...)
    local r = pack(rethrow_stop(co_resume(co, ...)))
    if not r[1] then raw_error(r[2], 0) end
    return unpack(r, 2, r.n)
  end
end
env.print = function(...)
  local parts = {}
  for i = 1, select("#", ...) do parts[i] = tostring((select(i, ...))) end
  log(table.concat(parts, " "))
end
if grants.io then env.io = io end
if grants.os then env.os = os end

-- The host API: a Python function returns (true, value) or (false, message); the message
-- becomes a Lua error at the plugin's line.
local api = {}
local utf8_len = utf8.len
for name, fn in pairs(host) do
  api[name] = function(...)
    for i = 1, select("#", ...) do
      local a = select(i, ...)
      if type(a) == "string" then
        local ok, bad = utf8_len(a)
        if not ok then
          raw_error("crucible." .. name .. ": argument " .. i .. " is not UTF-8 text (bad byte at offset "
                    .. (bad - 1) .. ")", 2)
        end
      end
    end
    local r = pack(fn(...))
    if not r[1] then raw_error(r[2], 2) end
    return unpack(r, 2, r.n)
  end
end
env.crucible = api

return env
"""

# Called with a tool's function and its arguments: runs it and checks its result in Lua, before
# any of it is converted to Python (which copies every string it meets): at most RESULT_BYTES_MAX
# bytes of text, RESULT_ITEMS_MAX values, RESULT_DEPTH_MAX levels, and only UTF-8 text (lupa
# would fail decoding it). Returns (problem, nil) or (nil, result); runs under the stop hook.
_CHECKED_CALL = r"""
local max_bytes, max_items, max_depth = ...
local type, next, utf8_len = type, next, utf8.len
local function check(value)
  local bytes, items = 0, 0
  local function text(s, what)
    bytes = bytes + #s
    if bytes > max_bytes then return "bytes" end
    local ok, bad = utf8_len(s)
    if not ok then return "utf8 " .. what .. " " .. (bad - 1) end
  end
  local function walk(v, depth)
    local t = type(v)
    if t == "string" then return text(v, "string") end
    if t ~= "table" then return nil end
    if depth > max_depth then return "depth" end
    for k, x in next, v do
      items = items + 1
      if items > max_items then return "items" end
      if type(k) == "string" then
        local p = text(k, "key")
        if p then return p end
      end
      local p = walk(x, depth + 1)
      if p then return p end
    end
  end
  return walk(value, 0)
end
return function(fn, ...)
  local r = fn(...)
  local problem = check(r)
  if problem ~= nil then return problem, nil end
  return nil, r
end
"""


class LuaPlugin:
    """A Lua runtime for one plugin: load its main file, call its tools. Not thread-safe by
    itself: `lock` serialises every use (the host holds it around each call)."""

    def __init__(self, name: str, folder: Path, *, memory: int = DEFAULT_MEMORY,
                 grants: frozenset[str] = frozenset(), host: dict[str, Callable[..., Any]] | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.name = name
        self.folder = folder.resolve()
        self.memory = memory
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._log = log or (lambda text: None)
        self.lua = lua54.LuaRuntime(unpack_returned_tuples=True, register_eval=False, register_builtins=False,
                                    attribute_filter=_deny_attributes, max_memory=memory)
        make_env = self.lua.execute("return function(...) " + _SANDBOX.replace("%(every)d", str(HOOK_EVERY))
                                    + " end")
        grants_table = self.lua.table_from({g: True for g in grants})
        host_table = self.lua.table_from(host or {})
        self.env = make_env(STOP, self._should_stop, grants_table, host_table, self._log_line)
        self._loaded: dict[str, Any] = {}
        self.env["require"] = self._require_function(unrestricted="require" in grants)
        # JSON objects handed to the plugin carry this metatable, so an empty one comes back as {}
        # (an empty table the plugin made is a list: []).
        self._object_mt = self.lua.table()
        self._is_object = self.lua.eval("function(mt) return function(t) return getmetatable(t) == mt end end")(
            self._object_mt)
        self._setmetatable = self.lua.eval("setmetatable")
        self._checked_call = self.lua.execute("return (function(...) " + _CHECKED_CALL + " end)(...)",
                                              RESULT_BYTES_MAX, RESULT_ITEMS_MAX, RESULT_DEPTH_MAX)

    # -- stopping ----------------------------------------------------------------------------

    def _should_stop(self) -> bool:
        return self._stop.is_set()

    def stop(self) -> None:
        """Make the running call (if any) stop at its next check."""
        self._stop.set()

    def _log_line(self, text: Any) -> None:
        self._log(str(text)[:2000])

    # -- loading -------------------------------------------------------------------------------

    def _chunk_name(self, path: Path) -> str:
        """`@<plugin>/<file>`: errors name the plugin's file, never an absolute path."""
        return "@" + f"{self.name}/{path.relative_to(self.folder).as_posix()}"

    def _load_file(self, path: Path) -> Any:
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            shown = path.relative_to(self.folder).as_posix() if path.is_relative_to(self.folder) else path.name
            raise PluginError(f"plugin '{self.name}': {shown} is not UTF-8 text (bad byte at offset {exc.start}): "
                              "save it as UTF-8") from None
        load = self.lua.eval("function(text, name, env) local f, e = load(text, name, 't', env) return f, e end")
        chunk, err = load(text, self._chunk_name(path), self.env)
        if chunk is None:
            raise PluginError(self.describe_error(str(err)))
        return chunk

    def _require_function(self, *, unrestricted: bool) -> Any:
        """`require("a.b")`: `a/b.lua` inside the plugin's folder, run once with the sandbox's
        environment. A name with `..` or `/`, or a file outside the folder, is refused."""

        def require(name: Any) -> Any:
            name = str(name)
            if name in self._loaded:
                return (True, self._loaded[name])
            if not _MODULE.match(name):
                return (False, f"require({name!r}): module names are words and dots (a.b loads a/b.lua "
                               "in the plugin's folder)")
            path = (self.folder / (name.replace(".", "/") + ".lua")).resolve()
            if not unrestricted and not path.is_relative_to(self.folder):
                return (False, f"require({name!r}): only files inside the plugin's folder can be loaded")
            if not path.is_file():
                return (False, f"require({name!r}): no {name.replace('.', '/')}.lua in the plugin's folder")
            try:
                value = self._load_file(path)()
            except PluginError as exc:
                return (False, str(exc))
            self._loaded[name] = True if value is None else value
            return (True, self._loaded[name])

        wrap = self.lua.eval("function(fn) return function(name) local ok, v = fn(name) "
                             "if not ok then error(v, 2) end return v end end")
        return wrap(require)

    def load(self, main: Path) -> Any:
        """Run the plugin's main file; returns what it returned (its spec table)."""
        self._stop.clear()
        try:
            return self._load_file(main)()
        except lua54.LuaMemoryError:
            raise PluginMemoryError(f"plugin '{self.name}' used more than {self.memory // (1024 * 1024)} MiB "
                                    "while loading") from None
        except lua54.LuaError as exc:
            raise self._error(exc) from None
        except UnicodeDecodeError as exc:
            raise self._not_utf8(exc) from None

    # -- calling --------------------------------------------------------------------------------

    def call(self, fn: Any, *args: Any) -> Any:
        """Call a Lua function (already holding `lock`); Lua values come back as JSON-able Python."""
        self._stop.clear()
        try:
            # Only the first value a function returns is its result.
            problem, result = self._checked_call(fn, *[self.to_lua(a) for a in args])
            if problem is not None:
                raise PluginError(self._describe_problem(str(problem)))
            return to_json(result, is_object=self._is_object)
        except lua54.LuaMemoryError:
            raise PluginMemoryError(f"plugin '{self.name}' used more than its {self.memory // (1024 * 1024)} MiB "
                                    "of memory and was stopped") from None
        except lua54.LuaError as exc:
            raise self._error(exc) from None
        except UnicodeDecodeError as exc:  # an error message, or a host function's argument, not UTF-8
            raise self._not_utf8(exc) from None
        finally:
            self._stop.clear()
            self.lua.execute("collectgarbage()")

    def _describe_problem(self, problem: str) -> str:
        """What the result check found (`_CHECKED_CALL`), for the agent."""
        if problem == "bytes":
            return (f"plugin '{self.name}' returned more than {RESULT_BYTES_MAX // (1024 * 1024)} MiB of text; "
                    "return less, e.g. a summary or a page")
        if problem == "items":
            return (f"plugin '{self.name}' returned more than {RESULT_ITEMS_MAX} values; "
                    "return less, e.g. a summary or a page")
        if problem == "depth":
            return (f"plugin '{self.name}' returned a result nested more than {RESULT_DEPTH_MAX} levels deep "
                    "(a table refers to itself?)")
        _, what, offset = problem.split(" ")
        return (f"plugin '{self.name}' returned text that is not UTF-8 (a {what} with a bad byte at offset "
                f"{offset}); return UTF-8 text only")

    def _not_utf8(self, exc: UnicodeDecodeError) -> PluginError:
        raw = exc.object[:ERROR_MAX * 4] if isinstance(exc.object, bytes | bytearray) else b""
        text = bytes(raw).decode("utf-8", "replace")
        if _LOCATION.match(text.split("\n", 1)[0]):  # an error message: keep its file and line
            return PluginError(self.describe_error(text))
        return PluginError(f"plugin '{self.name}' failed: it passed text that is not UTF-8 (bad byte at offset "
                           f"{exc.start}) to Crucible; use UTF-8 text only")

    def _error(self, exc: BaseException) -> PluginError:
        text = str(exc.args[0]) if exc.args else str(exc)
        first_line = text.split("\n", 1)[0]
        if text.startswith(STOP) or STOP in first_line:
            return PluginStopped(f"plugin '{self.name}' was stopped")
        return PluginError(self.describe_error(text))

    def describe_error(self, text: str) -> str:
        """A Lua error as one bounded message: the plugin, its file and line when known."""
        first = ("\n" + text).split("\nstack traceback:", 1)[0].strip()
        first = _GLUE.sub("", first, count=1)
        m = _LOCATION.match(first)
        where = ""
        if m:
            where = f" in {m.group(1).split('/', 1)[-1]} line {m.group(2)}"
            first = m.group(3).strip()
        if not first:
            first = "error() was given no message (a table or nil?); give it a string: error(\"what went wrong\")"
        if len(first) > ERROR_MAX:
            first = first[:ERROR_MAX] + f" [… {len(first) - ERROR_MAX} more characters cut]"
        return f"plugin '{self.name}' failed{where}: {first}"

    def to_lua(self, value: Any) -> Any:
        """JSON (arguments, config) as Lua values: objects and arrays become tables."""
        if isinstance(value, dict):
            table = self.lua.table_from({str(k): self.to_lua(v) for k, v in value.items() if v is not None})
            return self._setmetatable(table, self._object_mt)
        if isinstance(value, list | tuple):
            return self.lua.table_from([self.to_lua(v) for v in value])
        return value


def to_json(value: Any, depth: int = 0, budget: list[int] | None = None,
            is_object: Callable[[Any], bool] | None = None) -> Any:
    """A Lua value as JSON: a table with keys 1..n (holes allowed, as null) is an array, any
    other table an object (keys as strings); an empty table is [] unless it came in as a JSON
    object ({}); functions and other userdata are refused; numbers that are not finite become null.
    Bounded as it goes: at most RESULT_ITEMS_MAX values and RESULT_BYTES_MAX characters of text
    (counted each time a string is met), so a shared string cannot be copied without end."""
    budget = budget if budget is not None else [RESULT_ITEMS_MAX, RESULT_BYTES_MAX]
    if depth > RESULT_DEPTH_MAX:
        raise PluginError(f"the result is nested more than {RESULT_DEPTH_MAX} levels deep (a table refers to itself?)")
    if isinstance(value, str):
        _spend_text(budget, len(value))
        return value
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, bytes):
        _spend_text(budget, len(value))
        return value.decode("utf-8", "replace")
    if lua54.lua_type(value) == "table":
        items: list[tuple[Any, Any]] = []
        # One pair at a time (lupa copies each string as it hands it over): stop at the bound.
        for k, v in value.items():
            budget[0] -= 1
            if budget[0] < 0:
                raise PluginError(f"the result holds more than {RESULT_ITEMS_MAX} values")
            for part in (k, v):
                if isinstance(part, str | bytes):
                    _spend_text(budget, len(part))
            items.append((k, v))
        keys = [k for k, _ in items]
        if not keys:
            return {} if is_object is not None and is_object(value) else []

        def convert(v: Any) -> Any:  # strings were counted above
            return v if isinstance(v, str) else to_json(v, depth + 1, budget, is_object)

        if all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in keys):
            n = max(keys)
            if n <= 2 * len(keys):
                out: list[Any] = [None] * n
                for k, v in items:
                    out[k - 1] = convert(v)
                return out
        return {_key(k): convert(v) for k, v in items}
    kind = lua54.lua_type(value) or type(value).__name__
    raise PluginError(f"a {kind} cannot be part of a tool's result (return tables, strings, numbers, booleans)")


def _spend_text(budget: list[int], size: int) -> None:
    budget[1] -= size
    if budget[1] < 0:
        raise PluginError(f"the result holds more than {RESULT_BYTES_MAX // (1024 * 1024)} MiB of text; "
                          "return less, e.g. a summary or a page")


def _key(key: Any) -> str:
    if isinstance(key, float) and key.is_integer():
        return str(int(key))
    return key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
