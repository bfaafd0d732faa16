"""The ``agent-supervisor`` command line."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import resource
import signal
import stat
import sys
import threading
from collections.abc import AsyncIterator, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import urlsplit

import attrs
import trio
from attrs import define, frozen

from supervisor.agents.containment import ContainmentUnavailable, choose_blocking
from supervisor.config import (
    AgentSpec,
    Config,
    ConfigError,
    GatewaySettings,
    builtin_agents,
    default_max_sessions,
    load_agents,
    load_config,
)

# The runtime is imported where it is used: ``serve`` detects its containment in a thread
# meanwhile (``_detect_containment_early``).
if TYPE_CHECKING:
    import ssl

    from opentelemetry.sdk.trace import TracerProvider

    from protocols import events as ev
    from supervisor.receipt import CancelReceipt
    from supervisor.remote.hosts import HostSpec
    from supervisor.runtime.session import Subscription
    from supervisor.supervisor import AnySession, Supervisor

__all__ = ["LOCAL_NODE", "main"]

#: The host name of ``serve --local-node``'s node (this machine).
LOCAL_NODE = "local"
#: How long a graceful stop waits for the store to write the turns' ends before the
#: connections close: clients are given events once stored, and a write takes a few ms (a
#: store that cannot be written keeps them from the clients, as it would anyway).
STORE_WAIT_S = 2.0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = _command(argv)
        sys.stdout.flush()  # here, not at exit: a reader gone is then caught below
    except BrokenPipeError:  # the reader went (| head): nothing more to say, no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (the exit's flush)
        return 0
    return code


def _command(argv: Sequence[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if args.command == "demo":
            trio.run(run_demo, sys.stdout, args.words_before_stop, args.grace)
        elif args.command == "serve":
            _log_to_stderr()
            _detect_containment_early()
            return trio.run(run_serve, serve_options(args))
        elif args.command == "chat":
            if args.url and args.config:
                parser.error("--config is for the embedded supervisor; a gateway has its own")
            if args.session and not args.url:
                parser.error("--session names a gateway's session: give --url too")
            from supervisor.clients.chat import run_chat

            return trio.run(
                partial(run_chat, args.agent, args.url, args.config, session=args.session)
            )
        elif args.command == "acp":
            if args.connect and args.config:
                parser.error("--config is for the embedded supervisor; a gateway has its own")
            if args.session and not args.connect:
                parser.error("--session names a gateway's session: give --connect too")
            _log_to_stderr()
            from supervisor.clients.acp_front import BackendError, run_acp

            try:
                return trio.run(
                    partial(
                        run_acp,
                        agent=args.agent,
                        config=args.config,
                        connect=args.connect,
                        session=args.session,
                    )
                )
            except BackendError as exc:
                print(f"agent-supervisor acp: {exc}", file=sys.stderr)
                return 2
        elif args.command in ("pause", "resume"):
            return _operator(args)
        elif args.command == "sessions":
            return _sessions(args)
        elif args.command == "worktrees":
            return _worktrees(args)
        elif args.command == "node":
            from supervisor.node.daemon import main_node

            return main_node(args)
        elif args.command == "agents":
            agents = load_agents(args.config) if args.config else builtin_agents()
            width = max(len(name) for name in agents)
            for spec in agents.values():
                print(f"{spec.name:<{width}}  {spec.protocol:<8} {spec.description}".rstrip())
            print(f"\ncontainment: {_containment_line()}")
    except (ConfigError, ContainmentUnavailable) as exc:
        print(f"agent-supervisor: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def _detect_containment_early() -> None:
    """Start detecting the containment (a probe process and the cgroup keeper: ~25 ms, most
    of it waiting for them) in a thread, while the runtime and the gateway are imported; the
    result is kept for the supervisor (``supervisor/agents/containment.py``)."""

    def detect() -> None:
        with contextlib.suppress(Exception):  # the supervisor's own call reports it
            choose_blocking()

    threading.Thread(target=detect, name="containment", daemon=True).start()


#: The schemes a gateway URL may have: the ``ready`` line's, or a WebSocket one.
GATEWAY_SCHEMES = ("http", "https", "ws", "wss")


def gateway_url(value: str) -> str:
    """A gateway URL given to ``chat``, ``acp --connect``, ``pause``, ``resume``: refused at
    once, naming what is wanted, unless it has a scheme and a host."""
    parts = urlsplit(value)
    if parts.scheme.lower() not in GATEWAY_SCHEMES or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a gateway URL: give the one `agent-supervisor serve` printed"
            " (http://HOST:PORT/?token=...)"
        )
    return value


def _port(value: str) -> int:
    """A TCP port: a number out of range is refused, never bound modulo 65536."""
    try:
        port = int(value)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a port: 1 to 65535, or 0 for a free one"
        )
    return port


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agent-supervisor",
        description="Run coding agents and stop any turn, instantly, certainly and honestly.",
    )
    commands = parser.add_subparsers(dest="command")
    demo = commands.add_parser(
        "demo", help="cancel a streaming turn of the built-in demo agent, twice, and explain"
    )
    demo.add_argument(
        "--words-before-stop", type=int, default=8, metavar="N", help=argparse.SUPPRESS
    )
    demo.add_argument(
        "--grace",
        type=float,
        metavar="S",
        default=1.5,
        help="grace window for the stubborn agent, in seconds (default 1.5)",
    )
    serve = commands.add_parser(
        "serve", help="serve the WebSocket gateway, the web UI and the HTTP API on one port"
    )
    serve.add_argument(
        "--config",
        metavar="FILE",
        help="agents TOML file (the built-in demo agent is always there)",
    )
    serve.add_argument(
        "--host", metavar="ADDRESS", default="127.0.0.1", help="address to bind (default 127.0.0.1)"
    )
    serve.add_argument(
        "--port",
        type=_port,
        default=8765,
        metavar="PORT",
        help="port, 1 to 65535 (0 picks a free one)",
    )
    serve.add_argument(
        "--token",
        metavar="TOKEN",
        help=f"access token; visible to every local user in the process list: prefer"
        f" ${TOKEN_VARIABLE} or --token-file (default: a new random one)",
    )
    serve.add_argument(
        "--token-file",
        metavar="PATH",
        help="read the access token from PATH (refused if group or others may read it)",
    )
    serve.add_argument(
        "--tls-cert", metavar="PEM", help="serve HTTPS and WSS with this certificate"
    )
    serve.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    serve.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a name clients reach this server by (Host check), NAME or NAME:PORT; repeatable",
    )
    serve.add_argument(
        "--insecure",
        action="store_true",
        help="bind a non-loopback address without TLS (the token and prompts travel in clear)",
    )
    serve.add_argument(
        "--max-sessions",
        type=int,
        metavar="N",
        help="sessions running at once (default: [gateway] max_sessions, else one per 512 MiB"
        " of memory)",
    )
    serve.add_argument(
        "--store",
        metavar="URL",
        help="where sessions, their events and prompts are kept across restarts:"
        " sqlite:///PATH (PATH is what follows the three slashes: sqlite:///x.db is x.db in"
        " the working directory, sqlite:////var/lib/x.db is absolute, sqlite:///~/x.db in"
        " your home; missing directories are made), postgresql://..., or none (default:"
        " [store] url, else sessions.db in the state directory)",
    )
    serve.add_argument(
        "--local-node",
        action="store_true",
        help="run the sessions of this machine in a node here (host 'local'), so that they"
        " outlive a restart of serve (also: [gateway] local_node = true)",
    )
    serve.add_argument(
        "--stop-node-sessions",
        action="store_true",
        help="on exit, stop the sessions that run in nodes too (default: leave them running"
        " there, for the next serve to find)",
    )
    chat = commands.add_parser(
        "chat", help="chat with an agent in the terminal; Esc or Ctrl-C stops the turn"
    )
    chat.add_argument(
        "--agent", metavar="NAME", default="demo", help="agent to start (default: demo)"
    )
    chat.add_argument(
        "--url",
        type=gateway_url,
        metavar="URL",
        help="a running gateway (the `ready` URL of serve); default: an embedded one",
    )
    chat.add_argument(
        "--config", metavar="FILE", help="agents TOML file (embedded supervisor only)"
    )
    chat.add_argument(
        "--session",
        metavar="ID",
        help="with --url: join this session of the gateway (running or stored: a prompt brings"
        " a stored one back), its conversation so far shown first; quitting leaves it running",
    )
    acp = commands.add_parser(
        "acp", help="be an ACP agent on stdin/stdout (for Zed and any ACP client)"
    )
    acp.add_argument(
        "--agent",
        metavar="NAME",
        help="agent behind it (default: the first listed, the built-in demo; a session option too)",
    )
    acp.add_argument("--config", metavar="FILE", help="agents TOML file (embedded supervisor only)")
    acp.add_argument(
        "--connect",
        metavar="URL",
        type=gateway_url,
        help="a running gateway (the `ready` URL of serve): its sessions, shared with the"
        " web UI and the chat; default: an embedded supervisor",
    )
    acp.add_argument(
        "--session", metavar="ID", help="with --connect: every session/new joins this session"
    )
    _add_operator_parsers(commands)
    _add_sessions_parser(commands)
    _add_worktrees_parser(commands)
    from supervisor.node.daemon import add_node_parser

    add_node_parser(commands)
    agents = commands.add_parser("agents", help="list the configured agents")
    agents.add_argument("--config", metavar="FILE", help="agents TOML file")
    _describe(commands)
    return parser


def _describe(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Each command's ``--help`` opens with the line the command list gives it (and its own
    commands', for ``sessions``)."""
    for action in commands._choices_actions:
        command = commands.choices[action.dest]
        command.description = command.description or action.help
        if command._subparsers is not None:
            for inner in command._subparsers._group_actions:
                if isinstance(inner, argparse._SubParsersAction):
                    _describe(inner)


def _add_operator_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``pause`` and ``resume``: an operator's actions on a running gateway."""
    pause = commands.add_parser(
        "pause",
        help="pause all: no new turn starts in any session of a running gateway (prompts wait)",
    )
    pause.add_argument(
        "--deadline",
        type=float,
        metavar="S",
        help="cancel the turns still running S seconds from now (default: they finish)",
    )
    resume = commands.add_parser(
        "resume", help="resume all: the prompts a pause held start, in order"
    )
    for command in (pause, resume):
        command.add_argument(
            "--url",
            type=gateway_url,
            metavar="URL",
            help="the gateway: the `ready` URL of serve (its ?token= is used), default"
            " $AGENT_SUPERVISOR_URL or http://127.0.0.1:8765/",
        )
        command.add_argument(
            "--token-file",
            metavar="PATH",
            help=f"read the token from PATH (else the URL's, else ${TOKEN_VARIABLE})",
        )
        command.add_argument("--json", action="store_true", help="print the answer as JSON")


def _add_sessions_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``sessions list``, ``show ID``, ``export ID``: the store read directly."""
    sessions = commands.add_parser(
        "sessions", help="list, show or export the stored sessions (read from the store itself)"
    )
    sessions.add_argument(
        "--store",
        metavar="URL",
        help="the session store, as serve's --store (default: sessions.db in the state"
        " directory); read beside a running serve too",
    )
    which = sessions.add_subparsers(dest="sessions_command", metavar="COMMAND", required=True)
    listed = which.add_parser("list", help="every stored session, the newest first")
    show = which.add_parser("show", help="a session's turns and receipts")
    export = which.add_parser("export", help="a session's events as JSONL (the wire's bytes)")
    for command in (show, export):
        command.add_argument("session_id", metavar="ID", help="a session's id, as list shows it")
    for command in (listed, show, export):  # after the command too: `sessions list --store URL`
        command.add_argument(
            "--store", metavar="URL", default=argparse.SUPPRESS, help="as sessions --store"
        )


def _add_worktrees_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    worktrees = commands.add_parser(
        "worktrees",
        help="list the git worktrees of sessions started with worktree (path, branch, session,"
        " clean or dirty, commits ahead)",
    )
    worktrees.add_argument(
        "--prune",
        action="store_true",
        help="remove those with no changes and no commits whose session is not running",
    )


def _worktrees(args: argparse.Namespace) -> int:
    from supervisor.agents.statefile import default_state_dir
    from supervisor.worktrees import WorktreeError, Worktrees

    worktrees = Worktrees(default_state_dir() / "worktrees")

    async def run() -> None:
        found = await worktrees.recorded()
        if not found:
            print(f"no worktrees in {worktrees.root}")
        for worktree, live in found:
            try:
                status = await worktrees.status(worktree)
            except WorktreeError as exc:
                state = f"unknown ({exc})"
            else:
                state = ("clean" if status.clean else "dirty") if status.exists else "missing"
                state += f", {status.ahead} ahead"
            running = ", running" if live else ""
            print(
                f"{worktree.path}  {worktree.branch}  session {worktree.session_id}"
                f"  {state}{running}"
            )
        if args.prune:
            for left in await worktrees.prune():
                if left.kept:
                    print(f"kept {left.worktree.path}: {left.why}")
                else:
                    print(f"removed {left.worktree.path} and its branch {left.worktree.branch}")

    trio.run(run)
    return 0


def _sessions(args: argparse.Namespace) -> int:
    from supervisor.agents.statefile import default_state_dir
    from supervisor.clients.sessions import SessionsError, run_sessions
    from supervisor.store.url import default_url

    url = args.store or default_url(default_state_dir())
    try:
        run_sessions(
            args.sessions_command,
            url,
            getattr(args, "session_id", None),
            sys.stdout,
            sys.stdout.buffer,
        )
    except SessionsError as exc:
        print(f"agent-supervisor sessions: {exc}", file=sys.stderr)
        return exc.code
    except BrokenPipeError:  # (| head)
        return 0
    return 0


def _operator(args: argparse.Namespace) -> int:
    from supervisor.clients.operator import (
        URL_VARIABLE,
        OperatorError,
        default_url,
        run_operator,
        token_for,
    )

    deadline_s: float | None = getattr(args, "deadline", None)
    if deadline_s is not None and not (0 <= deadline_s < float("inf")):
        print("agent-supervisor: --deadline takes seconds, 0 or more", file=sys.stderr)
        return 2
    url = args.url or default_url()
    try:
        gateway_url(url)  # (from the environment: argparse has not seen it)
    except argparse.ArgumentTypeError as exc:
        print(f"agent-supervisor {args.command}: ${URL_VARIABLE}: {exc}", file=sys.stderr)
        return 2
    try:
        from_file = read_token_file(args.token_file) if args.token_file else None
        token = token_for(url, from_file, os.environ)
    except (ConfigError, OperatorError) as exc:
        print(f"agent-supervisor {args.command}: {exc}", file=sys.stderr)
        return 2
    try:
        trio.run(
            partial(
                run_operator,
                args.command,
                url,
                token,
                sys.stdout,
                deadline_s=deadline_s,
                as_json=args.json,
            )
        )
    except OperatorError as exc:
        print(f"agent-supervisor {args.command}: {exc}", file=sys.stderr)
        return 1
    return 0


class _Printer:
    """Streams a session's events as a person would like to read them."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.words = 0
        self.at_line_start = True
        self.enough_words = trio.Event()
        self.words_wanted = 0

    def line(self, text: str = "") -> None:
        if not self.at_line_start:
            self.out.write("\n")
        self.out.write(text + "\n")
        self.out.flush()
        self.at_line_start = True

    async def follow(self, subscription: Subscription) -> None:
        async for event in subscription:
            self.show(event)

    def show(self, event: ev.Event) -> None:
        from protocols import events as ev

        if isinstance(event, ev.MessageDelta) and event.role == "assistant":
            if self.at_line_start:
                self.out.write("   agent: ")
                self.at_line_start = False
            self.out.write(event.text)
            self.out.flush()
            self.words += 1
            if self.words >= self.words_wanted:
                self.enough_words.set()
        elif isinstance(event, ev.SessionState):
            detail = f" ({event.detail})" if event.detail else ""
            self.line(f"   [session {event.state}{detail}]")
        elif isinstance(event, ev.TurnEnded) and event.stop_reason != "dropped":
            self.line(f"   [turn {event.turn_id} ended: {event.outcome}]")
        elif isinstance(event, ev.AgentExited):
            how = ", as asked" if event.expected else " unexpectedly"
            self.line(f"   [agent process exited{how}]")

    def expect_words(self, count: int) -> None:
        self.words = 0
        self.words_wanted = count
        self.enough_words = trio.Event()


async def run_demo(out: TextIO, words_before_stop: int = 8, grace: float = 1.5) -> None:
    """Two stops: a cooperative agent, then one that ignores the interrupt."""
    from protocols import events as ev
    from supervisor.agents.statefile import default_state_dir
    from supervisor.supervisor import open_supervisor

    printer = _Printer(out)
    demo = AgentSpec.from_config("demo")
    printer.line("agent-supervisor demo: stopping a coding agent's turn, for real")
    printer.line("=" * 66)
    async with open_supervisor(state_dir=default_state_dir(), gc_policy=True) as supervisor:
        printer.line()
        printer.line("1. A cooperative agent: it honours the ACP session/cancel notification.")
        session = await supervisor.start_session(demo.with_args("--delay", "0.05"))
        command = [Path(demo.command[0]).name, *demo.command[1:]]  # (not the venv's path)
        printer.line(f"   started session {session.id}: {' '.join(command)}")
        await _prompt_and_stop(session, printer, "Tell me about supervisors", words_before_stop)

        printer.line()
        printer.line(
            f"2. A stubborn agent (--ignore-cancel): it ignores the interrupt. After {grace:g} s"
        )
        printer.line("   of grace the supervisor kills its whole process tree, starts it again and")
        printer.line("   resumes the session (ACP session/load), then answers.")
        stubborn = demo.with_args("--delay", "0.05", "--ignore-cancel").with_options(grace_s=grace)
        session = await supervisor.start_session(stubborn)
        printer.line(f"   started session {session.id}")
        await _prompt_and_stop(session, printer, "Refactor the whole parser", words_before_stop)

        printer.line()
        printer.line("   The session survived the kill: a new prompt on it completes.")
        async with session.subscribe() as events:
            turn = await session.prompt("Are you still there? words=6")
            async for event in events:
                printer.show(event)
                if isinstance(event, ev.TurnEnded) and event.turn_id == turn.id:
                    break
    printer.line()
    printer.line("Every agent process of both sessions is gone. Try `make test` next.")


async def _prompt_and_stop(
    session: AnySession, printer: _Printer, text: str, words_before_stop: int
) -> CancelReceipt:
    from supervisor.wire.codec import receipt_to_wire

    async with session.subscribe() as events, trio.open_nursery() as nursery:
        nursery.start_soon(printer.follow, events)
        printer.expect_words(words_before_stop)
        turn = await session.prompt(text)
        printer.line(f"   > prompt {turn.id}: {text!r}")
        await printer.enough_words.wait()
        printer.line(f"   ■ Stop pressed after {words_before_stop} words")
        receipt = await session.cancel(reason="demo")
        nursery.cancel_scope.cancel()
    printer.line(f"   receipt: {receipt.summary()}")
    printer.line("   " + json.dumps(receipt_to_wire(receipt)))
    return receipt


def _containment_line() -> str:
    """How agent trees are held together here, and why (``supervisor/agents/containment.py``)."""
    found = choose_blocking()
    return f"{found.kind}: {found.detail}"


TOKEN_VARIABLE = "AGENT_SUPERVISOR_TOKEN"


@frozen(kw_only=True)
class ServeOptions:
    """``serve``'s command line, checked: everything that can be refused is refused before
    anything starts (one line on stderr, exit 2)."""

    config: Config
    host: str
    port: int
    token: str | None
    ssl_context: ssl.SSLContext | None
    allow_hosts: tuple[str, ...]
    max_sessions: int | None
    #: the ``[hosts.NAME]`` of the config file (``supervisor/remote/``)
    hosts: dict[str, HostSpec] | None = None
    #: run this machine's sessions in a node here (``--local-node``)
    local_node: bool = False
    #: on exit, leave the sessions that run in nodes running there (no ``--stop-node-sessions``)
    keep_node_sessions: bool = True
    warnings: tuple[str, ...] = ()
    #: where spans go, as the ``OTEL_*`` variables ask (None: no traces)
    tracer_provider: TracerProvider | None = None
    #: the session store's URL (``--store``, ``[store] url``); None: the state directory's
    store: str | None = None


def serve_options(args: argparse.Namespace) -> ServeOptions:
    """Raises :class:`ConfigError` with the reason for what ``serve`` must refuse."""
    from supervisor.gateway import is_loopback

    warnings: list[str] = []
    config = load_config(args.config) if args.config else Config(agents=builtin_agents())
    token = _token(args, warnings)
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ConfigError("give --tls-cert and --tls-key together")
    context = _ssl_context(args.tls_cert, args.tls_key) if args.tls_cert else None
    if not is_loopback(args.host):
        if context is None and not args.insecure:
            raise ConfigError(
                f"refusing to bind {args.host} without TLS: the token and every prompt would"
                " cross the network in clear text. Give --tls-cert and --tls-key, or --insecure"
                " (behind a TLS proxy, or on a network you trust); or bind 127.0.0.1 and use an"
                " SSH tunnel"
            )
        if context is None:
            warnings.append(
                f"WARNING: binding {args.host} without TLS (--insecure): the token and every"
                " prompt cross the network in clear text"
            )
    for name in args.allow_host:
        if not name or any(c in name for c in "/ \t@?#"):
            raise ConfigError(f"--allow-host {name!r}: a host name, or NAME:PORT")
    if args.max_sessions is not None and args.max_sessions < 1:
        raise ConfigError("--max-sessions must be a whole number >= 1")
    hosts = _hosts(args.config) if args.config else None
    from supervisor.observe.tracing import provider_from_env

    tracer_provider = provider_from_env()
    local = args.local_node or config.gateway.local_node
    if local and hosts and LOCAL_NODE in hosts:
        raise ConfigError(
            f"--local-node ([gateway] local_node) runs a node named {LOCAL_NODE!r}:"
            f" [hosts.{LOCAL_NODE}] is taken; rename it"
        )
    store = getattr(args, "store", None) or config.store.url
    if store is not None:
        from supervisor.store.backend import StoreError
        from supervisor.store.url import backend_for

        try:
            backend_for(store)
        except StoreError as exc:
            raise ConfigError(str(exc)) from None
    return ServeOptions(
        store=store,
        config=config,
        host=args.host,
        port=args.port,
        token=token,
        ssl_context=context,
        allow_hosts=tuple(args.allow_host),
        max_sessions=args.max_sessions,
        hosts=hosts,
        local_node=local,
        keep_node_sessions=not args.stop_node_sessions,
        warnings=tuple(warnings),
        tracer_provider=tracer_provider,
    )


def _hosts(path: str) -> dict[str, HostSpec]:
    from supervisor.remote.hosts import load_hosts

    return load_hosts(path)


def _token(args: argparse.Namespace, warnings: list[str]) -> str | None:
    if args.token is not None and args.token_file is not None:
        raise ConfigError("give --token or --token-file, not both")
    token: str | None
    if args.token_file is not None:
        token = read_token_file(args.token_file)
    elif args.token is not None:
        token = args.token
        warnings.append(
            f"WARNING: --token is visible to every local user (ps, /proc/PID/cmdline); give it"
            f" in ${TOKEN_VARIABLE} or with --token-file PATH instead"
        )
    else:
        token = os.environ.get(TOKEN_VARIABLE) or None
    if token is not None and (not token.strip() or not token.isprintable() or " " in token):
        raise ConfigError("the token must be printable text without spaces")
    return token


def read_token_file(path: str) -> str:
    """The token in ``path`` (surrounding whitespace dropped); refused unless only its owner
    may read it: a token in a file others can read is no secret."""
    try:
        with open(path, "rb") as file:
            mode = os.fstat(file.fileno()).st_mode
            data = file.read(4096)
    except OSError as exc:
        raise ConfigError(f"--token-file {path}: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"--token-file {path} is open to group or others (mode {stat.S_IMODE(mode):04o}):"
            f" chmod 600 {path}"
        )
    try:
        token = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"--token-file {path}: not UTF-8 text") from None
    if not token:
        raise ConfigError(f"--token-file {path} is empty")
    return token


def _ssl_context(cert: str, key: str | None) -> ssl.SSLContext:
    import ssl

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except OSError as exc:  # ssl.SSLError is one too
        reason = exc.strerror or getattr(exc, "reason", None) or str(exc)
        raise ConfigError(f"--tls-cert {cert} / --tls-key {key}: {reason}") from None
    return context


def raise_open_files_limit() -> tuple[int, int]:
    """Soft ``RLIMIT_NOFILE`` up to the hard one: the common soft 1024 ran out at ~200
    sessions (each holds a few pipes). Returns (before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        try:
            with open("/proc/sys/fs/nr_open") as nr_open:  # what the kernel allows at most
                target = int(nr_open.read())
        except (OSError, ValueError):
            target = soft
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError):
            return soft, soft
    return soft, max(soft, target)


def _log_to_stderr() -> None:
    """Warnings and errors of the supervisor, one line each, on stderr."""
    logging.basicConfig(level=logging.WARNING, format="agent-supervisor: %(message)s")


@define
class _Shutdown:
    """The first SIGINT or SIGTERM asks for a graceful stop; a second kills every agent tree
    at once."""

    requested: trio.Event
    supervisor: Supervisor | None = None
    forced: bool = False

    async def watch(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            name = signal.Signals(signum).name
            if not self.requested.is_set():
                _say(
                    f"{name}: shutting down: stopping the running turns, then the agents"
                    f" ({name} again kills them at once){self._nodes_note()}"
                )
                self.requested.set()
            elif not self.forced:
                _say(f"{name} again: killing every agent now{self._nodes_note()}")
                self.forced = True
                if self.supervisor is not None:
                    await self.supervisor.kill()

    def _nodes_note(self) -> str:
        sup = self.supervisor
        if sup is None or not sup.keep_node_sessions or not sup.remote.hosts:
            return ""
        return (
            "; sessions in nodes go on there, for the next serve to find"
            " (--stop-node-sessions stops them too)"
        )


async def run_serve(options: ServeOptions) -> int:
    """``agent-supervisor serve``: one line ``ready URL`` on stdout once accepting; on SIGINT or
    SIGTERM a graceful stop, exit 0 (a second signal: the agents are killed at once, exit 1)."""
    from supervisor.gateway import CannotListen
    from supervisor.store.backend import StoreError

    refused: StoreError | CannotListen | None = None
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        shutdown = _Shutdown(trio.Event())
        try:
            async with trio.open_nursery() as watcher:
                watcher.start_soon(shutdown.watch, signals)
                await _serve(options, shutdown)
                watcher.cancel_scope.cancel()
        # The store cannot be opened, or the port is taken: one line, what to do.
        except* (StoreError, CannotListen) as group:
            refused = next(e for e in _leaves(group) if isinstance(e, (StoreError, CannotListen)))
    if refused is not None:
        taken = isinstance(refused, CannotListen) and refused.port_taken
        _say(str(refused) + ("; choose another with --port N (0 picks a free one)" * taken))
        return 2
    if shutdown.forced:
        return 1
    return 0


async def _serve(options: ServeOptions, shutdown: _Shutdown) -> None:
    from supervisor.agents.statefile import default_state_dir
    from supervisor.gateway import LIMITS, Gateway
    from supervisor.observe import Metrics
    from supervisor.store.retention import Retention
    from supervisor.supervisor import apply_gc_policy, open_supervisor

    for warning in options.warnings:
        _say(warning)
    before, after = raise_open_files_limit()
    settings: GatewaySettings = options.config.gateway
    max_sessions = options.max_sessions or settings.max_sessions or default_max_sessions()
    _say(f"containment: {_containment_line()}")
    _say(
        f"max_sessions {max_sessions}; open files {after}"
        + (f" (was {before})" * (before != after))
    )
    limits = attrs.evolve(
        LIMITS,
        max_connections=settings.max_connections or LIMITS.max_connections,
        request_timeout_s=settings.request_timeout_s or LIMITS.request_timeout_s,
    )
    agents, hosts = options.config.agents, options.hosts
    if options.local_node:
        from supervisor.remote.hosts import local_node

        local = local_node(
            LOCAL_NODE,
            state_dir=default_state_dir(),
            max_sessions=max_sessions,
            detach_s=settings.local_node_detach_s,
        )
        hosts = {**(hosts or {}), LOCAL_NODE: local}
        agents = {
            name: spec if spec.hosts else spec.with_options(hosts=(LOCAL_NODE,))
            for name, spec in agents.items()
        }
        _say(f"local sessions run in a node here (host {LOCAL_NODE!r}), and outlive a restart")
    store = options.store or _default_store(default_state_dir())
    if store.strip().lower() != "none":
        _say(f"sessions are stored in {_shown_store(store)}")
    kept = options.config.store
    async with open_supervisor(
        store=store,
        store_writer=kept.writer,
        retention=Retention(
            keep_days=kept.keep_days, keep_sessions=kept.keep_sessions, keep_bytes=kept.keep_bytes
        ),
        agents=agents,
        state_dir=default_state_dir(),
        max_sessions=max_sessions,
        hosts=hosts,
        keep_node_sessions=options.keep_node_sessions,
        metrics=Metrics(),  # GET /metrics, with the gateway's token
        tracer_provider=options.tracer_provider,
        checkpoint_watch=options.config.checkpoints.watch,
    ) as supervisor:
        shutdown.supervisor = supervisor
        gateway = Gateway(
            supervisor,
            token=options.token,
            host=options.host,
            port=options.port,
            limits=limits,
            ssl_context=options.ssl_context,
            allow_hosts=options.allow_hosts,
        )
        async with trio.open_nursery() as nursery:
            url = await nursery.start(gateway.serve)
            print(f"ready {url}", flush=True)
            apply_gc_policy()  # a full collection, ~10 ms: once serving, not before
            await shutdown.requested.wait()
            # Stop accepting; stop the turns through their ladder (the clients still connected
            # see them end); close the connections; then leaving the supervisor stops the
            # agents and removes the state file.
            gateway.stop_accepting()
            await supervisor.cancel_turns("shutdown")
            if supervisor.store is not None:
                with trio.move_on_after(STORE_WAIT_S):
                    await supervisor.store.flushed()  # the turns' ends reach their clients
            await gateway.close_connections()
            nursery.cancel_scope.cancel()
    if options.tracer_provider is not None:
        # The spans still batched (the stop's own) are exported before the process goes.
        await trio.to_thread.run_sync(options.tracer_provider.shutdown)


def _default_store(state_dir: Path) -> str:
    """The store in the state directory; ``none`` (and one line) if that directory cannot
    be used: ``serve`` runs on, as without the state directory's crash safety."""
    from supervisor.store.url import default_url

    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        usable = os.access(state_dir, os.W_OK)
    except OSError:
        usable = False
    if not usable:
        _say(
            f"sessions are not stored: {state_dir} cannot be used (give --store or"
            " [store] url to keep them)"
        )
        return "none"
    return default_url(state_dir)


def _leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    leaves: list[BaseException] = []
    for exc in group.exceptions:
        leaves.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return leaves


def _shown_store(url: str) -> str:
    from supervisor.store.url import redacted

    return url[len("sqlite:///") :] if url.startswith("sqlite:///") else redacted(url)


def _say(text: str) -> None:
    print(f"agent-supervisor: {text}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
