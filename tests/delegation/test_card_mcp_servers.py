"""A card's `mcp_servers` reach its agent: parse errors name the card file and the field;
`{env:VAR}` is filled in when the session starts; the agent (a real subprocess) starts the
card's stdio server itself and the person sees the tool's reply; a delegated child gets its
card's servers too; a transport the agent did not advertise is refused with what to do."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from delegation_helpers import REPO, Setup, agent_script, delegate_step, tool_json

from crucible.cards import CardError, parse_card

ECHO_SERVER = REPO / "fixtures" / "echo_mcp_server.py"
SECRET = "from-the-card-env-7f3a"


def card(front: str, body: str = "Use the echo server.") -> str:
    return f"---\ndescription: test card\n{front}---\n{body}\n"


ECHO_CARD_FRONT = f"""\
mcp_servers:
  - name: echo
    command: {json.dumps(sys.executable)}
    args: [tools/echo_server.py, --log, echo-calls.jsonl]
    env: {{ECHO_MCP_RESULT: "notes/{{env:CARD_SECRET}}.md"}}
"""


def caps(http: bool = False, sse: bool = False) -> Any:
    return SimpleNamespace(mcp_capabilities=SimpleNamespace(http=http, sse=sse))


# ---- parsing ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("servers", "expected"),
    [
        ("  - name: a\n    command: x\n    url: http://127.0.0.1:9/mcp\n",
         "field `mcp_servers[0]`: MCP server 'a': give exactly one of `command`"),
        ("  - name: a\n", "field `mcp_servers[0]`: MCP server 'a': give exactly one of `command`"),
        ("  - name: a\n    command: x\n    type: websocket\n",
         "field `mcp_servers[0].type`: Input should be 'stdio', 'http' or 'sse'"),
        ("  - name: a\n    command: x\n    cmd: y\n",
         "field `mcp_servers[0].cmd`: unknown field; allowed: name, type, command, args, env, url, headers"),
        ("  - name: a\n    command: x\n  - name: b\n    url: ftp://h/x\n",
         "field `mcp_servers[1]`: MCP server 'b': `url` must start with http:// or https://"),
        ("  - name: a\n    url: http://127.0.0.1:9/mcp\n    type: stdio\n",
         "field `mcp_servers[0]`: MCP server 'a': type 'stdio' needs `command`, not `url`"),
        ("  - name: a\n    command: x\n    headers: {A: b}\n",
         "field `mcp_servers[0]`: MCP server 'a': `headers` are for `url` servers"),
        ("  - name: crucible\n    command: x\n",
         "field `mcp_servers[0]`: MCP server 'crucible': the name 'crucible' is Crucible's own kiln bridge"),
        ("  - name: a\n    command: x\n  - name: a\n    command: y\n",
         "field `mcp_servers`: two MCP servers are named 'a'"),
        ("  - name: a\n    command: x\n    env: {DEBUG: true}\n",
         "field `mcp_servers[0].env.DEBUG`: Input should be a valid string"),
        ("  - name: a\n    command: x\n    args: --verbose\n",
         "field `mcp_servers[0].args`: Input should be a valid list"),
        ("  name: a\n", "field `mcp_servers`: Input should be a valid list"),
    ],
)
def test_card_mcp_server_errors_name_the_file_and_field(servers: str, expected: str) -> None:
    with pytest.raises(CardError) as err:
        parse_card(card("mcp_servers:\n" + servers), "kiln:helper.md", origin="kiln")
    assert str(err.value).startswith("card kiln:helper.md: ")
    assert expected in str(err.value)


def test_card_servers_become_acp_entries_with_env_filled_in_and_paths_as_written() -> None:
    text = card("""\
mcp_servers:
  - name: echo
    command: python3
    args: [server.py, --port, 8080]
    env: {TOKEN: "{env:MY_TOKEN}"}
  - name: docs
    url: http://127.0.0.1:9000/mcp
    headers: {Authorization: "Bearer {env:DOCS_TOKEN}"}
  - name: feed
    type: sse
    url: http://127.0.0.1:9001/sse
""")
    c = parse_card(text, "kiln:helper.md", origin="kiln")
    assert [(s.name, s.type) for s in c.mcp_servers] == [("echo", "stdio"), ("docs", "http"), ("feed", "sse")]
    env = {"MY_TOKEN": "tok-1", "DOCS_TOKEN": "tok-2"}
    entries = c.acp_mcp_servers(caps(http=True, sse=True), "some-agent", env=env)
    assert entries == [
        # No `type` on stdio entries; relative paths stay relative (the agent's cwd resolves them).
        {"name": "echo", "command": "python3", "args": ["server.py", "--port", "8080"],
         "env": [{"name": "TOKEN", "value": "tok-1"}]},
        {"type": "http", "name": "docs", "url": "http://127.0.0.1:9000/mcp",
         "headers": [{"name": "Authorization", "value": "Bearer tok-2"}]},
        {"type": "sse", "name": "feed", "url": "http://127.0.0.1:9001/sse", "headers": []},
    ]
    # The card itself keeps the reference (what `cru cards show` prints), never the secret.
    assert c.model_dump()["mcp_servers"][0]["env"] == {"TOKEN": "{env:MY_TOKEN}"}


def test_a_missing_variable_says_which_card_server_and_variable_and_what_to_do() -> None:
    c = parse_card(card(ECHO_CARD_FRONT), "kiln:helper.md", origin="kiln")
    with pytest.raises(CardError) as err:
        c.acp_mcp_servers(caps(), "some-agent", env={})
    assert err.value.message == (
        "card kiln:helper.md: mcp_servers[0].env.ECHO_MCP_RESULT refers to the environment variable "
        "CARD_SECRET, which is not set (needed to start the card's MCP server 'echo')")
    assert err.value.fix == "set CARD_SECRET in the environment, or change mcp_servers[0].env.ECHO_MCP_RESULT in card kiln:helper.md"


def test_a_url_from_the_environment_is_checked_once_filled_in() -> None:
    c = parse_card(card('mcp_servers:\n  - name: docs\n    url: "{env:DOCS_URL}"\n'), "kiln:docs.md", origin="kiln")
    ok = c.acp_mcp_servers(caps(http=True), "opencode", env={"DOCS_URL": "http://127.0.0.1:9/mcp"})
    assert ok[0]["url"] == "http://127.0.0.1:9/mcp"
    with pytest.raises(CardError) as err:
        c.acp_mcp_servers(caps(http=True), "opencode", env={"DOCS_URL": "127.0.0.1:9/mcp"})
    # The value is not echoed: it came from the environment and may hold a token (issue 17.5).
    assert err.value.message == ("card kiln:docs.md: mcp_servers[0].url of MCP server 'docs', once filled in "
                                 "from the environment, is not an http:// or https:// address")
    assert err.value.fix is not None and err.value.fix.startswith("set the variable to the server's address")


def test_a_transport_the_agent_did_not_advertise_is_refused() -> None:
    c = parse_card(card("mcp_servers:\n  - name: docs\n    url: http://127.0.0.1:9000/mcp\n"), "user:docs.md")
    with pytest.raises(CardError) as err:
        c.acp_mcp_servers(caps(http=False, sse=True), "opencode", env={})
    assert err.value.message == ("card user:docs.md: MCP server 'docs' is an http server, and the agent opencode "
                                 "does not take http MCP servers (its mcpCapabilities do not list http)")
    assert err.value.fix is not None and "give the server a `command`" in err.value.fix
    assert c.acp_mcp_servers(caps(http=True), "opencode", env={})[0]["type"] == "http"


# ---- with real subprocesses ---------------------------------------------------------------------


def echo_step(as_: str = "echo") -> dict[str, Any]:
    return {"mcp_call": {"server": "echo", "tool": "semantic_search", "arguments": {"query": "bread"}},
            "as": as_, "echo": True, "announce": True}


def install_echo_server(setup: Setup) -> None:
    """The echo server under the agent's working directory (the card names it by a relative path)."""
    (setup.tmp / "tools").mkdir(exist_ok=True)
    shutil.copy(ECHO_SERVER, setup.tmp / "tools" / "echo_server.py")


def echo_calls(setup: Setup) -> list[dict[str, Any]]:
    log = setup.tmp / "echo-calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def session_new_servers(setup: Setup, agent: str) -> list[dict[str, Any]]:
    for e in setup.entries(agent):
        frame = e.get("frame", {}) if e.get("kind") == "in" else {}
        if frame.get("method") == "session/new":
            servers: list[dict[str, Any]] = frame["params"]["mcpServers"]
            return servers
    raise AssertionError(f"{agent} got no session/new")


def test_the_agent_calls_a_tool_on_the_cards_stdio_server_and_the_person_sees_the_reply(setup: Setup) -> None:
    install_echo_server(setup)
    (setup.cards_dir / "echoer.md").write_text(card(ECHO_CARD_FRONT + "agent: solo\n"), encoding="utf-8")
    setup.scripts["solo"] = agent_script(echo_step(), {"text": "\nDONE"})
    setup.write()
    setup.env["CARD_SECRET"] = SECRET
    res = setup.run("solo", "find bread", "--card", "echoer")
    assert res.returncode == 0, res.stderr[-3000:]
    # What the person sees: the tool call and the server's reply, carrying the card's env.
    assert "[tool] echo: semantic_search (other): completed" in res.stderr, res.stderr
    # (The value came from {env:CARD_SECRET}: the person sees it redacted, issue 17.5; the
    # agent's own log shows the server really had it.)
    assert "Best match: notes/***.md" in res.stdout and SECRET not in res.stdout, res.stdout
    assert any(f"Best match: notes/{SECRET}.md" in json.dumps(e) for e in setup.entries("solo"))
    assert res.stdout.rstrip().endswith("DONE")
    assert [c["query"] for c in echo_calls(setup)] == ["bread"]
    # What the agent was given: the bridge first, then the card's server, as written.
    servers = session_new_servers(setup, "solo")
    assert [s["name"] for s in servers] == ["crucible", "echo"]
    assert servers[1] == {"name": "echo", "command": sys.executable,
                          "args": ["tools/echo_server.py", "--log", "echo-calls.jsonl"],
                          "env": [{"name": "ECHO_MCP_RESULT", "value": f"notes/{SECRET}.md"}]}
    # The saved transcript has the reply too, the secret redacted as on screen.
    transcripts = list((Path(setup.env["XDG_DATA_HOME"]) / "crucible").rglob("*.md"))
    assert any("Best match: notes/***.md" in t.read_text() for t in transcripts), transcripts
    assert not any(SECRET in t.read_text() for t in transcripts)


def test_a_missing_variable_stops_the_session_with_the_fix(setup: Setup) -> None:
    install_echo_server(setup)
    (setup.cards_dir / "echoer.md").write_text(card(ECHO_CARD_FRONT + "agent: solo\n"), encoding="utf-8")
    setup.scripts["solo"] = agent_script(echo_step())
    setup.write()
    setup.env.pop("CARD_SECRET", None)
    res = setup.run("solo", "find bread", "--card", "echoer")
    assert res.returncode != 0
    assert "card kiln:echoer.md: mcp_servers[0].env.ECHO_MCP_RESULT refers to the environment variable " \
           "CARD_SECRET, which is not set (needed to start the card's MCP server 'echo')" in res.stderr, res.stderr
    assert "fix: set CARD_SECRET in the environment" in res.stderr
    assert not echo_calls(setup)


def test_an_sse_server_for_an_agent_without_sse_is_refused_before_the_session(setup: Setup) -> None:
    # The scripted agent advertises mcpCapabilities {http: true, sse: false}.
    (setup.cards_dir / "feed.md").write_text(
        card("agent: solo\nmcp_servers:\n  - name: feed\n    type: sse\n    url: http://127.0.0.1:9/sse\n"),
        encoding="utf-8")
    setup.scripts["solo"] = agent_script({"text": "never"})
    setup.write()
    res = setup.run("solo", "hi", "--card", "feed")
    assert res.returncode != 0
    assert ("card kiln:feed.md: MCP server 'feed' is an sse server, and the agent solo does not take sse MCP "
            "servers") in res.stderr, res.stderr
    assert "never" not in res.stdout
    assert not any(e.get("frame", {}).get("method") == "session/new" for e in setup.entries("solo"))


def test_a_delegated_child_gets_its_cards_servers(setup: Setup) -> None:
    install_echo_server(setup)
    (setup.cards_dir / "echoer.md").write_text(card(ECHO_CARD_FRONT + "agent: child\n"), encoding="utf-8")
    setup.scripts["parent"] = agent_script(delegate_step("echoer", "search for bread"))
    setup.scripts["child"] = agent_script(echo_step())
    setup.write()
    setup.env["CARD_SECRET"] = SECRET
    res = setup.run("parent", "delegate it")
    assert res.returncode == 0, res.stderr[-3000:]
    result = tool_json(setup.results("parent", "delegate")[0])
    assert result["status"] == "completed", result
    assert f"Best match: notes/{SECRET}.md" in result["reply"]
    assert [s["name"] for s in session_new_servers(setup, "child")] == ["crucible", "echo"]
    # The parent has no card: it got only the bridge.
    assert [s["name"] for s in session_new_servers(setup, "parent")] == ["crucible"]
    assert [c["query"] for c in echo_calls(setup)] == ["bread"]


# ---- a real agent -------------------------------------------------------------------------------


def kiln_for_opencode(tmp_path: Path, fixture_kiln_src: Path) -> Path:
    """The fixture kiln with an empty card folder, once the npm agents are installed (else skip)."""
    sys.path.insert(0, str(REPO / "fixtures"))
    import agent_env

    reason = agent_env.ensure_npm()
    if reason is not None:
        pytest.skip(reason)
    kiln = tmp_path / "kiln"
    shutil.copytree(fixture_kiln_src, kiln, ignore=shutil.ignore_patterns(".crucible"))
    (kiln / ".crucible" / "agents").mkdir(parents=True)
    return kiln


@pytest.mark.real_agent
def test_opencode_calls_a_tool_on_the_cards_server(tmp_path: Path, fixture_kiln_src: Path, cru_bin: str) -> None:
    kiln = kiln_for_opencode(tmp_path, fixture_kiln_src)
    import agent_env
    import netns
    from fake_llm import FakeLLM, Reply

    (kiln / ".crucible" / "agents" / "echoer.md").write_text(card(f"""\
mcp_servers:
  - name: echo
    command: {json.dumps(sys.executable)}
    args: [echo_server.py, --log, echo-calls.jsonl]
    env: {{ECHO_MCP_RESULT: "notes/{{env:CARD_SECRET}}.md"}}
"""), encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(ECHO_SERVER, work / "echo_server.py")
    config = tmp_path / "config.toml"
    config.write_text("", encoding="utf-8")
    with FakeLLM() as llm:
        _, env = agent_env.agent_launch("opencode", llm.url, tmp_path / "home")
        env["CRUCIBLE_CONFIG"] = str(config)
        env["CARD_SECRET"] = SECRET
        llm.push(Reply.tool_call("semantic_search", {"query": "sourdough"}, server="echo"),
                 Reply.text_reply("FINAL: the echo server answered."))
        argv = [cru_bin, "chat", "-a", "opencode", "--card", "echoer", "--kiln", str(kiln), "--cwd", str(work),
                "-p", "Find my sourdough note."]
        if netns.unavailable_reason() is None:
            argv = netns.wrap(argv, [llm.port])
        res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240, cwd=work)
        offered = llm.main_requests()[0].tool_names() if llm.main_requests() else []
        results = "\n".join(llm.tool_result_texts())
    assert res.returncode == 0, res.stderr[-3000:]
    assert "echo_semantic_search" in offered, offered
    # The server OpenCode started from the card ran the call, with the card's env filled in,
    # and OpenCode handed its reply to the LLM.
    calls = [json.loads(line) for line in (work / "echo-calls.jsonl").read_text().splitlines()]
    assert [c["query"] for c in calls] == ["sourdough"]
    assert f"Best match: notes/{SECRET}.md" in results, results
    assert "FINAL: the echo server answered." in res.stdout


@pytest.mark.real_agent
def test_opencode_reaches_a_cards_http_server_with_its_token(
    tmp_path: Path, fixture_kiln_src: Path, cru_bin: str
) -> None:
    """A card names a team's docs kiln served by `cru mcp --http` (another process, with its
    own bearer token); OpenCode connects to it over streamable HTTP and reads a note there."""
    kiln = kiln_for_opencode(tmp_path, fixture_kiln_src)
    import agent_env
    import netns
    from fake_llm import FakeLLM, Reply

    (kiln / ".crucible" / "agents" / "docs.md").write_text(card("""\
mcp_servers:
  - name: docs
    url: "{env:DOCS_URL}"
    headers: {Authorization: "Bearer {env:DOCS_TOKEN}"}
"""), encoding="utf-8")
    docs = tmp_path / "team-docs"
    docs.mkdir()
    (docs / "Style guide.md").write_text("# Style guide\nHeadings use sentence case. Code word: quokka-41.\n",
                                         encoding="utf-8")
    config = tmp_path / "config.toml"
    config.write_text("", encoding="utf-8")
    with FakeLLM() as llm:
        _, env = agent_env.agent_launch("opencode", llm.url, tmp_path / "home")
        env["CRUCIBLE_CONFIG"] = str(config)
        server = subprocess.Popen([cru_bin, "mcp", "--kiln", str(docs), "--http", "--port", "0"],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  env=env, text=True)
        try:
            assert server.stderr is not None
            banner = ""
            while "token: " not in banner:
                line = server.stderr.readline()
                assert line, f"cru mcp --http exited: {banner}"
                banner += line
            url = re.search(r"http://127\.0\.0\.1:(\d+)/\S+", banner)
            token = re.search(r"token: (\S+)", banner)
            assert url and token, banner
            env |= {"DOCS_URL": url.group(0), "DOCS_TOKEN": token.group(1)}
            llm.push(Reply.tool_call("read_note", {"path": "Style guide.md"}, server="docs"),
                     Reply.text_reply("FINAL: headings use sentence case."))
            argv = [cru_bin, "chat", "-a", "opencode", "--card", "docs", "--kiln", str(kiln),
                    "-p", "How do our docs write headings?"]
            if netns.unavailable_reason() is None:
                argv = netns.wrap(argv, [llm.port, int(url.group(1))])
            res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
            offered = llm.main_requests()[0].tool_names() if llm.main_requests() else []
            results = "\n".join(llm.tool_result_texts())
        finally:
            server.terminate()
            server.wait(timeout=10)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "docs_read_note" in offered and "crucible_read_note" in offered, offered
    # The note came from the other kiln, over HTTP, through the card's token.
    assert "Code word: quokka-41." in results, results
    assert "FINAL: headings use sentence case." in res.stdout
