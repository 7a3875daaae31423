"""Plugin tools through a bridge (the one dispatcher), real Lua: schemas, results, errors with
their line, the time limit and memory cap while other calls are served, the sandbox."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import trio
from conftest import SECRET, bridge_for, host_for, texts, write_plugin
from mcp.client.client import Client

from crucible.permissions import PermissionPolicy, ToolKey

PROBE = """
return { name = "probe", tools = {
  echo = { desc = "Echo the arguments back", read_only = true,
    params = { { name = "value", type = "object", desc = "anything" },
               { name = "note", type = "string", desc = "a word", optional = true },
               { name = "count", type = "integer", desc = "how many", optional = true } },
    fn = function(args) return { value = args.value, note = args.note, count = args.count } end },
  shapes = { desc = "Lua values as JSON", read_only = true, params = {},
    fn = function() return { list = { 1, 2.5, "three", true }, holes = { 1, nil, 3 }, empty = {},
      nested = { a = { b = { c = "deep" } } }, int = 7, float = 0.1, big = 2^53, unicode = "é ✓",
      huge = math.huge } end },
  boom = { desc = "fails on line 13", params = {}, fn = function()
    local t = nil
    return t.field
  end },
  raise = { desc = "error() with a message", params = {}, fn = function() error("the file is missing") end },
  loop = { desc = "never ends", params = {}, fn = function() while true do end end },
  sneaky = { desc = "never ends, catching errors", params = {}, fn = function()
    while true do pcall(function() while true do end end) end end },
  hog = { desc = "allocates forever", params = {}, fn = function()
    local t = {} ; local i = 0
    while true do i = i + 1 ; t[i] = string.rep("x", 1000) .. i end end },
  ping = { desc = "answers at once", read_only = true, params = {}, fn = function() return "pong" end },
  escapes = { desc = "what is within reach", read_only = true, params = {}, fn = function()
    return { os_execute = type(os.execute), io = type(io), popen = io and type(io.popen) or "nil",
             debug = type(debug), load = type(load), loadfile = type(loadfile), dofile = type(dofile),
             dump = type(string.dump), python = type(python), package = type(package),
             getenv = type(os.getenv) } end },
  require_outside = { desc = "require a file outside", params = {{ name = "name", type = "string" }},
    fn = function(args) return require(args.name) end },
  read = { desc = "read a note through the host API", params = {{ name = "path", type = "string" }},
    fn = function(args) return crucible.read_note(args.path).content end },
  write = { desc = "write a note through the host API",
    params = {{ name = "path", type = "string" }, { name = "content", type = "string" }},
    fn = function(args) return crucible.write_note(args.path, args.content) end },
  peek = { desc = "look into a host function", params = {}, fn = function()
    return tostring(crucible.log.__globals) end },
} }
"""


def probe_host(tmp_path: Path, env: dict[str, str], config: str = "") -> Any:
    write_plugin(Path(env["CRUCIBLE_PLUGIN_PATH"]), "probe", PROBE)
    return host_for(tmp_path, env, config)


async def test_params_become_a_json_schema_and_are_checked(tmp_path: Path, env: dict[str, str], kiln: Path) -> None:
    async with Client(bridge_for(kiln, probe_host(tmp_path, env)).server, mode="legacy") as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        assert {"lua_probe_echo", "lua_daily_today", "lua_tasks_next_task", "read_note"} <= set(tools)
        assert tools["lua_probe_echo"].input_schema == {
            "type": "object", "additionalProperties": False, "required": ["value"], "properties": {
                "value": {"type": "object", "description": "anything"},
                "note": {"type": "string", "description": "a word"},
                "count": {"type": "integer", "description": "how many"}}}
        annotations = tools["lua_probe_echo"].annotations
        assert annotations is not None and annotations.read_only_hint is True
        r = await c.call_tool("lua_probe_echo", {"note": 3, "colour": "red"})
        assert r.is_error
        assert texts(r) == ("Invalid arguments for tool 'lua_probe_echo': unknown argument 'colour' (accepted: value, "
                            "note, count); missing required argument 'value': expected an object (anything); "
                            "argument 'note': expected a string (a word), got 3")


async def test_tables_and_json_round_trip(tmp_path: Path, env: dict[str, str], kiln: Path) -> None:
    value = {"nested": {"list": [1, 2, {"x": [True, False]}], "empty_list": [], "empty_object": {}},
             "number": 1.5, "int": 42, "text": "naïve ✓", "null": None}
    async with Client(bridge_for(kiln, probe_host(tmp_path, env)).server, mode="legacy") as c:
        r = await c.call_tool("lua_probe_echo", {"value": value, "note": "hi", "count": 2})
        assert not r.is_error, texts(r)
        back = json.loads(texts(r))
        assert r.structured_content == back
        expected = {k: v for k, v in value.items() if v is not None}  # nil is absence in Lua
        assert back == {"value": expected, "note": "hi", "count": 2}
        r = await c.call_tool("lua_probe_shapes", {})
        shapes = json.loads(texts(r))
        assert shapes == {"list": [1, 2.5, "three", True], "holes": [1, None, 3], "empty": [],
                          "nested": {"a": {"b": {"c": "deep"}}}, "int": 7, "float": 0.1,
                          "big": 9007199254740992.0, "unicode": "é ✓", "huge": None}


async def test_lua_errors_name_plugin_file_and_line(tmp_path: Path, env: dict[str, str], kiln: Path) -> None:
    async with Client(bridge_for(kiln, probe_host(tmp_path, env)).server, mode="legacy") as c:
        r = await c.call_tool("lua_probe_boom", {})
        assert r.is_error and texts(r) == (
            "plugin 'probe' failed in probe.lua line 13: attempt to index a nil value (local 't')")
        r = await c.call_tool("lua_probe_raise", {})
        assert texts(r) == "plugin 'probe' failed in probe.lua line 15: the file is missing"
        r = await c.call_tool("lua_probe_ping", {})  # the server and the plugin go on
        assert texts(r) == "pong"


async def test_runaway_and_memory_hog_stop_at_their_limits_while_other_calls_are_served(
        tmp_path: Path, env: dict[str, str], kiln: Path) -> None:
    host = probe_host(tmp_path, env, "[plugins.probe]\nmemory_mb = 16\n")
    async with Client(bridge_for(kiln, host, tool_timeout=1.5).server, mode="legacy") as c:
        for tool in ("lua_probe_loop", "lua_probe_sneaky"):
            others: list[float] = []
            outcome: dict[str, Any] = {}

            async def runaway(tool: str = tool, outcome: dict[str, Any] = outcome) -> None:
                outcome["result"] = await c.call_tool(tool, {})

            async with trio.open_nursery() as nursery:
                nursery.start_soon(runaway)
                await trio.sleep(0.2)  # the loop is running now
                for name, args in (("get_kiln_info", {}), ("lua_daily_today", {})):
                    started = time.monotonic()
                    r = await c.call_tool(name, args)
                    others.append(time.monotonic() - started)
                    assert not r.is_error, texts(r)
            assert texts(outcome["result"]) == f"Tool '{tool}' timed out after 1.5 seconds"
            assert max(others) < 1.0, others  # served while the plugin looped
            assert texts(await c.call_tool("lua_probe_ping", {})) == "pong"  # the runtime is free again
        started = time.monotonic()
        r = await c.call_tool("lua_probe_hog", {})
        assert r.is_error and texts(r) == "plugin 'probe' used more than its 16 MiB of memory and was stopped"
        assert time.monotonic() - started < 1.5
        assert texts(await c.call_tool("lua_probe_ping", {})) == "pong"


async def test_sandbox_escapes_are_refused(tmp_path: Path, env: dict[str, str], kiln: Path) -> None:
    outside = tmp_path / "evil.lua"
    outside.write_text("return 'ran code from outside'\n")
    async with Client(bridge_for(kiln, probe_host(tmp_path, env)).server, mode="legacy") as c:
        reach = json.loads(texts(await c.call_tool("lua_probe_escapes", {})))
        assert reach == {"os_execute": "nil", "io": "nil", "popen": "nil", "debug": "nil", "load": "nil",
                         "loadfile": "nil", "dofile": "nil", "dump": "nil", "python": "nil", "package": "nil",
                         "getenv": "nil"}
        for name in ("../evil", "/etc/passwd", "..evil"):
            r = await c.call_tool("lua_probe_require_outside", {"name": name})
            assert r.is_error and "module names are words and dots" in texts(r), texts(r)
        r = await c.call_tool("lua_probe_require_outside", {"name": "missing"})
        assert "no missing.lua in the plugin's folder" in texts(r)
        r = await c.call_tool("lua_probe_read", {"path": "../outside/secret.md"})
        assert r.is_error and "'..' is not allowed" in texts(r) and SECRET not in texts(r)
        r = await c.call_tool("lua_probe_read", {"path": "/etc/passwd"})
        assert r.is_error and "absolute paths are not allowed" in texts(r) and "root:" not in texts(r)
        r = await c.call_tool("lua_probe_write", {"path": "../escaped.md", "content": "x"})
        assert r.is_error and not (kiln.parent / "escaped.md").exists()
        r = await c.call_tool("lua_probe_write", {"path": "hook.sh", "content": "#!/bin/sh"})
        assert r.is_error and not (kiln / "hook.sh").exists()
        r = await c.call_tool("lua_probe_peek", {})  # host functions are Lua closures: nothing to look into
        assert r.is_error and "attempt to index a function value (field 'log')" in texts(r)
        r = await c.call_tool("lua_probe_write", {"path": "Inbox/from-lua.md", "content": "# From Lua\n"})
        assert not r.is_error and (kiln / "Inbox" / "from-lua.md").read_text() == "# From Lua\n"
        assert str(kiln) not in texts(r)


async def test_a_grant_lifts_part_of_the_sandbox_for_one_plugin(tmp_path: Path, env: dict[str, str],
                                                                kiln: Path) -> None:
    host = probe_host(tmp_path, env, '[plugins.probe]\ngrant = ["io"]\n')
    async with Client(bridge_for(kiln, host).server, mode="legacy") as c:
        reach = json.loads(texts(await c.call_tool("lua_probe_escapes", {})))
        assert reach["io"] == "table" and reach["popen"] == "function" and reach["os_execute"] == "nil"


async def test_a_card_can_deny_the_plugin_tools(tmp_path: Path, env: dict[str, str], kiln: Path) -> None:
    rules = PermissionPolicy(card_rules={"lua_*": "deny"}, card_name="no-lua")

    def policy(name: str) -> Any:
        return rules.decide(ToolKey(name, bridge=True, read_only=True)).rule

    async with Client(bridge_for(kiln, probe_host(tmp_path, env), policy=policy).server, mode="legacy") as c:
        names = {t.name for t in (await c.list_tools()).tools}
        assert not {n for n in names if n.startswith("lua_")} and "read_note" in names
        r = await c.call_tool("lua_probe_ping", {})
        assert r.is_error and texts(r).startswith("Unknown tool 'lua_probe_ping'")


def test_python_objects_in_reach_of_lua_show_no_attributes() -> None:
    """Defence in depth: were a Python object ever handed to Lua, its attributes stay closed."""
    from crucible.plugins.runtime import LuaPlugin

    plugin = LuaPlugin("raw", Path("."))
    peek = plugin.lua.eval("function(obj) return obj.__class__ end")
    try:
        peek(object())
    except Exception as exc:
        assert "Python attributes are not reachable" in str(exc)
    else:
        raise AssertionError("an attribute of a Python object was reachable from Lua")
