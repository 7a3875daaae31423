"""`cru chat -p` and Ctrl-C (issue 16, defect 11): the graceful session/cancel stays, bounded by
a few seconds for an agent that ignores it; a Ctrl-C while the agent starts stops at once, and
the message says what happened."""

from __future__ import annotations

import os
import signal
import time

from conftest import ChatRunner, group_gone

from crucible.chat import HEADLESS_CANCEL_GRACE


def _inbound(chat: ChatRunner, method: str) -> bool:
    return any(e.get("kind") == "in" and e["frame"].get("method") == method for e in chat.agent_log())


def test_sigint_while_the_agent_starts_stops_at_once_and_says_so(chat: ChatRunner) -> None:
    proc = chat.spawn({"initialize": {"delay": 60}}, "never sent")
    chat.wait_for_log(lambda e: e.get("kind") == "in" and e["frame"].get("method") == "initialize")
    os.kill(proc.pid, signal.SIGINT)
    # Well before the agent's 60 s start, or any 30 s bound, or the 300 s watchdog.
    out, err = proc.communicate(timeout=15)
    assert proc.returncode == 130, err
    assert "stopped by Ctrl-C while the agent was starting; no prompt was sent" in err
    assert "sent nothing" not in err and "Traceback" not in err
    assert not _inbound(chat, "session/prompt")
    assert group_gone(proc.pid)


def test_an_agent_that_ignores_the_cancel_is_stopped_after_the_grace(chat: ChatRunner) -> None:
    script = {"ignore_stdin_close": True,
              "prompts": [{"steps": [{"text": "working"}, {"sleep": 120}]}]}  # sleep: deaf to session/cancel
    proc = chat.spawn(script, "long task")
    chat.wait_for_log(lambda e: e.get("kind") == "in" and e["frame"].get("method") == "session/prompt")
    sent = time.monotonic()
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=HEADLESS_CANCEL_GRACE + 12)  # not the 30 s of the chat
    assert proc.returncode == 130, err
    assert _inbound(chat, "session/cancel")  # the graceful cancel was tried first
    assert f"waiting up to {HEADLESS_CANCEL_GRACE:g} s" in err
    assert f"the agent did not end the turn within {HEADLESS_CANCEL_GRACE:g} s of the cancel; it was stopped" in err
    assert time.monotonic() - sent >= HEADLESS_CANCEL_GRACE  # it did wait for the agent
    assert out.startswith("working")
    assert group_gone(proc.pid)


def test_a_second_sigint_stops_at_once(chat: ChatRunner) -> None:
    script = {"ignore_stdin_close": True, "prompts": [{"steps": [{"text": "working"}, {"sleep": 120}]}]}
    proc = chat.spawn(script, "long task")
    chat.wait_for_log(lambda e: e.get("kind") == "in" and e["frame"].get("method") == "session/prompt")
    os.kill(proc.pid, signal.SIGINT)
    chat.wait_for_log(lambda e: e.get("kind") == "in" and e["frame"].get("method") == "session/cancel")
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 130, err
    assert "stopped at once by a second Ctrl-C" in err
    assert group_gone(proc.pid)
