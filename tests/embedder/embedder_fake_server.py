"""Helpers for tests/embedder: a real HTTP embedding server on 127.0.0.1 (Ollama and OpenAI routes) for the HTTP embedders."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

FAKE_DIM = 8


def fake_vector(text: str) -> list[float]:
    """Deterministic, deliberately not unit length (the embedders must normalise)."""
    digest = hashlib.sha256(text.encode()).digest()
    return [float(b) - 100.0 for b in digest[:FAKE_DIM]]


def unit(v: list[float]) -> np.ndarray:
    a = np.asarray(v, dtype=np.float32)
    return a / np.linalg.norm(a)


@dataclass
class FakeServer:
    url: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    # Set to (status, body) to make every request fail that way.
    fail_with: tuple[int, str] | None = None
    # Set to a body to answer 200 with something that is not an embeddings response.
    garbage: str | None = None
    # OpenAI answers: shuffle the data items (their `index` says where each goes).
    shuffle: bool = False


def serve_fake_embeddings() -> Iterator[FakeServer]:
    state = FakeServer(url="")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
            pass

        def _send(self, status: int, body: str) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.requests.append(
                {"path": self.path, "body": body, "auth": self.headers.get("Authorization")}
            )
            if state.fail_with:
                self._send(*state.fail_with)
                return
            if state.garbage is not None:
                self._send(200, state.garbage)
                return
            texts = body["input"]
            if self.path == "/api/embed":
                self._send(
                    200,
                    json.dumps(
                        {"model": body["model"], "embeddings": [fake_vector(t) for t in texts]}
                    ),
                )
            elif self.path == "/v1/embeddings":
                data = [
                    {"object": "embedding", "index": i, "embedding": fake_vector(t)}
                    for i, t in enumerate(texts)
                ]
                if state.shuffle:
                    data.reverse()
                self._send(
                    200, json.dumps({"object": "list", "data": data, "model": body["model"]})
                )
            else:
                self._send(404, json.dumps({"error": f"no route {self.path}"}))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
