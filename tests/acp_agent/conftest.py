"""`cru acp` driven by real clients: the ACP SDK's client side and acpx."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "fixtures"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# Shared classes live in acp_agent_driver (a bare `conftest` import can resolve to another
# folder's conftest when the whole suite runs).
from acp_agent_driver import AcpSetup, RealClaude  # noqa: E402


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


@pytest.fixture
def real_claude(npm_ready: None, acp: AcpSetup, fake_llm: Any) -> RealClaude:
    return RealClaude(acp, fake_llm)
