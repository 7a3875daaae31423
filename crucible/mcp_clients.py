"""`cru mcp --print-config CLIENT`: the snippet each MCP client wants, to paste into its config.

Every snippet runs this machine's `cru` by its full path (an editor started from a desktop
launcher often has a PATH without `~/.local/bin`) on the kiln resolved now, so it keeps
working from any folder.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from crucible.config import load_config, resolve_kiln

SERVER_NAME = "crucible"


@dataclass(frozen=True)
class Client:
    title: str
    where: str  # where the snippet goes, for the hint on stderr
    render: Callable[[list[str]], str]


def _json(data: object) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False)


def _mcp_servers(argv: list[str]) -> str:
    return _json({"mcpServers": {SERVER_NAME: {"command": argv[0], "args": argv[1:]}}})


CLIENTS: dict[str, Client] = {
    "claude": Client(
        "Claude Code", "run it in a shell (add `--scope user` after `add` for every project)",
        lambda argv: shlex.join(["claude", "mcp", "add", SERVER_NAME, "--", *argv])),
    "claude-desktop": Client(
        "Claude Desktop",
        "merge it into claude_desktop_config.json (Settings → Developer → Edit Config; macOS: "
        "~/Library/Application Support/Claude/, Windows: %APPDATA%\\Claude\\)",
        _mcp_servers),
    "cursor": Client(
        "Cursor", "merge it into ~/.cursor/mcp.json (every project) or .cursor/mcp.json (this project)",
        _mcp_servers),
    "zed": Client(
        "Zed", "merge it into Zed's settings.json (zed: open settings; ~/.config/zed/settings.json)",
        lambda argv: _json({"context_servers": {SERVER_NAME: {"command": argv[0], "args": argv[1:], "env": {}}}})),
    "gemini": Client(
        "Gemini CLI", "merge it into ~/.gemini/settings.json (or .gemini/settings.json in a project)",
        _mcp_servers),
    "opencode": Client(
        "OpenCode", "merge it into opencode.json in a project, or ~/.config/opencode/opencode.json",
        lambda argv: _json({"$schema": "https://opencode.ai/config.json",
                            "mcp": {SERVER_NAME: {"type": "local", "command": argv, "enabled": True}}})),
}


def cru_argv() -> list[str]:
    """How to start this `cru`: the entry point beside the running interpreter (the venv pipx,
    `uv tool` or scripts/setup made), else the one on PATH, else `python -m crucible.cli`."""
    beside = Path(sys.executable).parent / "cru"
    if beside.is_file():
        return [str(beside)]
    on_path = shutil.which("cru")
    if on_path:
        return [on_path]
    return [sys.executable, "-m", "crucible.cli"]


def server_argv(kiln: Path, config: str | None) -> list[str]:
    argv = [*cru_argv(), "mcp", "--kiln", str(kiln)]
    if config:
        argv += ["--config", str(Path(config).expanduser().resolve())]
    return argv


def print_config(args: argparse.Namespace) -> int:
    client = CLIENTS[args.print_config]
    config = load_config(getattr(args, "config", None))
    kiln = resolve_kiln(getattr(args, "kiln", None), config)
    print(client.render(server_argv(kiln, getattr(args, "config", None))))
    print(f"# {client.title}: {client.where}", file=sys.stderr)
    return 0
