"""Start-up errors of the real agents point the right way (issue 16, defect 7): the real Claude
adapter as root with an IS_SANDBOX other than 1 (this machine's own environment has
IS_SANDBOX=yes, which the adapter accepts and the Claude Code CLI it runs refuses), and Gemini
without a key — in `cru chat -p`, in `cru acp` and in `cru doctor`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import agent_env
import netns
import pytest
from conftest import RealChat

pytestmark = [pytest.mark.real_agent]

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="Claude Code's root rule applies to root only")


@ROOT_ONLY
def test_claude_as_root_without_is_sandbox_1_is_named_with_its_fix(npm_ready: None, fake_llm, kiln: Path,
                                                                     tmp_path: Path, cru_bin: str) -> None:
    chat = RealChat("claude", fake_llm, kiln, tmp_path, cru_bin)
    chat.env["IS_SANDBOX"] = "yes"
    res = chat.run("hello")
    assert res.returncode == 1, res.stderr
    assert "Claude Code refuses to start as root with IS_SANDBOX=yes" in res.stderr, res.stderr
    assert "fix: set IS_SANDBOX=1" in res.stderr
    assert "Internal error" not in res.stderr and "cru doctor" not in res.stderr
    assert not fake_llm.requests  # it never got as far as the model


@ROOT_ONLY
def test_cru_acp_hands_the_editor_the_cause(npm_ready: None, fake_llm, kiln: Path, tmp_path: Path,
                                            cru_bin: str) -> None:
    chat = RealChat("claude", fake_llm, kiln, tmp_path, cru_bin)
    env = {**chat.env, "IS_SANDBOX": "yes"}
    argv = [cru_bin, "acp", "-a", "claude", "--kiln", str(kiln)]
    if netns.unavailable_reason() is None:
        argv = netns.wrap(argv, [fake_llm.port])
    frames = [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1,
                                                                            "clientCapabilities": {}}},
              {"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": str(chat.work),
                                                                             "mcpServers": []}}]
    proc = subprocess.Popen(argv, env=env, cwd=chat.work, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    answer: dict = {}
    try:
        for frame in frames:
            proc.stdin.write(json.dumps(frame) + "\n")
            proc.stdin.flush()
            while True:
                line = proc.stdout.readline()
                assert line, "cru acp closed its output"
                answer = json.loads(line)
                if answer.get("id") == frame["id"]:
                    break
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    error = answer["error"]
    assert "Claude Code refuses to start as root with IS_SANDBOX=yes" in error["message"], error
    assert "IS_SANDBOX=1" in error["data"]["fix"]


@ROOT_ONLY
def test_doctor_never_says_ok_beside_a_problem(npm_ready: None, tmp_path: Path, cru_bin: str) -> None:
    _, env = agent_env.agent_launch("claude", "http://127.0.0.1:9", tmp_path / "home")  # inspecting needs no LLM
    env["IS_SANDBOX"] = "yes"
    env.pop("GEMINI_API_KEY", None)
    kiln = tmp_path / "kiln"
    kiln.mkdir()
    (kiln / "a.md").write_text("# A\n")
    res = subprocess.run([cru_bin, "doctor", "--kiln", str(kiln)], env=env, capture_output=True, text=True,
                         timeout=180)
    rows = res.stdout.splitlines()
    agents = {line.split()[0]: i for i, line in enumerate(rows) if line and not line.startswith(" ")
              and len(line.split()) > 1 and line.split()[0] in ("claude", "opencode", "gemini", "codex")}
    for name, i in agents.items():
        state = rows[i].split()[1]
        follows = rows[i + 1] if i + 1 < len(rows) else ""
        if state == "ok":
            assert "problem:" not in follows, f"{name} is ok beside a problem:\n{res.stdout}"
    claude = rows[agents["claude"]]
    assert claude.split()[1] == "broken", res.stdout
    assert "IS_SANDBOX=yes" in rows[agents["claude"] + 1] and "IS_SANDBOX=1" in rows[agents["claude"] + 2]
    assert rows[agents["gemini"]].split()[1] == "login" and "GEMINI_API_KEY" in res.stdout


def test_gemini_without_a_key_is_told_how_to_log_in(npm_ready: None, fake_llm, kiln: Path, tmp_path: Path,
                                                     cru_bin: str) -> None:
    chat = RealChat("gemini", fake_llm, kiln, tmp_path, cru_bin, api_key=False)
    chat.env.pop("GOOGLE_GEMINI_BASE_URL", None)  # pointed at a base URL it runs without a key
    res = chat.run("hello")
    assert res.returncode == 1, res.stderr
    assert "the agent gemini needs you to log in (Gemini API key is missing or not configured., code -32000)" \
        in res.stderr, res.stderr
    assert "fix: set GEMINI_API_KEY" in res.stderr


def test_opencode_with_a_provider_it_has_no_key_for_says_so(npm_ready: None, fake_llm, kiln: Path,
                                                            tmp_path: Path, cru_bin: str) -> None:
    chat = RealChat("opencode", fake_llm, kiln, tmp_path, cru_bin)
    config = {"autoupdate": False, "share": "disabled", "model": "anthropic/claude-sonnet-4-5",
              "enabled_providers": ["anthropic"]}
    chat.env["OPENCODE_CONFIG_CONTENT"] = json.dumps(config)
    chat.env.pop("ANTHROPIC_API_KEY", None)
    res = chat.run("hello", timeout=180)
    assert res.returncode == 1, res.stderr
    assert "the agent opencode has no model it can use" in res.stderr, res.stderr
    assert "opencode auth login" in res.stderr
