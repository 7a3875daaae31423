"""bench/flood.py still runs end to end (a small N; figures are not asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "flood.py"


def test_flood_bench_runs_every_reader_and_counts_every_event() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--n", "300", "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {line.split()[0] for line in done.stdout.splitlines() if line.strip()}
    assert {"host", "stack", "sdk", "bare"} <= rows
    assert "host / sdk" in done.stdout and "host / bare" in done.stdout
