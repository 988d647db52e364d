"""``shoal bootstrap``: add hosts to the fleet over SSH (see :mod:`agent.bootstrap`).

::

    shoal bootstrap [--join HOST:PORT] [--identity DIR] [--wheelhouse DIR] [--jobs N]
                    [--hosts-file FILE.toml] [--uninstall] [--upgrade] user@host[:port] ...
    shoal bootstrap --build-wheelhouse DIR [--platform TAG ...]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

from rich.console import Console

from agent.bootstrap.display import ProgressDisplay, failure_lines, summary_table
from agent.bootstrap.hosts import HostSpec, load_hosts_file, parse_target
from agent.bootstrap.install import InstallSource, local_version
from agent.bootstrap.runner import BootstrapOptions, HostResult, Reporter, run_hosts
from agent.bootstrap.service import SERVICE_KINDS
from agent.bootstrap.ssh import BootstrapError, SshOptions, default_known_hosts
from agent.bootstrap.wheelhouse import DEFAULT_PLATFORMS, DEFAULT_PYTHON_VERSION, build_wheelhouse
from agent.errors import UserError
from agent.paths import default_cluster_dir
from gossip.identity import IdentityError, load_cluster

DEFAULT_JOBS = 8


def add_bootstrap_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("hosts", nargs="*", metavar="user@host[:port]", help="hosts to set up")
    parser.add_argument("--hosts-file", type=Path, metavar="FILE", help="a TOML file of [[host]]")
    parser.add_argument(
        "--join",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="an agent already in the mesh: the new agents join through it and bootstrap "
        "confirms the join there (repeatable)",
    )
    parser.add_argument(
        "--identity",
        type=Path,
        metavar="DIR",
        default=None,
        help="the cluster directory of shoal init (CA and your operator identity)",
    )
    parser.add_argument(
        "--wheelhouse",
        type=Path,
        metavar="DIR",
        help="install from these wheels (uploaded; pip --no-index) instead of the package index",
    )
    parser.add_argument("--index-url", metavar="URL", help="the package index to install from")
    parser.add_argument(
        "--shoal-version",
        metavar="VERSION",
        default=None,
        help=f"the Shoal version to install (default: the one running here, {local_version()})",
    )
    parser.add_argument(
        "--system-site-packages",
        action="store_true",
        help="let the venv use the packages of the interpreter it is built from (even when that "
        "is itself a venv) and install Shoal alone, without its dependencies",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help=f"hosts at once (default {DEFAULT_JOBS}); also the number of running nodes "
        "upgraded at once (default 1: a rolling upgrade)",
    )
    parser.add_argument("--uninstall", action="store_true", help="remove Shoal, revoke the node")
    parser.add_argument(
        "--upgrade",
        action="store_true",
        help="reinstall and restart even when the host already runs this version",
    )
    parser.add_argument(
        "--known-hosts",
        type=Path,
        default=None,
        metavar="FILE",
        help="known_hosts file to check host keys against (default ~/.ssh/known_hosts)",
    )
    parser.add_argument(
        "--ssh-key", type=Path, action="append", default=[], metavar="FILE", help="a private key"
    )
    parser.add_argument(
        "--remote-dir",
        metavar="DIR",
        help="where Shoal lives on the hosts (default ~/.local/share/shoal, /opt/shoal for root)",
    )
    parser.add_argument(
        "--python", metavar="PATH", help="the interpreter on the hosts to build the venv from"
    )
    parser.add_argument(
        "--service",
        choices=("auto", *SERVICE_KINDS),
        default="auto",
        help="how to keep the agent running (default: systemd, launchd or a supervised process)",
    )
    parser.add_argument(
        "--no-wait", action="store_true", help="do not wait for the nodes to join the mesh"
    )
    parser.add_argument(
        "--join-timeout", type=float, default=120.0, metavar="S", help="wait this long to join"
    )
    parser.add_argument(
        "--cert-days", type=int, default=365, metavar="N", help="node certificate lifetime"
    )
    parser.add_argument(
        "--drain-grace", type=float, default=60.0, metavar="S", help="grace for draining jobs"
    )
    parser.add_argument(
        "--build-wheelhouse", type=Path, metavar="DIR", help="prepare a wheelhouse and exit"
    )
    parser.add_argument(
        "--platform",
        action="append",
        default=[],
        metavar="TAG",
        help=f"target platform for --build-wheelhouse (default {', '.join(DEFAULT_PLATFORMS)})",
    )
    parser.add_argument(
        "--target-python",
        default=DEFAULT_PYTHON_VERSION,
        metavar="X.Y",
        help="Python version the wheelhouse targets",
    )


def collect_hosts(args: argparse.Namespace) -> list[HostSpec]:
    specs = [parse_target(h) for h in args.hosts]
    if args.hosts_file is not None:
        specs += load_hosts_file(args.hosts_file)
    if not specs:
        raise UserError("no hosts: name user@host[:port] or pass --hosts-file FILE")
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UserError(f"host {dupes[0]} is named twice")
    return specs


def options_from_args(args: argparse.Namespace) -> BootstrapOptions:
    directory = args.identity or default_cluster_dir()
    try:
        cluster = load_cluster(directory)
    except IdentityError as exc:
        raise UserError(
            f"cannot load the cluster from {directory} ({exc}); run 'shoal init' or pass "
            "--identity DIR"
        ) from None
    if args.wheelhouse is not None and not args.wheelhouse.is_dir():
        raise UserError(f"--wheelhouse {args.wheelhouse}: not a folder")
    source = InstallSource(
        version=args.shoal_version or local_version(),
        wheelhouse=args.wheelhouse,
        inherit_site_packages=args.system_site_packages,
        index_url=args.index_url,
    )
    if args.wheelhouse is not None:
        try:
            source.build_digest()  # a wheelhouse without the wanted wheel fails here, once
        except BootstrapError as exc:
            raise UserError(str(exc)) from None
    return BootstrapOptions(
        cluster=cluster,
        source=source,
        ssh=SshOptions(
            known_hosts=args.known_hosts or default_known_hosts(),
            client_keys=tuple(args.ssh_key),
        ),
        join=tuple(args.join),
        remote_dir=args.remote_dir,
        python=args.python,
        service=args.service,
        force_reinstall=args.upgrade,
        wait=not args.no_wait,
        join_timeout_s=args.join_timeout,
        cert_valid_for=timedelta(days=args.cert_days),
        drain_grace_s=args.drain_grace,
    )


class _WordsParser(argparse.ArgumentParser):
    """The ``shoal bootstrap`` parser for words that do not come from a shell: no ``--help``, and
    a mistake raises :class:`UserError` instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise UserError(message)


def parse_bootstrap_args(words: Sequence[str]) -> argparse.Namespace:
    """``shoal bootstrap``'s arguments from a list of words, exactly as the command line reads
    them (the TUI's add-host form builds such a list); a mistake raises :class:`UserError`."""
    parser = _WordsParser(prog="shoal bootstrap", add_help=False)
    add_bootstrap_arguments(parser)
    return parser.parse_args(list(words))


@dataclass(frozen=True, slots=True)
class BootstrapPlan:
    """A checked ``shoal bootstrap`` run: the hosts, the options and how many hosts at once."""

    specs: tuple[HostSpec, ...]
    options: BootstrapOptions
    jobs: int
    upgrade_jobs: int
    uninstall: bool = False

    @property
    def hosts(self) -> list[str]:
        """The hosts as every reporter names them."""
        return [s.name for s in self.specs]

    async def run(self, reporter: Reporter) -> list[HostResult]:
        """Every host through :func:`~agent.bootstrap.runner.run_hosts`; one result per host."""
        return await run_hosts(
            self.specs,
            self.options,
            reporter,
            jobs=self.jobs,
            upgrade_jobs=self.upgrade_jobs,
            uninstall=self.uninstall,
        )


def plan_bootstrap(args: argparse.Namespace) -> BootstrapPlan:
    """The hosts and options of ``args``, checked; :class:`UserError` when something is wrong.

    Reads the cluster directory and the wheelhouse (files only, no network).
    """
    specs = collect_hosts(args)
    options = options_from_args(args)
    jobs = args.jobs if args.jobs is not None else DEFAULT_JOBS
    upgrade_jobs = args.jobs if args.jobs is not None else 1
    if jobs < 1:
        raise UserError("--jobs must be at least 1")
    return BootstrapPlan(
        specs=tuple(specs),
        options=options,
        jobs=jobs,
        upgrade_jobs=upgrade_jobs,
        uninstall=args.uninstall,
    )


def bootstrap(
    args: argparse.Namespace, reporter: Reporter | None = None, console: Console | None = None
) -> list[HostResult]:
    """Run the hosts of ``args``; returns one result per host (printed by :func:`run_bootstrap`)."""
    plan = plan_bootstrap(args)
    if reporter is not None:
        return asyncio.run(plan.run(reporter))
    with ProgressDisplay(console or Console(stderr=True), plan.hosts) as display:
        return asyncio.run(plan.run(display))


def run_bootstrap(args: argparse.Namespace) -> int:
    """The ``shoal bootstrap`` command: 0 when every host succeeded, 1 otherwise."""
    if args.build_wheelhouse is not None:
        wheels = build_wheelhouse(
            args.build_wheelhouse, args.platform or DEFAULT_PLATFORMS, args.target_python
        )
        print(f"{len(wheels)} wheels in {args.build_wheelhouse}")
        return 0
    console = Console()
    results = bootstrap(args, console=Console(stderr=True))
    console.print(summary_table(results))
    for line in failure_lines(results):
        print(line, file=sys.stderr)
    return 0 if all(r.ok for r in results) else 1
