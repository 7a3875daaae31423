"""config.toml: defaults, every section, errors that name file + key + what is allowed,
{env:VAR} interpolation, mcps.toml, and where the config and the kiln come from."""

from __future__ import annotations

from pathlib import Path

import pytest

from crucible.config import (
    AgentProfile,
    Config,
    ConfigError,
    config_path,
    data_dir,
    load_config,
    resolve_kiln,
)
from crucible.errors import CrucibleError

FULL = """
kiln = "notes"
default_agent = "work"

[agents.work]
extends = "claude"
args = ["--verbose"]
env = { ANTHROPIC_BASE_URL = "{env:FAKE_URL}/v1" }

[agents.local]
command = "my-agent"

[index]
url = "http://127.0.0.1:8000"
collection = "mine"

[embedder]
provider = "ollama"
model = "nomic-embed-text"
url = "http://127.0.0.1:11434"
batch_size = 8

[permissions]
"kiln_*" = "allow"
"delete_note" = "deny"
"bash" = "ask"

[delegation]
enabled = false
max_depth = 2
allowed_targets = ["reviewer"]
max_concurrent = 1
result_max_bytes = 1024
timeout_secs = 60

[plugins.spellcheck]
language = "en-GB"
strict = true

[[mcp.servers]]
name = "github"
prefix = "gh_"
allowed_tools = ["search_*"]

[mcp.servers.transport]
type = "stdio"
command = "npx"
args = ["-y", "@modelcontextprotocol/server-github"]

[mcp.servers.transport.env]
GITHUB_TOKEN = "{env:GH_TOKEN}"
"""


def write(tmp_path: Path, text: str, name: str = "config.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path / "home"), **extra}


def error_of(tmp_path: Path, text: str, **env: str) -> str:
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as ei:
        load_config(p, env=env_for(tmp_path, **env))
    return str(ei.value)


# --- where the config comes from ----------------------------------------------------------


def test_config_path_precedence(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": "/x", "CRUCIBLE_CONFIG": "/from/env.toml", "HOME": "/h"}
    assert config_path("/cli.toml", env) == Path("/cli.toml")
    assert config_path(None, env) == Path("/from/env.toml")
    assert config_path(None, {"XDG_CONFIG_HOME": "/x", "HOME": "/h"}) == Path("/x/crucible/config.toml")
    assert config_path(None, {"HOME": "/h"}) == Path("/h/.config/crucible/config.toml")


def test_missing_default_config_gives_defaults(tmp_path: Path) -> None:
    config = load_config(env=env_for(tmp_path))
    assert config == Config()
    assert config.source is None
    assert config.default_agent == "claude"
    assert config.embedder.provider == "builtin" and config.embedder.batch_size == 16
    assert config.index.url is None and config.index.collection == "kiln"
    assert config.delegation.max_depth == 1 and config.delegation.timeout_secs == 300
    assert config.mcp.servers == []


def test_default_location_is_read(tmp_path: Path) -> None:
    (tmp_path / "xdg" / "crucible").mkdir(parents=True)
    write(tmp_path / "xdg" / "crucible", 'default_agent = "gemini"\n')
    config = load_config(env=env_for(tmp_path))
    assert config.default_agent == "gemini"
    assert config.source == tmp_path / "xdg" / "crucible" / "config.toml"


def test_missing_explicit_config_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as ei:
        load_config(missing, env=env_for(tmp_path))
    assert str(missing) in str(ei.value) and "--config" in str(ei.value)
    with pytest.raises(ConfigError, match=r"CRUCIBLE_CONFIG"):
        load_config(env=env_for(tmp_path, CRUCIBLE_CONFIG=str(missing)))


def test_full_config(tmp_path: Path) -> None:
    p = write(tmp_path, FULL)
    config = load_config(p, env=env_for(tmp_path, FAKE_URL="http://127.0.0.1:9", GH_TOKEN="t0k"))
    assert config.source == p
    assert config.kiln == tmp_path / "notes"  # relative to the config file
    assert config.default_agent == "work"
    assert config.agents["work"] == AgentProfile(
        extends="claude", args=["--verbose"], env={"ANTHROPIC_BASE_URL": "http://127.0.0.1:9/v1"}
    )
    assert config.agents["local"].command == "my-agent" and config.agents["local"].args == []
    assert config.index.url == "http://127.0.0.1:8000" and config.index.collection == "mine"
    assert (config.embedder.provider, config.embedder.model, config.embedder.batch_size) == (
        "ollama", "nomic-embed-text", 8)
    assert config.permissions == {"kiln_*": "allow", "delete_note": "deny", "bash": "ask"}
    d = config.delegation
    assert (d.enabled, d.max_depth, d.allowed_targets, d.max_concurrent, d.result_max_bytes,
            d.timeout_secs) == (False, 2, ["reviewer"], 1, 1024, 60)
    assert config.plugins == {"spellcheck": {"language": "en-GB", "strict": True}}
    (server,) = config.mcp.servers
    assert server.name == "github" and server.prefix == "gh_"
    assert server.allowed_tools == ["search_*"] and server.blocked_tools is None
    assert server.transport.type == "stdio" and server.transport.command == "npx"
    assert server.transport.env == {"GITHUB_TOKEN": "t0k"}


def test_kiln_tilde_is_expanded(tmp_path: Path) -> None:
    p = write(tmp_path, 'kiln = "~/my notes"\n')
    assert load_config(p, env=env_for(tmp_path)).kiln == Path.home() / "my notes"


def test_source_is_not_settable_from_the_file(tmp_path: Path) -> None:
    msg = error_of(tmp_path, 'source = "/etc"\n')
    assert "unknown key source" in msg


# --- errors name the file, the key and what is allowed -----------------------------------


def test_unknown_top_level_key(tmp_path: Path) -> None:
    msg = error_of(tmp_path, 'kiln = "."\ncolour = "blue"\n')
    assert str(tmp_path / "config.toml") in msg
    assert "unknown key colour" in msg
    assert ("allowed keys in the top level: kiln, default_agent, agents, index, embedder, "
            "permissions, delegation, plugins, mcp") in msg
    assert "source" not in msg.split("allowed keys")[1]


def test_unknown_key_in_a_profile(tmp_path: Path) -> None:
    msg = error_of(tmp_path, '[agents.claude]\ncomand = "x"\n')
    assert "unknown key agents.claude.comand" in msg
    assert "allowed keys in [agents.claude]: command, args, env, extends" in msg


def test_unknown_key_in_sections(tmp_path: Path) -> None:
    assert "allowed keys in [embedder]: provider, model, url, api_key, batch_size" in error_of(
        tmp_path, "[embedder]\nmodle = 'x'\n")
    assert "allowed keys in [delegation]: enabled, max_depth" in error_of(
        tmp_path, "[delegation]\ndepth = 3\n")
    msg = error_of(tmp_path, "[[mcp.servers]]\nname='a'\nport=1\n[mcp.servers.transport]\ntype='stdio'\n")
    assert "unknown key mcp.servers[0].port" in msg
    assert "allowed keys in [mcp.servers[0]]: name, prefix, transport, allowed_tools, blocked_tools" in msg


def test_wrong_type_names_key_and_expected_type(tmp_path: Path) -> None:
    msg = error_of(tmp_path, '[agents.claude]\nargs = "--verbose"\n')
    assert "agents.claude.args: expected a value of type list[str]; got str '--verbose'" in msg
    msg = error_of(tmp_path, '[delegation]\nmax_depth = "2"\n')
    assert "delegation.max_depth: expected an integer; got str '2'" in msg
    msg = error_of(tmp_path, "[delegation]\nenabled = 1\n")
    assert "delegation.enabled: expected true or false" in msg
    msg = error_of(tmp_path, "default_agent = 3\n")
    assert "default_agent: expected a string; got int 3" in msg


def test_wrong_choice_lists_the_choices(tmp_path: Path) -> None:
    msg = error_of(tmp_path, '[permissions]\n"delete_note" = "never"\n')
    assert "permissions.delete_note: expected one of 'allow', 'ask', 'deny'" in msg
    msg = error_of(tmp_path, '[embedder]\nprovider = "huggingface"\n')
    assert "embedder.provider: expected one of 'builtin', 'ollama', 'openai'" in msg


def test_missing_required_key(tmp_path: Path) -> None:
    msg = error_of(tmp_path, "[[mcp.servers]]\nname = 'x'\n")
    assert "mcp.servers[0].transport is required" in msg


def test_all_errors_are_listed(tmp_path: Path) -> None:
    msg = error_of(tmp_path, "colour = 1\n[delegation]\nmax_depth = 'x'\n")
    assert "unknown key colour" in msg and "delegation.max_depth" in msg


def test_invalid_toml(tmp_path: Path) -> None:
    msg = error_of(tmp_path, "kiln = \n")
    assert str(tmp_path / "config.toml") in msg and "not valid TOML" in msg and "line 1" in msg


# --- {env:VAR} ----------------------------------------------------------------------------


def test_env_interpolation_in_every_string(tmp_path: Path) -> None:
    p = write(tmp_path, 'kiln = "{env:NOTES}/kiln"\n[agents.a]\nargs = ["--key={env:K}", "x"]\n'
                        '[plugins.p]\nnested = { deep = ["{env:K}"] }\n')
    config = load_config(p, env=env_for(tmp_path, NOTES="/srv/notes", K="secret"))
    assert config.kiln == Path("/srv/notes/kiln")
    assert config.agents["a"].args == ["--key=secret", "x"]
    assert config.plugins["p"] == {"nested": {"deep": ["secret"]}}


def test_unset_env_var_names_var_and_key(tmp_path: Path) -> None:
    msg = error_of(tmp_path, '[agents.claude.env]\nANTHROPIC_API_KEY = "{env:MY_KEY}"\n')
    assert "MY_KEY" in msg and "agents.claude.env.ANTHROPIC_API_KEY" in msg
    assert str(tmp_path / "config.toml") in msg and "not set" in msg


# --- mcps.toml ----------------------------------------------------------------------------


MCPS = """
[[mcp.servers]]
name = "files"
prefix = "fs_"
blocked_tools = ["delete_*"]
[mcp.servers.transport]
type = "http"
url = "{env:FS_URL}"
"""


def test_mcps_toml_is_merged(tmp_path: Path) -> None:
    p = write(tmp_path, FULL)
    write(tmp_path, MCPS, "mcps.toml")
    config = load_config(p, env=env_for(tmp_path, FAKE_URL="u", GH_TOKEN="t", FS_URL="http://127.0.0.1:7/mcp"))
    assert [s.name for s in config.mcp.servers] == ["github", "files"]
    assert config.mcp.servers[1].transport.url == "http://127.0.0.1:7/mcp"
    assert config.mcp.servers[1].blocked_tools == ["delete_*"]


def test_mcps_toml_beside_a_missing_default_config(tmp_path: Path) -> None:
    folder = tmp_path / "xdg" / "crucible"
    folder.mkdir(parents=True)
    write(folder, "[[servers]]\nname = 'x'\n[servers.transport]\ntype = 'stdio'\ncommand = 'srv'\n", "mcps.toml")
    config = load_config(env=env_for(tmp_path))
    assert [s.transport.command for s in config.mcp.servers] == ["srv"]


def test_mcps_toml_errors_name_that_file(tmp_path: Path) -> None:
    p = write(tmp_path, "")
    write(tmp_path, "[[mcp.servers]]\nname='x'\n[mcp.servers.transport]\ntype='ftp'\n", "mcps.toml")
    with pytest.raises(ConfigError) as ei:
        load_config(p, env=env_for(tmp_path))
    msg = str(ei.value)
    assert str(tmp_path / "mcps.toml") in msg
    assert "mcp.servers[0].transport.type: expected one of 'stdio', 'http', 'sse'" in msg


def test_duplicate_mcp_server_names(tmp_path: Path) -> None:
    # (each entry complete, so the duplicate name is the only problem)
    p = write(tmp_path, "[[mcp.servers]]\nname='x'\n[mcp.servers.transport]\ntype='stdio'\ncommand='srv'\n")
    write(tmp_path, "[[mcp.servers]]\nname='x'\n[mcp.servers.transport]\ntype='sse'\nurl='http://127.0.0.1:1/sse'\n",
          "mcps.toml")
    with pytest.raises(ConfigError, match="two MCP servers are named 'x'"):
        load_config(p, env=env_for(tmp_path))


# --- the kiln and the data dir ------------------------------------------------------------


def test_resolve_kiln_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("cli", "env", "cfg", "cwd"):
        (tmp_path / name).mkdir()
    config = Config(kiln=tmp_path / "cfg")
    env = {"CRUCIBLE_KILN": str(tmp_path / "env")}
    monkeypatch.chdir(tmp_path / "cwd")
    assert resolve_kiln(str(tmp_path / "cli"), config, env) == tmp_path / "cli"
    assert resolve_kiln(None, config, env) == tmp_path / "env"
    assert resolve_kiln(None, config, {}) == tmp_path / "cfg"
    assert resolve_kiln(None, Config(), {}) == tmp_path / "cwd"
    # relative --kiln is taken from the current directory, and the result is absolute
    assert resolve_kiln("../cli", Config(), {}) == tmp_path / "cli"


def test_the_current_folder_is_not_the_kiln_when_it_is_the_home_or_the_root(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for folder, what in ((tmp_path, "your home folder"), (Path("/"), "the filesystem's root")):
        monkeypatch.chdir(folder)
        with pytest.raises(CrucibleError) as ei:
            resolve_kiln(None, Config(), {})
        assert what in ei.value.message and ei.value.fix and "--kiln" in ei.value.fix
        assert resolve_kiln(str(folder), Config(), {}) == folder.resolve()  # asked for by name: taken
        assert resolve_kiln(None, Config(kiln=folder), {}) == folder.resolve()


def test_resolve_kiln_missing_dir(tmp_path: Path) -> None:
    with pytest.raises(CrucibleError) as ei:
        resolve_kiln(str(tmp_path / "nowhere"), Config(), {})
    assert "does not exist" in ei.value.message and "--kiln" in ei.value.message
    assert ei.value.fix and "mkdir" in ei.value.fix
    (tmp_path / "file.md").write_text("x")
    with pytest.raises(CrucibleError, match="not a folder"):
        resolve_kiln(None, Config(), {"CRUCIBLE_KILN": str(tmp_path / "file.md")})


def test_data_dir(tmp_path: Path) -> None:
    assert data_dir({"XDG_DATA_HOME": "/d"}) == Path("/d/crucible")
    assert data_dir({"HOME": "/h"}) == Path("/h/.local/share/crucible")


def test_wrong_type_from_env_does_not_echo_the_value(tmp_path: Path) -> None:
    msg = error_of(tmp_path, '[embedder]\nprovider = "{env:SECRET}"\n', SECRET="hunter2-token")
    assert "embedder.provider: expected one of 'builtin', 'ollama', 'openai'" in msg
    assert "{env:SECRET}" in msg and "hunter2" not in msg
