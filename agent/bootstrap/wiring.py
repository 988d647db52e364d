"""One mesh, not several: the seeds each new host's agent joins through, and the check that every
host of the run sees every other (and the mesh that was there before).

**Seeds.** A host's config lists a few agents, never itself: up to :data:`EXISTING_SEEDS` of the
mesh that runs already (``--join``, else the fleet file), then up to :data:`PEER_SEEDS` other hosts
of this run, those after it in the run's order (so the seed lists of a new fleet chain every host
to the next: a host whose agent restarts rejoins through the others, and the new hosts find each
other even when the fleet file names agents that are gone). The list depends only on the hosts and
the existing mesh, so a rerun writes the same config and restarts nothing.

**Addresses.** Every host is named by the address SSH connected to, resolved
(:func:`~agent.bootstrap.agentconfig.agent_address`): the one its peers dial, and the one the
operator's commands reach.

**The check.** Each host's own API must list every other host of the run, and every agent the
existing mesh lists, as alive; until it does (or the time is up, when the run fails naming who does
not see whom).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agent.bootstrap.hostrun import HostResult, HostWiring
from agent.operator.client import ApiClient, ApiError
from agent.operator.failover import first_answering
from gossip.identity import NodeIdentity

EXISTING_SEEDS = 2
PEER_SEEDS = 2
POLL_S = 1.0


@dataclass(frozen=True, slots=True)
class Reached:
    """A host of the run as reached over SSH: its name and its agent's address."""

    name: str
    address: str


def plan_wiring(hosts: Sequence[Reached], existing: Sequence[str]) -> dict[str, HostWiring]:
    """Each host's wiring (see the module's docstring), by host name."""
    ours = {h.address for h in hosts}
    before = tuple(dict.fromkeys(a for a in existing if a not in ours))
    out: dict[str, HostWiring] = {}
    for i, host in enumerate(hosts):
        ring = [hosts[(i + k) % len(hosts)] for k in range(1, len(hosts))]
        others = tuple(dict.fromkeys(h.address for h in ring if h.address != host.address))
        seeds = (*before[:EXISTING_SEEDS], *others[:PEER_SEEDS])
        out[host.name] = HostWiring(
            address=host.address, seeds=seeds, existing=before, others=others
        )
    return out


def _alive_agents(nodes: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """node id -> host name of every live agent listed."""
    out = {}
    for node in nodes:
        if node.get("state") == "alive" and node.get("role") in ("agent", None):
            node_id = str(node.get("node_id"))
            out[node_id] = str((node.get("host") or {}).get("hostname") or node_id[:8])
    return out


async def _existing_agents(identity: NodeIdentity, existing: Sequence[str]) -> dict[str, str]:
    if not existing:
        return {}
    try:
        async with await first_answering(identity, existing, what="the mesh") as client:
            return _alive_agents(await client.nodes())
    except ApiError:
        return {}


async def _seen_by(identity: NodeIdentity, address: str) -> set[str] | str:
    """The live agents the agent at ``address`` lists, or why it did not answer."""
    try:
        async with ApiClient(identity, address, timeout_s=5.0) as client:
            return set(_alive_agents(await client.nodes()))
    except ApiError as exc:
        return str(exc)


async def confirm_one_mesh(
    identity: NodeIdentity,
    results: Sequence[HostResult],
    existing: Sequence[str],
    timeout_s: float,
) -> list[HostResult]:
    """``results`` with every succeeded host that does not see the whole mesh turned into a
    failure naming whom it does not see (through its own API)."""
    ours = {str(r.node_id): r.host for r in results if r.ok and r.node_id and r.address}
    if not ours:
        return list(results)
    deadline = time.monotonic() + timeout_s
    problems: dict[str, str] = {}
    while True:
        theirs = await _existing_agents(identity, existing)
        expected = {**theirs, **ours}
        checked = [r for r in results if str(r.node_id) in ours]
        seen = await asyncio.gather(*(_seen_by(identity, str(r.address)) for r in checked))
        problems = {}
        for result, view in zip(checked, seen, strict=True):
            if isinstance(view, str):
                problems[result.host] = f"its API does not answer ({view})"
                continue
            missing = [
                f"{name} (node {node_id[:8]})"
                for node_id, name in expected.items()
                if node_id != result.node_id and node_id not in view
            ]
            if missing:
                problems[result.host] = (
                    f"it does not see {', '.join(missing)} as alive (asked {result.address})"
                )
        if not problems or time.monotonic() >= deadline:
            break
        await asyncio.sleep(POLL_S)
    waited = f"not one mesh after {timeout_s:.0f} s: "
    left = " (the agent is left running: rerun once fixed, or --uninstall)"
    return [
        replace(r, ok=False, action="split", message=waited + problems[r.host] + left)
        if r.host in problems
        else r
        for r in results
    ]
