"""In the terminal chat (a real pty): an upstream's elicitation reaches the permission dialog
and the person answers it; `/mcp` shows the upstreams."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import UPSTREAM, write_config

_spec = importlib.util.spec_from_file_location("tui_conftest", Path(__file__).parents[1] / "tui" / "conftest.py")
assert _spec is not None and _spec.loader is not None
tui_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tui_conftest)
TuiRunner = tui_conftest.TuiRunner

CONFIG = (f'[[mcp.servers]]\nname = "up"\n[mcp.servers.transport]\ntype = "stdio"\n'
          f'command = "{sys.executable}"\nargs = ["{UPSTREAM}", "stdio"]\n[permissions]\n"up_*" = "allow"\n')


@pytest.fixture
def tui(cru_bin: str, clean_env: dict[str, str], kiln: Path, tmp_path: Path) -> Any:
    write_config(Path(clean_env["XDG_CONFIG_HOME"]) / "crucible", CONFIG)
    runner = TuiRunner(cru_bin, clean_env, kiln, tmp_path)
    yield runner
    for screen in runner.screens:
        screen.close()


def ask_twice() -> dict[str, Any]:
    call = {"mcp_call": {"server": "crucible", "tool": "up_elicit_name", "arguments": {}}, "echo": True}
    return {"initialize": {"result": {"agentCapabilities": {"mcpCapabilities": {"http": True, "sse": False}}}},
            "new_session": {"list_mcp_tools": True},
            "prompts": [[dict(call, **{"as": "first"}), {"text": "\nfirst done"}],
                        [dict(call, **{"as": "second"}), {"text": "\nsecond done"}]]}


def result_text(entry: dict[str, Any]) -> str:
    return "\n".join(c.get("text", "") for c in entry["result"]["result"]["content"])


def test_elicitation_is_answered_in_the_dialog_and_mcp_shows_the_servers(tui: Any) -> None:
    screen = tui.open(ask_twice(), cols=120, rows=30)
    screen.wait_for("›")
    screen.type_line("what is my name")
    screen.wait_all("Question from MCP server up", "What is your name?", "name: text (default \"Ada\")")
    screen.send("Grace")
    screen.wait_for("Grace")
    screen.send("\r")
    first = tui.wait_for_log(lambda e: e.get("kind") == "result" and e.get("as") == "first")
    assert result_text(first) == "action=accept content={'name': 'Grace'}"
    screen.wait_for("first done")
    screen.type_line("again")
    screen.wait_for("Question from MCP server up")
    screen.send("\x1b")  # Esc declines
    second = tui.wait_for_log(lambda e: e.get("kind") == "result" and e.get("as") == "second")
    assert result_text(second) == "action=decline content=None"
    screen.wait_for("second done")
    screen.type_line("/mcp")
    screen.wait_for(lambda s: "MCP servers:" in s and any(
        line.split()[:2] == ["up", "up"] and "tools" in line for line in s.splitlines()))


def test_a_question_that_opens_while_the_person_types_never_takes_their_sentence(tui: Any) -> None:
    # Typing a follow-up while the agent works, a server's question opened: Enter took the sentence
    # as the answer (sent to the server) and a first Esc of Esc-Enter declined it. The draft stays
    # theirs: Enter queues it as a prompt; then the box answers the question.
    call = {"mcp_call": {"server": "crucible", "tool": "up_elicit_name", "arguments": {}}, "echo": True}
    script = {"initialize": {"result": {"agentCapabilities": {"mcpCapabilities": {"http": True, "sse": False}}}},
              "new_session": {"list_mcp_tools": True},
              "prompts": [[{"sleep": 2}, dict(call, **{"as": "ask"}), {"text": "\nasked"}],
                          [{"text": "\nsecond turn"}]]}
    screen = tui.open(script, cols=120, rows=30)
    screen.wait_for("›")
    screen.type_line("go")
    screen.send("say it shorter")
    screen.wait_all("Question from MCP server up", "Enter  sends what you typed as a prompt")
    screen.send("\x1b\r")  # Esc-Enter adds a line to the draft (its Esc does not decline)
    screen.send("please")
    screen.wait_for("please")
    screen.send("\r")  # Enter: the draft goes to the queue, not to the server
    screen.wait_all("type the answer, Enter: send", "1. say it shorter")
    assert not any(e.get("kind") == "result" for e in tui.agent_log())
    screen.send("Grace")
    screen.wait_for("Grace")
    screen.send("\r")
    answered = tui.wait_for_log(lambda e: e.get("kind") == "result" and e.get("as") == "ask")
    assert result_text(answered) == "action=accept content={'name': 'Grace'}"
    screen.wait_for("second turn")  # the queued sentence was sent as the next prompt
    prompts = [e["frame"]["params"]["prompt"][0]["text"] for e in tui.agent_log()
               if e.get("kind") == "in" and e["frame"].get("method") == "session/prompt"]
    assert prompts[-1] == "say it shorter\nplease", prompts


def test_a_form_of_every_field_kind_is_shown_checked_and_sent_as_the_spec_types_it(tui: Any) -> None:
    # The MCP spec's select fields (titled choices, multi-selects, the older enumNames) and bounds:
    # the dialog says what each takes, a wrong answer says what is wrong and stays to be mended,
    # and the server gets each choice's value (not its title) and a multi-select as a list.
    call = {"mcp_call": {"server": "crucible", "tool": "up_elicit_form", "arguments": {}}, "echo": True}
    script = {"initialize": {"result": {"agentCapabilities": {"mcpCapabilities": {"http": True, "sse": False}}}},
              "new_session": {"list_mcp_tools": True},
              "prompts": [[dict(call, **{"as": "form"}), {"text": "\nform done"}]]}
    screen = tui.open(script, cols=140, rows=40)
    screen.wait_for("›")
    screen.type_line("fill the form")
    screen.wait_all("Question from MCP server up", "name: text (required)",
                    "count: a whole number from 1 to 100 (default 42)",
                    "hero: one of Superman, Wonder Woman (default Superman)",
                    "instruments: one or more of Guitar, Piano, Violin, Drums, with commas (default Guitar)",
                    "pet: one of Cats, Dogs (default Cats)", "born: a date (2026-12-31)",
                    "type name, or name=value; name=value")
    screen.send("name=Grace; count=500")
    screen.send("\r")
    screen.wait_for("count must be at most 100")
    assert not any(e.get("kind") == "result" for e in tui.agent_log())  # nothing sent yet
    screen.send(b"\x15")  # Ctrl-U: the line again
    screen.send("name=Grace; count=7; hero=wonder woman; instruments=piano, Drums; pet=Dogs; born=1906-12-09")
    screen.send("\r")
    form = tui.wait_for_log(lambda e: e.get("kind") == "result" and e.get("as") == "form")
    assert result_text(form) == ("action=accept content={'born': '1906-12-09', 'count': 7, 'hero': 'hero-3', "
                                 "'instruments': ['Piano', 'Drums'], 'name': 'Grace', 'pet': 'pet-2'}")
    screen.wait_for("form done")


def test_a_server_that_keeps_failing_is_one_line_in_the_chat_not_drawn_over_it(
        cru_bin: str, clean_env: dict[str, str], kiln: Path, tmp_path: Path) -> None:
    # A server whose program fails at once (a wrong import, as a person's first try often does)
    # is retried with backoff and logged down at every retry: that went to stderr, over the
    # full-screen chat, a line per retry across the input box and the status bar.
    failing, starts = tmp_path / "failing_server.py", tmp_path / "starts"
    failing.write_text(f'open({str(starts)!r}, "a").write("started\\n")\nimport sys\n'
                       'sys.stderr.write("ImportError: fastmcp\\n")\nsys.exit(1)\n')
    write_config(Path(clean_env["XDG_CONFIG_HOME"]) / "crucible",
                 f'[[mcp.servers]]\nname = "broken"\n[mcp.servers.transport]\ntype = "stdio"\n'
                 f'command = "{sys.executable}"\nargs = ["{failing}"]\n')
    runner = TuiRunner(cru_bin, clean_env, kiln, tmp_path)
    screen = runner.open({"new_session": {"list_mcp_tools": True}, "prompts": [[{"text": "hello back"}]]},
                         cols=120, rows=60)
    try:
        screen.wait_for(lambda s: "ready" in s.splitlines()[-1])
        screen.wait_for("MCP server broken is down")
        deadline = time.monotonic() + 60
        while len(starts.read_text().splitlines()) < 4:  # each retry logs the line again
            assert time.monotonic() < deadline, f"never retried three times:\n{screen.text()}"
            screen.pump(0.5)
        screen.type_line("hi")
        shown = screen.wait_for("hello back")
        lines = shown.splitlines()
        said = [line for line in lines if "MCP server broken is down" in line]
        assert len(said) == 1 and "(its stderr: ImportError: fastmcp)" in said[0], shown
        assert "ready" in lines[-1] and lines[-2].startswith("›"), shown
    finally:
        screen.close()
