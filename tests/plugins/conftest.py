"""Fixtures for the Lua plugin tests: plugin folders, an environment that finds them, a kiln,
and a bridge in front of the plugins (real Lua, real files)."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from crucible.config import parse_config
from crucible.kiln_mcp import CrucibleKilnBackend
from crucible.plugins.host import PluginHost, load_all
from mcp_bridge.server import BridgeServer

SECRET = "TOP-SECRET-OUTSIDE-THE-KILN"


@pytest.fixture
def kiln(tmp_path: Path, fixture_kiln_src: Path) -> Path:
    dest = tmp_path / "kiln"
    shutil.copytree(fixture_kiln_src, dest, ignore=shutil.ignore_patterns(".crucible"))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text(f"# Secret\n{SECRET}\n")
    return dest


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """Plugin search: $CRUCIBLE_PLUGIN_PATH = tmp/path-plugins, the user folder = tmp/xdg/crucible/plugins."""
    (tmp_path / "path-plugins").mkdir()
    (tmp_path / "xdg" / "crucible" / "plugins").mkdir(parents=True)
    return {"CRUCIBLE_PLUGIN_PATH": str(tmp_path / "path-plugins"), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
            "HOME": str(tmp_path / "home")}


def write_plugin(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.lua"
    path.write_text(textwrap.dedent(body).lstrip())
    return path


def config_from(tmp_path: Path, text: str = "") -> Any:
    import tomllib

    file = tmp_path / "config.toml"
    file.write_text(text)
    config = parse_config(tomllib.loads(text), file, {})
    config.source = file
    return config


def host_for(tmp_path: Path, env: dict[str, str], config_text: str = "") -> PluginHost:
    return load_all(config_from(tmp_path, config_text), env)


def bridge_for(kiln: Path, host: PluginHost, **kw: Any) -> BridgeServer:
    return BridgeServer(CrucibleKilnBackend(kiln), tool_sources=[host], **kw)


def texts(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))
