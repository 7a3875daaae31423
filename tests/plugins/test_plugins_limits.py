"""What a plugin cannot do to the server or to the agent, real Lua: a file that is not UTF-8,
a result that multiplies one shared string, odd values returned or raised, huge error
messages, tool and parameter names that clash, string.dump by the back door."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import bridge_for, host_for, texts, write_plugin
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters

from crucible.plugins.host import PluginHost
from crucible.plugins.runtime import RESULT_BYTES_MAX

NOT_UTF8 = b'return { name = "badutf", tools = {} }\n-- \xff\xfe\n'

ODD = r"""
return { name = "odd", tools = {
  amplify = { desc = "one 1 MiB string, referred to 50 times", read_only = true, params = {}, fn = function()
    local s = string.rep("x", 1024 * 1024) local t = {} for i = 1, 50 do t[i] = s end return t end },
  amplify_keys = { desc = "shared keys and values", read_only = true, params = {}, fn = function()
    local s = string.rep("k", 256 * 1024) local inner = {} for i = 1, 8 do inner[s .. i] = s end
    local t = {} for i = 1, 20 do t[i] = inner end return t end },
  amplify_json = { desc = "the same through crucible.json", read_only = true, params = {}, fn = function()
    local s = string.rep("x", 1024 * 1024) local t = {} for i = 1, 50 do t[i] = s end
    local v = crucible.json(t) return v end },
  fits = { desc = "a result under the bound", read_only = true, params = {}, fn = function()
    local s = string.rep("y", 1024 * 1024) return { s, s, s } end },
  badutf = { desc = "bytes that are not UTF-8", read_only = true, params = {}, fn = function()
    return "\xff\xfe\x80 ok" end },
  badutf_key = { desc = "a key that is not UTF-8", read_only = true, params = {}, fn = function()
    return { fine = "yes", ["\xff\27[2J"] = "x" } end },
  badutf_error = { desc = "an error message that is not UTF-8", params = {}, fn = function()
    error("bad \xff byte") end },
  badutf_arg = { desc = "a host call with bytes that are not UTF-8", params = {}, fn = function()
    local v = crucible.note_exists("\xff.md") return v end },
  errtbl = { desc = "error() with a table", params = {}, fn = function() error({ code = 1 }) end },
  errobj = { desc = "error() with an object", params = {}, fn = function()
    error(setmetatable({}, { __tostring = function() return "obj" end })) end },
  errnil = { desc = "error() with nothing", params = {}, fn = function() error() end },
  inf = { desc = "crucible.search with an infinite limit", params = {}, fn = function()
    local v = crucible.search("a", 1/0) return v end },
  err_big = { desc = "a 10 MiB error message", params = {}, fn = function()
    error(string.rep("E", 10 * 1024 * 1024)) end },
  err_big_bare = { desc = "a 10 MiB error message, no location", params = {}, fn = function()
    error(string.rep("F", 10 * 1024 * 1024), 0) end },
  dump = { desc = "string.dump by the strings' metatable", read_only = true, params = {}, fn = function()
    return { via_meta = type(getmetatable("").__index.dump), via_method = type(("").dump),
             upper = ("ok"):upper() } end },
  ping = { desc = "answers", read_only = true, params = {}, fn = function() return "pong" end },
} }
"""


def odd_host(tmp_path: Path, env: dict[str, str]) -> PluginHost:
    write_plugin(Path(env["CRUCIBLE_PLUGIN_PATH"]), "odd", ODD)
    return host_for(tmp_path, env)


def test_a_plugin_file_that_is_not_utf8_fails_alone(tmp_path: Path, env: dict[str, str], cru_bin: str,
                                                     clean_env: dict[str, str]) -> None:
    plugins = Path(env["CRUCIBLE_PLUGIN_PATH"])
    (plugins / "badutf.lua").write_bytes(NOT_UTF8)
    helper = plugins / "helped"
    helper.mkdir()
    (helper / "plugin.yaml").write_text("name: helped\nmain: main.lua\n")
    (helper / "util.lua").write_bytes(b"return '\xff'\n")
    (helper / "main.lua").write_text('local u = require("util")\nreturn { tools = {} }\n')
    host = host_for(tmp_path, env)
    bad = host.get("badutf")
    assert bad is not None and bad.state == "failed"
    assert bad.reason == "plugin 'badutf': badutf.lua is not UTF-8 text (bad byte at offset 42): save it as UTF-8"
    helped = host.get("helped")
    assert helped is not None and helped.state == "failed"
    assert helped.reason == ("plugin 'helped' failed in main.lua line 1: plugin 'helped': util.lua is not UTF-8 "
                             "text (bad byte at offset 8): save it as UTF-8")
    assert {p.name for p in host.plugins if p.state == "loaded"} == {"daily", "tasks"}
    res = subprocess.run([cru_bin, "plugins", "list"], env={**clean_env, **env}, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "plugin 'badutf': badutf.lua is not UTF-8 text (bad byte at offset 42): save it as UTF-8" in res.stdout
    assert "lua_daily_today" in res.stdout


async def test_cru_mcp_serves_beside_a_plugin_file_that_is_not_utf8(
        tmp_path: Path, env: dict[str, str], kiln: Path, cru_bin: str, clean_env: dict[str, str]) -> None:
    (Path(env["CRUCIBLE_PLUGIN_PATH"]) / "badutf.lua").write_bytes(NOT_UTF8)
    run_env = {**clean_env, **env}
    params = StdioServerParameters(command=cru_bin, args=["mcp", "--kiln", str(kiln)], env=run_env)
    async with Client(params, mode="legacy") as c:
        names = {t.name for t in (await c.list_tools()).tools}
        assert {"lua_daily_today", "read_note"} <= names
        r = await c.call_tool("read_note", {"path": "Index.md"})
        assert not r.is_error, texts(r)


async def test_a_result_is_bounded_in_bytes_however_its_strings_are_shared(
        tmp_path: Path, env: dict[str, str], kiln: Path) -> None:
    mib = RESULT_BYTES_MAX // (1024 * 1024)
    async with Client(bridge_for(kiln, odd_host(tmp_path, env)).server, mode="legacy") as c:
        for tool in ("lua_odd_amplify", "lua_odd_amplify_keys"):
            r = await c.call_tool(tool, {})
            assert r.is_error and texts(r) == (f"plugin 'odd' returned more than {mib} MiB of text; return less, "
                                               "e.g. a summary or a page"), texts(r)[:300]
        r = await c.call_tool("lua_odd_amplify_json", {})
        assert r.is_error and texts(r) == (f"plugin 'odd' failed in odd.lua line 9: json: the result holds more "
                                           f"than {mib} MiB of text; return less, e.g. a summary or a page")
        r = await c.call_tool("lua_odd_fits", {})
        assert not r.is_error and json.loads(texts(r)) == ["y" * 1024 * 1024] * 3
        assert texts(await c.call_tool("lua_odd_ping", {})) == "pong"


async def test_odd_values_returned_or_raised_become_clear_errors(tmp_path: Path, env: dict[str, str],
                                                                 kiln: Path) -> None:
    async with Client(bridge_for(kiln, odd_host(tmp_path, env)).server, mode="legacy") as c:
        expected = {
            "badutf": "plugin 'odd' returned text that is not UTF-8 (a string with a bad byte at offset 0); "
                      "return UTF-8 text only",
            "badutf_key": "plugin 'odd' returned text that is not UTF-8 (a key with a bad byte at offset 0); "
                          "return UTF-8 text only",
            "badutf_error": "plugin 'odd' failed in odd.lua line 17: bad \ufffd byte",
            "badutf_arg": "plugin 'odd' failed in odd.lua line 19: crucible.note_exists: argument 1 is not UTF-8 "
                          "text (bad byte at offset 0)",
            "errtbl": "plugin 'odd' failed: error() was given no message (a table or nil?); give it a string: "
                      'error("what went wrong")',
            "errobj": "plugin 'odd' failed: error() was given no message (a table or nil?); give it a string: "
                      'error("what went wrong")',
            "errnil": "plugin 'odd' failed: error() was given no message (a table or nil?); give it a string: "
                      'error("what went wrong")',
            "inf": "plugin 'odd' failed in odd.lua line 25: search: limit must be a whole number from 1 to 10000, "
                   "not inf",
        }
        for tool, message in expected.items():
            r = await c.call_tool(f"lua_odd_{tool}", {})
            assert r.is_error and texts(r) == message, (tool, texts(r))
            assert "Error" not in texts(r) and "Traceback" not in texts(r)
        assert texts(await c.call_tool("lua_odd_ping", {})) == "pong"


async def test_error_messages_are_bounded(tmp_path: Path, env: dict[str, str], kiln: Path) -> None:
    async with Client(bridge_for(kiln, odd_host(tmp_path, env)).server, mode="legacy") as c:
        r = await c.call_tool("lua_odd_err_big", {})
        assert r.is_error and texts(r) == ("plugin 'odd' failed in odd.lua line 27: " + "E" * 1000
                                           + f" [… {10 * 1024 * 1024 - 1000} more characters cut]")
        r = await c.call_tool("lua_odd_err_big_bare", {})
        assert r.is_error and texts(r) == ("plugin 'odd' failed: " + "F" * 1000
                                           + f" [… {10 * 1024 * 1024 - 1000} more characters cut]")


async def test_string_dump_is_out_of_reach_by_the_strings_metatable(tmp_path: Path, env: dict[str, str],
                                                                    kiln: Path) -> None:
    async with Client(bridge_for(kiln, odd_host(tmp_path, env)).server, mode="legacy") as c:
        r = await c.call_tool("lua_odd_dump", {})
        assert json.loads(texts(r)) == {"via_meta": "nil", "via_method": "nil", "upper": "OK"}


TOOL = """
return {{ name = "{name}", tools = {{ {tool} = {{ desc = "from {name}", read_only = true, params = {{}},
  fn = function() return "{name}" end }} }} }}
"""


def test_tool_names_that_clash_refuse_the_later_plugin(tmp_path: Path, env: dict[str, str], cru_bin: str,
                                                       clean_env: dict[str, str]) -> None:
    plugins = Path(env["CRUCIBLE_PLUGIN_PATH"])
    write_plugin(plugins, "a", TOOL.format(name="a", tool="b_c"))
    write_plugin(plugins, "a_b", TOOL.format(name="a_b", tool="c"))
    host = host_for(tmp_path, env)
    first, second = host.get("a"), host.get("a_b")
    assert first is not None and first.state == "loaded"
    tool = host.lookup("lua_a_b_c")
    assert tool is not None and tool.plugin is first
    assert second is not None and second.state == "failed" and second.tools == []
    reason = ("plugin 'a_b': its tool 'c' would be named lua_a_b_c, like tool 'b_c' of plugin 'a' (found first, "
              "kept); rename one")
    assert second.reason == reason
    res = subprocess.run([cru_bin, "plugins", "list"], env={**clean_env, **env}, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 1, res.stderr
    rows = {line.split()[0]: line for line in res.stdout.splitlines() if not line.startswith(" ")}
    assert rows["a"].split()[1] == "loaded" and rows["a"].split()[-1] == "lua_a_b_c"
    assert rows["a_b"].split()[1] == "failed"
    assert reason in " ".join(res.stdout.split())
    assert f"plugin a_b refused: {reason}" in " ".join(res.stderr.split())  # and a log line


def test_parameter_names_are_checked_like_tool_names(tmp_path: Path, env: dict[str, str]) -> None:
    plugins = Path(env["CRUCIBLE_PLUGIN_PATH"])
    body = """
        return {{ tools = {{ t = {{ desc = "x", params = {params}, fn = function() return 1 end }} }} }}
    """
    write_plugin(plugins, "escname", body.format(params='{ { name = "a b\\27[31m", type = "string" } }'))
    write_plugin(plugins, "longname", body.format(params='{ { name = string.rep("n", 10000), type = "string" } }'))
    write_plugin(plugins, "twice", body.format(params='{ { name = "x", type = "string" }, '
                                                     '{ name = "x", type = "integer" } }'))
    write_plugin(plugins, "fine", body.format(params='{ { name = "the-path_2", type = "string" } }'))
    host = host_for(tmp_path, env)
    reasons = {p.name: p.reason for p in host.plugins}
    assert reasons["escname"] == ("plugin 'escname', tool 't': params[1] has the name 'a b\\x1b[31m'; a parameter's "
                                  "name is a letter then letters, digits, '_' or '-' (at most 40)")
    assert reasons["longname"] == (f"plugin 'longname', tool 't': params[1] has the name {'n' * 60!r}; a parameter's "
                                   "name is a letter then letters, digits, '_' or '-' (at most 40)")
    assert reasons["twice"] == "plugin 'twice', tool 't': two parameters are named 'x'; give each its own name"
    assert {p.name for p in host.plugins if p.state == "loaded"} == {"fine", "daily", "tasks"}
    fine = host.lookup("lua_fine_t")
    assert fine is not None and list(fine.schema()["properties"]) == ["the-path_2"]
