"""Fixtures for tests/embedder (helpers live in embedder_fake_server.py, a unique module name)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from embedder_fake_server import FakeServer, serve_fake_embeddings


@pytest.fixture
def fake_server() -> Iterator[FakeServer]:
    yield from serve_fake_embeddings()
