"""The ``shoal`` command line. Every operator mistake is one line on stderr, never a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from agent.errors import UserError


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage mistake in one line and exits with status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _cmd_probe(args: argparse.Namespace) -> int:
    from agent.probe_view import run_probe

    return run_probe(
        root=args.root,
        sim=args.sim,
        as_json=args.json,
        watch=args.watch,
        interval_s=args.interval,
    )


def _cmd_init(args: argparse.Namespace) -> int:
    from agent.init_cmd import run_init

    return run_init(directory=args.dir, name=args.name, operator=args.operator)


def _cmd_demo(args: argparse.Namespace) -> int:
    from agent.demo import run_demo

    return run_demo(
        nodes=args.nodes,
        headless=args.headless,
        duration_s=args.duration,
        rate=args.rate,
        seed=args.seed,
        idle_s=args.idle,
        as_json=args.json,
        keep=args.keep,
        plain=args.plain,
    )


def _cmd_bootstrap(args: argparse.Namespace) -> int:
    from agent.bootstrap_cmd import run_bootstrap

    return run_bootstrap(args)


def _cmd_tui(args: argparse.Namespace) -> int:
    from tui.cli import run_tui  # the TUI loads only for this command

    return run_tui(args)


def _add_tui_parser(sub: Any) -> None:
    from agent.ops_cmd import add_agent_and_identity_arguments

    tui = sub.add_parser("tui", help="the operator's terminal UI, joined to the mesh as a peer")
    add_agent_and_identity_arguments(tui, agent_flag="--join")
    tui.add_argument("--readonly", action="store_true", help="hide every mutating key")
    tui.add_argument(
        "--sim", type=int, metavar="N", help="a simulated mesh of N hosts, no agents (demos)"
    )
    tui.add_argument("--theme", help="shoal or shoal-colorblind (default: from tui.toml)")
    tui.add_argument("--ascii", action="store_true", help="ASCII bars, for plain terminals")
    tui.set_defaults(func=_cmd_tui)


def build_parser() -> argparse.ArgumentParser:
    from agent.paths import default_cluster_dir

    parser = _Parser(prog="shoal", description="Shoal: one masterless mesh for a mixed GPU fleet.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    probe = sub.add_parser("probe", help="show this host's GPUs (or a simulated or captured host)")
    probe.add_argument("--json", action="store_true", help="print JSON instead of a table")
    probe.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    probe.add_argument(
        "--interval", type=float, default=1.0, metavar="S", help="seconds between refreshes"
    )
    probe.add_argument(
        "--root",
        type=Path,
        metavar="PATH",
        help="read sysfs under PATH instead of / and skip libraries and tools",
    )
    probe.add_argument(
        "--sim",
        metavar="PROFILE",
        help="simulate a host: a preset (demo, dgx-h100, ...) or MODEL[:COUNT][,MODEL:COUNT]",
    )
    probe.set_defaults(func=_cmd_probe)

    init = sub.add_parser("init", help="create a cluster: its CA and your operator identity")
    init.add_argument("--name", default="shoal", help="the cluster's name (default: shoal)")
    init.add_argument(
        "--dir",
        type=Path,
        default=default_cluster_dir(),
        metavar="DIR",
        help="where to keep the CA and your identity (default: %(default)s)",
    )
    init.add_argument("--operator", metavar="NAME", help="your name in the certificate")
    init.set_defaults(func=_cmd_init)

    from agent.agent_cmd import add_agent_arguments, run_agent

    agent = sub.add_parser("agent", help="run this host's agent in the foreground")
    add_agent_arguments(agent)
    agent.set_defaults(func=run_agent)

    from agent.ops_cmd import add_operator_commands

    add_operator_commands(sub)

    demo = sub.add_parser("demo", help="a local mesh of simulated GPU hosts, live or headless")
    demo.add_argument("--nodes", type=int, default=8, help="agents to start (default 8)")
    demo.add_argument("--headless", action="store_true", help="run a workload, print figures")
    demo.add_argument("--duration", type=float, default=30.0, metavar="S", help="workload time")
    demo.add_argument("--rate", type=float, default=4.0, metavar="JOBS/S", help="submit rate")
    demo.add_argument("--seed", type=int, default=1)
    demo.add_argument(
        "--idle",
        type=float,
        default=20.0,
        metavar="S",
        help="quiet spell before the workload; the idle footprint is its second half",
    )
    demo.add_argument("--json", action="store_true", help="print one JSON object")
    demo.add_argument("--keep", action="store_true", help="keep the demo's folder and logs")
    demo.add_argument("--plain", action="store_true", help="a live table view instead of the TUI")
    demo.set_defaults(func=_cmd_demo)

    _add_tui_parser(sub)

    from agent.bootstrap_args import add_bootstrap_arguments

    bootstrap = sub.add_parser("bootstrap", help="install, certify and start agents over SSH")
    add_bootstrap_arguments(bootstrap)
    bootstrap.set_defaults(func=_cmd_bootstrap)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from gossip.tls import import_aiohttp_without_system_cas

    # Every Shoal command talks only to its own cluster, with its own TLS contexts.
    import_aiohttp_without_system_cas()
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except UserError as exc:
        print(f"shoal: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
