"""Fixtures for tests/delegation (helpers: delegation_helpers.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from delegation_helpers import Setup


@pytest.fixture
def setup(tmp_path: Path, fixture_kiln_src: Path, clean_env: dict[str, str]) -> Iterator[Setup]:
    yield Setup(tmp_path, fixture_kiln_src, clean_env)
