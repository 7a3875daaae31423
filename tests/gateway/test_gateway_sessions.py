"""Upstream MCP servers through a session's bridge: `cru chat -p` with the scripted agent (a real
subprocess that connects to the bridge and calls tools as the real agents do)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, SECRET, UPSTREAM, everything_toml, write_config

SCRIPTED = REPO / "fixtures" / "scripted_agent.py"


class Chat:
    def __init__(self, cru: str, env: dict[str, str], kiln: Path, tmp: Path) -> None:
        self.cru, self.env, self.kiln, self.tmp = cru, env, kiln, tmp
        self.log = tmp / "agent-log.jsonl"
        self.config = tmp / "xdg-config" / "crucible"

    def run(self, steps: list[dict[str, Any]], *extra: str, http: bool = True) -> subprocess.CompletedProcess[str]:
        script = {"log": str(self.log),
                  "initialize": {"result": {"agentCapabilities": {"mcpCapabilities": {"http": http, "sse": False}}}},
                  "new_session": {"list_mcp_tools": True},
                  "prompts": [steps + [{"text": "\nok"}]]}
        path = self.tmp / "script.json"
        path.write_text(json.dumps(script))
        argv = [self.cru, "chat", "--agent-command", f"{sys.executable} {SCRIPTED} {path}", "--kiln", str(self.kiln),
                "-p", "go", *extra]
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=120, cwd=self.tmp)

    def entries(self, **match: Any) -> list[dict[str, Any]]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        out = [json.loads(line) for line in lines if line.strip()]
        return [e for e in out if all(e.get(k) == v for k, v in match.items())]

    def result_of(self, name: str) -> dict[str, Any]:
        (entry,) = self.entries(kind="result", **{"as": name})
        return entry["result"]


@pytest.fixture
def chat(cru_bin: str, gw_env: dict[str, str], kiln: Path, tmp_path: Path) -> Chat:
    return Chat(cru_bin, gw_env, kiln, tmp_path)


def call(tool: str, arguments: dict[str, Any], name: str) -> dict[str, Any]:
    return {"mcp_call": {"server": "crucible", "tool": tool, "arguments": arguments}, "as": name, "echo": True}


def result_text(result: dict[str, Any]) -> str:
    return "\n".join(c.get("text", "") for c in result.get("result", {}).get("content", []))


@pytest.mark.parametrize("http", [True, False], ids=["http", "stdio-relay"])
def test_session_bridge_lists_and_calls_prefixed_upstream_tools(chat: Chat, everything: list[str],
                                                              tmp_path: Path, http: bool) -> None:
    write_config(chat.config, everything_toml(everything))
    record = tmp_path / "recording.jsonl"
    res = chat.run([call("everything_echo", {"message": "through the bridge"}, "echo"),
                    call("everything_get-env", {}, "env"),
                    call("everything_get-sum", {"a": 1, "b": 2}, "sum")], "--record", str(record), http=http)
    assert res.returncode == 0, res.stderr
    (listed,) = chat.entries(kind="mcp_tools", server="crucible")
    assert {"read_note", "semantic_search", "everything_echo", "everything_get-sum"} <= set(listed["tools"])
    assert result_text(chat.result_of("echo")) == "Echo: through the bridge"
    assert "3" in result_text(chat.result_of("sum"))
    # The upstream was given the secret (it shows its environment) and the agent never sees it.
    env_text = result_text(chat.result_of("env"))
    assert "GATEWAY_TOKEN" in env_text and "{env:GATEWAY_TOKEN}" in env_text
    # Nothing the session wrote (transcript, events, the recording, the agent's own log) holds it.
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert record in written and any("sessions" in str(p) for p in written)
    for path in written:
        assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in res.stdout + res.stderr
    assert "Warning" not in res.stderr, res.stderr  # the SDK's deprecation of roots is not the person's business


def test_card_that_denies_the_upstream_hides_its_tools(chat: Chat, everything: list[str]) -> None:
    write_config(chat.config, everything_toml(everything))
    cards = chat.kiln / ".crucible" / "agents"
    cards.mkdir(parents=True, exist_ok=True)
    (cards / "no-everything.md").write_text(
        '---\ndescription: no upstream tools\ntools:\n  "everything_*": deny\n---\nBe brief.\n')
    res = chat.run([call("everything_echo", {"message": "x"}, "echo")], "--card", "no-everything")
    assert res.returncode == 0, res.stderr
    (listed,) = chat.entries(kind="mcp_tools", server="crucible")
    assert not [t for t in listed["tools"] if t.startswith("everything_")]
    assert "read_note" in listed["tools"]
    assert result_text(chat.result_of("echo")).startswith("Unknown tool 'everything_echo'")


def test_config_rules_and_read_only_hints_decide_for_upstream_tools(chat: Chat) -> None:
    # The SDK test server over stdio: `add` is read-only (runs), `slow` is not (asks: denied in -p),
    # unless [permissions] allows it by a glob.
    server = (f'[[mcp.servers]]\nname = "up"\n[mcp.servers.transport]\ntype = "stdio"\n'
              f'command = "{sys.executable}"\nargs = ["{UPSTREAM}", "stdio"]\n')
    write_config(chat.config, server)
    res = chat.run([call("up_add", {"a": 2, "b": 3}, "add"), call("up_slow", {"seconds": 0}, "slow")])
    assert res.returncode == 0, res.stderr
    assert result_text(chat.result_of("add")) == "5"
    assert result_text(chat.result_of("slow")) == "The person did not allow tool 'up_slow' to run"
    assert "[permission] up_slow: reject_once" in res.stderr
    write_config(chat.config, server + '[permissions]\n"up_*" = "allow"\n')
    chat.log.unlink()
    res = chat.run([call("up_slow", {"seconds": 0}, "slow")])
    assert result_text(chat.result_of("slow")) == "slept 0.0"


@pytest.mark.parametrize("flag", ["--approve-all", None])
def test_elicitation_in_p_mode(chat: Chat, flag: str | None) -> None:
    write_config(chat.config, f'[[mcp.servers]]\nname = "up"\n[mcp.servers.transport]\ntype = "stdio"\n'
                              f'command = "{sys.executable}"\nargs = ["{UPSTREAM}", "stdio"]\n'
                              '[permissions]\n"up_*" = "allow"\n')
    res = chat.run([call("up_elicit_name", {}, "ask")], *([flag] if flag else []))
    assert res.returncode == 0, res.stderr
    text = result_text(chat.result_of("ask"))
    if flag:
        assert text == "action=accept content={'name': 'Ada'}"  # the server's default
        assert "[elicitation] up: accept" in res.stderr
    else:
        assert text == "action=decline content=None"
        assert "[elicitation] up: decline" in res.stderr


def test_a_config_error_in_mcp_servers_names_file_server_and_field(chat: Chat, everything: list[str]) -> None:
    path = write_config(chat.config, everything_toml(everything) + everything_toml(everything, "again")
                        .replace('name = "again"', 'name = "again"\nprefix = "everything_"'))
    res = chat.run([])
    assert res.returncode != 0
    assert f"{path}: [[mcp.servers]] 'again': prefix: 'everything_' is already the prefix of server 'everything'" \
        in res.stderr


def test_a_server_that_fails_then_comes_up_is_said_down_once_and_up_again(chat: Chat, tmp_path: Path) -> None:
    # It is retried with backoff for as long as it takes: one line while it fails the same way
    # (not one per retry on the person's stderr), one when it is back.
    flaky, starts = tmp_path / "flaky.py", tmp_path / "starts"
    flaky.write_text(
        "import os, sys\n"
        f"with open({str(starts)!r}, 'a') as f: f.write('started\\n')\n"
        f"if len(open({str(starts)!r}).read().split()) < 3:\n"
        "    sys.stderr.write('not ready yet\\n'); sys.exit(1)\n"
        f"os.execv(sys.executable, [sys.executable, {str(UPSTREAM)!r}, 'stdio'])\n")
    write_config(chat.config, f'[[mcp.servers]]\nname = "flaky"\n[mcp.servers.transport]\ntype = "stdio"\n'
                              f'command = "{sys.executable}"\nargs = ["{flaky}"]\n')
    res = chat.run([{"sleep": 8}])
    assert res.returncode == 0, res.stderr
    assert len(starts.read_text().split()) >= 3, res.stderr
    assert res.stderr.count("MCP server flaky is down") == 1, res.stderr
    assert "MCP server flaky is down: the server exited or closed the connection (its stderr: not ready yet)" in res.stderr
    assert "MCP server flaky is up again (restarts: 2)" in res.stderr


def test_a_down_servers_error_tells_the_agent_no_path_of_the_home_folder(chat: Chat, tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "servers").mkdir(parents=True)
    broken = home / "servers" / "broken.py"
    broken.write_text("import sys\nsys.stderr.write(f'Traceback: File \"{__file__}\", line 2\\n')\nsys.exit(1)\n")
    chat.env["HOME"] = str(home)
    write_config(chat.config, f'[[mcp.servers]]\nname = "broken"\n[mcp.servers.transport]\ntype = "stdio"\n'
                              f'command = "{sys.executable}"\nargs = ["{broken}"]\n[permissions]\n"broken_*" = "allow"\n')
    res = chat.run([call("broken_anything", {}, "down")])
    assert res.returncode == 0, res.stderr
    told = json.dumps(chat.result_of("down"))
    assert "MCP server 'broken' is down" in told and 'File \\"~/servers/broken.py\\", line 2' in told, told
    assert str(home) not in told
    assert 'File "~/servers/broken.py", line 2' in res.stderr and str(home) not in res.stderr


def test_a_down_servers_error_shows_the_folder_cru_runs_in_as_dot(chat: Chat, tmp_path: Path) -> None:
    # A server kept beside the project (not under home) had its absolute path told to the agent.
    broken = chat.tmp / "tools" / "broken.py"
    broken.parent.mkdir(parents=True, exist_ok=True)
    broken.write_text("import sys\nsys.stderr.write(f'Traceback: File \"{__file__}\", line 2\\n')\nsys.exit(1)\n")
    write_config(chat.config, f'[[mcp.servers]]\nname = "broken"\n[mcp.servers.transport]\ntype = "stdio"\n'
                              f'command = "{sys.executable}"\nargs = ["{broken}"]\n[permissions]\n"broken_*" = "allow"\n')
    res = chat.run([call("broken_anything", {}, "down")])
    assert res.returncode == 0, res.stderr
    told = json.dumps(chat.result_of("down"))
    assert 'File \\"./tools/broken.py\\", line 2' in told, told
    assert str(chat.tmp) not in told
