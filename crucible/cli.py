"""`cru`: parse the command line, then call into the module that owns the command.

Handlers are imported lazily so `cru acp` / `cru mcp` answer `initialize` fast.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TypeVar

from crucible.errors import CrucibleError

E = TypeVar("E", bound=BaseException)

# command path -> "module:function"; each function takes the parsed args and returns an exit code.
HANDLERS: dict[str, str] = {
    "kiln.index": "crucible.kiln.commands:cmd_index",
    "kiln.search": "crucible.kiln.commands:cmd_search",
    "kiln.info": "crucible.kiln.commands:cmd_info",
    "mcp": "crucible.kiln_mcp:cmd_mcp",
    "chat": "crucible.chat:cmd_chat",
    "acp": "crucible.acp_agent:cmd_acp",
    "agents": "crucible.doctor:cmd_agents",
    "doctor": "crucible.doctor:cmd_doctor",
    "cards.list": "crucible.cards:cmd_list",
    "cards.show": "crucible.cards:cmd_show",
    "session.list": "crucible.session_store:cmd_list",
    "session.show": "crucible.session_store:cmd_show",
    "session.resume": "crucible.session_store:cmd_resume",
    "session.export": "crucible.session_store:cmd_export",
    "session.create": "crucible.chat:cmd_session_create",
}


# Commands whose stdout shows note, card, agent or session text: written through SafeStream.
# (Not chat/acp/mcp or session create/resume: a protocol stream or the TUI's own screen.)
SAFE_STDOUT = frozenset({"kiln.index", "kiln.search", "kiln.info", "session.list", "session.show",
                         "session.export", "agents", "doctor", "cards.list", "cards.show"})


def _add_kiln(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kiln", metavar="DIR", help="the kiln (default: $CRUCIBLE_KILN, config, cwd)")


def _add_agent(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("-a", "--acp", "--agent", dest="agent", metavar="AGENT",
                   help="built-in agent (claude, opencode, gemini, codex) or a config profile")
    g.add_argument("--agent-command", metavar="CMD ARGS", help="run any ACP agent command")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cru", description="Crucible: AI coding agents with your notes (an ACP host with MCP kiln tools).")
    parser.add_argument("--config", metavar="FILE",
                        help="config.toml (default: $CRUCIBLE_CONFIG, $XDG_CONFIG_HOME/crucible/config.toml)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    chat = sub.add_parser("chat", help="chat with an agent in the terminal, or run one turn with -p")
    _add_agent(chat)
    _add_kiln(chat)
    chat.add_argument("--card", metavar="NAME")
    chat.add_argument("--cwd", metavar="DIR")
    chat.add_argument("-p", "--prompt", metavar="TEXT", help="run one turn without the TUI and exit")
    chat.add_argument("--format", choices=["text", "json"], default="text")
    perm = chat.add_mutually_exclusive_group()
    perm.add_argument("--approve-all", action="store_true")
    perm.add_argument("--deny-all", action="store_true")
    chat.add_argument("--record", metavar="FILE", help="record both directions of ACP as JSONL")
    chat.add_argument("--resume", metavar="ID")

    acp = sub.add_parser("acp", help="serve ACP on stdio for an editor, proxying to a backend agent")
    _add_agent(acp)
    _add_kiln(acp)
    acp.add_argument("--card", metavar="NAME")

    mcp = sub.add_parser("mcp", help="serve the kiln tools over MCP (stdio unless --http / --sse)")
    _add_kiln(mcp)
    t = mcp.add_mutually_exclusive_group()
    t.add_argument("--http", action="store_true", help="streamable HTTP on 127.0.0.1")
    t.add_argument("--sse", action="store_true", help="the older HTTP+SSE transport on 127.0.0.1")
    t.add_argument("--connect", metavar="URL",
                   help="stdio relay to a session's bridge at URL (token in $CRUCIBLE_BRIDGE_TOKEN)")
    mcp.add_argument("--port", type=int, default=0, metavar="N")

    kiln = sub.add_parser("kiln", help="build and query the kiln's index")
    ksub = kiln.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True)
    k_index = ksub.add_parser("index", help="index the kiln (incremental)")
    k_index.add_argument("--rebuild", action="store_true", help="drop the index and build it again")
    k_search = ksub.add_parser("search", help="search the kiln")
    k_search.add_argument("query", metavar="QUERY")
    k_search.add_argument("--mode", choices=["hybrid", "semantic", "text", "property"], default=None)
    k_search.add_argument("--limit", type=int, default=10)
    k_search.add_argument("--regex", action="store_true", help="text mode: QUERY is a regular expression")
    k_search.add_argument("--case-sensitive", action="store_true", help="text mode: match case")
    k_info = ksub.add_parser("info", help="what is in the kiln and its index")
    for p in (k_index, k_search, k_info):
        _add_kiln(p)
        p.add_argument("--json", action="store_true", help="print JSON")

    session = sub.add_parser("session", help="saved sessions")
    ssub = session.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True)
    ssub.add_parser("list", help="list saved sessions")
    for name in ("show", "resume", "export"):
        sp = ssub.add_parser(name, help=f"{name} a saved session")
        sp.add_argument("id", metavar="ID")
    s_create = ssub.add_parser("create", help="a session from a card (as chat --card)")
    s_create.add_argument("--agent", required=True, metavar="CARD")
    _add_kiln(s_create)

    sub.add_parser("agents", help="which agents are installed and speak ACP")
    doctor = sub.add_parser("doctor", help="what is wrong and how to fix it")
    _add_kiln(doctor)

    cards = sub.add_parser("cards", help="agent cards")
    csub = cards.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True)
    c_list = csub.add_parser("list")
    c_show = csub.add_parser("show")
    c_show.add_argument("name", metavar="NAME")
    for p in (c_list, c_show):
        _add_kiln(p)
    return parser


def _resolve(key: str) -> Callable[[argparse.Namespace], int] | None:
    target = HANDLERS.get(key)
    if target is None:
        return None
    module_name, func_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return None
        raise
    func: Callable[[argparse.Namespace], int] | None = getattr(module, func_name, None)
    return func


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    key = args.command + (f".{args.subcommand}" if getattr(args, "subcommand", None) else "")
    from crucible.terminal import SafeStream, install_log_handler, sanitize

    install_log_handler(f"cru {args.command}: ")  # every log line sanitized, whoever logs it
    handler = _resolve(key)
    if handler is None:
        print(f"cru: `{key.replace('.', ' ')}` is not available in this version yet", file=sys.stderr)
        return 2
    stdout = sys.stdout
    if key in SAFE_STDOUT and not isinstance(stdout, SafeStream):
        sys.stdout = SafeStream(stdout)
    try:
        code = handler(args)
        sys.stdout.flush()  # here, not at exit: a reader gone (`| head`) is then caught below
        return code
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:  # noqa: B036 - trio nurseries wrap errors in groups
        if _find(exc, BrokenPipeError) is not None:
            return _reader_left()
        err = _find(exc, CrucibleError)
        if err is None:
            raise
        print(f"cru: {sanitize(str(err))}", file=sys.stderr)
        return 1
    finally:
        sys.stdout = stdout
        if argv is None:
            # The `cru` program is about to exit: spare the interpreter's last collections over
            # the SDKs' ~10^5 objects (0.2-0.5 s before the shell gets its prompt back).
            gc.freeze()


def _find(exc: BaseException, kind: type[E]) -> E | None:
    """The `kind` exception inside `exc` (possibly nested in exception groups), if any."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _find(inner, kind)
            if found is not None:
                return found
    return None


def _reader_left() -> int:
    """stdout's reader went away (`cru session list | head -1`): not an error to report. What
    is still buffered goes to /dev/null, or Python complains again when it exits."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.__stdout__.fileno() if sys.__stdout__ is not None else 1)
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return 128 + signal.SIGPIPE  # as a program killed by SIGPIPE: what `set -o pipefail` expects


if __name__ == "__main__":
    sys.exit(main())
