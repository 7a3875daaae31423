"""Shell completion for `cru` (argcomplete): `cru completion bash|zsh|fish` prints the script.

Beyond the commands and options argparse knows, TAB completes what lives on this machine:
agents (built-ins and the config's profiles) after `-a`, cards after `--card` / `cards show` /
`session create --agent`, saved sessions after `session show|resume|export`, and the kiln's
notes after `@` in `-p TEXT` (the kiln and config typed on the line are used). A completer
never fails the shell: whatever goes wrong completes nothing.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

SHELLS = ("bash", "zsh", "fish")
MAX_NOTES = 5000  # a TAB on a huge kiln stays quick

Completer = Callable[..., Iterable[str]]


def _quiet(fn: Callable[[str, argparse.Namespace], Iterable[str]]) -> Completer:
    def completer(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
        try:
            return [c for c in fn(prefix, parsed_args) if c.startswith(prefix)]
        except Exception:  # noqa: BLE001 - a broken config or kiln must not break the shell
            return []

    return completer


def _config(parsed_args: argparse.Namespace) -> Any:
    from crucible.config import load_config  # a TAB loads only what it completes

    return load_config(getattr(parsed_args, "config", None))


def _kiln(parsed_args: argparse.Namespace) -> Path:
    from crucible.config import resolve_kiln  # a TAB loads only what it completes

    return resolve_kiln(getattr(parsed_args, "kiln", None), _config(parsed_args))


def agents(prefix: str, parsed_args: argparse.Namespace) -> list[str]:
    from acp_host.registry import known_names  # a TAB loads only what it completes

    return known_names(_config(parsed_args).agents)


def cards(prefix: str, parsed_args: argparse.Namespace) -> list[str]:
    from crucible.cards import load_cards  # a TAB loads only what it completes

    try:
        kiln: Path | None = _kiln(parsed_args)
    except Exception:  # noqa: BLE001 - no kiln here: the other folders' cards still complete
        kiln = None
    return sorted(load_cards(kiln, Path.cwd()))


def sessions(prefix: str, parsed_args: argparse.Namespace) -> list[str]:
    from crucible.session_store import SessionStore  # a TAB loads only what it completes

    return [m.id for m in SessionStore().list()]


def notes(prefix: str, parsed_args: argparse.Namespace) -> list[str]:
    """`@path/of/note.md` for the last word of a -p prompt that starts with `@`."""
    from crucible.kiln.paths import iter_markdown  # a TAB loads only what it completes

    head, _, word = prefix.rpartition(" ")
    if not word.startswith("@"):
        return []
    lead = f"{head} @" if head else "@"
    try:
        kiln = _kiln(parsed_args)
    except Exception:  # noqa: BLE001 - no kiln here (none chosen in the home folder): nothing to offer
        return []
    out = []
    for rel in iter_markdown(kiln):
        if rel.startswith(word[1:]):
            out.append(lead + rel)
            if len(out) >= MAX_NOTES:
                break
    return sorted(out)


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterable[tuple[tuple[str, ...], argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, (*path, name))
        else:
            yield path, action


def attach(parser: argparse.ArgumentParser) -> None:
    """Set each argument's completer, found by what it holds (its dest and its command)."""
    from argcomplete.completers import DirectoriesCompleter, FilesCompleter  # only at a TAB

    for path, action in _walk(parser):
        dest = action.dest
        completer: Any = None
        if dest == "agent":
            completer = cards if path == ("session", "create") else agents
        elif dest == "card" or (path == ("cards", "show") and dest == "name"):
            completer = cards
        elif path[:1] == ("session",) and dest == "id":
            completer = sessions
        elif dest == "prompt":
            completer = notes
        if completer is not None:
            action.completer = _quiet(completer)  # type: ignore[attr-defined]
        elif dest in ("kiln", "cwd"):
            action.completer = DirectoriesCompleter()  # type: ignore[attr-defined]
        elif dest in ("config", "record", "model_wheel", "registry"):
            action.completer = FilesCompleter()  # type: ignore[attr-defined]


def autocomplete(parser: argparse.ArgumentParser) -> None:
    """Answer the shell's completion request and exit (only called when one is pending)."""
    import argcomplete  # only at a TAB

    attach(parser)
    # Options show once a `-` is typed, so `cru cards show <TAB>` lists cards, not --help.
    argcomplete.autocomplete(parser, always_complete_options=False)


def completion_requested() -> bool:
    return "_ARGCOMPLETE" in os.environ


def cmd_completion(args: argparse.Namespace) -> int:
    """`cru completion SHELL`: the script to source (or save where the shell loads it)."""
    import argcomplete  # only this command and a TAB need it

    print(argcomplete.shellcode(["cru"], shell=args.shell))
    return 0
