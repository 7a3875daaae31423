"""Soak (slow tier, loopback only): 20 concurrent sessions in one `cru acp` process with the
scripted agent, 200 turns in all, a backend killed with SIGKILL now and then. Every streamed
chunk reaches the editor in order under the right session; the killed session's turn fails
with a message and a new session replaces it; no file descriptor or process leaks; RSS stays
flat after the first round. The figures are printed (run with -s to see them)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import descendants, script_file, scripted_command, wait_until

pytestmark = pytest.mark.slow

SESSIONS = 20
ROUNDS = 10  # 20 sessions x 10 rounds = 200 turns
CHUNKS = 30
KILL_EVERY = 3  # rounds: one backend killed mid-turn in each of these
# Each turn streams CHUNKS pieces naming its prompt, with a pause halfway (time to kill it).
TURN = {"steps": [*({"text": f"{{prompt}}#{i} "} for i in range(CHUNKS // 2)), {"sleep": 0.3},
                  *({"text": f"{{prompt}}#{i} "} for i in range(CHUNKS // 2, CHUNKS))]}


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _backends(pid: int) -> set[int]:
    out = set()
    for p in descendants(pid):
        try:
            if b"scripted_agent.py" in Path(f"/proc/{p}/cmdline").read_bytes():
                out.add(p)
        except OSError:
            pass
    return out


class Editor:
    """One connection to `cru acp`, many sessions; frames read by a thread, kept in order."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, err: Path) -> None:
        self._err = err.open("wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err,
                                     env=env, cwd=cwd, start_new_session=True)
        self.inbox: queue.Queue[Any] = queue.Queue()
        self._next = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.inbox.put(json.loads(line))
        self.inbox.put(None)

    def send(self, method: str, params: dict[str, Any]) -> int:
        assert self.proc.stdin is not None
        self._next += 1
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": self._next, "method": method,
                                          "params": params}).encode() + b"\n")
        self.proc.stdin.flush()
        return self._next

    def collect(self, ids: set[int], timeout: float = 120) -> tuple[dict[int, Any], list[Any]]:
        """Frames until every request in `ids` is answered: (answers by id, updates in order)."""
        answers: dict[int, Any] = {}
        updates: list[Any] = []
        deadline = time.monotonic() + timeout
        while set(answers) != ids:
            frame = self.inbox.get(timeout=max(0.1, deadline - time.monotonic()))
            assert frame is not None, "cru acp closed its output"
            if frame.get("method") == "session/update":
                updates.append(frame["params"])
            elif frame.get("id") in ids and "method" not in frame:
                answers[frame["id"]] = frame
        return answers, updates

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            return self.proc.wait(30)
        finally:
            self._err.close()


def test_twenty_sessions_two_hundred_turns_with_backends_killed(cru_bin: str, clean_env: dict[str, str],
                                                                  kiln: Path, tmp_path: Path) -> None:
    script = script_file(tmp_path, {"default_turn": TURN})
    editor = Editor([cru_bin, "acp", "--agent-command", scripted_command(script), "--kiln", str(kiln)],
                    clean_env, tmp_path, tmp_path / "acp.err")
    pid = editor.proc.pid
    figures: dict[str, Any] = {}
    try:
        init = editor.send("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        editor.collect({init})
        slots: dict[int, str] = {}  # slot -> session id
        owner: dict[int, int] = {}  # slot -> its backend's pid

        def open_slot(slot: int) -> None:
            before = _backends(pid)
            rid = editor.send("session/new", {"cwd": str(tmp_path), "mcpServers": []})
            answers, _ = editor.collect({rid})
            slots[slot] = answers[rid]["result"]["sessionId"]
            owner[slot] = wait_until(lambda: next(iter(_backends(pid) - before), None), 30, "the new backend")

        for slot in range(SESSIONS):
            open_slot(slot)
        figures["sessions"] = SESSIONS
        figures["before"] = {"rss_kib": _rss_kib(pid), "fds": _fds(pid), "processes": len(descendants(pid))}
        figures["rounds"] = []
        turns = kills = events = 0
        started = time.monotonic()
        for rnd in range(ROUNDS):
            prompts = {}
            for slot, sid in slots.items():
                text = f"s{slot}-r{rnd}"
                prompts[editor.send("session/prompt", {"sessionId": sid,
                                                       "prompt": [{"type": "text", "text": text}]})] = (slot, text)
            victim = None
            if rnd % KILL_EVERY == KILL_EVERY - 1:
                victim = rnd % SESSIONS
                time.sleep(0.15)  # into the turn's pause (the only sleep: the kill must land mid-turn)
                os.kill(owner[victim], signal.SIGKILL)
                kills += 1
            answers, updates = editor.collect(set(prompts))
            turns += len(prompts)
            events += len(updates)
            by_session: dict[str, list[str]] = {}
            for params in updates:
                update = params["update"]
                if update.get("sessionUpdate") == "agent_message_chunk" and not \
                        update["content"]["text"].startswith("⚠ Crucible:"):  # the session's warnings
                    by_session.setdefault(params["sessionId"], []).append(update["content"]["text"])
            for rid, (slot, text) in prompts.items():
                got = by_session.get(slots[slot], [])
                expected = [f"{text}#{i} " for i in range(CHUNKS)]
                if slot == victim:
                    assert "error" in answers[rid], answers[rid]
                    assert got == expected[:len(got)], "the killed session's chunks are out of order"
                    assert "exit" in answers[rid]["error"]["message"] or "closed" in answers[rid]["error"]["message"]
                else:
                    assert answers[rid].get("result", {}).get("stopReason") == "end_turn", answers[rid]
                    assert got == expected, f"session {slot}, round {rnd}: {got[:3]}…"
            if victim is not None:  # the editor replaces the dead session
                closed = editor.send("session/close", {"sessionId": slots[victim]})
                editor.collect({closed})
                open_slot(victim)
            figures["rounds"].append({"rss_kib": _rss_kib(pid), "fds": _fds(pid)})
            if rnd == 0:
                figures["after round 1"] = {"rss_kib": _rss_kib(pid), "fds": _fds(pid),
                                            "processes": len(descendants(pid))}
        figures["elapsed_s"] = round(time.monotonic() - started, 1)
        # The killed backends are reaped: the tree settles back to its size after round 1.
        wait_until(lambda: len(descendants(pid)) <= figures["after round 1"]["processes"], 10, "the tree to settle")
        figures["end"] = {"rss_kib": _rss_kib(pid), "fds": _fds(pid), "processes": len(descendants(pid))}
        figures["turns"], figures["kills"], figures["session_updates"] = turns, kills, events
    finally:
        code = editor.close()
    print("soak figures:", json.dumps(figures))
    assert turns == SESSIONS * ROUNDS and kills == ROUNDS // KILL_EVERY
    assert code == 0
    start, end = figures["after round 1"], figures["end"]
    assert end["processes"] == start["processes"], figures
    assert end["fds"] <= start["fds"] + 2, figures  # no leak (a pipe or two may be mid-reuse)
    assert end["rss_kib"] <= start["rss_kib"] * 1.25, figures  # flat, with room for allocator noise
