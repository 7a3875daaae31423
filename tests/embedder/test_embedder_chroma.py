"""The embedder as Chroma's embedding function: a real PersistentClient, reopened in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import chromadb
import pytest
from embedder_fake_server import FakeServer

from crucible.config import EmbedderConfig
from crucible.kiln.embedder import CrucibleEmbeddingFunction, make_embedder, model_dir

DOCS = {
    "pasta": "Boil the pasta in salted water for nine minutes, then toss it with olive oil.",
    "index": "To rebuild the search index, run cru kiln index --rebuild in the kiln folder.",
    "garden": "Tomatoes need full sun and regular watering through the summer.",
}

# Runs in a fresh interpreter: only the registration in crucible.kiln.embedder tells Chroma
# how to rebuild the embedding function from the collection's stored config.
REOPEN = r"""
import json, sys
import chromadb
import crucible.kiln.embedder  # registers "crucible"
client = chromadb.PersistentClient(path=sys.argv[1])
col = client.get_collection("notes")
res = col.query(query_texts=[sys.argv[2]], n_results=3)
ef = col.configuration_json["embedding_function"]
print(json.dumps({"ids": res["ids"][0], "ef": ef, "space": col.configuration_json["hnsw"]["space"],
                  "class": type(col.configuration["embedding_function"]).__name__}))
"""


def _reopen(path: Path, query: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", REOPEN, str(path), query],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_builtin_collection_reopens_and_queries_in_a_fresh_process(tmp_path: Path) -> None:
    store = tmp_path / "chroma"
    ef = CrucibleEmbeddingFunction(make_embedder(EmbedderConfig()))
    client = chromadb.PersistentClient(path=str(store))
    col = client.create_collection("notes", embedding_function=ef)  # type: ignore[arg-type]
    col.add(ids=list(DOCS), documents=list(DOCS.values()))
    assert col.query(query_texts=["how long to cook spaghetti"], n_results=1)["ids"][0] == ["pasta"]
    del col, client

    got = _reopen(store, "regenerate the note index")
    assert got["ids"][0] == "index"
    assert got["class"] == "CrucibleEmbeddingFunction"
    assert got["ef"]["name"] == "crucible"
    assert got["ef"]["config"] == {"provider": "builtin", "model": None, "url": None}
    assert got["space"] == "cosine"
    # Nothing machine-specific in the store: not the weights' folder, not the store's own path.
    raw = b"".join(p.read_bytes() for p in store.rglob("*.sqlite3"))
    assert str(model_dir()).encode() not in raw
    assert str(tmp_path).encode() not in raw


def test_http_embedder_config_keeps_url_but_never_the_api_key(
    tmp_path: Path, fake_server: FakeServer
) -> None:
    store = tmp_path / "chroma"
    cfg = EmbedderConfig(
        provider="openai", model="fake-embed", url=fake_server.url, api_key="sk-very-secret"
    )
    client = chromadb.PersistentClient(path=str(store))
    ef = CrucibleEmbeddingFunction(make_embedder(cfg))
    col = client.create_collection("notes", embedding_function=ef)  # type: ignore[arg-type]
    col.add(ids=list(DOCS), documents=list(DOCS.values()))
    del col, client

    got = _reopen(store, DOCS["garden"])  # the fake server's vectors only match identical text
    assert got["ids"][0] == "garden"
    assert got["ef"]["config"] == {
        "provider": "openai",
        "model": "fake-embed",
        "url": fake_server.url,
    }
    raw = b"".join(p.read_bytes() for p in store.rglob("*") if p.is_file())
    assert b"sk-very-secret" not in raw
    # The first process sent the key; the reopened one has none from the store.
    assert fake_server.requests[0]["auth"] == "Bearer sk-very-secret"
    assert fake_server.requests[-1]["auth"] is None


def test_embedding_function_round_trips_its_config() -> None:
    ef = CrucibleEmbeddingFunction(
        config=EmbedderConfig(provider="ollama", model="nomic", url="http://127.0.0.1:1")
    )
    again = CrucibleEmbeddingFunction.build_from_config(ef.get_config())
    assert again.get_config() == ef.get_config()
    assert again.embedder.name == "ollama:nomic"
    assert CrucibleEmbeddingFunction.name() == "crucible"
    with pytest.raises(ValueError, match="unknown crucible embedder provider"):
        CrucibleEmbeddingFunction.validate_config({"provider": "torch"})


def test_embedding_function_output_is_what_chroma_expects() -> None:
    ef = CrucibleEmbeddingFunction(make_embedder(EmbedderConfig()))
    vectors = ef(["hello", "world"])
    assert len(vectors) == 2 and len(vectors[0]) == 384
