"""`cru plugins list | show NAME`: the plugins found, where, their tools, and why any failed."""

from __future__ import annotations

import argparse
import json
from typing import Any

from crucible.config import load_config
from crucible.errors import CrucibleError
from crucible.plugins.host import load_all, settings


def _host(args: argparse.Namespace) -> Any:

    return load_all(load_config(getattr(args, "config", None)))


def _as_json(info: Any) -> dict[str, Any]:
    return {"name": info.name, "state": info.state, "reason": info.reason, "source": info.source,
            "path": info.shown_path(), "version": info.version, "description": info.description,
            "tools": [{"name": t.name, "description": t.description, "read_only": t.read_only,
                       "input_schema": t.schema()} for t in info.tools],
            "load_ms": round(info.load_seconds * 1000, 2)}


def cmd_list(args: argparse.Namespace) -> int:
    host = _host(args)
    if getattr(args, "json", False):
        print(json.dumps([_as_json(p) for p in host.plugins], indent=2))
        return 0 if not host.failed() else 1
    if not host.plugins:
        print("no plugins found (see the README: Lua plugin tools)")
    for p in host.plugins:
        tools = ", ".join(t.name for t in p.tools)
        print(f"{p.name:<16} {p.state:<9} {p.source:<22} {tools}")
        if p.reason and p.state != "loaded":
            print(f"{'':<16} {p.reason}")
    return 0 if not host.failed() else 1


def cmd_show(args: argparse.Namespace) -> int:

    host = _host(args)
    info = host.get(args.name)
    if info is None:
        names = ", ".join(sorted({p.name for p in host.plugins})) or "none"
        raise CrucibleError(f"no plugin named {args.name!r} (found: {names})", "cru plugins list shows them all")
    if getattr(args, "json", False):
        print(json.dumps(_as_json(info), indent=2))
        return 0
    print(f"{info.name} {info.version or ''}".rstrip() + f"  ({info.state}, {info.source})")
    print(f"  path: {info.shown_path()}")
    if info.description:
        print(f"  {info.description}")
    if info.reason:
        print(f"  {info.reason}")
    conf = settings(load_config(getattr(args, "config", None)), info.name)
    if conf:
        # Keys only: values may come from {env:VAR}.
        print(f"  settings [plugins.{info.name}]: {', '.join(sorted(conf))}")
    for t in info.tools:
        ro = " (read-only)" if t.read_only else ""
        print(f"  {t.name}{ro}: {t.description}")
        for p in t.params:
            print(f"      {p.name}: {p.type}{'' if not p.optional else ', optional'}{' — ' + p.desc if p.desc else ''}")
    return 0
