"""acp_host.registry: built-ins found on a PATH, npx fallback, profiles with extends, errors."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from acp_host.registry import (
    BUILTINS,
    AgentRegistryError,
    auth_hint,
    install_hint,
    known_names,
    resolve_agent,
)
from crucible.config import AgentProfile


def _bin_dir(tmp_path: Path, *names: str) -> str:
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    for n in names:
        exe = d / n
        exe.write_text("#!/bin/sh\nexit 0\n")
        exe.chmod(0o755)
    return str(d)


def test_builtins_found_on_path_run_with_their_acp_arguments(tmp_path: Path) -> None:
    path = _bin_dir(tmp_path, "claude-agent-acp", "opencode", "gemini", "codex-acp")
    expected = {
        "claude": [f"{path}/claude-agent-acp"],
        "opencode": [f"{path}/opencode", "acp"],
        "gemini": [f"{path}/gemini", "--acp"],
        "codex": [f"{path}/codex-acp"],
    }
    for name, argv in expected.items():
        spec = resolve_agent(name, path=path)
        assert spec.argv == argv
        assert spec.found
        assert spec.name == name
        assert spec.source == f"built-in: {argv[0]}"


def test_claude_and_codex_fall_back_to_npx_when_not_on_path(tmp_path: Path) -> None:
    path = _bin_dir(tmp_path, "npx")
    claude = resolve_agent("claude", path=path)
    assert claude.argv == [f"{path}/npx", "-y", "@agentclientprotocol/claude-agent-acp"]
    assert claude.found and "npx" in claude.source
    assert resolve_agent("codex", path=path).argv == [f"{path}/npx", "-y", "@agentclientprotocol/codex-acp"]


def test_a_missing_builtin_without_fallback_is_reported_not_found(tmp_path: Path) -> None:
    path = _bin_dir(tmp_path)
    for name, argv in {"opencode": ["opencode", "acp"], "gemini": ["gemini", "--acp"],
                       "claude": ["claude-agent-acp"]}.items():
        spec = resolve_agent(name, path=path)
        assert spec.argv == argv
        assert not spec.found
        assert "not on PATH" in spec.source


def test_profile_extending_a_builtin_merges_env_replaces_args_inherits_command(tmp_path: Path) -> None:
    path = _bin_dir(tmp_path, "gemini")
    profiles = {"fast-gemini": {"extends": "gemini", "args": ["--acp", "--model", "flash"],
                                "env": {"GEMINI_API_KEY": "k"}}}
    spec = resolve_agent("fast-gemini", profiles=profiles, path=path)
    assert spec.argv == [f"{path}/gemini", "--acp", "--model", "flash"]
    assert spec.env == {"GEMINI_API_KEY": "k"}
    assert spec.name == "fast-gemini"
    assert "extends gemini" in spec.source


def test_a_chain_of_profiles_merges_env_nearest_wins(tmp_path: Path) -> None:
    path = _bin_dir(tmp_path, "opencode")
    profiles = {
        "base": {"extends": "opencode", "env": {"A": "base", "B": "base"}},
        "mid": {"extends": "base", "env": {"B": "mid", "C": "mid"}},
        "top": {"extends": "mid", "env": {"C": "top"}},
    }
    spec = resolve_agent("top", profiles=profiles, path=path)
    assert spec.argv == [f"{path}/opencode", "acp"]
    assert spec.env == {"A": "base", "B": "mid", "C": "top"}


def test_a_profile_named_like_a_builtin_refines_it(tmp_path: Path) -> None:
    path = _bin_dir(tmp_path, "claude-agent-acp")
    for profile in ({"env": {"ANTHROPIC_API_KEY": "k"}},
                    {"extends": "claude", "env": {"ANTHROPIC_API_KEY": "k"}}):
        spec = resolve_agent("claude", profiles={"claude": profile}, path=path)
        assert spec.argv == [f"{path}/claude-agent-acp"]
        assert spec.env == {"ANTHROPIC_API_KEY": "k"}


def test_config_models_count_only_the_fields_they_were_given(tmp_path: Path) -> None:
    # AgentProfile defaults args to []: an unset args must still inherit the base's.
    path = _bin_dir(tmp_path, "opencode")
    profiles = {"oc": AgentProfile(extends="opencode", env={"X": "1"}),
                "oc-bare": AgentProfile(extends="opencode", args=[])}
    assert resolve_agent("oc", profiles=profiles, path=path).argv == [f"{path}/opencode", "acp"]
    assert resolve_agent("oc-bare", profiles=profiles, path=path).argv == [f"{path}/opencode"]


def test_attribute_profiles_work_too(tmp_path: Path) -> None:
    profiles = {"mine": SimpleNamespace(command="/opt/agent", args=["--stdio"], env={"K": "v"}, extends=None)}
    spec = resolve_agent("mine", profiles=profiles, path=_bin_dir(tmp_path))
    assert (spec.argv, spec.env, spec.source) == (["/opt/agent", "--stdio"], {"K": "v"}, "profile mine")


def test_a_profile_overriding_the_command_of_a_missing_builtin_is_found(tmp_path: Path) -> None:
    spec = resolve_agent("gemini", profiles={"gemini": {"command": "/opt/gemini/bin/gemini"}},
                         path=_bin_dir(tmp_path))
    assert spec.argv == ["/opt/gemini/bin/gemini", "--acp"]
    assert spec.found


def test_an_extends_loop_is_an_error_naming_the_chain() -> None:
    profiles = {"a": {"extends": "b"}, "b": {"extends": "c"}, "c": {"extends": "a"}}
    with pytest.raises(AgentRegistryError) as e:
        resolve_agent("a", profiles=profiles)
    assert "a -> b -> c -> a" in e.value.message
    assert e.value.fix and "extends" in e.value.fix
    with pytest.raises(AgentRegistryError, match="self -> self"):
        resolve_agent("self", profiles={"self": {"extends": "self", "command": "x"}})


def test_unknown_names_list_the_known_ones() -> None:
    profiles = {"mine": {"command": "my-agent"}}
    with pytest.raises(AgentRegistryError) as e:
        resolve_agent("cluade", profiles=profiles)
    assert e.value.message == "unknown agent 'cluade'; known agents: claude, opencode, gemini, codex, mine"
    assert e.value.fix and "--agent-command" in e.value.fix
    with pytest.raises(AgentRegistryError, match=r"\[agents.mine\] extends 'nope'"):
        resolve_agent("mine", profiles={"mine": {"extends": "nope"}})
    with pytest.raises(AgentRegistryError, match="no agent given"):
        resolve_agent(None)


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        ({}, "has neither command nor extends"),
        ({"command": "  "}, "command must be a non-empty string"),
        ({"command": "x", "args": "--acp"}, "args must be a list of strings"),
        ({"command": "x", "env": {"K": 1}}, "env must be a table of strings"),
        ({"extends": 3}, "extends must be an agent name"),
    ],
)
def test_bad_profiles_say_what_to_write(profile: dict[str, object], message: str) -> None:
    with pytest.raises(AgentRegistryError) as e:
        resolve_agent("bad", profiles={"bad": profile})
    assert message in e.value.message
    assert "[agents.bad]" in e.value.message
    assert e.value.fix


def test_agent_command_is_split_like_a_shell() -> None:
    spec = resolve_agent(None, agent_command="node '/opt/my agent/index.js' --acp")
    assert spec.argv == ["node", "/opt/my agent/index.js", "--acp"]
    # Named by the program that speaks ACP, not its interpreter (issue 16.3): index.js names nothing,
    # its folder does.
    assert (spec.name, spec.source, spec.env) == ("my agent", "--agent-command", {})
    assert resolve_agent("claude", agent_command="my-claude --x").argv == ["my-claude", "--x"]
    with pytest.raises(AgentRegistryError, match="is empty"):
        resolve_agent(None, agent_command="   ")
    with pytest.raises(AgentRegistryError, match="cannot split"):
        resolve_agent(None, agent_command="node 'unclosed")


def test_hints_name_the_install_and_login_commands() -> None:
    assert install_hint("claude") == "npm install -g @agentclientprotocol/claude-agent-acp"
    assert install_hint("opencode") == "npm install -g opencode-ai"
    assert install_hint("gemini") == "npm install -g @google/gemini-cli"
    assert install_hint("codex") == "npm install -g @agentclientprotocol/codex-acp"
    assert "--agent-command" in install_hint("mine")
    assert "claude /login" in auth_hint("claude") and "ANTHROPIC_API_KEY" in auth_hint("claude")
    assert "GEMINI_API_KEY" in auth_hint("gemini")
    assert "opencode auth login" in auth_hint("opencode")
    assert "OPENAI_API_KEY" in auth_hint("codex")
    assert known_names({"zed": {}, "claude": {}}) == [*BUILTINS, "zed"]


def test_fetch_on_run_names_what_a_package_runner_would_download() -> None:
    from acp_host.registry import fetch_on_run

    assert fetch_on_run(["/usr/bin/npx", "-y", "@agentclientprotocol/claude-agent-acp"]) == \
        "npm package @agentclientprotocol/claude-agent-acp"
    assert fetch_on_run(["npx", "--yes", "--package", "@google/gemini-cli@1.2.3", "gemini", "--acp"]) == \
        "npm package @google/gemini-cli@1.2.3"
    assert fetch_on_run(["bunx", "opencode-ai", "acp"]) == "npm package opencode-ai"
    assert fetch_on_run(["uvx", "--python", "3.12", "crucible==0.1.0", "acp"]) == "PyPI package crucible==0.1.0"
    assert fetch_on_run(["uvx", "--from", "crucible==0.1.0", "cru", "acp"]) == "PyPI package crucible==0.1.0"
    assert fetch_on_run(["/usr/local/bin/claude-agent-acp"]) is None
    assert fetch_on_run(["opencode", "acp"]) is None
    assert fetch_on_run([]) is None
