"""17.8: errors a person meets are a message and the fix, never a traceback; one broken card
never hides the others; a config that cannot be read says that the kiln's cards are hidden."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from conftest import wait_until


def _fake_sessions(data_home: Path, count: int) -> None:
    """Saved sessions as `cru chat` writes them (session.json is all `session list` reads)."""
    root = data_home / "crucible" / "sessions"
    for i in range(count):
        folder = root / f"20250101-0000{i:02d}-{i:06x}"
        folder.mkdir(parents=True)
        meta = {"id": folder.name, "agent": "claude", "created": time.time(), "updated": time.time() - i,
                "cwd": "/tmp", "title": f"conversation {i} " + "x" * 200, "turns": 1}
        (folder / "session.json").write_text(json.dumps(meta))


def test_session_list_into_head_ends_quietly(cru_bin: str, clean_env: dict[str, str], tmp_path: Path) -> None:
    _fake_sessions(Path(clean_env["XDG_DATA_HOME"]), 400)  # more than a pipe buffer of lines
    done = subprocess.run(f"'{cru_bin}' session list | head -1", shell=True, env=clean_env, capture_output=True,
                          text=True, timeout=60, executable="/bin/bash")
    assert done.stdout.startswith("20250101-000000-") and done.stdout.count("\n") == 1
    assert done.stderr == "", done.stderr  # no BrokenPipeError traceback, no "Exception ignored"


def test_cards_list_names_the_broken_card_and_lists_the_others(cru_bin: str, clean_env: dict[str, str],
                                                               kiln: Path, tmp_path: Path) -> None:
    agents = kiln / ".crucible" / "agents"
    agents.mkdir(parents=True)
    (agents / "good.md").write_text("---\ndescription: a good card\n---\nBe good.\n")
    (agents / "deep.md").write_text("---\ndescription: " + "[" * 5000 + "\n---\n")
    (agents / "typo.md").write_text("---\ndescriptoin: oops\n---\n")
    done = subprocess.run([cru_bin, "cards", "list", "--kiln", str(kiln)], env=clean_env, capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert "Traceback" not in done.stderr
    assert "good" in done.stdout and "librarian" in done.stdout
    assert "left out card kiln:deep.md: frontmatter refused: nested too deeply" in done.stderr
    assert "left out card kiln:typo.md: field `description`: required field is missing" in done.stderr
    assert done.returncode == 1  # something is broken: a script can tell
    shown = subprocess.run([cru_bin, "cards", "show", "good", "--kiln", str(kiln)], env=clean_env,
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert shown.returncode == 0 and "Be good." in shown.stdout, shown.stderr
    broken = subprocess.run([cru_bin, "cards", "show", "deep", "--kiln", str(kiln)], env=clean_env,
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert broken.returncode == 1 and "card kiln:deep.md: frontmatter refused" in broken.stderr


def test_unset_env_in_the_config_says_why_kiln_cards_are_hidden(cru_bin: str, clean_env: dict[str, str],
                                                                kiln: Path, tmp_path: Path) -> None:
    agents = kiln / ".crucible" / "agents"
    agents.mkdir(parents=True)
    (agents / "kilncard.md").write_text("---\ndescription: from the kiln\n---\n")
    config = tmp_path / "config.toml"
    config.write_text(f'kiln = "{kiln}"\n[agents.work]\nextends = "claude"\nenv = {{ KEY = "{{env:WORK_KEY_UNSET}}" }}\n')
    env = {**clean_env, "CRUCIBLE_CONFIG": str(config)}
    env.pop("WORK_KEY_UNSET", None)
    done = subprocess.run([cru_bin, "cards", "list"], env=env, capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert "librarian" in done.stdout and "kilncard" not in done.stdout
    assert "the kiln's cards are not listed" in done.stderr and "WORK_KEY_UNSET" in done.stderr
    assert done.returncode == 1 and "Traceback" not in done.stderr
    shown = subprocess.run([cru_bin, "cards", "show", "kilncard"], env=env, capture_output=True, text=True,
                           timeout=60, cwd=tmp_path)
    assert shown.returncode == 1
    assert "no card named 'kilncard'" in shown.stderr and "the kiln's cards were not looked at" in shown.stderr
    # With --kiln the config is not needed to find the kiln: its cards are there.
    given = subprocess.run([cru_bin, "cards", "list", "--kiln", str(kiln)], env=env, capture_output=True,
                           text=True, timeout=60, cwd=tmp_path)
    assert "kilncard" in given.stdout, given.stderr


def test_wait_until_is_bounded() -> None:
    """The helper the process tests rely on gives up with a message (never hangs)."""
    started = time.monotonic()
    try:
        wait_until(lambda: False, timeout=0.2, what="nothing")
    except AssertionError as exc:
        assert "nothing" in str(exc)
    assert time.monotonic() - started < 5


def test_a_missing_agent_is_named_missing_and_one_that_ran_is_quoted(cru_bin: str, clean_env: dict[str, str],
                                                                      kiln: Path, tmp_path: Path) -> None:
    def chat_with(command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([cru_bin, "chat", "--kiln", str(kiln), "--agent-command", command, "-p", "hi"],
                              env=clean_env, capture_output=True, text=True, timeout=60, cwd=tmp_path)

    missing = chat_with("no-such-agent-3f9a --acp")
    assert missing.returncode == 1 and "is not installed or not on PATH" in missing.stderr, missing.stderr
    # An agent that started and then crashed on a file of its own is not "not installed": any
    # "not found" or "no such file" in its words once made it so, and hid them.
    script = tmp_path / "agent.py"
    script.write_text("import sys\nsys.stderr.write(\"FileNotFoundError: [Errno 2] No such file or directory: "
                      "'settings.json'\\n\")\nsys.exit(2)\n")
    ran = chat_with(f"python3 {script}")
    assert ran.returncode == 1, ran.stderr
    assert "not installed" not in ran.stderr and "settings.json" in ran.stderr, ran.stderr
    assert "Traceback" not in ran.stderr
