"""`cru mcp --print-config CLIENT`: each snippet is read by its client as that client's format.

Where the client is at hand (npm), the real one reads the snippet and connects to the
`cru mcp` it describes: Claude Code's CLI (for `claude mcp add` and for the `mcpServers`
JSON that Claude Desktop and Cursor share with Claude Code's .mcp.json), Gemini CLI
(settings.json) and OpenCode (opencode.json). Zed is checked against its documented shape.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import agent_env
import pytest

from crucible.mcp_clients import CLIENTS


def _print_config(cru_bin: str, client: str, kiln: Path, env: dict[str, str], *extra: str) -> str:
    res = subprocess.run([cru_bin, "mcp", "--print-config", client, "--kiln", str(kiln), *extra],
                         env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stderr.startswith(f"# {CLIENTS[client].title}: ")  # where it goes, on stderr only
    return res.stdout


@pytest.fixture
def kiln(tmp_path: Path, fixture_kiln_src: Path) -> Path:
    dest = tmp_path / "kiln"
    shutil.copytree(fixture_kiln_src, dest, ignore=shutil.ignore_patterns(".crucible"))
    return dest


def _expected_argv(cru_bin: str, kiln: Path) -> list[str]:
    return [cru_bin, "mcp", "--kiln", str(kiln)]


@pytest.mark.parametrize("client", ["claude-desktop", "cursor", "gemini"])
def test_mcp_servers_json_runs_this_cru_on_this_kiln(client: str, kiln: Path, clean_env: dict[str, str],
                                                     cru_bin: str) -> None:
    data = json.loads(_print_config(cru_bin, client, kiln, clean_env))
    assert data == {"mcpServers": {"crucible": {"command": cru_bin, "args": ["mcp", "--kiln", str(kiln)]}}}


def test_zed_context_servers_has_the_documented_shape(kiln: Path, clean_env: dict[str, str], cru_bin: str) -> None:
    data = json.loads(_print_config(cru_bin, "zed", kiln, clean_env))
    server = data["context_servers"]["crucible"]
    assert set(data) == {"context_servers"}
    assert server == {"command": cru_bin, "args": ["mcp", "--kiln", str(kiln)], "env": {}}


def test_an_explicit_config_travels_with_the_snippet(kiln: Path, clean_env: dict[str, str], cru_bin: str,
                                                     tmp_path: Path) -> None:
    config = tmp_path / "my.toml"
    config.write_text("")
    data = json.loads(_print_config(cru_bin, "cursor", kiln, clean_env, "--config", str(config)))
    assert data["mcpServers"]["crucible"]["args"] == ["mcp", "--kiln", str(kiln), "--config", str(config)]


def test_the_kiln_defaults_as_for_every_command(tmp_path: Path, kiln: Path, clean_env: dict[str, str],
                                                cru_bin: str) -> None:
    env = {**clean_env, "CRUCIBLE_KILN": str(kiln)}
    res = subprocess.run([cru_bin, "mcp", "--print-config", "claude"], env=env, capture_output=True, text=True,
                         cwd=tmp_path, timeout=60)
    assert shlex.split(res.stdout) == ["claude", "mcp", "add", "crucible", "--", *_expected_argv(cru_bin, kiln)]


def test_an_unknown_client_lists_the_known_ones(cru_bin: str) -> None:
    res = subprocess.run([cru_bin, "mcp", "--print-config", "emacs"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    for name in CLIENTS:
        assert name in res.stderr


# --- the real clients read the snippets and connect to cru mcp -------------------------------


def _client_env(name: agent_env.AgentName, home: Path) -> dict[str, str]:
    _, env = agent_env.agent_launch(name, "http://127.0.0.1:9", home)
    return env


def _claude_cli() -> list[str]:
    modules = agent_env.npm_modules_dir()
    assert modules is not None
    return ["node", str(modules / "@anthropic-ai" / "claude-agent-sdk" / "cli.js")]


@pytest.mark.real_agent
def test_claude_code_runs_the_printed_mcp_add_and_connects(npm_ready: None, tmp_path: Path, kiln: Path,
                                                           cru_bin: str, clean_env: dict[str, str]) -> None:
    line = _print_config(cru_bin, "claude", kiln, clean_env).strip()
    argv = shlex.split(line)
    assert argv[:4] == ["claude", "mcp", "add", "crucible"] and argv[5:] == _expected_argv(cru_bin, kiln)
    env = _client_env("claude", tmp_path / "home")
    project = tmp_path / "project"
    project.mkdir()
    added = subprocess.run([*_claude_cli(), *argv[1:]], env=env, cwd=project, capture_output=True, text=True,
                           timeout=120)
    assert added.returncode == 0, added.stderr
    got = subprocess.run([*_claude_cli(), "mcp", "get", "crucible"], env=env, cwd=project, capture_output=True,
                         text=True, timeout=120)
    assert "Status: ✓ Connected" in got.stdout, got.stdout + got.stderr
    assert f"Command: {cru_bin}" in got.stdout


@pytest.mark.real_agent
@pytest.mark.parametrize("client", ["claude-desktop", "cursor"])
def test_the_mcp_servers_file_is_read_by_claude_code_and_connects(
        client: str, npm_ready: None, tmp_path: Path, kiln: Path, cru_bin: str, clean_env: dict[str, str]) -> None:
    """Claude Desktop's claude_desktop_config.json, Cursor's mcp.json and Claude Code's .mcp.json
    share the `mcpServers` format: Claude Code reads the snippet as its project file."""
    project = tmp_path / "project"
    project.mkdir()
    (project / ".mcp.json").write_text(_print_config(cru_bin, client, kiln, clean_env))
    env = _client_env("claude", tmp_path / "home")
    got = subprocess.run([*_claude_cli(), "mcp", "get", "crucible"], env=env, cwd=project, capture_output=True,
                         text=True, timeout=120)
    assert "Scope: Project config" in got.stdout, got.stdout + got.stderr
    assert "Status: ✓ Connected" in got.stdout


@pytest.mark.real_agent
def test_gemini_cli_reads_its_settings_snippet_and_connects(npm_ready: None, tmp_path: Path, kiln: Path,
                                                            cru_bin: str, clean_env: dict[str, str]) -> None:
    home = tmp_path / "home"
    env = _client_env("gemini", home)
    settings_file = home / ".gemini" / "settings.json"
    settings = json.loads(settings_file.read_text())
    settings.update(json.loads(_print_config(cru_bin, "gemini", kiln, clean_env)))  # "merge it in"
    settings_file.write_text(json.dumps(settings))
    project = tmp_path / "project"
    project.mkdir()
    modules = agent_env.npm_modules_dir()
    assert modules is not None
    res = subprocess.run(["node", str(modules / "@google" / "gemini-cli" / "bundle" / "gemini.js"), "mcp", "list"],
                         env=env, cwd=project, capture_output=True, text=True, timeout=120)
    out = res.stdout + res.stderr
    line = next((ln for ln in out.splitlines() if "crucible" in ln), "")
    assert f"{cru_bin} mcp --kiln {kiln}" in line, out
    assert "Connected" in line and "Disconnected" not in line, out


@pytest.mark.real_agent
def test_opencode_reads_its_json_snippet_and_connects(npm_ready: None, tmp_path: Path, kiln: Path,
                                                      cru_bin: str, clean_env: dict[str, str]) -> None:
    env = _client_env("opencode", tmp_path / "home")
    project = tmp_path / "project"
    project.mkdir()
    (project / "opencode.json").write_text(_print_config(cru_bin, "opencode", kiln, clean_env))
    modules = agent_env.npm_modules_dir()
    assert modules is not None
    res = subprocess.run([str(modules / "opencode-ai" / "bin" / "opencode.exe"), "mcp", "list"], env=env,
                         cwd=project, capture_output=True, text=True, timeout=120)
    out = res.stdout + res.stderr
    line = next((ln for ln in out.splitlines() if "crucible" in ln), "")
    assert "✓ crucible" in line and "connected" in line, out


def test_cru_path_is_the_running_venvs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from crucible import mcp_clients

    assert mcp_clients.cru_argv() == [str(Path(sys.executable).parent / "cru")]
    monkeypatch.setattr(mcp_clients.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert mcp_clients.cru_argv() == [str(tmp_path / "python"), "-m", "crucible.cli"]
