"""Devices an owner offered a moment ago: in use, in its eyes, until gossip can have said so.

An owner places jobs from its gossip view of the runners' free devices. A runner republishes
its node record as soon as it starts a job, but the record takes a moment to reach every owner
(longer on a loaded machine). Until it does, the owner that just started a job there sees the
devices free and may offer them again; and an owner whose offer a runner declined because the
devices were in use (another owner got there first) ranks the same stale devices first again at
its next pass, and is declined again. Every policy that ranks the same best place for every
owner (first fit's first node, the Shoal policy's fastest device) collides there most.

:class:`RecentOffers` keeps the devices of each offer as in use from the moment the owner reserves
them for it (the job is then neither pending nor running in anyone's view), and again from when a
runner started or declined it, for ``hold_s``, a few gossip rounds; the placements count them as
busy. Sans-I/O: ``now`` is passed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from agent.policy.adapt import BUSY
from agent.policy.snapshot import Device, Node

HOLD_S = 3.0
"""How long an offered device stays in use in the owner's eyes (gossip spreads a record to
every agent of a loaded 32-agent loopback mesh in well under this)."""


@dataclass(slots=True)
class RecentOffers:
    hold_s: float = HOLD_S
    _until: dict[tuple[str, str], float] = field(default_factory=dict)

    def note(self, node_id: str, devices: Iterable[str], now: float) -> None:
        """``devices`` on ``node_id`` were reserved for an offer, or an offer of them was
        started or declined, at ``now``."""
        for key in devices:
            self._until[(node_id, key)] = now + self.hold_s

    def held(self, now: float) -> dict[str, frozenset[str]]:
        """Node id -> the devices still held at ``now`` (the expired ones are forgotten)."""
        for k in [k for k, until in self._until.items() if until <= now]:
            del self._until[k]
        out: dict[str, set[str]] = {}
        for node_id, key in self._until:
            out.setdefault(node_id, set()).add(key)
        return {n: frozenset(keys) for n, keys in out.items()}


def mark_held(nodes: Iterable[Node], held: Mapping[str, frozenset[str]]) -> tuple[Node, ...]:
    """``nodes`` with the ``held`` devices busy (a device already busy keeps its holder)."""
    out = []
    for node in nodes:
        keys = held.get(node.node_id)
        if keys:
            devices = tuple(
                replace(d, whole_job=BUSY) if d.key in keys and _idle(d) else d
                for d in node.devices
            )
            node = replace(node, devices=devices)
        out.append(node)
    return tuple(out)


def _idle(device: Device) -> bool:
    return device.whole_job is None and not device.shares
