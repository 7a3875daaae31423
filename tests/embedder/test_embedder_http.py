"""Ollama and OpenAI-compatible embedders against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import socket

import numpy as np
import pytest
from embedder_fake_server import FAKE_DIM, FakeServer, fake_vector, unit

from crucible.config import EmbedderConfig
from crucible.errors import CrucibleError
from crucible.kiln.embedder import OllamaEmbedder, make_embedder

TEXTS = [f"note number {i}" for i in range(7)] + ["", "日本語"]


def _dead_url() -> str:
    # A port that was free a moment ago and that nobody listens on now.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _expected(texts: list[str]) -> np.ndarray:
    return np.stack([unit(fake_vector(t)) for t in texts])


@pytest.mark.parametrize("provider", ["ollama", "openai"])
def test_http_embedder_batches_normalises_and_keeps_order(
    fake_server: FakeServer, provider: str
) -> None:
    e = make_embedder(
        EmbedderConfig(provider=provider, model="fake-embed", url=fake_server.url, batch_size=4)  # type: ignore[arg-type]
    )
    assert e.name == f"{provider}:fake-embed"
    fake_server.shuffle = True  # only the OpenAI answer has indexes to reorder by
    vectors = e.embed(TEXTS)
    assert vectors.dtype == np.float32 and vectors.shape == (len(TEXTS), FAKE_DIM)
    np.testing.assert_allclose(vectors, _expected(TEXTS), rtol=1e-6)
    assert e.dim == FAKE_DIM
    path = "/api/embed" if provider == "ollama" else "/v1/embeddings"
    assert [r["path"] for r in fake_server.requests] == [path] * 3
    assert [r["body"]["input"] for r in fake_server.requests] == [TEXTS[0:4], TEXTS[4:8], TEXTS[8:]]
    assert all(r["body"]["model"] == "fake-embed" for r in fake_server.requests)


def test_ollama_order_is_the_servers_list_order(fake_server: FakeServer) -> None:
    e = make_embedder(EmbedderConfig(provider="ollama", model="m", url=fake_server.url))
    np.testing.assert_allclose(e.embed(TEXTS), _expected(TEXTS), rtol=1e-6)
    assert len(fake_server.requests) == 1  # batch_size 16 fits all


def test_openai_sends_bearer_key_and_accepts_v1_in_url(fake_server: FakeServer) -> None:
    e = make_embedder(
        EmbedderConfig(
            provider="openai", model="m", url=fake_server.url + "/v1/", api_key="sk-test"
        )
    )
    e.embed(["x"])
    assert fake_server.requests[0]["path"] == "/v1/embeddings"
    assert fake_server.requests[0]["auth"] == "Bearer sk-test"


def test_dim_is_learned_by_asking_once(fake_server: FakeServer) -> None:
    e = make_embedder(EmbedderConfig(provider="ollama", model="m", url=fake_server.url))
    assert e.dim == FAKE_DIM
    assert e.dim == FAKE_DIM
    assert len(fake_server.requests) == 1


@pytest.mark.parametrize("provider", ["ollama", "openai"])
def test_server_down_names_url_and_what_to_check(provider: str) -> None:
    url = _dead_url()
    e = make_embedder(EmbedderConfig(provider=provider, model="m", url=url))  # type: ignore[arg-type]
    with pytest.raises(CrucibleError) as info:
        e.embed(["hello"])
    assert url in info.value.message and "cannot be reached" in info.value.message
    assert info.value.fix and "running" in info.value.fix and "url" in info.value.fix


@pytest.mark.parametrize(
    ("status", "body", "hint"),
    [
        (401, '{"error": {"message": "Incorrect API key provided"}}', "api_key"),
        (404, '{"error": "model \\"m\\" not found, try pulling it first"}', "exists on the server"),
        (500, "internal error", "serves embeddings"),
    ],
)
def test_server_error_is_reported_with_its_message(
    fake_server: FakeServer, status: int, body: str, hint: str
) -> None:
    fake_server.fail_with = (status, body)
    e = make_embedder(EmbedderConfig(provider="openai", model="m", url=fake_server.url))
    with pytest.raises(CrucibleError) as info:
        e.embed(["hello"])
    msg = info.value.message
    assert f"{fake_server.url}/v1/embeddings" in msg and f"HTTP {status}" in msg
    assert body[:20] in msg
    assert info.value.fix and hint in info.value.fix


def test_answer_that_is_not_embeddings_is_an_error(fake_server: FakeServer) -> None:
    fake_server.garbage = '{"hello": "world"}'
    e = make_embedder(EmbedderConfig(provider="ollama", model="m", url=fake_server.url))
    with pytest.raises(CrucibleError, match="not an embeddings response") as info:
        e.embed(["hello"])
    assert info.value.fix and "ollama server" in info.value.fix


def test_wrong_number_of_vectors_is_an_error(fake_server: FakeServer) -> None:
    fake_server.garbage = '{"embeddings": [[1.0, 2.0]]}'
    e = make_embedder(EmbedderConfig(provider="ollama", model="m", url=fake_server.url))
    with pytest.raises(CrucibleError, match="returned 1 vectors for 2 texts"):
        e.embed(["a", "b"])


def test_http_config_errors() -> None:
    with pytest.raises(CrucibleError, match="needs a model name") as info:
        make_embedder(EmbedderConfig(provider="ollama"))
    assert info.value.fix and "model =" in info.value.fix
    with pytest.raises(CrucibleError, match="not an http"):
        make_embedder(EmbedderConfig(provider="openai", model="m", url="localhost:1234"))


def test_defaults_point_at_the_usual_servers() -> None:
    ollama = make_embedder(EmbedderConfig(provider="ollama", model="m"))
    assert isinstance(ollama, OllamaEmbedder)
    assert ollama.url == "http://127.0.0.1:11434"
