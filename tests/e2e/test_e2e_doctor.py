"""`cru agents` / `cru doctor` against the real agents from npm (initialize only)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import agent_env
import pytest

pytestmark = [pytest.mark.real_agent]


def test_agents_reports_found_missing_and_broken(npm_ready: None, tmp_path: Path, cru_bin: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    node = shutil.which("node")
    assert node is not None
    os.symlink(node, bin_dir / "node")  # node for the agents, but no npx: codex has no fallback
    _, env = agent_env.agent_launch("claude", "http://127.0.0.1:9", tmp_path / "home")
    env["PATH"] = f"{agent_env.npm_bin_dir()}{os.pathsep}{bin_dir}"
    config = tmp_path / "config.toml"
    config.write_text(f'[agents.broken]\ncommand = "{sys.executable}"\nargs = ["-c", "print(\'not acp\')"]\n')
    res = subprocess.run([cru_bin, "--config", str(config), "agents"], env=env, capture_output=True, text=True,
                         timeout=180)
    assert res.returncode == 0, res.stderr
    lines = {line.split()[0]: line for line in res.stdout.splitlines() if line and not line.startswith(" ")}
    for name in ("claude", "opencode"):
        assert lines[name].split()[1] == "ok", res.stdout
    # The adapter the tests pin is the old package, whose answers lag after a cancel: said, with the update.
    rows = res.stdout.splitlines()
    after_claude = rows[rows.index(lines["claude"]) + 1]
    assert "note:" in after_claude and "npm install -g @agentclientprotocol/claude-agent-acp" in after_claude
    assert "note:" not in rows[rows.index(lines["opencode"]) + 1]
    # No key for gemini in this environment: not "ok" beside a problem, but what is missing (16.7).
    assert lines["gemini"].split()[1] == "login" and "GEMINI_API_KEY" in res.stdout, res.stdout
    assert lines["codex"].split()[1] == "missing"
    assert "npm install -g @agentclientprotocol/codex-acp" in res.stdout
    assert lines["broken"].split()[1] == "broken"
    assert "initialize" in res.stdout


def test_doctor_names_every_problem_with_a_fix(npm_ready: None, tmp_path: Path, cru_bin: str) -> None:
    _, env = agent_env.agent_launch("claude", "http://127.0.0.1:9", tmp_path / "home", api_key=False)
    env.pop("GEMINI_API_KEY", None)
    kiln = tmp_path / "kiln"
    kiln.mkdir()
    (kiln / "a.md").write_text("# A\n")
    res = subprocess.run([cru_bin, "doctor", "--kiln", str(kiln)], env=env, capture_output=True, text=True,
                         timeout=180)
    # A kiln never indexed is no problem (every session builds its index in the background): the
    # line says so and how to build it now. Nothing here stops a chat (OpenCode runs; Claude's missing
    # login is named with its fix below), so the exit is 0.
    assert res.returncode == 0, res.stdout
    index_line = next(line for line in res.stdout.splitlines() if line.split()[1:2] == ["index"])
    assert index_line.startswith("ok ") and "builds it in the background" in index_line, res.stdout
    assert f"cru kiln index --kiln {kiln}" in index_line
    assert "ANTHROPIC_API_KEY" in res.stdout  # claude speaks ACP but has no login: the fix is shown
    assert "ok  node" in res.stdout
