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
runner started or declined it, for ``hold_s``, a few gossip rounds, or, once the offer was
answered, until the runner's next status record arrives (it says what became of them), or the
job's end is reported; the placements count them as busy. Without the record's word a GPU whose
job ended a moment after a declined offer stood idle for the rest of the hold. Sans-I/O: ``now``
and the records are passed in.
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
    _until: dict[tuple[str, str], tuple[float, object | None]] = field(default_factory=dict)
    """(node, device) -> until when, and the node's record it was noted against (or None)."""

    def note(
        self, node_id: str, devices: Iterable[str], now: float, record: object | None = None
    ) -> None:
        """``devices`` on ``node_id`` were reserved for an offer, or an offer of them was
        started or declined, at ``now``. ``record``: the node's status record as the view held
        it then (an answered offer): a newer one says what became of the devices, and ends the
        hold (:meth:`held`); ``None``: an offer on its way, held for the whole ``hold_s``."""
        for key in devices:
            self._until[(node_id, key)] = (now + self.hold_s, record)

    def forget(self, node_id: str, devices: Iterable[str]) -> None:
        """The offer of ``devices`` on ``node_id`` is over (its job ended): no longer held."""
        for key in devices:
            self._until.pop((node_id, key), None)

    def held(
        self, now: float, records: Mapping[str, object | None] | None = None
    ) -> dict[str, frozenset[str]]:
        """Node id -> the devices still held at ``now`` (the expired ones are forgotten, and,
        with ``records``, the node's status record in the view now, those whose node has sent
        a newer record than the one they were noted against)."""
        for k in [k for k, v in self._until.items() if _over(k[0], v, now, records)]:
            del self._until[k]
        out: dict[str, set[str]] = {}
        for node_id, key in self._until:
            out.setdefault(node_id, set()).add(key)
        return {n: frozenset(keys) for n, keys in out.items()}


def _over(
    node_id: str,
    held: tuple[float, object | None],
    now: float,
    records: Mapping[str, object | None] | None,
) -> bool:
    until, record = held
    if until <= now:
        return True
    return record is not None and records is not None and records.get(node_id) is not record


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
