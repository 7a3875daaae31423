"""17.5: secrets redacted wherever shown or saved — `{env:…}` values (profiles, cards) and bearer
tokens in `--record` recordings, `cru agents` / `cru doctor`, start errors, a card url's error,
the session's own files — and those files 0600 in 0700 folders."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import SCRIPTED, Screen, script_file, scripted_command

from crucible.private_files import FILE_MODE, FOLDER_MODE

CARD_SECRET = "card-secret-5d1e9a"
PROFILE_SECRET = "profile-secret-77c3b2"
URL_SECRET = "tok-3f9a1c@internal"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _card_with_secrets(kiln: Path) -> None:
    folder = kiln / ".crucible" / "agents"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "keyed.md").write_text(
        "---\ndescription: a card whose MCP server needs a key\nmcp_servers:\n"
        f"  - name: echo\n    command: {sys.executable}\n    args: [server.py, \"--key={{env:CARD_TOKEN}}\"]\n"
        "    env: {TOKEN: \"{env:CARD_TOKEN}\"}\n---\nUse the key.\n")


def test_recording_holds_no_secret_and_is_private(chat: Any) -> None:
    _card_with_secrets(chat.kiln)
    chat.env["CARD_TOKEN"] = CARD_SECRET
    record = chat.tmp / "rec.jsonl"
    done = chat.run({"prompts": [[{"text": f"the key is {CARD_SECRET}"}]]}, "hello", "--card", "keyed",
                    "--record", str(record))
    assert done.returncode == 0, done.stderr
    # What the agent really got (its own log), so the test knows what must not be in the recording.
    sent = next(e["frame"] for e in chat.agent_log() if e.get("kind") == "in"
                and e["frame"].get("method") == "session/new")
    servers = sent["params"]["mcpServers"]
    bridge = next(s for s in servers if s["name"] == "crucible")
    token = (bridge.get("headers") or bridge.get("env"))[0]["value"].removeprefix("Bearer ")
    assert len(token) > 10 and any(CARD_SECRET in json.dumps(s) for s in servers)
    text = record.read_text()
    assert token not in text and CARD_SECRET not in text
    assert "***" in text and "hello" in text  # the recording is still a recording
    assert _mode(record) == FILE_MODE
    # The agent's message echoed the key: shown and saved as *** too.
    assert CARD_SECRET not in done.stdout and "the key is ***" in done.stdout
    sessions = Path(chat.env["XDG_DATA_HOME"]) / "crucible" / "sessions"
    for path in sessions.rglob("*"):
        if path.is_file():
            assert CARD_SECRET not in path.read_text() and token not in path.read_text(), path


def test_session_files_are_private(chat: Any) -> None:
    done = chat.run(None, "hello")
    assert done.returncode == 0, done.stderr
    data = Path(chat.env["XDG_DATA_HOME"]) / "crucible"
    (folder,) = list((data / "sessions").iterdir())
    assert _mode(data) == FOLDER_MODE and _mode(data / "sessions") == FOLDER_MODE and _mode(folder) == FOLDER_MODE
    files = sorted(p.name for p in folder.iterdir())
    assert files == [".lock", "events.jsonl", "session.json", "transcript.md"]  # .lock: the conversation lock
    assert all(_mode(folder / name) == FILE_MODE for name in files)


def _profile_config(tmp: Path, argv_tail: list[str]) -> Path:
    config = tmp / "config.toml"
    args = json.dumps([str(SCRIPTED), *argv_tail, "--key={env:PROFILE_KEY}"])
    config.write_text(f'[agents.keyed]\ncommand = "{sys.executable}"\nargs = {args}\n'
                      '[agents.keyed.env]\nOTHER = "{env:PROFILE_KEY}"\n')
    return config


def _quiet_env(env: dict[str, str], tmp: Path, config: Path) -> dict[str, str]:
    """No real agents on PATH (and no npx): `cru agents` probes only the profile."""
    out = {**env, "CRUCIBLE_CONFIG": str(config), "PROFILE_KEY": PROFILE_SECRET, "CRUCIBLE_LOGIN_PATH": "0",
           "PATH": str(Path(sys.executable).parent), "HOME": str(tmp / "home")}
    return out


def test_agents_and_doctor_never_print_a_profile_secret(cru_bin: str, clean_env: dict[str, str], kiln: Path,
                                                        tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text("{}")
    env = _quiet_env(clean_env, tmp_path, _profile_config(tmp_path, [str(script)]))
    for argv in ([cru_bin, "agents"], [cru_bin, "doctor", "--kiln", str(kiln)]):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        assert "keyed" in done.stdout, done.stdout + done.stderr
        assert PROFILE_SECRET not in done.stdout + done.stderr
        assert re.search(r"keyed\s+ok\b.*--key=\*\*\*", done.stdout), done.stdout


def test_a_start_error_never_prints_a_profile_secret(cru_bin: str, clean_env: dict[str, str], kiln: Path,
                                                     tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"startup": [{"crash": {"code": 3, "stderr": f"bad key {PROFILE_SECRET}"}}]}))
    env = _quiet_env(clean_env, tmp_path, _profile_config(tmp_path, [str(script)]))
    done = subprocess.run([cru_bin, "chat", "-a", "keyed", "--kiln", str(kiln), "-p", "hi"], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1 and "exited" in done.stderr, done.stderr
    assert PROFILE_SECRET not in done.stderr and "--key=***" in done.stderr and "bad key ***" in done.stderr


def test_an_agents_words_quoted_in_a_start_error_are_redacted_before_they_are_cut() -> None:
    # A start error quotes the agent's last words up to QUOTE_MAX characters: cut before they
    # were redacted, a secret across the cut no longer matched and its first part was shown
    # ("… invalid api key SEKRET-A-1234567…)" in the audit, through `cru chat -a`).
    from crucible.redaction import remember_secret
    from crucible.start_failures import QUOTE_MAX, _quote

    secret = "quoted-secret-0a9b8c7d6e"
    remember_secret(secret)
    for before in range(QUOTE_MAX - len(secret), QUOTE_MAX + 1):
        shown = _quote("x" * before + secret + " end")
        assert secret[:6] not in shown, (before, shown)


def test_a_card_url_from_the_environment_is_not_echoed_in_its_error(chat: Any) -> None:
    folder = chat.kiln / ".crucible" / "agents"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "docs.md").write_text('---\ndescription: docs\nmcp_servers:\n  - name: docs\n    url: "{env:DOCS_URL}"\n'
                                    "---\n")
    chat.env["DOCS_URL"] = URL_SECRET
    done = chat.run({"initialize": {"result": {"agentCapabilities": {"mcpCapabilities": {"http": True}}}}},
                    "hi", "--card", "docs")
    assert done.returncode == 1 and "is not an http:// or https:// address" in done.stderr, done.stderr
    assert URL_SECRET not in done.stderr


def test_a_config_cru_writes_is_private(tmp_path: Path) -> None:
    from crucible.tui.permissions import save_permission_rule

    path = tmp_path / "fresh" / "crucible" / "config.toml"
    old = os.umask(0o022)
    try:
        save_permission_rule(path, "create_note", "allow")
    finally:
        os.umask(old)
    assert _mode(path) == FILE_MODE and _mode(path.parent) == FOLDER_MODE
    assert 'create_note = "allow"' in path.read_text()


def test_the_chat_history_is_private(cru_bin: str, clean_env: dict[str, str], kiln: Path, tmp_path: Path) -> None:
    """The prompts typed in `cru chat` (kept for the up arrow) are the person's: 0600 in a 0700 folder."""
    script = script_file(tmp_path, {"prompts": [[{"text": "noted"}]]})
    argv = [cru_bin, "chat", "--agent-command", scripted_command(script), "--kiln", str(kiln)]
    old = os.umask(0o022)
    try:
        screen = Screen(argv, {**clean_env, "TERM": "xterm-256color"}, tmp_path, cols=100, rows=30)
    finally:
        os.umask(old)
    try:
        screen.wait_for("ready", timeout=60)
        screen.type_line("my api key is hunter2")
        screen.wait_for("noted", timeout=60)
        screen.send("\x04")  # Ctrl-D leaves
        assert screen.wait_exit() == 0
    finally:
        screen.close()
    data = Path(clean_env["XDG_DATA_HOME"]) / "crucible"
    history = data / "chat-history"
    assert "my api key is hunter2" in history.read_text()
    assert _mode(history) == FILE_MODE and _mode(data) == FOLDER_MODE


# The card's secret as an agent streams it: a token at a time, with a pause long enough for
# the session's timed flush (1 s) to fall inside it.
STREAMED_SECRET = [{"text": "the key is card-se"}, {"sleep": 0.2}, {"text": "cret-5d"}, {"sleep": 1.3},
                   {"text": "1e9a"}, {"sleep": 0.2}, {"text": " and that is all"}]


def test_a_secret_streamed_in_pieces_is_masked_in_the_recording(chat: Any) -> None:
    # `--record` masked each frame alone: a key cut across chunks (as a model streams tokens)
    # was written in two readable halves.
    _card_with_secrets(chat.kiln)
    chat.env["CARD_TOKEN"] = CARD_SECRET
    record = chat.tmp / "rec.jsonl"
    done = chat.run({"prompts": [STREAMED_SECRET]}, "hello", "--card", "keyed", "--record", str(record))
    assert done.returncode == 0, done.stderr
    text = record.read_text()
    for piece in ("card-se", "cret-5d", "1e9a"):
        assert piece not in text, piece
    frames = [json.loads(line)["frame"] for line in text.splitlines()[1:]]
    chunks = [f["params"]["update"]["content"]["text"] for f in frames if f.get("method") == "session/update"
              and f["params"]["update"].get("sessionUpdate") == "agent_message_chunk"]
    assert "".join(chunks) == "the key is *** and that is all"  # the recording still holds the message


def test_a_secret_streamed_in_pieces_is_masked_on_stdout_and_in_the_saved_files(chat: Any) -> None:
    _card_with_secrets(chat.kiln)
    chat.env["CARD_TOKEN"] = CARD_SECRET
    done = chat.run({"prompts": [STREAMED_SECRET]}, "hello", "--card", "keyed")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "the key is *** and that is all\n"
    js = chat.run({"prompts": [STREAMED_SECRET]}, "hello", "--card", "keyed", "--format", "json")
    assert js.returncode == 0, js.stderr
    assert CARD_SECRET not in js.stdout
    chunks = [e["text"] for e in map(json.loads, js.stdout.splitlines()) if e.get("type") == "message_chunk"]
    assert "".join(chunks) == "the key is *** and that is all"
    sessions = Path(chat.env["XDG_DATA_HOME"]) / "crucible" / "sessions"
    folders = list(sessions.iterdir())
    assert len(folders) == 2
    for folder in folders:
        for name in ("events.jsonl", "transcript.md", "session.json"):
            assert CARD_SECRET not in (folder / name).read_text(), f"{folder.name}/{name}"
        assert "the key is *** and that is all" in (folder / "transcript.md").read_text()
        saved = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
        parts = [e for e in saved if e["type"] == "agent_message"]
        assert len(parts) >= 2, parts  # the timed flush did cut the message (the case this is about)
        assert "".join(e["text"] for e in parts) == "the key is *** and that is all"


def test_a_secret_streamed_in_pieces_is_masked_in_the_full_screen_chat(cru_bin: str, clean_env: dict[str, str],
                                                                       kiln: Path, tmp_path: Path) -> None:
    _card_with_secrets(kiln)
    script = script_file(tmp_path, {"prompts": [STREAMED_SECRET]})
    argv = [cru_bin, "chat", "--agent-command", scripted_command(script), "--kiln", str(kiln), "--card", "keyed"]
    screen = Screen(argv, {**clean_env, "CARD_TOKEN": CARD_SECRET, "TERM": "xterm-256color"}, tmp_path,
                    cols=100, rows=30)
    try:
        screen.wait_for("ready", timeout=60)
        screen.type_line("hello")
        prefix_shown = []

        def over(shown: str) -> bool:  # polled while the pieces arrive (a 1.3 s pause inside the secret)
            if "card-se" in shown:
                prefix_shown.append(shown)
            return "and that is all" in shown

        screen.wait_for(over, timeout=60)
        assert not prefix_shown, prefix_shown[0]  # not even its first characters
        assert "the key is *** and that is all" in screen.text()
        screen.send("\x04")
        assert screen.wait_exit() == 0
    finally:
        screen.close()
    assert CARD_SECRET.encode() not in bytes(screen.raw)


def test_the_kilns_index_folder_is_private(cru_bin: str, clean_env: dict[str, str], tmp_path: Path) -> None:
    """The index holds the notes' text (chunks, words, properties): a note in a private folder
    must not be readable through it, so `.crucible` is 0700, also when an older version left it open."""
    root = tmp_path / "kiln"
    (root / "Private").mkdir(parents=True)
    (root / "Private" / "Diary.md").write_text("# Diary\n\nThe safe's code is 4521.\n")
    (root / "Private").chmod(0o700)
    reserved = root / ".crucible"
    old = os.umask(0o022)
    try:
        for _ in range(2):
            done = subprocess.run([cru_bin, "kiln", "index", "--kiln", str(root)], env=clean_env,
                                  capture_output=True, text=True, timeout=300, check=False)
            assert done.returncode == 0, done.stderr
            assert _mode(reserved) == FOLDER_MODE
            # why: the diary's words are in there
            assert any(b"4521" in p.read_bytes() for p in reserved.rglob("*") if p.is_file())
            assert _mode(reserved / "lexical-kiln.idx") == FILE_MODE  # the words: private in itself too
            assert _mode(reserved / "index.lock") == FILE_MODE
            reserved.chmod(0o755)  # as an older version left it
            (root / "Private" / "Diary.md").write_text("# Diary\n\nThe safe's code is 4521. Changed.\n")
    finally:
        os.umask(old)
