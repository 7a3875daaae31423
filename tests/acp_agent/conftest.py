"""`cru acp` driven by real clients: the ACP SDK's client side and acpx."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "fixtures"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SCRIPTED = REPO / "fixtures" / "scripted_agent.py"
ECHO_MCP = REPO / "fixtures" / "echo_mcp_server.py"


class AcpSetup:
    """A private kiln, work folder, data dir and scripted-agent log for one test."""

    def __init__(self, tmp: Path, env: dict[str, str], kiln: Path, cru: str) -> None:
        self.tmp, self.env, self.kiln, self.cru = tmp, env, kiln, cru
        self.work = tmp / "work"
        self.work.mkdir()
        self.log_path = tmp / "agent-log.jsonl"
        self.stderr_path = tmp / "cru-acp-stderr.txt"
        self.script_path = tmp / "script.json"

    def script(self, data: dict[str, Any]) -> Path:
        self.script_path.write_text(json.dumps({"log": str(self.log_path), **data}), encoding="utf-8")
        return self.script_path

    @property
    def agent_command(self) -> str:
        return shlex.join([sys.executable, str(SCRIPTED), str(self.script_path)])

    def argv(self, *extra: str, agent_command: str | None = None) -> list[str]:
        return [self.cru, "acp", "--agent-command", agent_command or self.agent_command,
                "--kiln", str(self.kiln), *extra]

    def log(self) -> list[dict[str, Any]]:
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text(encoding="utf-8").splitlines() if line.strip()]

    def results(self, name: str | None = None) -> list[Any]:
        """What the backend got back for its requests named `name` (the JSON-RPC result, or the
        whole answer when it was an error)."""
        out = []
        for e in self.log():
            if e.get("kind") == "result" and (name is None or e.get("as") == name):
                r = e["result"]
                out.append(r["result"] if isinstance(r, dict) and "result" in r else r)
        return out

    def inbound(self, method: str) -> list[dict[str, Any]]:
        return [e["frame"] for e in self.log() if e.get("kind") == "in" and e["frame"].get("method") == method]

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""


@pytest.fixture
def acp(tmp_path: Path, clean_env: dict[str, str], fixture_kiln_src: Path, cru_bin: str) -> AcpSetup:
    kiln = tmp_path / "kiln"
    shutil.copytree(fixture_kiln_src, kiln, ignore=shutil.ignore_patterns(".crucible"))
    return AcpSetup(tmp_path, clean_env, kiln, cru_bin)


@pytest.fixture(scope="session")
def npm_ready() -> None:
    import agent_env

    reason = agent_env.ensure_npm()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def acpx_bin(npm_ready: None) -> str:
    import agent_env

    bin_dir = agent_env.npm_bin_dir()
    acpx = bin_dir / "acpx" if bin_dir is not None else None
    if acpx is None or not acpx.exists():
        pytest.skip(f"acpx is not installed in {bin_dir} (scripts/setup-npm installs it)")
    return str(acpx)


@pytest.fixture
def fake_llm() -> Iterator[Any]:
    from fake_llm import FakeLLM

    with FakeLLM() as llm:
        yield llm


class RealClaude:
    """`cru acp -a claude` (the real claude-agent-acp from npm) against the fake LLM, offline."""

    def __init__(self, acp: AcpSetup, llm: Any) -> None:
        import agent_env

        self.acp, self.llm = acp, llm
        _, env = agent_env.agent_launch("claude", llm.url, acp.tmp / "home")
        self.env = {**env, "XDG_CONFIG_HOME": acp.env["XDG_CONFIG_HOME"], "XDG_DATA_HOME": acp.env["XDG_DATA_HOME"]}

    def argv(self, *extra: str) -> list[str]:
        import netns

        argv = [self.acp.cru, "acp", "-a", "claude", "--kiln", str(self.acp.kiln), *extra]
        if netns.unavailable_reason() is None:
            argv = netns.wrap(argv, [self.llm.port])
        return argv


@pytest.fixture
def real_claude(npm_ready: None, acp: AcpSetup, fake_llm: Any) -> RealClaude:
    return RealClaude(acp, fake_llm)
