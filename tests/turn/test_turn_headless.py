"""What a one-turn `cru chat -p` does at its start and its end, that the person waits for:
the agent is stopped and reaped even when it ignores stdin closing, the turn never loads the
vector store it does not use, and an agent may exit by itself within its exit grace."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import trio

from acp_host.process import AgentProcess

REPO = Path(__file__).resolve().parents[2]
SCRIPTED = REPO / "fixtures" / "scripted_agent.py"


def _agent_command(tmp: Path, script: dict[str, object]) -> tuple[str, Path]:
    """The scripted agent, started through sh so it writes its pid (= its process group) first."""
    path = tmp / "script.json"
    path.write_text(json.dumps(script))
    pidfile = tmp / "agent.pid"
    inner = f"echo $$ > {shlex.quote(str(pidfile))}; exec {shlex.quote(sys.executable)} " \
            f"{shlex.quote(str(SCRIPTED))} {shlex.quote(str(path))}"
    return f"sh -c {shlex.quote(inner)}", pidfile


def _run(cru: str, env: dict[str, str], kiln: Path, tmp: Path, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([cru, "chat", "--agent-command", command, "--kiln", str(kiln), "-p", "hello"],
                          env=env, capture_output=True, text=True, timeout=120, cwd=tmp)


def test_turn_an_agent_that_ignores_stdin_close_is_stopped_and_reaped(
        cru_bin: str, clean_env: dict[str, str], fixture_kiln_src: Path, tmp_path: Path) -> None:
    command, pidfile = _agent_command(tmp_path, {"ignore_stdin_close": True,
                                                 "prompts": [[{"text": "all done"}]]})
    res = _run(cru_bin, clean_env, fixture_kiln_src, tmp_path, command)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "all done"
    pgid = int(pidfile.read_text())
    try:  # cru reaps its agent before it exits: nothing of the group is left, not even a zombie
        os.killpg(pgid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive, f"the agent's process group {pgid} outlived cru chat -p"


def test_turn_a_headless_turn_never_loads_the_vector_store(
        cru_bin: str, clean_env: dict[str, str], fixture_kiln_src: Path, tmp_path: Path) -> None:
    # -X importtime lists every module cru imports on its stderr (the agent's own stderr is
    # kept by cru, not printed).
    command, _ = _agent_command(tmp_path, {"prompts": [[{"text": "no search needed"}]]})
    env = {**clean_env, "PYTHONPROFILEIMPORTTIME": "1"}
    res = _run(cru_bin, env, fixture_kiln_src, tmp_path, command)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "no search needed" in res.stdout
    imported = {line.split("|")[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
    assert "acp.schema" in imported  # the listing works: the modules the turn needs are there
    assert not {m for m in imported if m.split(".")[0] in ("chromadb", "onnxruntime")}


async def test_turn_exit_grace_lets_the_agent_exit_by_itself_or_ends_it() -> None:
    # Exits 7 on its own, a moment after its stdin closes.
    argv = ["sh", "-c", "cat > /dev/null; sleep 0.5; exit 7"]
    async with trio.open_nursery() as nursery:
        patient = await AgentProcess.start(nursery, argv)
        patient.exit_grace = 60
        await patient.aclose()
        hasty = await AgentProcess.start(nursery, argv)
        hasty.exit_grace = 0
        await hasty.aclose()
    assert patient.returncode == 7
    assert hasty.returncode == -signal.SIGTERM
