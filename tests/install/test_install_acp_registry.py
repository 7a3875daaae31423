"""Crucible's entry for the ACP agent registry: packaging/acp-registry/crucible/.

Checked against the registry's format (agentclientprotocol/registry: agent.schema.json and
FORMAT.md): the required fields and their shapes, a `uvx` distribution, a 16x16 monochrome
icon; kept equal to pyproject.toml; and what `uvx` would run (`crucible-acp acp`) answers ACP.
"""

from __future__ import annotations

import json
import re
import select
import subprocess
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import crucible
from acp_host.registry import parse_registry, registry_launches

ROOT = Path(__file__).resolve().parents[2]
ENTRY = ROOT / "packaging" / "acp-registry" / "crucible"
AGENT = json.loads((ENTRY / "agent.json").read_text())
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

REQUIRED = ("id", "name", "version", "description", "distribution")  # agent.schema.json "required"
ISSUE_FIELDS = ("repository", "authors", "license", "icon")  # what issue 18 asks for besides
KNOWN = {"id", "name", "version", "description", "repository", "website", "authors", "license",
         "license_url", "icon", "distribution"}


def test_agent_json_has_the_registry_format() -> None:
    for key in (*REQUIRED, *ISSUE_FIELDS):
        assert key in AGENT, key
    assert set(AGENT) <= KNOWN
    assert re.fullmatch(r"[a-z][a-z0-9-]*", AGENT["id"])
    assert AGENT["id"] == ENTRY.name  # the registry wants the folder named after the id
    assert re.match(r"^[0-9]+\.[0-9]+\.[0-9]+", AGENT["version"])
    for key in ("name", "description", "license", "icon"):
        assert isinstance(AGENT[key], str) and AGENT[key]
    assert re.fullmatch(r"https://\S+", AGENT["repository"])
    assert isinstance(AGENT["authors"], list) and all(isinstance(a, str) and a for a in AGENT["authors"])
    dist = AGENT["distribution"]
    assert set(dist) == {"uvx"}
    # packageDistribution: package required; only package/args/env (the older schema allows no more)
    assert set(dist["uvx"]) <= {"package", "args", "env"}
    assert isinstance(dist["uvx"]["package"], str) and dist["uvx"]["package"]
    assert dist["uvx"]["args"] == ["acp"]


def test_agent_json_agrees_with_pyproject() -> None:
    assert AGENT["version"] == crucible.__version__
    assert PYPROJECT["dynamic"] == ["version"]  # pyproject reads crucible.__version__ too
    assert AGENT["distribution"]["uvx"]["package"] == f"{PYPROJECT['name']}=={crucible.__version__}"
    assert AGENT["license"] == PYPROJECT["license"]
    assert AGENT["repository"] == PYPROJECT["urls"]["Repository"]
    assert AGENT["authors"] == [a["name"] for a in PYPROJECT["authors"]]
    # `uvx PACKAGE acp` runs the script named like the distribution: it must be cru's main
    assert PYPROJECT["scripts"][PYPROJECT["name"]] == PYPROJECT["scripts"]["cru"] == "crucible.cli:main"


def test_the_icon_is_16px_monochrome_svg() -> None:
    text = (ENTRY / "icon.svg").read_text()
    assert "<!--" not in text
    root = ET.fromstring(text)
    assert root.tag.rsplit("}", 1)[-1] == "svg"
    assert (root.get("width"), root.get("height")) == ("16", "16")
    colours = {e.get(a).lower() for e in root.iter() for a in ("fill", "stroke") if e.get(a)}  # type: ignore[union-attr]
    assert "currentcolor" in colours and colours <= {"currentcolor", "none", "inherit"}


def test_cru_reads_it_as_a_registry() -> None:
    (agent,) = parse_registry(AGENT, "agent.json")
    (launch,) = registry_launches(agent)
    assert [launch.command, *launch.args] == ["uvx", f"crucible-acp=={crucible.__version__}", "acp"]


@pytest.mark.slow
def test_what_uvx_would_run_answers_acp(installed_venv: Path, tmp_path: Path) -> None:
    """The wheel's `crucible-acp acp` (what `uvx crucible-acp==V acp` starts) initializes as Crucible."""
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": 1, "clientCapabilities": {}}}
    proc = subprocess.Popen([str(installed_venv / "bin" / "crucible-acp"), "acp", "--agent-command", "true"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                                               "XDG_DATA_HOME": str(tmp_path / "data"),
                                               "XDG_CONFIG_HOME": str(tmp_path / "config")})
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(json.dumps(init) + "\n")
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], 60)  # a bound, not a sleep
        assert ready, "no answer to initialize within 60 s"
        first = json.loads(proc.stdout.readline())
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert first["id"] == 1
    assert first["result"]["agentInfo"]["name"] == "crucible"
    assert first["result"]["agentInfo"]["version"] == crucible.__version__
