import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from crucible.cli import build_parser


def test_cru_help_lists_the_contract_commands() -> None:
    out = subprocess.run([sys.executable, "-m", "crucible.cli", "--help"],
                         capture_output=True, text=True, check=True).stdout
    for command in ("chat", "acp", "mcp", "kiln", "session", "agents", "doctor", "cards"):
        assert command in out


def test_unknown_subcommand_is_a_clear_error() -> None:
    res = subprocess.run([sys.executable, "-m", "crucible.cli", "kiln", "frobnicate"],
                         capture_output=True, text=True)
    assert res.returncode == 2
    assert "invalid choice" in res.stderr


# --- global options: before or after the subcommand (issue 18) -----------------------------

def _kiln_with_card(tmp_path: Path) -> Path:
    kiln = tmp_path / "kiln"
    (kiln / ".crucible" / "agents").mkdir(parents=True)
    (kiln / ".crucible" / "agents" / "kiln-only.md").write_text(
        "---\ndescription: a card only this kiln has\n---\nBe brief.\n")
    (kiln / "a.md").write_text("# A\n")
    return kiln


@pytest.mark.parametrize("where", ["before", "after", "between"])
def test_config_is_read_wherever_it_is_typed(tmp_path: Path, clean_env: dict[str, str],
                                             cru_bin: str, where: str) -> None:
    kiln = _kiln_with_card(tmp_path)
    config = tmp_path / "elsewhere.toml"
    config.write_text(f'kiln = "{kiln}"\n')
    argv = {"before": ["--config", str(config), "cards", "list"],
            "between": ["cards", "--config", str(config), "list"],
            "after": ["cards", "list", "--config", str(config)]}[where]
    res = subprocess.run([cru_bin, *argv], env=clean_env, capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "kiln-only" in res.stdout  # the config's kiln was used: its card is listed


def test_chat_accepts_config_after_the_subcommand(tmp_path: Path, clean_env: dict[str, str],
                                                  cru_bin: str) -> None:
    """The issue's own example: `cru chat --config FILE ...` said "unrecognized arguments"."""
    config = tmp_path / "c.toml"
    config.write_text('[agents.nothere]\ncommand = "/nonexistent/agent-binary"\n')
    res = subprocess.run([cru_bin, "chat", "--config", str(config), "-a", "nothere", "-p", "hi",
                          "--kiln", str(_kiln_with_card(tmp_path))],
                         env=clean_env, capture_output=True, text=True, timeout=60)
    assert "unrecognized arguments" not in res.stderr
    assert res.returncode != 0
    assert "/nonexistent/agent-binary" in res.stderr or "nothere" in res.stderr  # the profile was read


@pytest.mark.parametrize("argv", [
    ["--kiln", "K", "kiln", "info"], ["kiln", "--kiln", "K", "info"], ["kiln", "info", "--kiln", "K"],
])
def test_kiln_is_accepted_at_every_level(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert args.kiln == "K"


def test_an_option_typed_after_wins_over_the_same_typed_before() -> None:
    args = build_parser().parse_args(["--kiln", "first", "chat", "--kiln", "second"])
    assert args.kiln == "second"


def test_verbose_before_or_after_and_defaults_when_absent(tmp_path: Path, clean_env: dict[str, str],
                                                          cru_bin: str) -> None:
    assert build_parser().parse_args(["-v", "agents"]).verbose == 1
    assert build_parser().parse_args(["agents", "-vv"]).verbose == 2
    kiln = _kiln_with_card(tmp_path)
    for argv in (["-v", "cards", "list", "--kiln", str(kiln)], ["cards", "list", "--kiln", str(kiln), "--verbose"]):
        res = subprocess.run([cru_bin, *argv], env=clean_env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert "kiln-only" in res.stdout


def test_handlers_see_every_global_option_even_when_not_typed() -> None:
    import crucible.cli as cli

    seen: dict[str, object] = {}

    def fake(args: object) -> int:
        seen.update(vars(args))
        return 0

    original = cli._resolve
    cli._resolve = lambda key: fake  # type: ignore[assignment]
    try:
        assert cli.main(["agents"]) == 0
    finally:
        cli._resolve = original  # type: ignore[assignment]
    assert seen["config"] is None and seen["kiln"] is None and seen["verbose"] == 0


def test_version_prints_the_installed_version(cru_bin: str) -> None:
    res = subprocess.run([cru_bin, "--version"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0
    assert res.stdout.strip() == f"cru {importlib.metadata.version('crucible-acp')}"


# --- an error cru did not expect --------------------------------------------------------------

def test_an_unexpected_error_is_reported_sanitized_and_as_a_bug(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    import crucible.cli as cli
    from crucible.redaction import forget_all, remember_secret

    secret = "tok-3f9a1c77e2b14d0a"
    remember_secret(secret)

    def handler(args: object) -> int:  # a bug whose message carries a server's hostile text
        raise RuntimeError(f"upstream said \x1b]0;pwned\x07\x1b[2J with {secret}")

    monkeypatch.setattr(cli, "_resolve", lambda key: handler)
    try:
        code = cli.main(["doctor"])
    finally:
        forget_all()
    err = capsys.readouterr().err
    assert code == 1
    assert "Traceback" in err and "RuntimeError: upstream said" in err  # the report a developer needs
    assert "\x1b" not in err and "\x07" not in err and "^[]0;pwned^G" in err  # shown, not obeyed
    assert secret not in err and "***" in err
    assert "this is a bug in Crucible" in err


def test_sys_exit_inside_a_command_keeps_its_code(monkeypatch: pytest.MonkeyPatch) -> None:
    import crucible.cli as cli

    def handler(args: object) -> int:
        raise SystemExit(4)

    monkeypatch.setattr(cli, "_resolve", lambda key: handler)
    with pytest.raises(SystemExit) as exc:
        cli.main(["doctor"])
    assert exc.value.code == 4


def test_the_home_folder_is_never_taken_as_the_kiln_by_default(tmp_path: Path, clean_env: dict[str, str],
                                                              cru_bin: str) -> None:
    # `cru chat` typed in a terminal that opens in ~, with no kiln configured: indexing every
    # markdown file of the home folder (and writing ~/.crucible) is never what was meant.
    home = tmp_path / "home"
    (home / "project").mkdir(parents=True)
    (home / "project" / "README.md").write_text("# a repository's readme, not a note\n")
    env = {**clean_env, "HOME": str(home)}
    res = subprocess.run([cru_bin, "kiln", "index"], env=env, cwd=home, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stderr
    assert "no kiln chosen, and the current folder is your home folder" in res.stderr
    assert "--kiln ~/notes" in res.stderr and "$CRUCIBLE_KILN" in res.stderr
    assert not (home / ".crucible").exists()
    # Named, it is taken (a person may keep their notes there).
    res = subprocess.run([cru_bin, "kiln", "info", "--kiln", "~"], env=env, cwd=home, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "files: 1 (1 markdown)" in res.stdout
