"""The gateway as the application configures and shows it: `[[mcp.servers]]` -> upstream specs,
`cru mcp servers`, and the lines `/mcp` and `cru doctor` print.

The gateway itself (connections, prefixes, reconnects) is `mcp_bridge.gateway`; this module
knows the config and the terminal.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import asdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from crucible.config import Config, McpServerConfig
    from mcp_bridge.gateway import Gateway, UpstreamSpec, UpstreamStatus

# `cru mcp servers` and `cru doctor` wait this long for every upstream to start.
STATUS_WAIT = 30.0


def upstream_spec(server: McpServerConfig) -> UpstreamSpec:
    from mcp_bridge.gateway import (
        UpstreamSpec,  # the mcp SDK's clients load only when upstreams are configured
    )

    t = server.transport
    return UpstreamSpec(
        name=server.name, prefix=server.tool_prefix, transport=t.type, command=t.command, args=tuple(t.args),
        env=dict(t.env), cwd=str(t.cwd.expanduser()) if t.cwd else None, url=t.url, headers=dict(t.headers),
        allowed_tools=tuple(server.allowed_tools) if server.allowed_tools is not None else None,
        blocked_tools=tuple(server.blocked_tools or ()), auto_reconnect=server.auto_reconnect,
        timeout=server.timeout_secs, secrets=dict(server.secrets),
    )


def build_gateway(config: Config) -> Gateway:
    """The process's one gateway (not started: upstreams start on a bridge's first tools/list)."""
    from mcp_bridge.gateway import (
        Gateway,  # the mcp SDK's clients load only when upstreams are configured
    )

    return Gateway([upstream_spec(s) for s in config.mcp.servers],
                   schema_budget_bytes=config.mcp.schema_budget_bytes, startup_wait=config.mcp.startup_wait_secs)


def status_lines(statuses: Iterable[UpstreamStatus], *, verbose: bool = False) -> list[str]:
    """One line per upstream (state, tools, prefix, what runs it), then its last error."""
    lines: list[str] = []
    for s in statuses:
        state = {"up": "up", "idle": "not started", "starting": "starting"}.get(s.state, s.state)
        counts = f"{s.tools} tools"
        if s.resources:
            counts += f", {s.resources} resources"
        if s.prompts:
            counts += f", {s.prompts} prompts"
        lines.append(f"{s.name:<14} {state:<11} {counts:<34} {s.prefix}*  ({s.target})")
        if s.last_error:
            lines.append(f"{'':<14} last error: {s.last_error}")
        if s.restarts:
            lines.append(f"{'':<14} restarts: {s.restarts}")
        if verbose or (s.state != "up" and s.stderr_tail):
            for line in s.stderr_tail[-5:]:
                lines.append(f"{'':<14} stderr: {line}")
    return lines


async def probe(config: Config, wait: float = STATUS_WAIT) -> list[UpstreamStatus]:
    """Start every upstream, wait for each to be up or failed, and report."""
    gateway = build_gateway(config)
    async with gateway.running():
        await gateway.ensure_started(wait=wait)
        return gateway.status()


def cmd_servers(args: argparse.Namespace) -> int:
    """`cru mcp servers [--json]`: start each configured upstream and show how it is."""
    import trio  # only `cru mcp servers` runs its own trio loop

    from crucible.config import load_config  # (with it: the command's own config)

    config = load_config(getattr(args, "config", None))
    if not config.mcp.servers:
        where = config.source or "config.toml"
        print(f"no MCP servers configured: add [[mcp.servers]] to {where} or mcps.toml beside it "
              "(see the README)", file=sys.stderr)
        return 0
    statuses = trio.run(probe, config)
    if getattr(args, "json", False):
        print(json.dumps([asdict(s) for s in statuses], indent=2))
    else:
        for line in status_lines(statuses):
            print(line)
    return 0 if all(s.state == "up" for s in statuses) else 1
