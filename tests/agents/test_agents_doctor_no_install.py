"""`cru doctor` and `cru agents` inspect; they never install (issue 17, "Also"; issue 18).

Before: with `claude-agent-acp` and `codex-acp` missing from PATH, both commands ran
`npx -y @zed-industries/claude-agent-acp` (and codex's) to probe them, and npx downloaded
~300 MB from the npm registry without asking. Here the real `npx` sits behind a wrapper that
logs every start, npm's registry and every proxy variable point at a listener on 127.0.0.1
that counts connections, and npm's cache is empty: any npx start or download attempt shows.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest


class ConnectionCounter:
    """A TCP listener on 127.0.0.1 that accepts, counts and drops every connection."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.count = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.count += 1
            conn.close()

    def close(self) -> None:
        # shutdown wakes the blocked accept(); close alone does not on Linux.
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self._thread.join(timeout=5)


@pytest.fixture
def counter() -> Iterator[ConnectionCounter]:
    c = ConnectionCounter()
    yield c
    c.close()


@pytest.fixture
def npx_env(tmp_path: Path, clean_env: dict[str, str], counter: ConnectionCounter) -> dict[str, str]:
    """PATH with node and a logging wrapper around the real npx, and no agent installed."""
    real_npx = shutil.which("npx")
    node = shutil.which("node")
    if real_npx is None or node is None:
        pytest.skip("node/npx are not installed on this machine (the scripts/setup-npm step needs them)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(node, bin_dir / "node")
    log = tmp_path / "npx-starts.log"
    wrapper = bin_dir / "npx"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\nexec "{real_npx}" "$@"\n')
    wrapper.chmod(0o755)
    env = dict(clean_env)
    home = tmp_path / "home"
    home.mkdir()
    listener = f"http://127.0.0.1:{counter.port}"
    env.update({
        "HOME": str(home),
        # the wrapper first; no npm bin dir of the tests, so no agent is installed
        "PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "npm_config_registry": f"{listener}/",
        "npm_config_cache": str(tmp_path / "npm-cache"),
        "HTTP_PROXY": listener, "HTTPS_PROXY": listener, "ALL_PROXY": listener,
        "http_proxy": listener, "https_proxy": listener, "all_proxy": listener,
    })
    env.pop("NO_PROXY", None)
    env.pop("no_proxy", None)
    return env


def _cru(cru_bin: str, *argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([cru_bin, *argv], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", [["doctor"], ["agents"]])
def test_inspecting_agents_starts_no_npx_and_makes_no_network_call(
        command: list[str], npx_env: dict[str, str], counter: ConnectionCounter, tmp_path: Path,
        fixture_kiln_src: Path, cru_bin: str) -> None:
    if command == ["doctor"]:
        command = [*command, "--kiln", str(fixture_kiln_src)]
    res = _cru(cru_bin, *command, env=npx_env)
    assert not (tmp_path / "npx-starts.log").exists(), (
        "npx was started: " + (tmp_path / "npx-starts.log").read_text())
    assert counter.count == 0, f"{counter.count} connection(s) to the registry/proxy"
    assert not (tmp_path / "npm-cache").exists() or not any((tmp_path / "npm-cache").rglob("*.tgz"))
    for package in ("@agentclientprotocol/claude-agent-acp", "@agentclientprotocol/codex-acp"):
        # what npx would fetch, the command that would fetch it, and the install command
        assert f"would first download the npm package {package}" in res.stdout, res.stdout
        assert f"{tmp_path}/bin/npx -y {package}" in res.stdout
        assert f"npm install -g {package}" in res.stdout
    lines = {line.split()[0]: line for line in res.stdout.splitlines()
             if line and not line.startswith(" ") and len(line.split()) > 1}
    assert lines["claude"].split()[1:3] == ["not", "run"]
    assert lines["codex"].split()[1:3] == ["not", "run"]


def test_doctor_json_says_what_npx_would_fetch(npx_env: dict[str, str], counter: ConnectionCounter,
                                               tmp_path: Path, cru_bin: str, fixture_kiln_src: Path) -> None:
    import json

    res = _cru(cru_bin, "doctor", "--kiln", str(fixture_kiln_src), "--json", env=npx_env)
    data = json.loads(res.stdout)
    agents = {a["name"]: a for a in data["agents"]}
    assert agents["claude"]["would_fetch"] == "npm package @agentclientprotocol/claude-agent-acp"
    assert agents["claude"]["speaks_acp"] is None  # not probed
    assert agents["opencode"]["would_fetch"] is None and agents["opencode"]["found"] is False
    assert counter.count == 0
    assert not (tmp_path / "npx-starts.log").exists()


def test_a_profile_that_runs_uvx_is_not_started_either(npx_env: dict[str, str], counter: ConnectionCounter,
                                                       tmp_path: Path, cru_bin: str) -> None:
    uvx_log = tmp_path / "uvx-starts.log"
    uvx = tmp_path / "bin" / "uvx"
    uvx.write_text(f'#!/bin/sh\necho "$@" >> "{uvx_log}"\nexit 1\n')
    uvx.chmod(0o755)
    config = tmp_path / "config.toml"
    config.write_text('[agents.pyagent]\ncommand = "uvx"\nargs = ["--from", "some-agent==1.0", "some-agent", "acp"]\n')
    res = _cru(cru_bin, "agents", "--config", str(config), env=npx_env)
    assert res.returncode == 0, res.stderr
    assert not uvx_log.exists()
    assert "would first download the PyPI package some-agent==1.0" in res.stdout
    assert "run `uvx --from some-agent==1.0 some-agent acp` once yourself" in res.stdout
