"""Shell completion: the script `cru completion SHELL` prints, loaded into the real shell,
completes commands, agents, cards, sessions and notes from this machine (issue 18)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest


@pytest.fixture
def machine(tmp_path: Path, clean_env: dict[str, str], cru_bin: str) -> dict[str, str]:
    """A config with a profile, a kiln with notes and a card, a saved session; PATH has cru."""
    kiln = tmp_path / "notes"
    (kiln / "projects").mkdir(parents=True)
    (kiln / "projects" / "alpha.md").write_text("# Alpha\n")
    (kiln / "projects" / "beta.md").write_text("# Beta\n")
    (kiln / "inbox.md").write_text("# Inbox\n")
    (kiln / ".crucible" / "agents").mkdir(parents=True)
    (kiln / ".crucible" / "agents" / "kiln-scribe.md").write_text("---\ndescription: writes\n---\nWrite.\n")
    config_dir = Path(clean_env["XDG_CONFIG_HOME"]) / "crucible"
    config_dir.mkdir(parents=True)
    (config_dir / "config.toml").write_text(f'kiln = "{kiln}"\n[agents.work-claude]\nextends = "claude"\n')
    session = Path(clean_env["XDG_DATA_HOME"]) / "crucible" / "sessions" / "20260101-120000-abc123"
    session.mkdir(parents=True)
    now = time.time()
    (session / "session.json").write_text(json.dumps(
        {"id": session.name, "agent": "claude", "created": now, "updated": now, "cwd": str(tmp_path)}))
    env = dict(clean_env)
    env["PATH"] = f"{Path(cru_bin).parent}:/usr/bin:/bin"
    env["HOME"] = str(tmp_path)
    return env


def _script(cru_bin: str, shell: str, env: dict[str, str]) -> str:
    res = subprocess.run([cru_bin, "completion", shell], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout


def _bash_complete(script: Path, line: str, env: dict[str, str], cwd: Path) -> list[str]:
    """What bash offers for TAB at the end of `line`, through the completion function."""
    words = line.split(" ")
    prog = f"""
source {script}
COMP_LINE={json.dumps(line)}; COMP_POINT=${{#COMP_LINE}}; COMP_TYPE=9
COMP_WORDS=({" ".join(json.dumps(w) for w in words)}); COMP_CWORD={len(words) - 1}
_python_argcomplete cru {json.dumps(words[-1])} {json.dumps(words[-2])}
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    res = subprocess.run(["bash", "-c", prog], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return [w.strip() for w in res.stdout.splitlines() if w.strip()]


@pytest.fixture
def bash_script(tmp_path: Path, cru_bin: str, machine: dict[str, str]) -> Path:
    path = tmp_path / "cru.bash"
    path.write_text(_script(cru_bin, "bash", machine))
    return path


def test_bash_completes_commands_and_options(bash_script: Path, machine: dict[str, str], tmp_path: Path) -> None:
    assert _bash_complete(bash_script, "cru ses", machine, tmp_path) == ["session"]
    assert set(_bash_complete(bash_script, "cru session ", machine, tmp_path)) == {
        "list", "show", "resume", "export", "create", "search"}
    assert "--print-config" in _bash_complete(bash_script, "cru mcp --pr", machine, tmp_path)
    assert set(_bash_complete(bash_script, "cru mcp --print-config ", machine, tmp_path)) == {
        "claude", "claude-desktop", "cursor", "zed", "gemini", "opencode"}


def test_bash_completes_agents_cards_sessions_and_notes(bash_script: Path, machine: dict[str, str],
                                                        tmp_path: Path) -> None:
    assert _bash_complete(bash_script, "cru chat -a ", machine, tmp_path) == [
        "claude", "opencode", "gemini", "codex", "work-claude"]
    assert _bash_complete(bash_script, "cru chat -a wo", machine, tmp_path) == ["work-claude"]
    cards = _bash_complete(bash_script, "cru chat --card ", machine, tmp_path)
    assert {"librarian", "planner", "reviewer", "kiln-scribe"} <= set(cards)
    assert _bash_complete(bash_script, "cru cards show kiln", machine, tmp_path) == ["kiln-scribe"]
    assert _bash_complete(bash_script, "cru session create --agent plan", machine, tmp_path) == ["planner"]
    assert _bash_complete(bash_script, "cru session resume ", machine, tmp_path) == ["20260101-120000-abc123"]
    # `@` is one of bash's COMP_WORDBREAKS: bash replaces the part after it, so the line reads
    # `-p @projects/alpha.md` once one is picked
    notes = _bash_complete(bash_script, "cru chat -p @proj", machine, tmp_path)
    assert notes == ["projects/alpha.md", "projects/beta.md"]
    assert _bash_complete(bash_script, "cru chat -p inbox", machine, tmp_path) == []  # no @, no notes


def test_the_kiln_typed_on_the_line_is_the_one_completed(bash_script: Path, machine: dict[str, str],
                                                         tmp_path: Path) -> None:
    other = tmp_path / "other-kiln"
    (other / ".crucible" / "agents").mkdir(parents=True)
    (other / "zeta.md").write_text("# Z\n")
    (other / ".crucible" / "agents" / "other-card.md").write_text("---\ndescription: o\n---\nO.\n")
    assert _bash_complete(bash_script, f"cru chat --kiln {other} -p @", machine, tmp_path) == ["zeta.md"]
    assert "other-card" in _bash_complete(bash_script, f"cru --kiln {other} cards show ", machine, tmp_path)


def test_a_broken_config_completes_nothing_rather_than_failing(bash_script: Path, machine: dict[str, str],
                                                                tmp_path: Path) -> None:
    config = Path(machine["XDG_CONFIG_HOME"]) / "crucible" / "config.toml"
    config.write_text("this is [not toml")
    assert _bash_complete(bash_script, "cru chat -a ", machine, tmp_path) == []
    assert _bash_complete(bash_script, "cru ses", machine, tmp_path) == ["session"]


def test_no_notes_are_walked_for_a_tab_in_the_home_folder_with_no_kiln_chosen(
        bash_script: Path, machine: dict[str, str], tmp_path: Path) -> None:
    # HOME is tmp_path here: with no kiln configured, the home folder is not the kiln (a TAB must
    # not walk every markdown file of it); completing still works.
    config = Path(machine["XDG_CONFIG_HOME"]) / "crucible" / "config.toml"
    config.write_text(config.read_text().replace(f'kiln = "{tmp_path / "notes"}"\n', ""))
    assert _bash_complete(bash_script, "cru chat -p @", machine, tmp_path) == []
    assert _bash_complete(bash_script, f"cru chat --kiln {tmp_path / 'notes'} -p @proj", machine, tmp_path) == [
        "projects/alpha.md", "projects/beta.md"]


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed here (apt-get install fish)")
def test_fish_completes_agents_sessions_and_notes_through_the_script(tmp_path: Path, cru_bin: str, machine: dict[str, str]) -> None:
    script = tmp_path / "cru.fish"
    script.write_text(_script(cru_bin, "fish", machine))
    def fish_complete(line: str) -> list[str]:
        res = subprocess.run(["fish", "--no-config", "-c", f"source {script}; complete -C {json.dumps(line)}"],
                             env=machine, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        return [out.split("\t")[0] for out in res.stdout.splitlines()]

    assert fish_complete("cru chat -a wo") == ["work-claude"]
    assert fish_complete("cru session show 2026") == ["20260101-120000-abc123"]
    assert fish_complete("cru chat -p @proj") == ["@projects/alpha.md", "@projects/beta.md"]


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed here (apt-get install zsh)")
def test_zsh_loads_the_script_and_registers_cru(tmp_path: Path, cru_bin: str, machine: dict[str, str]) -> None:
    script = tmp_path / "_cru"
    script.write_text(_script(cru_bin, "zsh", machine))
    res = subprocess.run(["zsh", "-f", "-c", f"autoload -U compinit && compinit -u && source {script} "
                          "&& print -r -- ${_comps[cru]}"],
                         env=machine, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "_python_argcomplete"
