"""Saved conversations (issue 16, defects 2 and 3): `cru session resume ID` goes on with the
session's own agent, card, kiln and cwd; an ID prefix works as git's does; one conversation is
one entry in `cru session list` whatever happened to the agent process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pexpect
import pyte
from conftest import SCRIPTED, ChatRunner

from crucible.session_store import SessionMeta, SessionStore, sessions_root


def _cru(chat: ChatRunner, *argv: str, config: Path | None = None, cwd: Path | None = None,
         check: bool = True) -> subprocess.CompletedProcess[str]:
    pre = ["--config", str(config)] if config is not None else []
    res = subprocess.run([chat.cru, *pre, *argv], env=chat.env, capture_output=True, text=True, timeout=90,
                         cwd=cwd or chat.tmp)
    if check:
        assert res.returncode == 0, res.stderr
    return res


def _listed(chat: ChatRunner, *extra: str) -> list[str]:
    return [line for line in _cru(chat, "session", "list", *extra).stdout.splitlines() if line.strip()]


def _profiles(chat: ChatRunner) -> Path:
    """Two scripted agents as config profiles; the default is `beta`, which answers differently."""
    def script(name: str, reply: str) -> Path:
        path = chat.tmp / f"{name}.json"
        path.write_text(json.dumps({"log": str(chat.tmp / f"{name}-log.jsonl"),
                                    "default_turn": [{"text": reply}]}))
        return path

    alpha, beta = script("alpha", "alpha answers"), script("beta", "beta answers")
    config = chat.tmp / "config.toml"
    config.write_text(f'default_agent = "beta"\n'
                      f'[agents.alpha]\ncommand = {json.dumps(sys.executable)}\n'
                      f'args = [{json.dumps(str(SCRIPTED))}, {json.dumps(str(alpha))}]\n'
                      f'[agents.beta]\ncommand = {json.dumps(sys.executable)}\n'
                      f'args = [{json.dumps(str(SCRIPTED))}, {json.dumps(str(beta))}]\n')
    return config


def _log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def test_resume_goes_on_with_the_sessions_own_agent_card_and_cwd(chat: ChatRunner) -> None:
    config = _profiles(chat)
    cards = chat.kiln / ".crucible" / "agents"
    cards.mkdir(parents=True)
    (cards / "terse.md").write_text("---\ndescription: short answers\n---\nBe terse.\n")
    project = chat.tmp / "project"
    project.mkdir()
    first = _cru(chat, "chat", "-a", "alpha", "--card", "terse", "--kiln", str(chat.kiln), "--cwd", str(project),
                 "-p", "hello", config=config)
    assert first.stdout.strip() == "alpha answers"
    [line] = _listed(chat)
    sid = line.split()[0]

    # From another folder, with only a prefix of the random part of the id, and no -a.
    elsewhere = chat.tmp / "elsewhere"
    elsewhere.mkdir()
    again = _cru(chat, "session", "resume", sid[-6:-2], "-p", "and again?", config=config, cwd=elsewhere)
    assert again.stdout.strip() == "alpha answers", again.stderr  # not the default agent, beta
    assert not (chat.tmp / "beta-log.jsonl").exists()
    frames = [e["frame"] for e in _log(chat.tmp / "alpha-log.jsonl") if e.get("kind") == "in"]
    resumed = [f for f in frames if f.get("method") == "session/resume"]
    assert len(resumed) == 1 and resumed[0]["params"]["cwd"] == str(project)
    store = SessionStore(sessions_root(chat.env))
    meta = store.meta(sid)
    assert (meta.agent, meta.card, meta.cwd, meta.turns) == ("alpha", "terse", str(project), 2)

    # Told otherwise, it uses what it is told: the other agent, given the conversation as context.
    other = _cru(chat, "chat", "--resume", sid, "-a", "beta", "-p", "third", config=config)
    assert other.stdout.strip() == "beta answers"
    prompt = next(e["frame"] for e in _log(chat.tmp / "beta-log.jsonl")
                  if e.get("kind") == "in" and e["frame"].get("method") == "session/prompt")
    assert "User: hello" in json.dumps(prompt)
    assert [line.split()[0] for line in _listed(chat)] == [sid]


def test_an_ambiguous_or_unknown_prefix_lists_the_candidates(chat: ChatRunner) -> None:
    store = SessionStore(sessions_root(chat.env))
    for sid, title in (("20261203-101010-aa11bb", "first talk"), ("20261203-101010-aa22cc", "second talk")):
        w = store.create(SessionMeta(id=sid, agent="claude", created=0, updated=0, cwd=str(chat.tmp), title=title))
        w.append({"type": "user_message", "text": title})
        w.append({"type": "turn_end", "stop_reason": "end_turn"})
        w.close()
    res = _cru(chat, "session", "show", "aa", check=False)
    assert res.returncode == 1
    assert "the session id 'aa' is ambiguous" in res.stderr
    assert "20261203-101010-aa11bb" in res.stderr and "second talk" in res.stderr
    assert "give more of the id" in res.stderr
    res = _cru(chat, "session", "resume", "20261203-101010-aa", check=False)
    assert res.returncode == 1 and "ambiguous" in res.stderr
    assert "first talk" in _cru(chat, "session", "show", "aa1").stdout
    assert "first talk" in _cru(chat, "session", "show", "20261203-101010-aa1").stdout
    res = _cru(chat, "session", "show", "zz", check=False)
    assert res.returncode == 1 and "no saved session 'zz'" in res.stderr


def test_one_conversation_is_one_entry_through_restarts_and_a_resume(chat: ChatRunner) -> None:
    """Two /restarts in the chat and one resume: one entry, with every turn, titled by the first prompt."""
    script = chat.tmp / "script.json"
    script.write_text(json.dumps({"log": str(chat.log)}))
    argv = ["chat", "--agent-command", f"{sys.executable} {SCRIPTED} {script}", "--kiln", str(chat.kiln)]
    child = pexpect.spawn(chat.cru, argv, env={**chat.env, "TERM": "xterm-256color"}, cwd=str(chat.tmp),
                          dimensions=(24, 100), timeout=30)
    screen = pyte.Screen(100, 24)
    stream = pyte.ByteStream(screen)

    def ready() -> bool:
        return "ready" in screen.display[-1]

    try:
        for n, text in enumerate(["first question", "second question", "third question"]):
            if n:
                child.send("/restart\r")
                _wait(child, stream, lambda n=n: _count(chat, "initialize") == n + 1)
                _wait(child, stream, lambda n=n: _count(chat, "session/resume") + _count(chat, "session/load") == n)
            _wait(child, stream, ready)
            child.send(text + "\r")
            _wait(child, stream, lambda n=n: _count(chat, "session/prompt") == n + 1)
            _wait(child, stream, lambda n=n: sum(e.get("kind") == "turn_end" for e in chat.agent_log()) == n + 1)
        child.send("/exit\r")
        child.expect(pexpect.EOF, timeout=30)
    finally:
        child.close(force=True)
    [line] = _listed(chat)
    sid = line.split()[0]
    assert "turns=3" in line and line.endswith("first question")
    res = chat.run({}, "fourth question", "--resume", sid)
    assert res.returncode == 0, res.stderr
    [line] = _listed(chat)
    assert line.split()[0] == sid and "turns=4" in line
    assert len(_listed(chat, "--all")) == 1  # no empty entries behind it either
    store = SessionStore(sessions_root(chat.env))
    said = [r["text"] for r in store.events(sid) if r["type"] == "user_message"]
    assert said == ["first question", "second question", "third question", "fourth question"]
    shown = _cru(chat, "session", "show", sid).stdout
    assert shown.index("first question") < shown.index("fourth question")


def _count(chat: ChatRunner, method: str) -> int:
    return sum(1 for e in chat.agent_log() if e.get("kind") == "in" and e["frame"].get("method") == method)


def _wait(child: pexpect.spawn, stream: pyte.ByteStream, pred: Any, timeout: float = 30) -> None:
    """Poll the agent's log, written by another process (no other channel exists), or the
    chat's screen, which is read meanwhile (a full pty would stop the chat)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened; the screen shows:\n{chr(10).join(stream.listener.display)}")
        try:
            stream.feed(child.read_nonblocking(65536, timeout=0.05))
        except pexpect.TIMEOUT:
            pass


def test_empty_sessions_are_not_listed_and_titles_come_from_the_agent(chat: ChatRunner) -> None:
    refused = {"new_session": {"error": {"code": -32603, "message": "Internal error"}}}
    assert chat.run(refused, "never sent").returncode == 1
    assert _listed(chat) == []  # the failed start left an empty entry: not listed
    assert len(_listed(chat, "--all")) == 1
    titled = {"prompts": [[{"text": "sure"}, {"title": "Planning the \x1b[31mgarden\nbeds"}]]}
    res = chat.run(titled, "what should I plant in the spring, given my notes?")
    assert res.returncode == 0, res.stderr
    [line] = _listed(chat)
    assert line.endswith("Planning the garden beds")  # the agent's title, one line, no escape or its remains
    plain = chat.run({}, "a plain question")
    assert plain.returncode == 0
    lines = _listed(chat)
    assert len(lines) == 2 and lines[0].endswith("a plain question")


def test_agent_command_sessions_are_named_by_the_program_and_resumed_with_it(chat: ChatRunner) -> None:
    res = chat.run({}, "hello")
    assert res.returncode == 0, res.stderr
    [line] = _listed(chat)
    assert line.split()[3] == "scripted_agent"  # not python3 (id, date, time, agent)
    sid = line.split()[0]
    res = _cru(chat, "session", "resume", sid, "-p", "again")
    assert "echo: again" in res.stdout
    assert _count(chat, "session/resume") == 1


def test_agent_command_names_are_the_programs_that_speak_acp() -> None:
    from acp_host.registry import program_name

    cases = {
        "python3 /x/fixtures/scripted_agent.py script.json": "scripted_agent",
        "npx -y @zed-industries/claude-agent-acp": "claude-agent-acp",
        "node /m/node_modules/@zed-industries/claude-agent-acp/dist/index.js": "claude-agent-acp",
        "node /m/@google/gemini-cli/bundle/gemini.js --acp": "gemini",
        "/m/opencode-ai/bin/opencode.exe acp": "opencode",
        "python -m my_agent.server": "my_agent.server",
        "env FOO=1 uvx --from pkg my-agent": "my-agent",
        "npx my-pkg@1.2.3": "my-pkg",
        "my-agent --acp": "my-agent",
    }
    for command, name in cases.items():
        assert program_name(command.split()) == name, command
