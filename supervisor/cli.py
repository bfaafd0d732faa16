"""The ``agent-supervisor`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TextIO

import trio

from protocols import events as ev
from supervisor.config import AgentSpec, ConfigError, builtin_agents, load_agents
from supervisor.containment import ContainmentUnavailable, choose_blocking
from supervisor.receipt import CancelReceipt
from supervisor.remote.hosts import load_hosts
from supervisor.remote.node import add_node_parser, main_node
from supervisor.session import Subscription
from supervisor.statefile import default_state_dir
from supervisor.supervisor import AnySession, open_supervisor
from supervisor.wire import receipt_to_wire

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if args.command == "demo":
            trio.run(run_demo, sys.stdout, args.words_before_stop, args.grace)
        elif args.command == "serve":
            trio.run(run_serve, args.config, args.host, args.port, args.token)
        elif args.command == "chat":
            if args.url and args.config:
                parser.error("--config is for the embedded supervisor; a gateway has its own")
            from supervisor.chat import run_chat

            return trio.run(run_chat, args.agent, args.url, args.config)
        elif args.command == "node":
            return main_node(args)
        elif args.command == "agents":
            agents = load_agents(args.config) if args.config else builtin_agents()
            for spec in agents.values():
                print(f"{spec.name:<12} {spec.protocol:<8} {spec.description}")
            print(f"\ncontainment: {_containment_line()}")
    except (ConfigError, ContainmentUnavailable) as exc:
        print(f"agent-supervisor: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agent-supervisor",
        description="Run coding agents and stop any turn, instantly, certainly and honestly.",
    )
    commands = parser.add_subparsers(dest="command")
    demo = commands.add_parser(
        "demo", help="cancel a streaming turn of the built-in demo agent, twice, and explain"
    )
    demo.add_argument("--words-before-stop", type=int, default=8, help=argparse.SUPPRESS)
    demo.add_argument(
        "--grace", type=float, default=1.5, help="grace window for the stubborn agent (s)"
    )
    serve = commands.add_parser(
        "serve", help="serve the WebSocket gateway, the web UI and the HTTP API on one port"
    )
    serve.add_argument(
        "--config", help="agents TOML file (the built-in demo agent is always there)"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8765, help="port (0 picks a free one)")
    serve.add_argument("--token", help="access token (default: a new random one)")
    chat = commands.add_parser(
        "chat", help="chat with an agent in the terminal; Esc or Ctrl-C stops the turn"
    )
    chat.add_argument("--agent", default="demo", help="agent to start (default: demo)")
    chat.add_argument(
        "--url", help="a running gateway (the `ready` URL of serve); default: an embedded one"
    )
    chat.add_argument("--config", help="agents TOML file (embedded supervisor only)")
    add_node_parser(commands)
    agents = commands.add_parser("agents", help="list the configured agents")
    agents.add_argument("--config", help="agents TOML file")
    return parser


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
            how = "asked to" if event.expected else "unexpectedly"
            self.line(f"   [agent process exited {how}]")

    def expect_words(self, count: int) -> None:
        self.words = 0
        self.words_wanted = count
        self.enough_words = trio.Event()


async def run_demo(out: TextIO, words_before_stop: int = 8, grace: float = 1.5) -> None:
    """Two stops: a cooperative agent, then one that ignores the interrupt."""
    printer = _Printer(out)
    demo = AgentSpec.from_config("demo")
    printer.line("agent-supervisor demo: stopping a coding agent's turn, for real")
    printer.line("=" * 66)
    async with open_supervisor(state_dir=default_state_dir(), gc_policy=True) as supervisor:
        printer.line()
        printer.line("1. A cooperative agent: it honours the ACP session/cancel notification.")
        session = await supervisor.start_session(demo.with_args("--delay", "0.05"))
        printer.line(f"   started session {session.id}: {' '.join(demo.command[1:])}")
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
    """How agent trees are held together here, and why (``supervisor/containment.py``)."""
    found = choose_blocking()
    return f"{found.kind}: {found.detail}"


async def run_serve(config: str | None, host: str, port: int, token: str | None) -> None:
    """``agent-supervisor serve``: one line ``ready URL`` on stdout once accepting."""
    from supervisor.gateway import Gateway, is_loopback

    agents = load_agents(config) if config else builtin_agents()
    hosts = load_hosts(config) if config else None
    print(f"agent-supervisor: containment: {_containment_line()}", file=sys.stderr, flush=True)
    if not is_loopback(host):
        print(
            f"WARNING: binding {host}: the gateway has no TLS, so the token and every prompt"
            " cross the network in clear text. Prefer 127.0.0.1 and an SSH tunnel or a TLS"
            " proxy.",
            file=sys.stderr,
            flush=True,
        )
    async with (
        open_supervisor(
            agents=agents, state_dir=default_state_dir(), gc_policy=True, hosts=hosts
        ) as supervisor,
        trio.open_nursery() as nursery,
    ):
        gateway = Gateway(supervisor, token=token, host=host, port=port)
        url = await nursery.start(gateway.serve)
        print(f"ready {url}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
