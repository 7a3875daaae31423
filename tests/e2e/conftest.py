"""Real agents from npm, driven through `cru chat -p` against the fake LLM, offline."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "fixtures"))

import agent_env  # noqa: E402
import netns  # noqa: E402
from fake_llm import FakeLLM  # noqa: E402


@pytest.fixture(scope="session")
def npm_ready() -> None:
    reason = agent_env.ensure_npm()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def indexed_kiln(tmp_path_factory: pytest.TempPathFactory, fixture_kiln_src: Path, cru_bin: str) -> Path:
    """The fixture kiln with its index built once (copied per test)."""
    dest = tmp_path_factory.mktemp("indexed") / "kiln"
    shutil.copytree(fixture_kiln_src, dest, ignore=shutil.ignore_patterns(".crucible"))
    subprocess.run([cru_bin, "kiln", "index", "--kiln", str(dest)], check=True, capture_output=True, timeout=600)
    return dest


@pytest.fixture
def kiln(tmp_path: Path, indexed_kiln: Path) -> Path:
    dest = tmp_path / "kiln"
    shutil.copytree(indexed_kiln, dest, symlinks=True)
    return dest


@pytest.fixture
def fake_llm() -> Iterator[FakeLLM]:
    with FakeLLM() as llm:
        yield llm


class RealChat:
    def __init__(self, name: str, llm: FakeLLM, kiln: Path, tmp: Path, cru: str, *, api_key: bool = True) -> None:
        self.name, self.llm, self.kiln, self.tmp, self.cru = name, llm, kiln, tmp, cru
        self.work = tmp / "work"
        self.work.mkdir(exist_ok=True)
        _, self.env = agent_env.agent_launch(name, llm.url, tmp / f"home-{name}",  # type: ignore[arg-type]
                                             api_key=api_key)

    def argv(self, prompt: str, *extra: str) -> list[str]:
        argv = [self.cru, "chat", "-a", self.name, "--kiln", str(self.kiln), "--cwd", str(self.work), "-p", prompt,
                *extra]
        if netns.unavailable_reason() is None:
            argv = netns.wrap(argv, [self.llm.port])
        return argv

    def run(self, prompt: str, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(prompt, *extra), env=self.env, capture_output=True, text=True,
                              timeout=timeout, cwd=self.work)

    def spawn(self, prompt: str, *extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(prompt, *extra), env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=self.work, start_new_session=True)


@pytest.fixture(params=["claude", "opencode", "gemini"])
def real_chat(request: pytest.FixtureRequest, npm_ready: None, fake_llm: FakeLLM, kiln: Path, tmp_path: Path,
              cru_bin: str) -> Iterator[RealChat]:
    yield RealChat(request.param, fake_llm, kiln, tmp_path, cru_bin)
    # Claude's CLI writes into HOME just after it exits; let the group finish before tmp_path goes.
    time.sleep(0)
