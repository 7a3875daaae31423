"""`cru agents --registry FILE|URL` and `cru agents add ID` with a fixture registry (issue 18).

Listing and adding download nothing: the profile written runs the agent through its npx /
uvx / binary distribution, and what that first run would fetch is said.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import threading
import tomllib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from acp_host.registry import current_platform, parse_registry, registry_launches, resolve_agent
from crucible.config import load_config

FIXTURE = Path(__file__).with_name("acp_registry_fixture.json")


def _cru(cru_bin: str, *argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([cru_bin, *argv], env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def env(clean_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    e = dict(clean_env)
    e["PATH"] = f"{tmp_path / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin"  # no agent installed
    (tmp_path / "bin").mkdir()
    return e


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text('# my settings\ndefault_agent = "claude"  # keep this comment\n\n[permissions]\ndelete_note = "deny"\n')
    return path


def test_the_listing_says_how_to_run_install_and_add_each_agent(cru_bin: str, env: dict[str, str]) -> None:
    res = _cru(cru_bin, "agents", "--registry", str(FIXTURE), env=env)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert out.startswith(f"5 agent(s) in {FIXTURE}:")
    assert "npx -y @example/npx-agent@1.2.3 --acp   (its first run downloads the npm package @example/npx-agent@1.2.3)" in out
    assert "install: npm install -g @example/npx-agent@1.2.3" in out
    assert "uvx --from uvx-agent==0.4.0 uvx-agent-acp serve" in out
    assert "install: uv tool install uvx-agent==0.4.0" in out
    if current_platform() in ("linux-x86_64", "linux-aarch64"):
        assert f"binary-agent-2.0.0-{current_platform()}.tar.gz, unpack it and put binary-agent on your PATH" in out
        assert "(also: --via binary)" in out  # both-agent
    assert f"no way to run it here ({current_platform()}); it has: binary" in out  # windows-only
    assert f"add:     cru agents add npx-agent --registry {FIXTURE}" in out


def test_add_writes_a_profile_that_runs_through_npx_and_keeps_the_file(
        cru_bin: str, env: dict[str, str], config: Path, tmp_path: Path) -> None:
    res = _cru(cru_bin, "agents", "add", "npx-agent", "--registry", str(FIXTURE), "--config", str(config), env=env)
    assert res.returncode == 0, res.stderr
    assert "downloads the npm package @example/npx-agent@1.2.3 (nothing is downloaded now)" in res.stdout
    text = config.read_text()
    assert text.startswith('# my settings\ndefault_agent = "claude"  # keep this comment\n')
    data = tomllib.loads(text)
    assert data["agents"]["npx-agent"] == {"command": "npx", "args": ["-y", "@example/npx-agent@1.2.3", "--acp"],
                                           "env": {"NPX_AGENT_MODE": "acp"}}
    assert data["permissions"] == {"delete_note": "deny"}
    assert config.stat().st_mode & 0o777 == 0o600
    spec = resolve_agent("npx-agent", profiles=load_config(config).agents, path=str(tmp_path / "bin"))
    assert spec.argv == ["npx", "-y", "@example/npx-agent@1.2.3", "--acp"]
    # and `cru agents` then reports it without running npx (doctor/agents never install)
    listed = _cru(cru_bin, "agents", "--config", str(config), env=env)
    assert "would first download the npm package @example/npx-agent@1.2.3" in listed.stdout


def test_add_through_uvx_with_a_command_and_through_a_binary(cru_bin: str, env: dict[str, str], config: Path) -> None:
    res = _cru(cru_bin, "agents", "add", "uvx-agent", "--registry", str(FIXTURE), "--config", str(config), env=env)
    assert res.returncode == 0, res.stderr
    assert tomllib.loads(config.read_text())["agents"]["uvx-agent"] == {
        "command": "uvx", "args": ["--from", "uvx-agent==0.4.0", "uvx-agent-acp", "serve"]}
    if current_platform() not in ("linux-x86_64", "linux-aarch64"):
        return
    res = _cru(cru_bin, "agents", "add", "both-agent", "--via", "binary", "--registry", str(FIXTURE),
               "--config", str(config), env=env)
    assert res.returncode == 0, res.stderr
    assert tomllib.loads(config.read_text())["agents"]["both-agent"] == {"command": "both", "args": []}
    assert "before the first `cru chat -a both-agent`: download https://example.invalid/both-3.0.0" in res.stdout


def test_add_refuses_what_it_cannot_do_and_leaves_the_file_alone(
        cru_bin: str, env: dict[str, str], config: Path) -> None:
    before = config.read_text()
    unknown = _cru(cru_bin, "agents", "add", "nope", "--registry", str(FIXTURE), "--config", str(config), env=env)
    assert unknown.returncode == 1
    assert "no agent 'nope' in" in unknown.stderr and "one of: binary-agent, both-agent, npx-agent" in unknown.stderr
    elsewhere = _cru(cru_bin, "agents", "add", "windows-only", "--registry", str(FIXTURE), "--config", str(config),
                     env=env)
    assert elsewhere.returncode == 1 and "has no distribution that runs here" in elsewhere.stderr
    wrong_via = _cru(cru_bin, "agents", "add", "npx-agent", "--via", "uvx", "--registry", str(FIXTURE),
                     "--config", str(config), env=env)
    assert wrong_via.returncode == 1 and "has no uvx distribution" in wrong_via.stderr
    assert config.read_text() == before


def test_adding_twice_needs_force_or_another_name(cru_bin: str, env: dict[str, str], config: Path) -> None:
    args = ["agents", "add", "npx-agent", "--registry", str(FIXTURE), "--config", str(config)]
    assert _cru(cru_bin, *args, env=env).returncode == 0
    again = _cru(cru_bin, *args, env=env)
    assert again.returncode == 1 and "already has [agents.npx-agent]" in again.stderr and "--force" in again.stderr
    assert _cru(cru_bin, *args, "--as", "npx2", env=env).returncode == 0
    assert _cru(cru_bin, *args, "--force", env=env).returncode == 0
    assert set(tomllib.loads(config.read_text())["agents"]) == {"npx-agent", "npx2"}


def test_a_broken_registry_is_named_with_what_is_wrong(cru_bin: str, env: dict[str, str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": "1.0.0", "agents": [{"id": "x", "name": "X", "version": "1.0.0"}]}))
    res = _cru(cru_bin, "agents", "--registry", str(bad), env=env)
    assert res.returncode == 1
    assert f"{bad}: agents[0] lacks description, distribution" in res.stderr
    bad.write_text("{not json")
    res = _cru(cru_bin, "agents", "--registry", str(bad), env=env)
    assert res.returncode == 1 and "is not JSON" in res.stderr and "Traceback" not in res.stderr


def test_registry_text_reaches_the_terminal_without_control_characters(
        cru_bin: str, env: dict[str, str], tmp_path: Path) -> None:
    hostile = tmp_path / "hostile.json"
    hostile.write_text(json.dumps({"agents": [{
        "id": "evil", "name": "Evil\x1b]0;owned\x07", "version": "1.0.0",
        "description": "clears \x1b[2J your screen", "distribution": {"npx": {"package": "evil\x1b[31m"}}}]}))
    res = _cru(cru_bin, "agents", "--registry", str(hostile), env=env)
    assert res.returncode == 0, res.stderr
    assert "\x1b" not in res.stdout and "\x07" not in res.stdout


class _RegistryServer:
    def __init__(self, body: bytes) -> None:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/registry.json"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def registry_url() -> Iterator[str]:
    server = _RegistryServer(FIXTURE.read_bytes())
    yield server.url
    server.close()


def test_a_registry_url_is_read_when_the_person_names_it(cru_bin: str, env: dict[str, str], config: Path,
                                                         registry_url: str) -> None:
    res = _cru(cru_bin, "agents", "--registry", registry_url, env=env)
    assert res.returncode == 0, res.stderr
    assert f"5 agent(s) in {registry_url}:" in res.stdout
    res = _cru(cru_bin, "agents", "add", "uvx-agent", "--registry", registry_url, "--config", str(config), env=env)
    assert res.returncode == 0, res.stderr
    assert "uvx-agent" in tomllib.loads(config.read_text())["agents"]


def test_parse_and_launches_as_a_library() -> None:
    agents = {a.id: a for a in parse_registry(json.loads(FIXTURE.read_text()), "fixture")}
    npx = registry_launches(agents["npx-agent"])[0]
    assert (npx.kind, shlex.join([npx.command, *npx.args])) == ("npx", "npx -y @example/npx-agent@1.2.3 --acp")
    both = registry_launches(agents["both-agent"], platform="linux-x86_64")
    assert [x.kind for x in both] == ["npx", "binary"]
    assert registry_launches(agents["binary-agent"], platform="windows-aarch64") == []
