import subprocess
import sys


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
