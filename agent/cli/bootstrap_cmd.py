"""``shoal bootstrap``: add hosts to the fleet over SSH (see :mod:`agent.bootstrap`).

::

    shoal bootstrap [--accept-new] [--join HOST:PORT] [--identity DIR] [--wheelhouse DIR]
                    [--jobs N] [--hosts-file FILE.toml] [--uninstall] [--upgrade]
                    user@host[:port] ...
    shoal bootstrap --build-wheelhouse DIR [--platform TAG ...]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass
from datetime import timedelta

from rich.console import Console

from agent.bootstrap.display import (
    ProgressDisplay,
    failure_lines,
    note_lines,
    summary_table,
    warning_lines,
)
from agent.bootstrap.fleetrun import run_hosts
from agent.bootstrap.hostrun import BootstrapOptions, HostResult, Reporter
from agent.bootstrap.hosts import HostSpec, load_hosts_file, parse_target
from agent.bootstrap.install import InstallSource
from agent.bootstrap.shipping import LocalBuild, build_checkout_wheel
from agent.bootstrap.ssh import BootstrapError, SshOptions, default_known_hosts
from agent.bootstrap.wheelhouse import build_wheelhouse, local_version, project_root
from agent.cli.bootstrap_args import DEFAULT_JOBS, DEFAULT_PLATFORMS
from agent.common.errors import UserError
from agent.common.paths import default_cluster_dir
from agent.operator.fleet import fleet_path, load_fleet
from agent.operator.terminal import console
from gossip.identity import IdentityError, load_cluster


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


def _source(args: argparse.Namespace) -> InstallSource:
    """Where Shoal comes from: ``--wheelhouse``; else, for Shoal run from a checkout (which the
    index does not have), this checkout's own build, shipped with its dependencies; else (or
    with ``--index-url`` or another ``--shoal-version``) the package index."""
    if args.wheelhouse is not None and not args.wheelhouse.is_dir():
        raise UserError(f"--wheelhouse {args.wheelhouse}: not a folder")
    version = args.shoal_version or local_version()
    local_build = None
    checkout = project_root()
    if (
        args.wheelhouse is None
        and args.index_url is None
        and version == local_version()
        and checkout is not None
    ):
        local_build = LocalBuild(build_checkout_wheel(checkout, version), checkout)
    source = InstallSource(
        version=version,
        wheelhouse=args.wheelhouse,
        inherit_site_packages=args.system_site_packages,
        index_url=args.index_url,
        local_build=local_build,
    )
    if args.wheelhouse is not None:
        try:
            source.build_digest()  # a wheelhouse without the wanted wheel fails here, once
        except BootstrapError as exc:
            raise UserError(str(exc)) from None
    return source


def options_from_args(args: argparse.Namespace) -> BootstrapOptions:
    directory = args.identity or default_cluster_dir()
    try:
        cluster = load_cluster(directory)
    except IdentityError as exc:
        raise UserError(
            f"cannot load the cluster from {directory} ({exc}); run 'shoal init' or pass "
            "--identity DIR"
        ) from None
    join = tuple(args.join) or tuple(load_fleet(directory).addresses)
    return BootstrapOptions(
        cluster=cluster,
        source=_source(args),
        ssh=SshOptions(
            known_hosts=args.known_hosts or default_known_hosts(),
            client_keys=tuple(args.ssh_key),
            accept_new=args.accept_new,
        ),
        join=join,
        fleet_dir=directory,
        remote_dir=args.remote_dir,
        python=args.python,
        service=args.service,
        force_reinstall=args.upgrade,
        wait=not args.no_wait,
        join_timeout_s=args.join_timeout,
        cert_valid_for=timedelta(days=args.cert_days),
        drain_grace_s=args.drain_grace,
    )


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
        """Every host through :func:`~agent.bootstrap.fleetrun.run_hosts`; one per host."""
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


def _announce(plan: BootstrapPlan, console: Console) -> None:
    """Say where Shoal comes from when it is not the obvious place (the package index)."""
    build = plan.options.source.local_build
    if build is not None and not plan.uninstall:
        console.print(
            f"shoal {plan.options.source.version} runs from the checkout {build.checkout}, which "
            f"the package index does not have: each host gets this checkout's wheel "
            f"({build.wheel.name}) and its dependencies (--index-url or --wheelhouse to choose "
            "otherwise)",
            highlight=False,
            soft_wrap=True,
        )


def bootstrap(
    args: argparse.Namespace, reporter: Reporter | None = None, console: Console | None = None
) -> list[HostResult]:
    """Run the hosts of ``args``; returns one result per host (printed by :func:`run_bootstrap`)."""
    plan = plan_bootstrap(args)
    if reporter is not None:
        return asyncio.run(plan.run(reporter))
    err = console or Console(stderr=True)
    _announce(plan, err)
    with ProgressDisplay(err, plan.hosts) as display:
        return asyncio.run(plan.run(display))


def run_bootstrap(args: argparse.Namespace) -> int:
    """The ``shoal bootstrap`` command: 0 when every host succeeded, 1 otherwise."""
    if args.build_wheelhouse is not None:
        wheels = build_wheelhouse(
            args.build_wheelhouse, args.platform or DEFAULT_PLATFORMS, args.target_python
        )
        print(f"{len(wheels)} wheels in {args.build_wheelhouse}")
        return 0
    results = bootstrap(args, console=Console(stderr=True))
    out = console()
    out.print(summary_table(results, out.width))
    for line in note_lines(results):
        print(line)
    for line in warning_lines(results):
        print(line, file=sys.stderr)
    for line in failure_lines(results):
        print(line, file=sys.stderr)
    directory = args.identity or default_cluster_dir()
    if any(r.ok for r in results) and not args.no_wait:
        count = len(load_fleet(directory).agents)
        print(
            f"fleet: {count} agent{'s' * (count != 1)} in {fleet_path(directory)}; shoal "
            "commands talk to the first that answers unless --agent or $SHOAL_AGENT names one"
        )
    return 0 if all(r.ok for r in results) else 1
