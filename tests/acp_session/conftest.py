"""Fixtures for the ACP session tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from acp_session_helpers import Scripted


@pytest.fixture
def scripted(tmp_path: Path) -> Scripted:
    return Scripted(tmp_path)
