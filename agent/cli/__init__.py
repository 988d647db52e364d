"""The ``shoal`` command line. Every operator mistake is one line on stderr, never a traceback.

Subcommands are lazy: :data:`COMMANDS` names each one's argument builder (in a module that imports
only argparse and the standard library) and, as ``module:function``, the code that runs it,
imported only once the arguments are parsed. ``shoal --help``, ``shoal SUB --help`` and every
argument error therefore load neither aiohttp, cryptography, rich, textual nor asyncssh.

Exit status: 0 done, 2 a mistake (one line; an ambiguous name lists its matches), 130 Ctrl-C
(except where Ctrl-C is how a command ends: ``logs -f``, ``events -f``, ``demo``: 0). Output
into a pipe that closes early (``shoal nodes --json | head``) ends the command quietly with
status 0, as ``head`` users expect.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from agent.cli import data_args, history_args, ops_args, user_args
from agent.cli.agent_args import add_agent_arguments
from agent.common.errors import UserError
from agent.common.paths import default_cluster_dir
from agent.common.quiet import quiet_third_party_warnings


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage mistake in one line and exits with status 2: a mistyped
    command or choice names the nearest one, and an unknown option names the subcommand whose
    help to read."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {_with_hint(message)} (see '{self.prog} --help')\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extra = super().parse_known_args(args, namespace)
        if extra and self._subparsers is not None:
            # said by the chosen subcommand's own parser (the deepest one), so the mistake
            # points at its --help
            _chosen(self, parsed).error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed, extra


def _chosen(parser: argparse.ArgumentParser, parsed: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the subcommand ``parsed`` names under ``parser`` (itself if none)."""
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        choices = action.choices if isinstance(action.choices, dict) else {}
        name = getattr(parsed, action.dest, None)
        if isinstance(name, str) and name in choices:
            return _chosen(choices[name], parsed)
    return parser


_INVALID_CHOICE = re.compile(
    r"^argument (?P<arg>[^:]+): invalid choice: '(?P<got>[^']*)' \(choose from (?P<choices>.*)\)$"
)


def _with_hint(message: str) -> str:
    """argparse's message, with the nearest choice to a mistyped one (and, for a command, the
    nearest instead of the whole list, which ``--help`` shows)."""
    found = _INVALID_CHOICE.match(message)
    if found is None:
        return message
    choices = re.findall(r"'([^']*)'", found["choices"])
    near = difflib.get_close_matches(found["got"], choices, n=1)
    hint = f"; did you mean '{near[0]}'?" if near else ""
    if found["arg"] == "COMMAND":
        return f"invalid choice: '{found['got']}' is not a command{hint}"
    return message + hint


@dataclass(frozen=True, slots=True)
class Command:
    """One subcommand: its help line, how to build its arguments, and what runs it."""

    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: str
    """``module:function`` taking the parsed arguments and returning the exit status."""
    network: bool = True
    """Talks to agents: aiohttp is imported first without the system CAs (Shoal trusts only its
    cluster's CA, see :func:`gossip.tls.import_aiohttp_without_system_cas`)."""


def _probe_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    p.add_argument(
        "--interval", type=float, default=1.0, metavar="S", help="seconds between refreshes"
    )
    p.add_argument(
        "--root",
        type=Path,
        metavar="PATH",
        help="read sysfs under PATH instead of / and skip libraries and tools",
    )
    p.add_argument(
        "--sim",
        metavar="PROFILE",
        help="simulate a host: a preset (demo, dgx-h100, ...) or MODEL[:COUNT][,MODEL:COUNT]",
    )


def _init_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", default="shoal", help="the cluster's name (default: shoal)")
    p.add_argument(
        "--dir",
        type=Path,
        default=default_cluster_dir(),
        metavar="DIR",
        help="where to keep the CA and your identity (default: %(default)s)",
    )
    p.add_argument("--operator", metavar="NAME", help="your name in the certificate")


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=8, help="agents to start (default 8)")
    p.add_argument("--headless", action="store_true", help="run a workload, print figures")
    p.add_argument(
        "--duration",
        type=float,
        metavar="S",
        help="workload time (default 30; with --policy 60)",
    )
    p.add_argument(
        "--rate", type=float, metavar="JOBS/S", help="submit rate (default 4; with --policy 0.5)"
    )
    p.add_argument(
        "--policy",
        choices=("fifo", "shoal"),
        help="every agent places with this policy; headless: run the placement workload",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--idle",
        type=float,
        default=20.0,
        metavar="S",
        help="quiet spell before the workload; the idle footprint is its second half",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="headless: the figures as one JSON object; live: how to reach the mesh, as JSON",
    )
    p.add_argument("--keep", action="store_true", help="keep the demo's folder and logs")
    p.add_argument("--plain", action="store_true", help="a live table view instead of the TUI")


def _tui_arguments(p: argparse.ArgumentParser) -> None:
    ops_args.add_agent_and_identity_arguments(p, agent_flag="--join")
    p.add_argument("--readonly", action="store_true", help="hide every mutating key")
    p.add_argument(
        "--sim", type=int, metavar="N", help="a simulated mesh of N hosts, no agents (demos)"
    )
    p.add_argument("--theme", help="shoal or shoal-colorblind (default: from tui.toml)")
    p.add_argument("--ascii", action="store_true", help="ASCII bars, for plain terminals")


def _bootstrap_arguments(p: argparse.ArgumentParser) -> None:
    from agent.cli.bootstrap_args import add_bootstrap_arguments  # standard library only

    add_bootstrap_arguments(p)


OPS = "agent.cli.ops_cmd"
COMMANDS: tuple[Command, ...] = (
    Command(
        "probe",
        "show this host's GPUs (or a simulated or captured host)",
        _probe_arguments,
        "agent.cli.probe_cmd:cmd_probe",
        network=False,
    ),
    Command(
        "init",
        "create a cluster: its CA and your operator identity",
        _init_arguments,
        "agent.cli.init_cmd:cmd_init",
        network=False,
    ),
    Command(
        "agent",
        "run this host's agent in the foreground",
        add_agent_arguments,
        "agent.daemon.agent_cmd:run_agent",
    ),
    Command(
        "submit",
        "submit a job: shoal submit [options] -- COMMAND ...",
        ops_args.submit_arguments,
        "agent.cli.submit_cmd:cmd_submit",
    ),
    Command(
        "jobs",
        "list the mesh's jobs (JOB: one in detail)",
        ops_args.jobs_arguments,
        f"{OPS}:cmd_jobs",
    ),
    Command(
        "nodes",
        "list the mesh's nodes and their GPUs",
        ops_args.listing_arguments,
        f"{OPS}:cmd_nodes",
    ),
    Command(
        "events",
        "the mesh's event log (-f: follow it)",
        ops_args.events_arguments,
        "agent.cli.events_cmd:cmd_events",
    ),
    Command(
        "logs",
        "show a job's output (-f: wait for it to start, then follow it)",
        ops_args.logs_arguments,
        "agent.cli.logs_cmd:cmd_logs",
    ),
    Command(
        "history",
        "a node's or a job's stored samples as charts (--json, --csv for scripts); --fleet: "
        "the fleet's GPU utilization by vendor and model, and GPUs idle while jobs waited",
        history_args.history_arguments,
        "agent.cli.history_cmd:cmd_history",
    ),
    Command("cancel", "cancel a job", ops_args.cancel_arguments, f"{OPS}:cmd_cancel"),
    Command(
        "migrate",
        "checkpoint a job and restart it elsewhere from its checkpoint",
        ops_args.migrate_arguments,
        f"{OPS}:cmd_migrate",
    ),
    Command("cordon", "place no new work on a node", ops_args.node_arguments, f"{OPS}:cmd_cordon"),
    Command(
        "drain",
        "cordon a node and move its work off",
        ops_args.drain_arguments,
        f"{OPS}:cmd_drain",
    ),
    Command(
        "undrain",
        "make a node schedulable again",
        ops_args.node_arguments,
        f"{OPS}:cmd_undrain",
    ),
    Command(
        "revoke",
        "revoke nodes' certificates; the mesh shuns them",
        ops_args.revoke_arguments,
        f"{OPS}:cmd_revoke",
    ),
    Command(
        "data",
        "datasets: add one in place, list versions and copies, evict, pin",
        data_args.data_arguments,
        "agent.cli.data_cmd:cmd_data",
    ),
    Command(
        "user",
        "people: request and install your certificate; admins add, set, revoke, list",
        user_args.user_arguments,
        "agent.cli.user_cmd:cmd_user",
    ),
    Command(
        "team",
        "admin: a team's priority ceiling and GPU quotas in the team policy",
        user_args.team_arguments,
        "agent.cli.user_cmd:cmd_team",
    ),
    Command(
        "usage",
        "GPU-hours and energy by day and team, user or model, summed over the mesh",
        user_args.usage_arguments,
        "agent.cli.usage_cmd:cmd_usage",
    ),
    Command(
        "cache",
        "what each node keeps: datasets, images, environments, working folders",
        data_args.cache_arguments,
        "agent.cli.cache_cmd:cmd_cache",
    ),
    Command(
        "enroll",
        "on a host: make its key and a certificate request, or install the certificate",
        ops_args.enroll_arguments,
        "agent.cli.enroll_cmd:cmd_enroll",
        network=False,
    ),
    Command(
        "certify",
        "sign a host's certificate request with the cluster CA",
        ops_args.certify_arguments,
        "agent.cli.enroll_cmd:cmd_certify",
        network=False,
    ),
    Command(
        "demo",
        "a local mesh of simulated GPU hosts, live or headless",
        _demo_arguments,
        "agent.cli.demo:cmd_demo",
    ),
    Command(
        "tui",
        "the operator's terminal UI, joined to the mesh as a peer",
        _tui_arguments,
        "tui.cli:run_tui",  # the TUI loads only for this command
    ),
    Command(
        "bootstrap",
        "install, certify and start agents over SSH",
        _bootstrap_arguments,
        "agent.cli.bootstrap_cmd:run_bootstrap",
    ),
)
BY_NAME = {command.name: command for command in COMMANDS}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="shoal", description="Shoal: one masterless mesh for a mixed GPU fleet.")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for command in COMMANDS:
        command.arguments(sub.add_parser(command.name, help=command.help))
    return parser


def _runner(command: Command) -> Callable[[argparse.Namespace], int]:
    module, _, name = command.run.partition(":")
    run: Callable[[argparse.Namespace], int] = getattr(importlib.import_module(module), name)
    return run


def _stdout_closed() -> int:
    """The reader of our output has gone (``| head``): stop quietly, status 0. Later writes, and
    the flush at exit, go nowhere instead of raising again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0


def _main(argv: Sequence[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:  # --help, or a usage mistake (said on stderr)
        sys.stdout.flush()
        raise
    command = BY_NAME[args.subcommand]
    try:
        if command.network:
            from gossip.tls import import_aiohttp_without_system_cas

            import_aiohttp_without_system_cas()
        code = _runner(command)(args)
    except UserError as exc:
        print(f"shoal: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
    return int(code)


def main(argv: Sequence[str] | None = None) -> int:
    quiet_third_party_warnings()
    try:
        return _main(argv)
    except BrokenPipeError:
        return _stdout_closed()


if __name__ == "__main__":
    sys.exit(main())
