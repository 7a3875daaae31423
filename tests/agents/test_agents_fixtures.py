"""The offline test kit on its own: the fake LLM speaks each API as the agents expect, the
netns launcher lets through only the forwarded ports, agent_env builds what FIELD-NOTES says."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import agent_env
import httpx
import netns
import pytest
from fake_llm import EXHAUSTED_TEXT, FakeLLM, Reply

from acp_host.registry import resolve_agent

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
TOOLS_ANTHROPIC = [{"name": "Bash", "input_schema": {}}, {"name": "mcp__crucible__semantic_search", "input_schema": {}}]
TOOLS_OPENAI = [{"type": "function", "function": {"name": "crucible_semantic_search", "parameters": {}}}]
TOOLS_GEMINI = [{"functionDeclarations": [{"name": "mcp_crucible_semantic_search"}]}]


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(trust_env=False, timeout=30) as client:
        yield client


def _sse(text: str) -> list[tuple[str | None, Any]]:
    """(event, parsed data) for each SSE event."""
    out: list[tuple[str | None, Any]] = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        event = None
        data = ""
        for line in block.splitlines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data += line[6:]
        out.append((event, data if data == "[DONE]" else json.loads(data)))
    return out


def test_anthropic_stream_text_then_tool_use(http: httpx.Client) -> None:
    with FakeLLM([Reply.text_reply("Hello from the fake"), Reply.tool_call("semantic_search", {"query": "q"})]) as llm:
        body = {"model": "claude-x", "stream": True, "tools": TOOLS_ANTHROPIC,
                "messages": [{"role": "user", "content": "hi"}]}
        first = _sse(http.post(f"{llm.url}/v1/messages?beta=true", json=body).text)
        second = _sse(http.post(f"{llm.url}/v1/messages?beta=true", json=body).text)
    assert [e for e, _ in first] == ["message_start", "content_block_start", "content_block_delta",
                                     "content_block_delta", "content_block_delta", "content_block_stop",
                                     "message_delta", "message_stop"]
    assert "".join(d["delta"]["text"] for e, d in first if e == "content_block_delta") == "Hello from the fake"
    usage = first[-2][1]["usage"]
    assert usage["cache_read_input_tokens"] == 0 and usage["cache_creation_input_tokens"] == 0
    assert first[-2][1]["delta"]["stop_reason"] == "end_turn"
    start = second[1][1]["content_block"]
    assert (start["type"], start["name"]) == ("tool_use", "mcp__crucible__semantic_search")
    partial = "".join(d["delta"]["partial_json"] for e, d in second if e == "content_block_delta")
    assert json.loads(partial) == {"query": "q"}
    assert second[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_openai_side_request_does_not_consume_the_script(http: httpx.Client) -> None:
    with FakeLLM([Reply.tool_call("semantic_search", {"query": "q"})]) as llm:
        title = _sse(http.post(f"{llm.url}/v1/chat/completions",
                                json={"stream": True, "messages": [{"role": "user", "content": "title?"}]}).text)
        main = _sse(http.post(f"{llm.url}/v1/chat/completions",
                               json={"stream": True, "tools": TOOLS_OPENAI, "messages": []}).text)
        assert [r.side for r in llm.requests] == [True, False]
        assert llm.remaining() == 0
    assert "".join(d["choices"][0]["delta"].get("content") or "" for _, d in title[:-1] if d["choices"])
    assert main[-1] == (None, "[DONE]")
    calls = [tc for _, d in main[:-1] if d["choices"] for tc in d["choices"][0]["delta"].get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "crucible_semantic_search"
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"query": "q"}
    assert [d["choices"][0]["finish_reason"] for _, d in main[:-1] if d["choices"]][-1] == "tool_calls"


def test_gemini_router_gets_a_score_and_the_stream_a_function_call(http: httpx.Client) -> None:
    with FakeLLM([Reply.tool_call("semantic_search", {"query": "q"})]) as llm:
        router = http.post(f"{llm.url}/v1beta/models/gemini-flash-lite:generateContent",
                            json={"contents": [], "generationConfig": {"responseJsonSchema": {
                                "properties": {"complexity_reasoning": {}, "complexity_score": {}}}}}).json()
        stream = _sse(http.post(f"{llm.url}/v1beta/models/gemini-flash:streamGenerateContent?alt=sse",
                                 json={"contents": [], "tools": TOOLS_GEMINI}).text)
    verdict = json.loads(router["candidates"][0]["content"]["parts"][0]["text"])
    assert verdict["complexity_score"] == 1
    part = stream[0][1]["candidates"][0]["content"]["parts"][0]
    assert part == {"functionCall": {"name": "mcp_crucible_semantic_search", "args": {"query": "q"}}}


def test_tool_results_are_read_from_each_api(http: httpx.Client) -> None:
    bodies = {
        "/v1/messages": {"tools": TOOLS_ANTHROPIC, "messages": [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                          "content": [{"type": "text", "text": "Best match: notes/a.md"}]}]}]},
        "/v1/chat/completions": {"tools": TOOLS_OPENAI, "messages": [
            {"role": "tool", "tool_call_id": "c", "content": "Best match: notes/b.md"}]},
        "/v1beta/models/m:streamGenerateContent?alt=sse": {"tools": TOOLS_GEMINI, "contents": [
            {"role": "user", "parts": [{"functionResponse": {"name": "x", "response": {"output": "notes/c.md"}}}]}]},
    }
    with FakeLLM([Reply.text_reply("ok")] * 3) as llm:
        http.post(f"{llm.url}/v1/chat/completions", json={"stream": True, "tools": TOOLS_OPENAI, "messages": []})
        for path, body in bodies.items():
            http.post(f"{llm.url}{path}", json=body)
        carried = llm.requests_with_tool_results()
        assert [r.api for r in carried] == ["anthropic", "openai", "gemini"]
        assert llm.tool_result_texts() == ["Best match: notes/a.md"]
        assert carried[1].tool_results() == ["Best match: notes/b.md"]
        assert "notes/c.md" in carried[2].tool_results()[0]


def test_errors_exhaustion_and_hang(http: httpx.Client) -> None:
    with FakeLLM([Reply.error(500)]) as llm:
        body = {"stream": False, "tools": TOOLS_ANTHROPIC, "messages": []}
        assert http.post(f"{llm.url}/v1/messages", json=body).status_code == 500
        exhausted = http.post(f"{llm.url}/v1/messages", json=body).json()
        assert exhausted["content"][0]["text"] == EXHAUSTED_TEXT
        assert [r.reply for r in llm.requests] == ["error", "exhausted"]
        assert http.head(llm.url).status_code == 200

    llm = FakeLLM([Reply.hang()]).start()
    outcome: list[object] = []

    def call() -> None:
        try:
            outcome.append(http.post(f"{llm.url}/v1/messages", json=body, timeout=30).status_code)
        except httpx.HTTPError as e:
            outcome.append(e)

    t = threading.Thread(target=call)
    t.start()
    assert llm.wait_until(lambda f: len(f.requests) == 1, timeout=10)
    assert outcome == []  # recorded, and no answer: it hangs until the server stops
    llm.stop()
    t.join(timeout=10)
    assert len(outcome) == 1 and isinstance(outcome[0], httpx.HTTPError)


def test_standalone_server_reads_a_script_and_records_requests(http: httpx.Client, tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": "scripted answer"}]))
    record = tmp_path / "requests.jsonl"
    proc = subprocess.Popen([sys.executable, str(FIXTURES / "fake_llm.py"), "--script", str(script),
                             "--record", str(record)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        resp = http.post(f"{url}/v1/chat/completions",
                          json={"stream": False, "tools": TOOLS_OPENAI, "messages": [{"role": "user", "content": "x"}]})
        assert resp.json()["choices"][0]["message"]["content"] == "scripted answer"
        lines = [json.loads(line) for line in record.read_text().splitlines()]
        assert [(r["api"], r["reply"]) for r in lines] == [("openai", "text")]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"nonsense": 1}]))
    r = subprocess.run([sys.executable, str(FIXTURES / "fake_llm.py"), "--script", str(bad)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "needs one of text/tool/hang/error" in r.stderr


def test_netns_lets_through_only_the_forwarded_port() -> None:
    reason = netns.unavailable_reason()
    if reason is not None:
        pytest.skip(f"no loopback-only network namespace here: {reason}")
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed.listen()  # listening on the host, but not forwarded
    with FakeLLM([Reply.text_reply("inside")]) as llm:
        probe = f"""
import json, socket, urllib.request
def connect(host, port):
    s = socket.socket(); s.settimeout(5)
    return s.connect_ex((host, port))
body = json.dumps({{"stream": False, "tools": {TOOLS_OPENAI!r}, "messages": []}}).encode()
r = urllib.request.urlopen(urllib.request.Request("{llm.url}/v1/chat/completions", data=body,
                           headers={{"Content-Type": "application/json"}}), timeout=10)
print(json.dumps({{"reply": json.load(r)["choices"][0]["message"]["content"],
                  "unforwarded": connect("127.0.0.1", {closed.getsockname()[1]}),
                  "outside": connect("192.0.2.1", 80)}}))
"""
        r = subprocess.run(netns.wrap([sys.executable, "-c", probe], [llm.port]), capture_output=True,
                           text=True, timeout=30)
    closed.close()
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    assert seen["reply"] == "inside"
    assert seen["unforwarded"] != 0  # refused: inside, nothing listens there
    assert seen["outside"] != 0  # unreachable: only loopback exists


def test_agent_env_builds_a_fresh_home_for_each_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The cache dir name must be the one scripts/setup-npm computes.
    digest = subprocess.run(["sh", "-c", "cat package.json package-lock.json | sha256sum"],
                            cwd=FIXTURES / "npm", capture_output=True, text=True, check=True).stdout[:12]
    assert agent_env.npm_install_dir().name == f"npm-{digest}"
    monkeypatch.setenv("ANTHROPIC_API_KEY", "the-persons-real-key")
    if agent_env.npm_modules_dir() is None:
        with pytest.raises(RuntimeError):
            agent_env.agent_launch("claude", "http://127.0.0.1:1", tmp_path / "h")
        return
    url = "http://127.0.0.1:4321"
    argv, env = agent_env.agent_launch("claude", url, tmp_path / "claude")
    assert argv[1].endswith("claude-agent-acp/dist/index.js")
    assert env["ANTHROPIC_BASE_URL"] == url and env["ANTHROPIC_API_KEY"] != "the-persons-real-key"
    assert env["CLAUDE_CODE_MAX_RETRIES"] == "0" and env["HOME"] == str(tmp_path / "claude")
    assert (env.get("IS_SANDBOX") == "1") == (os.geteuid() == 0)
    # A host run with this env resolves the built-in to the same npm install.
    assert resolve_agent("claude", path=env["PATH"]).command == str(Path(argv[1]).parents[3] / ".bin" / "claude-agent-acp")
    argv, env = agent_env.agent_launch("opencode", url, tmp_path / "opencode")
    assert argv[1:] == ["acp"] and Path(argv[0]).is_file()
    provider = json.loads(env["OPENCODE_CONFIG_CONTENT"])["provider"]["fake"]
    assert provider["options"]["baseURL"] == f"{url}/v1"
    assert Path(env["TMPDIR"]).is_dir() and env["TMPDIR"].startswith(str(tmp_path / "opencode"))
    argv, env = agent_env.agent_launch("gemini", url, tmp_path / "gemini", api_key=False)
    assert argv[-1] == "--acp" and "GEMINI_API_KEY" not in env
    settings = json.loads((tmp_path / "gemini" / ".gemini" / "settings.json").read_text())
    assert settings["security"]["folderTrust"]["enabled"] is False
