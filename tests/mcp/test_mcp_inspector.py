"""The MCP Inspector's CLI (npm `@modelcontextprotocol/inspector` 2.12.0) against `cru mcp`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from conftest import npm_bin_or_skip


def _inspector(bin_dir: Path, env: dict[str, str], *args: str, rc: int = 0) -> dict[str, Any]:
    out = subprocess.run([str(bin_dir / "mcp-inspector"), "--cli", *args], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == rc, out.stderr[-2000:]
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def test_inspector_lists_and_calls_tools(cru_bin: str, mcp_kiln: Path, cru_env: dict[str, str],
                                         tmp_path: Path) -> None:
    bin_dir = npm_bin_or_skip()
    server = ["--", cru_bin, "mcp", "--kiln", str(mcp_kiln)]
    listed = _inspector(bin_dir, cru_env, "--method", "tools/list", *server)
    tools = {t["name"]: t for t in listed["tools"]}
    assert len(tools) == 12 + 5 and tools["semantic_search"]["inputSchema"]["required"] == ["query"]
    assert tools["delete_note"]["annotations"]["destructiveHint"] is True

    called = _inspector(bin_dir, cru_env, "--method", "tools/call", "--tool-name", "read_note",
                        "--tool-arg", "path=Cooking/Weeknight dal.md", "--tool-arg", "end_line=3", *server)
    sc = called["structuredContent"]
    assert called.get("isError") is False and isinstance(sc, dict)
    assert sc["path"] == "Cooking/Weeknight dal.md" and sc["end_line"] == 3
    assert sc["content"] == "".join((mcp_kiln / "Cooking" / "Weeknight dal.md").read_text().splitlines(True)[:3])

    refused = _inspector(bin_dir, cru_env, "--method", "tools/call", "--tool-name", "create_note",
                         "--tool-arg", "path=hook.sh", "--tool-arg", "content=echo pwned", *server,
                         rc=5)  # the inspector's exit code for an isError result
    assert refused["isError"] is True
    assert "only markdown notes (.md) can be written" in json.dumps(refused)
    assert str(tmp_path) not in json.dumps(refused)
    assert not (mcp_kiln / "hook.sh").exists()
