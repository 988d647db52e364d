"""What an agent says of itself in gossip, and how often: the records this node publishes.

- ``inventory`` once at start: host facts (hostname, or the configured name; OS, CPU
  architecture), API address, labels, boot count, the job-spec features this agent runs, and
  every device's static facts with its links and MIG instances. An inventory larger than one
  record goes on in ``inventory/1``, ``inventory/2``... (``agent.wire.inventory.InventoryRecord``);
  nothing is dropped.
- ``telemetry``: on change beyond 5 utilization points, 1 GiB of memory or 3 degrees, at most
  every :func:`spacing_s` (once a second up to :data:`MESH_CHANGES_PER_S` agents, then slower as
  the mesh grows), and at least every :func:`quiet_every_s` (``telemetry_heartbeat_s``, longer
  past :data:`QUIET_AGENTS` agents; the record says which, for readers to judge its age by).
- ``node``: drain state, running jobs, free devices and shares at once when they change (what
  placement reads); a change in the rest alone (the length of the queue this node owns, the
  running jobs' progress, their saves, staging lines) at most every :data:`PROGRESS_EVERY_S`.
- ``events``: this node's recent events at most every :func:`spacing_s` (:data:`EVENTS_EVERY_S`
  up to :data:`MESH_CHANGES_PER_S` agents).
- ``place``: the datasets this node holds with their sizes (at once when a scan finds a change)
  and its network coordinate (once it has measured a round trip; again when it moved more than
  :data:`COORD_MOVED_S`, at most every :data:`PLACE_EVERY_S`, longer past :data:`QUIET_AGENTS`
  agents: :func:`quiet_every_s`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping

from agent.daemon.config import AgentConfig
from agent.daemon.devices import HostDevices
from agent.job.jobspec import SUPPORTED_FEATURES
from agent.mesh.events import GOSSIPED_FOR_S, EventLog
from agent.wire.codec import MAX_RECORD_BYTES, WireError
from agent.wire.inventory import InventoryRecord
from agent.wire.place import PLACE, HeldContent, HeldVersion, PlaceRecord, coord_moved_s
from agent.wire.records import MAX_TELEMETRY_EVERY_S, NodeRecord, TelemetryRecord
from gossip.vivaldi import Coordinate
from probers.records import DeviceStatic

log = logging.getLogger("shoal.agent")

GIB = 1024**3
PROGRESS_EVERY_S = 2.0
"""A change in what placement does not read (the queue's length, progress, saves, staging lines)
republishes the node record at most this often; what placement reads (drain, running jobs, free
devices, shares) is republished at once. The queue's length once went at once: every submission
and every placement republished its owner's node record to the whole mesh."""
EVENTS_EVERY_S = 1.0
"""This node's recent events are republished at most this often (each event used to resend
them all: a third of the gossip bytes of a mesh under load)."""
PLACE_EVERY_S = 120.0
"""A moved coordinate alone republishes the ``place`` record at most this often. Coordinates
settle slowly, and on a busy host they wander by a millisecond or so with its event loop's
delays: at 30 s this record was half of the records an idle mesh of 16 agents gossiped."""
COORD_MOVED_S = 0.001
"""How far (in RTT) a coordinate must move before it is worth telling everyone."""
MESH_CHANGES_PER_S = 16.0
"""Telemetry changes and event records, each kind, that the whole mesh publishes a second at
most (:func:`spacing_s`). Every agent applies every agent's records, so a fixed interval per agent
made each agent's share of the work grow with the mesh: a GPU whose utilization moves with its
jobs republished its telemetry every second, 1,000 records a second for each agent of a fleet of
1,000. Placement reads neither (the node record says what is free, at once)."""
QUIET_AGENTS = 16.0
"""Past this many agents, what an agent republishes though nothing (or little) changed, the
telemetry heartbeat and a coordinate that wandered, goes out the less often the larger the mesh
(:func:`quiet_every_s`): the whole mesh sends about this many of each per interval. At fixed
intervals these were all the records an idle mesh gossiped, each agent's share growing with the
mesh."""
UNMEASURED_LOOK_S = 1.0
"""While this node's first coordinate is unsaid, how often the publisher looks for it."""


def spacing_s(base_s: float, live_agents: int) -> float:
    """How often one agent may publish a kind of record that changes at will: ``base_s``, or
    slower in a mesh large enough that ``MESH_CHANGES_PER_S`` would be exceeded."""
    return max(base_s, live_agents / MESH_CHANGES_PER_S)


def quiet_every_s(base_s: float, live_agents: int) -> float:
    """How often one agent republishes what did not change (its telemetry heartbeat, from
    ``telemetry_heartbeat_s``) or barely did (its coordinate, :data:`PLACE_EVERY_S`): ``base_s``,
    times the mesh's size over :data:`QUIET_AGENTS` past that many agents (a 60 s heartbeat is
    8 minutes at 128 agents). A telemetry record says its heartbeat (``every_s``): readers call
    telemetry stale after one and a half of what its node promised."""
    return base_s * max(1.0, live_agents / QUIET_AGENTS)


class Publisher:
    def __init__(
        self,
        publish: Callable[[str, bytes], None],
        config: AgentConfig,
        devices: HostDevices,
        events: EventLog,
        node_doc: Callable[[], NodeRecord],
        coordinate: Callable[[], Coordinate | None] = lambda: None,
        *,
        features: frozenset[str] = SUPPORTED_FEATURES,
        container_runtime: str | None = None,
        live_agents: Callable[[], int] = lambda: 1,
    ) -> None:
        """``node_doc``: the ``node`` record as it would be now (drain, queue, running, free,
        progress); ``coordinate``: this node's network coordinate, ``None`` while unmeasured;
        ``features``: the job-spec features this agent runs (``image`` only with a container
        runtime); ``container_runtime``: which (``podman``, ``docker``), in its inventory;
        ``live_agents``: how many agents the mesh has now (:func:`spacing_s`)."""
        self._live_agents = live_agents
        self._publish = publish
        self._config = config
        self._features = features
        self._container_runtime = container_runtime
        self._devices = devices
        self._events = events
        self._node_doc = node_doc
        self.rates: Callable[[], Mapping[str, float]] = dict
        """The bytes/s this node measured from each holder it fetched from (the place record
        carries them; a holder measured for the first time republishes it at its next look)."""
        self.content: Callable[[], tuple[HeldContent, ...]] = tuple
        """The images and environments held here whole, for the ``place`` record."""
        self._node_dirty = True
        self._node_sent: NodeRecord | None = None
        self._node_at = float("-inf")
        self._events_dirty = False
        self._events_at = float("-inf")
        self._last_telemetry: dict[str, tuple[float, float, float]] = {}
        self._telemetry_at = float("-inf")
        self._telemetry_every_s = config.telemetry_heartbeat_s
        """The heartbeat the last telemetry record promised (the next comes within it)."""
        self._coordinate = coordinate
        self._datasets: dict[str, int] = dict.fromkeys(config.datasets, 0)
        self._versions: tuple[HeldVersion, ...] = ()
        self._place_sent: PlaceRecord | None = None
        self._place_at = float("-inf")
        self._place_dirty = True
        self.wake: Callable[[], None] = lambda: None
        """Called when something becomes due to publish (the agent's loop then ticks)."""

    def node_changed(self) -> None:
        self._node_dirty = True
        self.wake()

    def events_changed(self) -> None:
        self._events_dirty = True
        self.wake()

    def datasets_scanned(
        self, held: dict[str, int], versions: tuple[HeldVersion, ...] = ()
    ) -> None:
        """What a scan of the datasets found; published at the next tick if it changed."""
        if held != self._datasets or versions != self._versions:
            self._datasets = held
            self._versions = versions
            self._place_dirty = True
            self.wake()

    def content_changed(self) -> None:
        """An image or environment was added or removed here: the place record says so at the
        next tick."""
        self._place_dirty = True
        self.wake()

    def inventory(self, address: str, boot: int) -> None:
        report = self._devices.report
        host = report.host
        if self._config.name:
            host = dataclasses.replace(host, hostname=self._config.name)
        record = InventoryRecord(
            host=host,
            api=address,
            labels=self._config.all_labels(),
            boot=boot,
            devices=tuple(d.static for d in report.devices),
            features=tuple(sorted(self._features)),
            container_runtime=self._container_runtime,
        )
        try:
            records = record.encode()
        except WireError as exc:  # a device alone larger than a record: say so, keep the rest
            log.error("inventory not published whole: %s", exc)
            self._events.add("inventory_too_large", str(exc))
            records = record._replace(devices=_fitting(record)).encode()
        for kind, payload in records:
            self._publish(kind, payload)

    def telemetry(self, now: float | None = None, *, force: bool = False) -> None:
        now = time.monotonic() if now is None else now
        devices = self._devices.report.devices
        current = {
            d.static.key: (
                d.sample.util_pct or 0.0,
                float(d.sample.mem_used_bytes or 0),
                d.sample.temp_c or 0.0,
            )
            for d in devices
        }
        last = self._last_telemetry
        changed = any(
            key not in last
            or abs(u - last[key][0]) >= 5
            or abs(m - last[key][1]) >= GIB
            or abs(t - last[key][2]) >= 3
            for key, (u, m, t) in current.items()
        )
        heartbeat = now - self._telemetry_at >= self._telemetry_every_s  # as the last promised
        live = self._live_agents()
        if (
            not force
            and not heartbeat
            and not (changed and now - self._telemetry_at >= spacing_s(1.0, live))
        ):
            return
        self._last_telemetry = current
        self._telemetry_at = now
        every_s = quiet_every_s(self._config.telemetry_heartbeat_s, live)
        self._telemetry_every_s = min(every_s, MAX_TELEMETRY_EVERY_S)  # what a record may say
        record = TelemetryRecord(
            at=time.time(),
            samples=tuple(d.sample for d in devices),
            every_s=self._telemetry_every_s,
        )
        self._publish("telemetry", record.encode())

    def due_in_s(self, now: float) -> float:
        """How long until :meth:`tick` has something to publish (0: now). Nothing becoming
        dirty meanwhile (which calls :attr:`wake`), the agent may sleep this long."""
        due = [self._place_at + self._place_every_s() - now]
        if self._node_dirty:
            progress_only = self._node_sent is not None and (
                self._node_doc().placement_view() == self._node_sent.placement_view()
            )
            due.append(self._node_at + PROGRESS_EVERY_S - now if progress_only else 0.0)
        if self._events_dirty:
            due.append(self._events_at + self._events_every_s() - now)
        if self._place_dirty:
            due.append(0.0)
        elif self._place_sent is None or self._place_sent.coord is None:
            due.append(UNMEASURED_LOOK_S)
        return max(0.0, min(due))

    def tick(self, now: float) -> None:
        """What is due of the node record, the events and the ``place`` record, published."""
        if self._node_dirty:
            self.node(now)
        if self._events_dirty and now - self._events_at >= self._events_every_s():
            self.events(now)
        sent = self._place_sent
        unsaid = sent is None or sent.coord is None  # a first measured coordinate goes at once
        if (
            self._place_dirty
            or now - self._place_at >= self._place_every_s()
            or (unsaid and self._coordinate() is not None)
        ):
            self.place(now)

    def _place_every_s(self) -> float:
        return quiet_every_s(PLACE_EVERY_S, self._live_agents())

    def place(self, now: float) -> None:
        """The ``place`` record, when its datasets changed or its coordinate moved."""
        coord = self._coordinate()
        sent = self._place_sent
        rates = self.rates()
        if (
            not self._place_dirty
            and sent is not None
            and coord_moved_s(sent.coord, coord) < COORD_MOVED_S
            and set(rates) <= set(sent.rates)
        ):
            self._place_at = now
            return
        self._place_dirty = False
        self._place_at = now
        record = PlaceRecord(
            datasets=dict(self._datasets),
            coord=coord,
            versions=self._versions,
            rates=rates,
            content=self.content(),
        )
        if (
            sent is None
            and not record.datasets
            and not record.versions
            and not record.content
            and coord is None
        ):
            return  # nothing to say yet: no record until a dataset or a measured round trip
        payload, left_out = record.encode()
        if left_out and (
            sent is None or (sent.datasets, sent.versions) != (record.datasets, record.versions)
        ):
            log.warning("place record: %d dataset(s) do not fit and are not gossiped", left_out)
            self._events.add("datasets_not_gossiped", f"{left_out} dataset(s) do not fit")
        self._place_sent = record
        self._publish(PLACE, payload)

    def node(self, now: float) -> None:
        """The node record, when it says something new (see :data:`PROGRESS_EVERY_S`)."""
        doc = self._node_doc()
        sent = self._node_sent
        if sent is not None and doc.placement_view() == sent.placement_view():
            if _said(doc) == _said(sent):
                self._node_dirty = False  # an owner's save that changed nothing others read
                return
            if now - self._node_at < PROGRESS_EVERY_S:
                return  # still dirty: the rest goes out when the interval is up
        self._node_dirty = False
        self._node_sent, self._node_at = doc, now
        self._publish("node", doc.encode())

    def _events_every_s(self) -> float:
        return spacing_s(EVENTS_EVERY_S, self._live_agents())

    def events(self, now: float) -> None:
        every_s = self._events_every_s()
        self._events_dirty = False
        self._events_at = now
        # An event stays in the record one interval longer than the record is apart: each is
        # in at least one version however the mesh's size moves the interval.
        payload = self._events.gossip_record(GOSSIPED_FOR_S + every_s - EVENTS_EVERY_S).encode()
        if len(payload) <= MAX_RECORD_BYTES:
            self._publish("events", payload)


def _said(doc: NodeRecord) -> tuple[object, ...]:
    """What the node record says beside what placement reads."""
    return (doc.queue, doc.progress, doc.saved, doc.staging)


def _fitting(record: InventoryRecord) -> tuple[DeviceStatic, ...]:
    """The devices that each fit in one record (what :meth:`InventoryRecord.encode` can carry)."""
    kept = []
    for device in record.devices:
        try:
            record._replace(devices=(device,)).encode()
        except WireError:
            continue
        kept.append(device)
    return tuple(kept)
