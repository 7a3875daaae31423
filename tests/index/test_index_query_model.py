"""Issue 15: a search on a kiln mostly not embedded yet does not wait for the query model to
load (seconds, holding the GIL): it answers by words, then the model loads in the background,
once, for the next search; a kiln mostly embedded waits for it as before (`cru mcp`'s
semantic_search)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from crucible.config import Config
from crucible.kiln.builder import BackgroundIndex


class SlowModel:
    """An embedder whose model load the test lets finish (a stand-in inside a unit test)."""

    name = "builtin:slow"
    dim = 384

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.loads = 0
        self._loaded = False

    @property
    def loaded(self) -> bool:
        return self._loaded

    def load(self) -> None:
        self.loads += 1
        self.started.set()
        assert self.release.wait(30)
        self._loaded = True

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.zeros((len(texts), self.dim), dtype=np.float32)


class ServerModel:
    """An embedder with nothing to load (an ollama/openai server)."""

    name = "openai:m"
    dim = 8


def test_the_query_model_loads_once_in_the_background_when_asked(tiny_kiln: Path) -> None:
    background = BackgroundIndex(tiny_kiln, Config(), mode="process")
    try:
        index = background.open_index()
        model = SlowModel()
        index.embedder = model
        assert background.query_embedder_ready() is False  # not loaded: the caller goes on by words
        assert not model.started.is_set()  # asking does not load it
        background.load_query_embedder(after=0.05)
        assert model.started.wait(10)  # the load started, in the background
        background.load_query_embedder()
        assert background.query_embedder_ready() is False  # still loading: no second load
        model.release.set()
        deadline = time.monotonic() + 10
        while not background.query_embedder_ready():
            assert time.monotonic() < deadline, "the loaded model was never seen"
            time.sleep(0.01)
        assert model.loads == 1
        index.embedder = ServerModel()
        assert background.query_embedder_ready() is True  # nothing to load
    finally:
        background.close()
