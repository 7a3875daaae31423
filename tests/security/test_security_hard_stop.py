"""17.7 and 16.1 with the scripted agent, as real process trees: a crash (kill -9) of
`cru chat -p` mid-turn keeps the prompt and the streamed output on disk and takes the agent
with it; SIGTERM and SIGHUP stop `cru chat -p`, `cru acp` and `cru mcp` and everything under
them within ~2 s (no 30 s graceful cancel); an editor that dies takes `cru acp` along (stdin
EOF, and the parent-death check when the pipe is held elsewhere)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    REPO,
    RawAcp,
    Screen,
    descendants,
    pid_alive,
    script_file,
    scripted_command,
    wait_until,
)

# An agent that streams, starts a tool call, streams more, then waits for ever: it ignores
# session/cancel's wish to wrap up and keeps running when its stdin closes (as Claude does).
STALLING = {"ignore_stdin_close": True, "prompts": [{"steps": [
    {"text": "streamed before the tool"},
    {"tool_call": {"toolCallId": "t1", "title": "Long task", "kind": "execute", "status": "pending"}},
    # (ends in "." and a newline: no secret starts with them, so no end of it waits for a next
    # piece that never comes — crucible.redaction holds back what could begin a secret)
    {"text": " and after it.\n"},
    {"sleep": 3600}]}]}
# Bound for "at once": the 2 s, plus slack for a loaded 2-core test machine.
STOP_BOUND = 3.0


def _session_folder(env: dict[str, str]) -> Path:
    sessions = Path(env["XDG_DATA_HOME"]) / "crucible" / "sessions"
    return wait_until(lambda: next(iter(sessions.iterdir()), None) if sessions.is_dir() else None, 30,
                      "the session folder")


def _all_gone(pids: set[int], timeout: float) -> set[int]:
    """The pids still alive after `timeout` seconds (empty: all gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = {p for p in pids if pid_alive(p)}
        if not alive:
            return set()
        time.sleep(0.02)
    alive = {p for p in pids if pid_alive(p)}
    for p in alive:  # reported to the test, then stopped: a failing test leaves nothing running
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    return alive


def _agent_pids(root: int) -> set[int]:
    return {p for p in descendants(root) if "scripted_agent.py" in _cmdline(p)}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def _read_stream_until(proc: subprocess.Popen[str], text: str, timeout: float = 60) -> str:
    """Read the child's stdout (a pipe) until `text` shows; bounded by a watchdog kill."""
    assert proc.stdout is not None
    seen = ""
    deadline = time.monotonic() + timeout
    os.set_blocking(proc.stdout.fileno(), False)
    while text not in seen:
        if time.monotonic() > deadline:
            raise AssertionError(f"never saw {text!r}; got {seen!r}")
        try:
            chunk = proc.stdout.read()
        except (BlockingIOError, TypeError):  # nothing there yet (text mode over a non-blocking pipe)
            chunk = None
        if chunk:
            seen += chunk
        else:
            time.sleep(0.02)
    return seen


def test_kill_9_mid_turn_keeps_the_prompt_and_the_streamed_text_and_takes_the_agent(chat: Any) -> None:
    proc = chat.spawn(STALLING, "my question, kept")
    try:
        _read_stream_until(proc, "and after it")
        folder = _session_folder(chat.env)
        events = folder / "events.jsonl"
        # Written as it happens: within about a second of being shown.
        wait_until(lambda: "and after it" in events.read_text(), 5, "the streamed text on disk")
        agents = _agent_pids(proc.pid)
        assert agents, "the scripted agent is not running under cru"
        proc.kill()
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not _all_gone(agents, 5), "the agent outlived cru's kill -9"
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    kinds = [e["type"] for e in lines]
    assert {"type": "user_message", "text": "my question, kept"}.items() <= lines[kinds.index("user_message")].items()
    text = "".join(e["text"] for e in lines if e["type"] == "agent_message")
    assert text == "streamed before the tool and after it.\n"
    assert "tool_call" in kinds
    meta = json.loads((folder / "session.json").read_text())
    assert meta["title"] == "my question, kept"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_stops_chat_p_and_its_agent_at_once(chat: Any, sig: signal.Signals) -> None:
    proc = chat.spawn(STALLING, "wait for me")
    try:
        _read_stream_until(proc, "and after it")
        tree = descendants(proc.pid)
        assert _agent_pids(proc.pid)
        started = time.monotonic()
        proc.send_signal(sig)
        code = proc.wait(30)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
    assert took < STOP_BOUND, f"cru chat -p took {took:.1f} s to stop on {sig.name}"
    assert code == 128 + sig
    assert not _all_gone(tree, 2), "processes outlived cru"
    # The transcript was closed properly on the way out, and says why the turn has no answer.
    events = (_session_folder(chat.env) / "events.jsonl").read_text()
    assert "and after it" in events
    why = ("the terminal closed before the agent finished" if sig == signal.SIGHUP
           else "cru was stopped (SIGTERM) before the agent finished")
    assert _turn_cut_short(chat.env) == why


def _turn_cut_short(env: dict[str, str]) -> str:
    """Why the session's last turn was cut short, as its events and `cru session show` say it
    (and it counts as a turn in `cru session list`)."""
    folder = _session_folder(env)
    last = json.loads((folder / "events.jsonl").read_text().splitlines()[-1])
    assert last["type"] == "turn_end" and last["stop_reason"] == "interrupted", last
    assert json.loads((folder / "session.json").read_text())["turns"] == 1
    shown = subprocess.run([sys.executable, "-m", "crucible.cli", "session", "show", folder.name],
                           env=env, capture_output=True, text=True, timeout=60)
    assert f"*the turn was cut short: {last['why']}*" in shown.stdout, shown.stdout + shown.stderr
    return str(last["why"])


def _acp(cru_bin: str, env: dict[str, str], kiln: Path, tmp: Path) -> RawAcp:
    script = script_file(tmp, {**STALLING, "log": str(tmp / "agent.jsonl")})
    return RawAcp([cru_bin, "acp", "--agent-command", scripted_command(script), "--kiln", str(kiln)],
                  env, tmp, tmp / "acp.err")


def _acp_mid_turn(editor: RawAcp, cwd: Path) -> None:
    editor.initialize()
    sid = editor.request("session/new", {"cwd": str(cwd), "mcpServers": []})["result"]["sessionId"]
    editor.send({"jsonrpc": "2.0", "id": 77, "method": "session/prompt",
                 "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]}})
    editor.wait_for(lambda f: "and after it" in json.dumps(f))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_stops_cru_acp_and_its_backends_at_once(cru_bin: str, clean_env: dict[str, str], kiln: Path,
                                                         tmp_path: Path, sig: signal.Signals) -> None:
    editor = _acp(cru_bin, clean_env, kiln, tmp_path)
    try:
        _acp_mid_turn(editor, tmp_path)
        tree = descendants(editor.proc.pid)
        assert _agent_pids(editor.proc.pid)
        started = time.monotonic()
        editor.proc.send_signal(sig)
        code = editor.proc.wait(30)
        took = time.monotonic() - started
    finally:
        editor.close()
    assert took < STOP_BOUND, f"cru acp took {took:.1f} s to stop on {sig.name}"
    assert code == 0  # told to stop: a normal end for the editor
    assert not _all_gone(tree, 2)


# An editor: starts `cru acp` with pipes, drives it into a turn, then waits to be killed. With
# HOLD, the test process holds a second copy of cru acp's stdin, so the editor's death closes
# nothing: only the parent-death check can tell.
EDITOR = r"""
import json, os, subprocess, sys, time
argv, read_fd, write_fd = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
proc = subprocess.Popen(argv, stdin=read_fd if read_fd >= 0 else subprocess.PIPE, stdout=subprocess.PIPE)
out = proc.stdout
def send(frame):
    data = (json.dumps(frame) + "\n").encode()
    if proc.stdin is not None:
        proc.stdin.write(data); proc.stdin.flush()
    else:
        os.write(write_fd, data)
def wait_id(i):
    for line in out:
        frame = json.loads(line)
        if frame.get("id") == i and "method" not in frame:
            return frame
send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1, "clientCapabilities": {}}})
wait_id(1)
send({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": sys.argv[4], "mcpServers": []}})
sid = wait_id(2)["result"]["sessionId"]
send({"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]}})
for line in out:
    if b"and after it" in line:
        break
print(proc.pid, flush=True)
while True:
    time.sleep(60)
"""


@pytest.mark.parametrize("hold_stdin", [False, True], ids=["stdin-eof", "parent-death-check"])
def test_an_editor_that_dies_takes_cru_acp_and_its_backends(cru_bin: str, clean_env: dict[str, str], kiln: Path,
                                                            tmp_path: Path, hold_stdin: bool) -> None:
    script = script_file(tmp_path, {**STALLING, "log": str(tmp_path / "agent.jsonl")})
    argv = [cru_bin, "acp", "--agent-command", scripted_command(script), "--kiln", str(kiln)]
    read_fd, write_fd = os.pipe() if hold_stdin else (-1, -1)
    pass_fds = (read_fd, write_fd) if hold_stdin else ()
    editor = subprocess.Popen([sys.executable, "-c", EDITOR, json.dumps(argv), str(read_fd), str(write_fd),
                               str(tmp_path)], stdout=subprocess.PIPE, text=True, env=clean_env,
                              pass_fds=pass_fds, start_new_session=True)
    try:
        assert editor.stdout is not None
        acp_pid = int(wait_until(editor.stdout.readline, 90, "the editor's turn"))
        tree = descendants(acp_pid) | {acp_pid}
        assert _agent_pids(acp_pid)
        editor.kill()  # the editor crashes
        editor.wait(10)
        left = _all_gone(tree, 5)
    finally:
        if editor.poll() is None:
            editor.kill()
        for fd in (read_fd, write_fd):
            if fd >= 0:
                os.close(fd)
    assert not left, f"left running after the editor died: {[_cmdline(p) for p in left]}"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_stops_cru_mcp_at_once(cru_bin: str, clean_env: dict[str, str], kiln: Path,
                                        sig: signal.Signals) -> None:
    proc = subprocess.Popen([cru_bin, "mcp", "--kiln", str(kiln)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=clean_env, start_new_session=True)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
                         .encode() + b"\n")
        proc.stdin.flush()
        assert b'"id":1' in proc.stdout.readline().replace(b" ", b"")
        started = time.monotonic()
        proc.send_signal(sig)
        code = proc.wait(30)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
    assert took < STOP_BOUND and code == 0, (took, code)


# An upstream MCP server that leaves a process running once its stdin closes (as a wrapper
# script that starts the real server and then something else would): the SDK's server exits
# on EOF, the shell that ran it then sleeps on.
UPSTREAM = REPO / "tests" / "gateway" / "gateway_upstream.py"


def test_kill_9_of_cru_mcp_takes_its_upstream_servers(cru_bin: str, clean_env: dict[str, str], kiln: Path,
                                                      tmp_path: Path) -> None:
    shell = f"'{sys.executable}' '{UPSTREAM}' stdio; sleep 3600"
    config = tmp_path / "config.toml"
    config.write_text(f'[[mcp.servers]]\nname = "up"\n[mcp.servers.transport]\ntype = "stdio"\n'
                      f'command = "/bin/sh"\nargs = ["-c", {json.dumps(shell)}]\n')
    client = RawAcp([cru_bin, "--config", str(config), "mcp", "--kiln", str(kiln)], clean_env, tmp_path,
                    tmp_path / "mcp.err")
    try:
        client.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                      "clientInfo": {"name": "t", "version": "1"}})
        client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        tools = client.request("tools/list", {})  # the first listing starts the upstreams
        assert "up_add" in json.dumps(tools), tools
        tree = descendants(client.proc.pid)
        assert any("gateway_upstream.py" in _cmdline(p) for p in tree), [_cmdline(p) for p in tree]
        client.proc.kill()
        client.proc.wait(10)
        left = _all_gone(tree, 5)
    finally:
        client.close()
    assert not left, f"left running after cru mcp was killed: {[_cmdline(p) for p in left]}"


def _chat_mid_turn(cru_bin: str, env: dict[str, str], kiln: Path, tmp: Path, *, stderr_to: Path | None = None,
                   script: dict[str, Any] | None = None) -> Any:
    """Interactive `cru chat` on a pty, mid-turn with the stalling agent (or `script`; its stderr
    in a file when given: a closed terminal shows nothing)."""
    script = script_file(tmp, script or STALLING)
    argv = [cru_bin, "chat", "--agent-command", scripted_command(script), "--kiln", str(kiln)]
    if stderr_to is not None:
        argv = ["/bin/sh", "-c", f'exec "$@" 2>"{stderr_to}"', "sh", *argv]
    screen = Screen(argv, {**env, "TERM": "xterm-256color"}, tmp, cols=100, rows=30)
    screen.wait_for("ready", timeout=60)
    screen.type_line("my question, kept")
    screen.wait_for("and after it", timeout=60)
    return screen


def test_sigterm_stops_the_interactive_chat_and_gives_the_terminal_back(cru_bin: str, clean_env: dict[str, str],
                                                                      kiln: Path, tmp_path: Path) -> None:
    screen = _chat_mid_turn(cru_bin, clean_env, kiln, tmp_path)
    try:
        cru = _cru_pid(screen.child.pid)
        tree = descendants(cru) | {cru}
        assert _agent_pids(cru)
        started = time.monotonic()
        os.kill(cru, signal.SIGTERM)
        code = screen.wait_exit(30)
        took = time.monotonic() - started
    finally:
        screen.close()
    assert took < STOP_BOUND, f"cru chat took {took:.1f} s to stop on SIGTERM"
    assert code == 128 + signal.SIGTERM
    assert not _all_gone(tree, 2)
    # The person's terminal is as it was: the full-screen view left, the cursor shown.
    assert screen.raw.rfind(b"\x1b[?1049l") > screen.raw.rfind(b"\x1b[?1049h") >= 0
    assert screen.raw.rfind(b"\x1b[?25h") > screen.raw.rfind(b"\x1b[?25l")
    events = (_session_folder(clean_env) / "events.jsonl").read_text()
    assert "my question, kept" in events and "and after it" in events


def test_closing_the_terminal_of_the_interactive_chat_keeps_the_turn_and_says_nothing(
        cru_bin: str, clean_env: dict[str, str], kiln: Path, tmp_path: Path) -> None:
    err = tmp_path / "chat.err"
    screen = _chat_mid_turn(cru_bin, clean_env, kiln, tmp_path, stderr_to=err)
    try:
        cru = _cru_pid(screen.child.pid)
        tree = descendants(cru) | {cru}
        assert _agent_pids(cru)
        took = screen.close_window()  # the pty goes away: SIGHUP, and nothing else
        left = _all_gone(tree, STOP_BOUND)
    finally:
        screen.close()
    assert not left, f"left running after the terminal closed: {[_cmdline(p) for p in left]}"
    assert took < STOP_BOUND, f"cru chat took {took:.1f} s to stop when its terminal closed"
    assert "Traceback" not in err.read_text()  # no error restoring a terminal that is gone
    events = (_session_folder(clean_env) / "events.jsonl").read_text()
    assert "my question, kept" in events and "and after it" in events
    assert _turn_cut_short(clean_env) == "the terminal closed before the agent finished"


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_a_second_stop_signal_does_not_kill_the_chat_mid_teardown(cru_bin: str, clean_env: dict[str, str],
                                                                   kiln: Path, tmp_path: Path,
                                                                   sig: signal.Signals) -> None:
    """A closing terminal sends SIGHUP more than once (the kernel, then the terminal or the
    shell); the second one must not meet the default action while the first one's teardown
    saves the session. The agent ignores SIGTERM, so that teardown takes a second (its group's
    SIGKILL comes after a grace): the later signals come in the middle of it."""
    screen = _chat_mid_turn(cru_bin, clean_env, kiln, tmp_path, script={**STALLING, "ignore_sigterm": True})
    try:
        cru = _cru_pid(screen.child.pid)
        tree = descendants(cru) | {cru}
        for _ in range(3):
            os.kill(cru, sig)
            time.sleep(0.02)
        code = screen.wait_exit(30)
    finally:
        screen.close()
    # Ended by that signal: its exit code, or (a signal that came once the interpreter was
    # finalizing, its handlers gone, the session saved) killed by it — a shell shows both as 128+sig.
    assert code in (128 + sig, -sig), f"cru chat ended with {code}"
    assert not _all_gone(tree, STOP_BOUND)
    events = (_session_folder(clean_env) / "events.jsonl").read_text()
    assert "my question, kept" in events and "and after it" in events


def _cru_pid(pid: int) -> int:
    """`cru` itself: `pid`, or the process it exec'd into (the same pid), once it runs."""
    wait_until(lambda: "cru" in _cmdline(pid) and "chat" in _cmdline(pid), 10, "cru chat to run")
    return pid


# -- delegated children, `cru mcp`'s upstreams, kill -9 of `cru acp` --------------------------

HTTP_CAPS = {"agentCapabilities": {"mcpCapabilities": {"http": True, "sse": False}}}


def _delegating_family(tmp: Path, env: dict[str, str], *, background: bool = False) -> tuple[dict[str, str], Path]:
    """Profiles `parent` and `child` running the scripted agent: the parent delegates to the
    child through its bridge (as a real agent does); the child streams, then stalls for ever and
    survives its stdin closing. Returns the environment (its config) and the child's script."""
    scripts = {
        "parent": {"initialize": {"result": HTTP_CAPS}, "new_session": {"list_mcp_tools": True},
                   "ignore_stdin_close": True, "prompts": [[
                       {"mcp_call": {"server": "crucible", "tool": "delegate_session",
                                     "arguments": {"target": "child", "prompt": "work for ever",
                                                   "background": background}}, "as": "delegate"},
                       {"sleep": 3600}]]},
        "child": {"ignore_stdin_close": True, "prompts": [[{"text": "child at work\n"}, {"sleep": 3600}]]},
    }
    lines = []
    for name, body in scripts.items():
        path = tmp / f"{name}.json"
        path.write_text(json.dumps(body))
        lines += [f"[agents.{name}]", f"command = {json.dumps(sys.executable)}",
                  f"args = [{json.dumps(str(REPO / 'fixtures' / 'scripted_agent.py'))}, {json.dumps(str(path))}]", ""]
    lines += ["[permissions]", 'delegate_session = "allow"']
    config = tmp / "family.toml"
    config.write_text("\n".join(lines) + "\n")
    return {**env, "CRUCIBLE_CONFIG": str(config)}, tmp / "child.json"


def _running(marker: Path, root: int) -> set[int]:
    return {p for p in descendants(root) if str(marker) in _cmdline(p)}


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP])
@pytest.mark.parametrize("background", [False, True], ids=["blocking", "background"])
def test_a_delegated_child_dies_with_cru_chat_p(cru_bin: str, clean_env: dict[str, str], kiln: Path,
                                                tmp_path: Path, sig: signal.Signals, background: bool) -> None:
    env, child_script = _delegating_family(tmp_path, clean_env, background=background)
    proc = subprocess.Popen([cru_bin, "chat", "-a", "parent", "--kiln", str(kiln), "--cwd", str(tmp_path),
                             "-p", "delegate"], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the child's events are shown on stderr, labelled with the chain
            if "child at work" in line:
                break
        else:
            raise AssertionError(f"the child never worked (cru exited {proc.wait()})")
        child = _running(child_script, proc.pid)
        assert child, "the delegated child is not running under cru"
        tree = descendants(proc.pid)
        started = time.monotonic()
        proc.send_signal(sig)
        proc.wait(30)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
    left = _all_gone(tree, STOP_BOUND)
    assert not left, f"left running after {sig.name} of cru chat -p: {[_cmdline(p) for p in left]}"
    assert took < STOP_BOUND, f"cru chat -p took {took:.1f} s to stop on {sig.name}"


def test_kill_9_of_cru_acp_takes_its_backends_and_their_delegated_children(
        cru_bin: str, clean_env: dict[str, str], kiln: Path, tmp_path: Path) -> None:
    env, child_script = _delegating_family(tmp_path, clean_env)
    editor = RawAcp([cru_bin, "acp", "-a", "parent", "--kiln", str(kiln)], env, tmp_path, tmp_path / "acp.err")
    try:
        editor.initialize()
        sid = editor.request("session/new", {"cwd": str(tmp_path), "mcpServers": []})["result"]["sessionId"]
        editor.send({"jsonrpc": "2.0", "id": 77, "method": "session/prompt",
                     "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "go"}]}})
        wait_until(lambda: _running(child_script, editor.proc.pid), 60, "the delegated child")
        tree = descendants(editor.proc.pid)
        assert len(_agent_pids(editor.proc.pid)) == 2  # the backend and its child
        editor.proc.kill()
        editor.proc.wait(10)
        left = _all_gone(tree, STOP_BOUND)
    finally:
        editor.close()
    assert not left, f"left running after kill -9 of cru acp: {[_cmdline(p) for p in left]}"


def _mcp_with_upstream(cru_bin: str, env: dict[str, str], kiln: Path, tmp: Path, *,
                       argv_prefix: tuple[str, ...] = ()) -> tuple[Path, list[str]]:
    """A config with one stdio upstream that leaves a `sleep` running after its server exits,
    and the argv of `cru mcp` with it."""
    shell = f"'{sys.executable}' '{UPSTREAM}' stdio; sleep 3600"
    config = tmp / "config.toml"
    config.write_text(f'[[mcp.servers]]\nname = "up"\n[mcp.servers.transport]\ntype = "stdio"\n'
                      f'command = "/bin/sh"\nargs = ["-c", {json.dumps(shell)}]\n')
    return config, [*argv_prefix, cru_bin, "--config", str(config), "mcp", "--kiln", str(kiln)]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_stops_cru_mcp_and_its_upstream_servers_at_once(cru_bin: str, clean_env: dict[str, str],
                                                                 kiln: Path, tmp_path: Path,
                                                                 sig: signal.Signals) -> None:
    _, argv = _mcp_with_upstream(cru_bin, clean_env, kiln, tmp_path)
    client = RawAcp(argv, clean_env, tmp_path, tmp_path / "mcp.err")
    try:
        client.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                      "clientInfo": {"name": "t", "version": "1"}})
        client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert "up_add" in json.dumps(client.request("tools/list", {}))
        tree = descendants(client.proc.pid)
        assert any("gateway_upstream.py" in _cmdline(p) for p in tree)
        started = time.monotonic()
        client.proc.send_signal(sig)
        code = client.proc.wait(30)
        took = time.monotonic() - started
        left = _all_gone(tree, 2)
    finally:
        client.close()
    assert not left, f"left running after {sig.name} of cru mcp: {[_cmdline(p) for p in left]}"
    assert took < STOP_BOUND and code == 0, (took, code)
    assert "Traceback" not in client.stderr()


# An MCP client (as Claude Code runs `cru mcp`): starts it, lists its tools (which starts the
# upstream), prints cru mcp's pid, then waits to be killed. With HOLD the pipe to cru mcp's
# stdin is also held by the test, so the client's death closes nothing.
MCP_CLIENT = r"""
import json, os, subprocess, sys, time
argv, read_fd, write_fd = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
proc = subprocess.Popen(argv, stdin=read_fd if read_fd >= 0 else subprocess.PIPE, stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL)
def send(frame):
    data = (json.dumps(frame) + "\n").encode()
    if proc.stdin is not None:
        proc.stdin.write(data); proc.stdin.flush()
    else:
        os.write(write_fd, data)
def wait_id(i):
    for line in proc.stdout:
        frame = json.loads(line)
        if frame.get("id") == i:
            return frame
send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
      "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
wait_id(1)
send({"jsonrpc": "2.0", "method": "notifications/initialized"})
send({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}})
wait_id(2)
print(proc.pid, flush=True)
while True:
    time.sleep(60)
"""


@pytest.mark.parametrize("hold_stdin", [False, True], ids=["stdin-eof", "parent-death-check"])
def test_a_client_that_dies_takes_cru_mcp_and_its_upstreams(cru_bin: str, clean_env: dict[str, str], kiln: Path,
                                                            tmp_path: Path, hold_stdin: bool) -> None:
    _, argv = _mcp_with_upstream(cru_bin, clean_env, kiln, tmp_path)
    read_fd, write_fd = os.pipe() if hold_stdin else (-1, -1)
    pass_fds = (read_fd, write_fd) if hold_stdin else ()
    client = subprocess.Popen([sys.executable, "-c", MCP_CLIENT, json.dumps(argv), str(read_fd), str(write_fd)],
                              stdout=subprocess.PIPE, text=True, env=clean_env, pass_fds=pass_fds,
                              start_new_session=True)
    try:
        assert client.stdout is not None
        mcp_pid = int(wait_until(client.stdout.readline, 90, "cru mcp's tools"))
        tree = descendants(mcp_pid) | {mcp_pid}
        assert any("gateway_upstream.py" in _cmdline(p) for p in tree)
        client.kill()  # the MCP client crashes
        client.wait(10)
        left = _all_gone(tree, 5)
    finally:
        if client.poll() is None:
            client.kill()
        for fd in (read_fd, write_fd):
            if fd >= 0:
                os.close(fd)
    assert not left, f"left running after the client died: {[_cmdline(p) for p in left]}"


def test_kill_9_of_the_interactive_chat_keeps_the_turn_and_takes_the_agent(cru_bin: str, clean_env: dict[str, str],
                                                                         kiln: Path, tmp_path: Path) -> None:
    screen = _chat_mid_turn(cru_bin, clean_env, kiln, tmp_path)
    try:
        cru = _cru_pid(screen.child.pid)
        tree = descendants(cru)
        assert _agent_pids(cru)
        events = _session_folder(clean_env) / "events.jsonl"
        wait_until(lambda: "and after it" in events.read_text(), 5, "the streamed text on disk")
        os.kill(cru, signal.SIGKILL)
        screen.wait_exit(30)
        left = _all_gone(tree, STOP_BOUND)
    finally:
        screen.close()
    assert not left, f"left running after kill -9 of cru chat: {[_cmdline(p) for p in left]}"
    text = events.read_text()
    assert "my question, kept" in text and "and after it" in text
