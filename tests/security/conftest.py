"""Fixtures for the hostile-input and hard-stop tests: real `cru` subprocesses against the
scripted agent, and process-tree checks. The chat runner is the sessions tests' own."""

from __future__ import annotations

import importlib.util
import os
import resource
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTED = REPO / "fixtures" / "scripted_agent.py"


def _sessions_conftest() -> Any:
    spec = importlib.util.spec_from_file_location("sessions_conftest", REPO / "tests" / "sessions" / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ChatRunner = _sessions_conftest().ChatRunner

# A billion-laughs YAML (nine levels of nine aliases: 387 million values once expanded, 383 bytes).
BOMB_YAML = "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9) if prev else ', '.join(['lol'] * 9)}]\n"
    for prev, name in zip(["", *"abcdefgh"], "abcdefghi", strict=True)
)
# Six levels (531,441 values): costs today's code ~1 s, so tests can show it is not refused.
SMALL_BOMB_YAML = "".join(BOMB_YAML.splitlines(keepends=True)[:6])


@pytest.fixture
def kiln(tmp_path: Path, fixture_kiln_src: Path) -> Path:
    dest = tmp_path / "kiln"
    shutil.copytree(fixture_kiln_src, dest, ignore=shutil.ignore_patterns(".crucible"))
    return dest


@pytest.fixture
def chat(cru_bin: str, clean_env: dict[str, str], kiln: Path, tmp_path: Path) -> Iterator[Any]:
    yield ChatRunner(cru_bin, clean_env, kiln, tmp_path)


def memory_capped(limit_bytes: int = 2 << 30) -> Callable[[], None]:
    """preexec_fn: cap the child's address space, so a regression fails the test instead of
    eating the machine's memory."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    return cap


def wait_until(pred: Callable[[], Any], timeout: float = 10, what: str = "condition") -> Any:
    """Poll a condition another process makes true (no other channel), with a bound."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] not in (b"Z", b"X")


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (children, grandchildren, …), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out: set[int] = set()
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in out:
                out.add(child)
                stack.append(child)
    return out


sys.path.insert(0, str(REPO / "fixtures"))
