"""Fixtures for the index/search tests: small kilns in tmp dirs and a real Chroma server."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from index_helpers import TINY_NOTES, write_notes


@pytest.fixture
def tiny_kiln(tmp_path: Path) -> Path:
    root = tmp_path / "tiny"
    write_notes(root, TINY_NOTES)
    return root


@pytest.fixture
def tmp_kiln(tmp_path: Path, fixture_kiln_src: Path) -> Path:
    """A writable copy of the project's fixture kiln."""
    dst = tmp_path / "kiln"
    shutil.copytree(fixture_kiln_src, dst, ignore=shutil.ignore_patterns(".crucible"))
    return dst


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def chroma_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `chroma run` on 127.0.0.1 (free port, tmp data dir), stopped after the session.
    Ready when it logs that it listens (read from its output, no polling), then checked with a
    heartbeat."""
    chroma = Path(sys.executable).parent / "chroma"
    port = _free_port()
    data = tmp_path_factory.mktemp("chroma-server")
    proc = subprocess.Popen(
        [str(chroma), "run", "--host", "127.0.0.1", "--port", str(port), "--path", str(data)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
    )
    ready = threading.Event()
    output: list[str] = []

    def drain() -> None:  # read everything, so the server never blocks on a full pipe
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            if "listening on address" in line:
                ready.set()
        ready.set()  # it exited

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        if not ready.wait(60) or proc.poll() is not None:
            raise RuntimeError("chroma run did not start:\n" + "".join(output[-30:]))
        url = f"http://127.0.0.1:{port}"
        httpx.get(f"{url}/api/v2/heartbeat", timeout=10).raise_for_status()
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(5)
