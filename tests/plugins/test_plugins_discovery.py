"""Where plugins come from: search order and shadowing, never a kiln's own folder unless the
config names it, folder plugins with plugin.yaml, failures listed with their reason."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import host_for, write_plugin

ECHO = """
return {{ name = "{name}", tools = {{ who = {{ desc = "who am I", read_only = true, params = {{}},
  fn = function() return "{origin}" end }} }} }}
"""


def test_first_found_wins_and_the_rest_are_shadowed(tmp_path: Path, env: dict[str, str]) -> None:
    path_dir, user_dir = Path(env["CRUCIBLE_PLUGIN_PATH"]), tmp_path / "xdg" / "crucible" / "plugins"
    write_plugin(path_dir, "hello", ECHO.format(name="hello", origin="env path"))
    write_plugin(user_dir, "hello", ECHO.format(name="hello", origin="user folder"))
    write_plugin(user_dir, "daily", ECHO.format(name="daily", origin="the person's daily"))  # shadows the built-in
    host = host_for(tmp_path, env)
    states = [(p.name, p.source, p.state) for p in host.plugins]
    assert ("hello", "$CRUCIBLE_PLUGIN_PATH", "loaded") in states
    assert ("hello", "user", "shadowed") in states
    assert ("daily", "user", "loaded") in states and ("daily", "built-in", "shadowed") in states
    assert ("tasks", "built-in", "loaded") in states
    assert host.lookup("lua_hello_who") is not None and host.lookup("lua_hello_who").plugin.source.startswith("$")
    assert host.lookup("lua_daily_who") is not None and host.lookup("lua_daily_today") is None


def test_a_kilns_plugins_are_ignored_unless_the_config_names_them(tmp_path: Path, env: dict[str, str],
                                                                  kiln: Path) -> None:
    for folder in (kiln / "plugins", kiln / ".crucible" / "plugins"):
        write_plugin(folder, "cloned", ECHO.format(name="cloned", origin="a cloned repository"))
    host = host_for(tmp_path, env)
    assert "cloned" not in {p.name for p in host.plugins}
    named = host_for(tmp_path, env, f'[plugins]\npaths = ["{kiln / ".crucible" / "plugins"}"]\n')
    (info,) = [p for p in named.plugins if p.name == "cloned"]
    assert info.state == "loaded" and info.source == "config"


def test_folder_plugin_with_manifest_and_require(tmp_path: Path, env: dict[str, str]) -> None:
    folder = Path(env["CRUCIBLE_PLUGIN_PATH"]) / "greeter"
    folder.mkdir()
    (folder / "plugin.yaml").write_text("name: greeter\nversion: 0.2.0\nmain: main.lua\ndescription: Says hello\n")
    (folder / "words.lua").write_text('return { hello = function(who) return "hello, " .. who end }\n')
    (folder / "main.lua").write_text(
        'local words = require("words")\n'
        'return { name = "greeter", tools = { greet = { desc = "Greet someone", read_only = true,\n'
        '  params = {{ name = "who", type = "string", desc = "whom" }},\n'
        '  fn = function(args) return words.hello(args.who) end } } }\n')
    host = host_for(tmp_path, env)
    info = host.get("greeter")
    assert info is not None and info.state == "loaded", info.reason if info else None
    assert info.version == "0.2.0" and info.description == "Says hello"
    assert [t.name for t in info.tools] == ["lua_greeter_greet"]


def test_broken_plugins_are_listed_with_their_reason_and_the_others_load(tmp_path: Path, env: dict[str, str]) -> None:
    plugins = Path(env["CRUCIBLE_PLUGIN_PATH"])
    write_plugin(plugins, "syntax", "return { name = 'syntax', tools = {\n  oops = \n}\n")
    write_plugin(plugins, "throws", "local x = 1\nerror('no config file')\n")
    write_plugin(plugins, "shape", "return 42\n")
    write_plugin(plugins, "badparam", "return { tools = { t = { desc = 'x', params = {{ name = 'n', type = 'date' }},"
                                      " fn = function() end } } }\n")
    write_plugin(plugins, "slowload", "while true do end\n")
    bomb = plugins / "bomb"
    bomb.mkdir()
    (bomb / "plugin.yaml").write_text("a: &x [1, 2]\nb: *x\nname: bomb\n")
    (plugins / "nomanifest").mkdir()
    host = host_for(tmp_path, env)
    reasons = {p.name: p.reason for p in host.plugins if p.state == "failed"}
    assert reasons["syntax"] is not None and reasons["syntax"].startswith("plugin 'syntax' failed in syntax.lua line ")
    assert reasons["throws"] == "plugin 'throws' failed in throws.lua line 2: no config file"
    assert "must return a table" in (reasons["shape"] or "")
    assert "param 'n' has type 'date'" in (reasons["badparam"] or "")
    assert reasons["slowload"] == "loading took more than 5 s and was stopped"
    assert reasons["bomb"] == "plugin.yaml: anchors and aliases (& and *) are not allowed"
    assert "needs a plugin.yaml" in (reasons["nomanifest"] or "")
    assert {p.name for p in host.plugins if p.state == "loaded"} == {"daily", "tasks"}


def test_disabled_and_settings_passed_to_setup(tmp_path: Path, env: dict[str, str]) -> None:
    write_plugin(Path(env["CRUCIBLE_PLUGIN_PATH"]), "cfg", """
        local seen = {}
        return { name = "cfg", setup = function(cfg) seen = cfg end,
          tools = { show = { desc = "the settings", read_only = true, params = {}, fn = function() return seen end } } }
    """)
    host = host_for(tmp_path, env, '[plugins.daily]\nenabled = false\n[plugins.cfg]\ncolour = "blue"\nsize = 3\n'
                                    'memory_mb = 32\n')
    assert host.get("daily") is not None and host.get("daily").state == "disabled"  # type: ignore[union-attr]
    assert host.lookup("lua_daily_today") is None
    cfg = host.get("cfg")
    assert cfg is not None and cfg.state == "loaded" and cfg.runtime is not None
    assert cfg.runtime.call(cfg.tools[0].fn, {}) == {"colour": "blue", "size": 3}  # Crucible's keys stay out


def test_cru_plugins_list_and_show(tmp_path: Path, env: dict[str, str], cru_bin: str,
                                   clean_env: dict[str, str]) -> None:
    run_env = {**clean_env, **env}
    write_plugin(Path(env["CRUCIBLE_PLUGIN_PATH"]), "throws", "error('cannot start')\n")
    res = subprocess.run([cru_bin, "plugins", "list"], env=run_env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1, res.stderr  # one failed
    rows = {line.split()[0]: line for line in res.stdout.splitlines() if not line.startswith(" ")}
    assert rows["daily"].split()[1:3] == ["loaded", "built-in"] and "lua_daily_today" in rows["daily"]
    assert rows["throws"].split()[1] == "failed"
    assert "plugin 'throws' failed in throws.lua line 1: cannot start" in res.stdout
    res = subprocess.run([cru_bin, "plugins", "show", "tasks", "--json"], env=run_env, capture_output=True,
                         text=True, timeout=60)
    data = json.loads(res.stdout)
    assert data["state"] == "loaded" and data["version"] == "1.0.0"
    assert {t["name"] for t in data["tools"]} == {"lua_tasks_list_tasks", "lua_tasks_next_task", "lua_tasks_mark_done"}
    res = subprocess.run([cru_bin, "plugins", "show", "nope"], env=run_env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 1 and "no plugin named 'nope'" in res.stderr
    res = subprocess.run([cru_bin, "doctor"], env={**run_env, "PATH": "/nonexistent"}, capture_output=True,
                         text=True, timeout=120)
    assert "FIX plugin throws plugin 'throws' failed in throws.lua line 1: cannot start" in \
        " ".join(res.stdout.split()), res.stdout
    assert "enabled = false" in res.stdout
