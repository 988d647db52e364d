"""Many hosts at once, wired into one mesh, remembered as the fleet.

1. Every host is reached over SSH (at most ``jobs`` handshakes at a time); the address each
   connection reached is the one its agent advertises.
2. Each host's seeds are planned among the existing mesh and the other hosts of the run
   (:func:`agent.bootstrap.wiring.plan_wiring`), then every host is installed, certified, started
   and confirmed in the mesh (:func:`agent.bootstrap.runner.bootstrap_host`), ``jobs`` at a time,
   upgrades of running nodes ``upgrade_jobs`` at a time.
3. Every host must see every other, and the mesh that was there before
   (:func:`agent.bootstrap.wiring.confirm_one_mesh`), or its result says whom it does not see.
4. The agents confirmed are written to the cluster's ``fleet.toml`` (:mod:`agent.operator.fleet`),
   where every command finds them; ``--uninstall`` removes theirs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from agent.bootstrap.agentconfig import agent_address
from agent.bootstrap.hostrun import BootstrapOptions, HostResult, HostRun, Reporter
from agent.bootstrap.hosts import HostSpec
from agent.bootstrap.runner import bootstrap_host, connect_host, uninstall_host
from agent.bootstrap.wiring import Reached, confirm_one_mesh, plan_wiring
from agent.operator.fleet import FleetAgent, load_fleet, save_fleet


def _fleet_agents(results: Sequence[HostResult]) -> list[FleetAgent]:
    return [
        FleetAgent(address=r.address, node_id=r.node_id, ssh=r.host)
        for r in results
        if r.ok and r.address and r.node_id
    ]


def remember(options: BootstrapOptions, results: Sequence[HostResult], uninstall: bool) -> None:
    """Add the agents confirmed to the fleet file (or, uninstalling, remove theirs)."""
    if options.fleet_dir is None or not (options.wait or uninstall):
        return  # only agents seen in the mesh are remembered
    fleet = load_fleet(options.fleet_dir)
    if uninstall:
        gone = [
            FleetAgent(address=r.address or "", node_id=r.node_id, ssh=r.host)
            for r in results
            if r.ok
        ]
        updated = fleet.without(gone)
    else:
        updated = fleet.merged(_fleet_agents(results))
    if updated != fleet:
        save_fleet(options.fleet_dir, updated)


async def run_hosts(
    specs: Sequence[HostSpec],
    options: BootstrapOptions,
    reporter: Reporter,
    *,
    jobs: int,
    upgrade_jobs: int = 1,
    uninstall: bool = False,
) -> list[HostResult]:
    """Every host, as the module's docstring says; one result per host, in ``specs``' order."""
    slots = asyncio.Semaphore(max(1, jobs))
    upgrade_slots = asyncio.Semaphore(max(1, upgrade_jobs))

    async def reach(spec: HostSpec) -> HostRun | HostResult:
        async with slots:
            return await connect_host(spec, options, reporter)

    reached = list(await asyncio.gather(*(reach(s) for s in specs)))
    runs = [r for r in reached if isinstance(r, HostRun)]
    wiring = plan_wiring(
        [Reached(r.name, agent_address(r.spec, r.peer_ip)) for r in runs], options.join
    )

    async def one(item: HostRun | HostResult) -> HostResult:
        if isinstance(item, HostResult):
            reporter.step(item.host, "failed")
            return item
        async with slots:
            if uninstall:
                result = await uninstall_host(item, options, wiring[item.name])
            else:
                result = await bootstrap_host(item, options, wiring[item.name], upgrade_slots)
        if result.ok and options.wait and not uninstall:
            reporter.step(result.host, "checking that every host sees every other")
        else:
            reporter.step(result.host, "done" if result.ok else "failed")
        return result

    try:
        results = list(await asyncio.gather(*(one(item) for item in reached)))
    finally:
        for run in runs:
            run.close()
    if options.wait and not uninstall:
        existing = next(iter(wiring.values())).existing if wiring else ()
        results = await confirm_one_mesh(
            options.cluster.operator, results, existing, options.join_timeout_s
        )
        for result in results:
            if result.node_id and result.address:
                reporter.step(result.host, "done" if result.ok else "failed")
    remember(options, results, uninstall)
    return results
