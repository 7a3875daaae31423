"""Shared test fixtures. Area-specific fixtures live in each tests/<area>/conftest.py."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_KILN = REPO_ROOT.parent / "shared" / "kilns" / "crucible-docs"


@pytest.fixture(autouse=True)
def _no_secrets_from_other_tests() -> Iterator[None]:
    """The secrets a test's config or session remembered (process-wide, as in `cru`) end with
    it: a `{env:K}` of "secret" loaded by one test masked "secret" inside another's text."""
    from crucible.redaction import forget_all

    yield
    forget_all()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def fixture_kiln_src() -> Path:
    """The project's own sample kiln (read-only: the `kiln` fixture is a copy to write in)."""
    return REPO_ROOT / "fixtures" / "kiln"


@pytest.fixture
def kiln(tmp_path: Path, fixture_kiln_src: Path) -> Path:
    """A writable copy of the sample kiln, without its index (e2e and plugins have their own)."""
    dest = tmp_path / "kiln"
    shutil.copytree(fixture_kiln_src, dest, ignore=shutil.ignore_patterns(".crucible"))
    return dest


@pytest.fixture(scope="session")
def shared_kiln() -> Path:
    if not SHARED_KILN.is_dir():
        pytest.skip(f"the sample kiln {SHARED_KILN.name} is not beside the project")
    return SHARED_KILN


@pytest.fixture(scope="session")
def cru_bin() -> str:
    """The `cru` executable of the venv running the tests."""
    return str(Path(sys.executable).parent / "cru")


@pytest.fixture
def clean_env(tmp_path: Path) -> dict[str, str]:
    """The environment with a private config and data dir, so tests never read the person's own."""
    env = dict(os.environ)
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg-config")
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg-data")
    env.pop("CRUCIBLE_CONFIG", None)
    env.pop("CRUCIBLE_KILN", None)
    return env


def pytest_collectstart(collector: pytest.Collector) -> None:
    """Test modules import helpers with `from conftest import ...`. Every folder's conftest.py
    is a module named `conftest`, so point that name at the collected module's own folder's
    conftest before the module is imported (otherwise the last one loaded wins)."""
    path = getattr(collector, "path", None)
    if not isinstance(collector, pytest.Module) or path is None:
        return
    local = str(path.parent / "conftest.py")
    for plugin in collector.config.pluginmanager.get_plugins():
        if getattr(plugin, "__file__", None) == local:
            sys.modules["conftest"] = plugin
            return
