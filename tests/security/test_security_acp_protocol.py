"""17.10: `cru acp` refuses session/new (and everything else) before initialize, starting no
backend; a request whose id is an object (or null) gets -32600 with `id: null`, as JSON-RPC
asks, and the connection goes on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import RawAcp, script_file, scripted_command

from acp_host.jsonrpc import Invalid, classify


def _editor(cru_bin: str, env: dict[str, str], kiln: Path, tmp: Path) -> tuple[RawAcp, Path]:
    log = tmp / "agent-log.jsonl"
    script = script_file(tmp, {"log": str(log)})
    editor = RawAcp([cru_bin, "acp", "--agent-command", scripted_command(script), "--kiln", str(kiln)],
                    env, tmp, tmp / "acp.err")
    return editor, log


def test_nothing_before_initialize(cru_bin: str, clean_env: dict[str, str], kiln: Path, tmp_path: Path) -> None:
    editor, log = _editor(cru_bin, clean_env, kiln, tmp_path)
    try:
        for method, params in [("session/new", {"cwd": str(tmp_path), "mcpServers": []}),
                               ("session/list", {}), ("session/prompt", {"sessionId": "x", "prompt": []})]:
            answer = editor.request(method, params)
            assert answer.get("error", {}).get("code") == -32600, answer
            assert "initialize first" in answer["error"]["message"]
        assert not log.exists()  # no backend agent was started
        assert "result" in editor.initialize()
        made = editor.request("session/new", {"cwd": str(tmp_path), "mcpServers": []})
        assert "result" in made, made
    finally:
        assert editor.close() == 0
    assert log.exists()


def test_request_with_an_object_id_gets_invalid_request_with_null_id(cru_bin: str, clean_env: dict[str, str],
                                                                     kiln: Path, tmp_path: Path) -> None:
    editor, _ = _editor(cru_bin, clean_env, kiln, tmp_path)
    try:
        editor.initialize()
        bad_frames = [{"jsonrpc": "2.0", "id": {"x": 1}, "method": "session/list", "params": {}},
                      {"jsonrpc": "2.0", "id": [1], "method": "session/list"},
                      {"jsonrpc": "2.0", "id": None, "method": "session/list"},
                      {"jsonrpc": "2.0", "id": {"x": 1}}]
        for count, bad in enumerate(bad_frames, 1):
            editor.send(bad)

            def answered(frame: Any, count: int = count) -> bool:
                return len([f for f in editor.frames if isinstance(f, dict) and "error" in f]) >= count

            editor.wait_for(answered)
        errors = [f for f in editor.frames if isinstance(f, dict) and "error" in f]
        assert [(e["id"], e["error"]["code"]) for e in errors] == [(None, -32600)] * len(bad_frames), errors
        # The connection still works.
        assert "result" in editor.request("session/list", {})
    finally:
        assert editor.close() == 0


def test_classify_marks_unechoable_ids_for_a_null_reply() -> None:
    for frame in ({"id": {"x": 1}, "method": "m"}, {"id": 1.5, "method": "m"}, {"id": True, "method": "m"},
                  {"id": None, "method": "m"}, {"id": {"x": 1}}):
        msg = classify(json.loads(json.dumps(frame)))
        assert isinstance(msg, Invalid) and msg.answer_null and msg.id is None, frame
    # Responses are never answered, whatever their id.
    msg = classify({"id": {"x": 1}, "result": {}})
    assert isinstance(msg, Invalid) and not msg.answer_null


def test_a_malformed_permission_request_is_answered_invalid_params_not_asked(chat: Any) -> None:
    done = chat.run({"prompts": [[{"permission": {"toolCall": None, "options": 5}, "as": "broken"},
                                  {"permission": {"toolCall": {"toolCallId": "t1", "title": "x"}, "options": []},
                                   "as": "no-options"}, {"text": "went on"}]]}, "hi")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "went on\n"
    assert "[permission]" not in done.stderr  # nothing was asked or decided
    for name in ("broken", "no-options"):
        entry = chat.wait_for_log(lambda e, n=name: e.get("kind") == "result" and e.get("as") == n)
        assert entry["result"]["error"]["code"] == -32602, entry
        assert "toolCall (an object) and options" in entry["result"]["error"]["message"]


def test_chat_p_says_once_that_it_could_not_read_an_update_and_goes_on(chat: Any) -> None:
    bad = {"update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": 12345}}}
    newer = {"update": {"sessionUpdate": "some_future_update", "x": 1}}
    done = chat.run({"prompts": [[{"text": "before "}, bad, bad, newer, {"text": "after"}]]}, "hi")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "before after\n"
    said = [line for line in done.stderr.splitlines() if "cannot read" in line]
    assert said == ["[warning] the agent sent an update this chat cannot read (invalid agent_message_chunk); "
                    "what it carried is not shown (`--format json` prints it)"], done.stderr
    assert "some_future_update" not in done.stderr  # a newer kind: said with -v only
