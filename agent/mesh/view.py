"""What an agent knows of the mesh: the gossip records it holds, decoded.

Every record kind is defined, encoded and decoded in :mod:`agent.wire.records` (the inventory in
:mod:`agent.wire.inventory`); here they are taken in, by node and by job. A record that does not
decode (garbage, a field of the wrong type, more than 4 KiB) is refused and counted, by reason and
by kind (``shoal_records_refused_total``, ``shoal_records_refused_kinds_total``), and the node
keeps what it had.

- ``inventory`` and its parts ``inventory/<n>``: the node's host and devices, believed once
  every part of one set has arrived (:func:`agent.wire.inventory.assemble`).
- ``telemetry``, ``node``, ``events``: the latest of each replaces the one before.
- ``sub/<id>``: the operator's sealed submission of a job (``agent.job.authority``), published by
  each agent that owns the job. A job is believed to exist only once its submission verifies.
- ``job/<id>``: a job as its owner sees it (:class:`agent.wire.records.JobStatus`, without the
  spec, which the submission holds); several origins may hold one (an old owner's, the new
  owner's). Only the records of origins that may own the job (``Authority.may_own``) and that
  name themselves as its owner are believed; among them the highest ``gen`` wins. When no origin
  may own it right now (a membership change in flight), the record believed last stays. A job
  believed ended gives way only to a newer record: its owner may since have fallen behind others
  in the order (agents back from a restart), which makes the older records of those others no
  truer; unless that owner has been revoked since.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.job.authority import FeaturesLacking, Submission, SubmissionRefused
from agent.job.jobstate import TERMINAL_JOB_STATES, JobState
from agent.wire.codec import MAX_RECORD_BYTES, WireError, pack, unpack
from agent.wire.inventory import (
    INVENTORY,
    INVENTORY_PART_PREFIX,
    InventoryHead,
    InventoryPart,
    InventoryRecord,
    assemble,
)
from agent.wire.place import PLACE, PlaceRecord
from agent.wire.records import (
    EVENTS,
    JOB_PREFIX,
    NODE,
    SUB_PREFIX,
    TELEMETRY,
    EventsRecord,
    GossipedEvent,
    JobStatus,
    NodeRecord,
    TelemetryRecord,
)
from gossip.membership import MemberInfo
from gossip.messages import MemberState
from probers.records import DeviceSample, DeviceStatic

__all__ = ["JOB_PREFIX", "MAX_PAYLOAD_BYTES", "SUB_PREFIX", "pack"]

MAX_PAYLOAD_BYTES = MAX_RECORD_BYTES


@dataclass(slots=True)
class NodeView:
    """One node as gossip tells it (any part may be missing while the records travel)."""

    node_id: str
    inventory: InventoryRecord | None = None
    samples: dict[str, DeviceSample] = field(default_factory=dict)
    telemetry_received_at: float | None = None
    telemetry_every_s: float | None = None
    """The heartbeat its last telemetry record promised (``None``: not said)."""
    status: NodeRecord | None = None
    inventory_head: InventoryHead | None = None
    inventory_parts: dict[int, InventoryPart] = field(default_factory=dict)
    """The parts of the inventory held so far (believed once all of one set are here)."""
    place: PlaceRecord | None = None
    """Its datasets with their sizes and its network coordinate (``None`` until published)."""

    @property
    def datasets(self) -> Mapping[str, int]:
        """Dataset -> bytes it holds: its ``place`` record, else the names its inventory's
        ``datasets`` label gives (an agent that predates the record; sizes not known: 0)."""
        if self.place is not None:
            return self.place.datasets
        labels = self.inventory.labels if self.inventory is not None else {}
        return dict.fromkeys((d for d in labels.get("datasets", "").split(",") if d), 0)

    @property
    def statics(self) -> tuple[DeviceStatic, ...]:
        return self.inventory.devices if self.inventory is not None else ()

    @property
    def drain(self) -> str:
        return self.status.drain if self.status is not None else "schedulable"

    @property
    def free(self) -> list[str]:
        if self.status is None or self.status.free is None:
            return [s.key for s in self.statics]
        return list(self.status.free)

    @property
    def shares(self) -> Mapping[str, Mapping[str, int]]:
        """Device key -> {job -> bytes} of the shares of a GPU that run there."""
        return self.status.shares if self.status is not None else {}

    @property
    def running(self) -> list[str]:
        return list(self.status.running) if self.status is not None else []

    @property
    def api(self) -> str | None:
        return self.inventory.api if self.inventory is not None else None

    @property
    def features(self) -> frozenset[str]:
        """The job-spec features this node's agent can run (none known: none)."""
        return frozenset(self.inventory.features) if self.inventory is not None else frozenset()


def job_gen(doc: Mapping[str, Any]) -> int:
    value = doc.get("gen", 0)
    return value if isinstance(value, int) else 0


class JobAuthority(Protocol):
    """What the view asks of ``agent.job.authority.Authority``."""

    def submission(self, sealed: bytes, job_id: str | None = None) -> Submission: ...

    def may_own(self, job_id: str, node: str) -> bool: ...

    def is_agent(self, node: str) -> bool: ...


class ClusterView:
    """Decoded records by node and by job; fed every gossip ``RecordChanged``."""

    def __init__(self, authority: JobAuthority) -> None:
        self.authority = authority
        self.nodes: dict[str, NodeView] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        """The believed record of each job (``JobStatus.to_wire``), with its spec from the
        submission."""
        self.submissions: dict[str, Submission] = {}
        self.events: dict[str, tuple[GossipedEvent, ...]] = {}
        self.refused: Counter[str] = Counter()
        """Records and submissions refused or not believed, by reason."""
        self.refused_kinds: Counter[str] = Counter()
        """The same, by record kind (``job`` and ``sub`` for every job's)."""
        self._docs: dict[str, dict[str, JobStatus]] = {}
        """Every origin's latest record of each job."""
        self._open: set[str] = set()
        """Jobs whose believed record may change with membership (several origins' records, or
        a record not believed yet)."""
        self.pending: set[str] = set()
        """The jobs whose believed record is pending (the mesh's queue, unordered)."""
        self.generation = 0
        """Counts changes to what placement reads: a believed job record, a node record,
        membership. Equal: nothing placement reads changed."""

    def rtt_s(self, a: str, b: str) -> float | None:
        """The estimated round trip between nodes ``a`` and ``b`` from the coordinates they
        gossip; ``None`` while either has not published one."""
        if a == b:
            return 0.0
        pa, pb = self.nodes.get(a), self.nodes.get(b)
        if pa is None or pb is None or pa.place is None or pb.place is None:
            return None
        return pa.place.rtt_s(pb.place)

    def node(self, node_id: str) -> NodeView:
        view = self.nodes.get(node_id)
        if view is None:
            view = self.nodes[node_id] = NodeView(node_id)
        return view

    def _refuse(self, kind: str, reason: str) -> None:
        self.refused[reason] += 1
        self.refused_kinds[kind.split("/", 1)[0]] += 1

    def apply(self, origin: str, kind: str, payload: bytes, now: float) -> str | None:
        """Take one record in; returns the job id when it was a job record that changed."""
        if kind.startswith(SUB_PREFIX):
            return self._apply_submission(kind[len(SUB_PREFIX) :], payload)
        if len(payload) > MAX_RECORD_BYTES:
            self._refuse(kind, "oversized")
            return None
        try:
            doc = unpack(payload)
            if kind.startswith(JOB_PREFIX):
                return self._apply_job(origin, kind[len(JOB_PREFIX) :], JobStatus.from_wire(doc))
            self._apply_node_record(origin, kind, doc, now)
            self.generation += 1
        except WireError:
            self._refuse(kind, "malformed")
        return None

    def _apply_node_record(
        self, origin: str, kind: str, doc: Mapping[str, Any], now: float
    ) -> None:
        view = self.node(origin)
        if kind == INVENTORY:
            view.inventory_head = InventoryHead.decode(doc)
            self._assemble(view)
        elif kind.startswith(INVENTORY_PART_PREFIX):
            part = InventoryPart.decode(doc)
            if kind != f"{INVENTORY_PART_PREFIX}{part.part}":
                raise WireError(f"part {part.part} published as {kind}")
            view.inventory_parts[part.part] = part
            self._assemble(view)
        elif kind == TELEMETRY:
            telemetry = TelemetryRecord.decode(doc)
            view.samples = {s.key: s for s in telemetry.samples}
            view.telemetry_received_at = now
            view.telemetry_every_s = telemetry.every_s
        elif kind == NODE:
            view.status = NodeRecord.decode(doc)
        elif kind == EVENTS:
            self.events[origin] = EventsRecord.decode(doc).events
        elif kind == PLACE:
            view.place = PlaceRecord.decode(doc)

    def _assemble(self, view: NodeView) -> None:
        """Believe the node's inventory once every part of its set is held."""
        head = view.inventory_head
        if head is None:
            return
        inventory = assemble(head, view.inventory_parts)
        if inventory is not None:
            view.inventory = inventory
            view.inventory_head = None  # the raw rows are no longer needed
            view.inventory_parts.clear()

    def _apply_job(self, origin: str, job_id: str, status: JobStatus) -> str | None:
        kind = JOB_PREFIX + job_id
        if status.job_id != job_id:
            self._refuse(kind, "malformed")
            return None
        if status.owner != origin:
            self._refuse(kind, "not_its_owner")
            return None
        if not self.authority.may_own(job_id, origin):
            self._refuse(kind, "not_an_owner")  # kept: it may be a view that lags behind
        self._docs.setdefault(job_id, {})[origin] = status
        return job_id if self._believe(job_id) else None

    def _apply_submission(self, job_id: str, sealed: bytes) -> str | None:
        held = self.submissions.get(job_id)
        if held is not None and held.sealed == sealed:
            return None
        try:
            self.submissions[job_id] = self.authority.submission(sealed, job_id)
        except FeaturesLacking:
            self._refuse(SUB_PREFIX + job_id, "features")  # a newer spec: not listed here
            return None
        except SubmissionRefused:
            self._refuse(SUB_PREFIX + job_id, "submission")
            return None
        return job_id if self._believe(job_id) else None

    def _believe(self, job_id: str) -> bool:
        """Choose the job's believed record; True when it changed."""
        docs = self._docs.get(job_id)
        sub = self.submissions.get(job_id)
        if not docs or sub is None:
            self._open.add(job_id)
            return False
        entitled = [
            (status.gen, origin)
            for origin, status in docs.items()
            if self.authority.may_own(job_id, origin)
        ]
        if not entitled:
            self._open.add(job_id)
            return False
        gen, origin = max(entitled)
        status = docs[origin]
        ended = status.state in TERMINAL_JOB_STATES
        if len(docs) == 1 or (ended and gen >= max(d.gen for d in docs.values())):
            self._open.discard(job_id)  # nothing membership can change any more
        else:
            self._open.add(job_id)
        held = self.jobs.get(job_id)
        if held is not None and held.get("gen") == status.gen and held.get("owner") == origin:
            return False
        if (
            held is not None
            and held.get("state") in TERMINAL_JOB_STATES
            and job_gen(held) > gen
            and self.authority.is_agent(str(held.get("owner")))
        ):
            # An end believed from an owner of its time is final: an older record believed
            # again (its origin back ahead in the order) is history, not news. Unless the
            # owner that ended it has been revoked since: nothing of a revoked node is believed.
            return False
        believed = status.to_wire()
        believed["spec"] = sub.spec.to_dict()
        self.jobs[job_id] = believed
        if status.state == JobState.PENDING:
            self.pending.add(job_id)
        else:
            self.pending.discard(job_id)
        self.generation += 1
        return True

    def retire(self, job_id: str) -> None:
        """Forget a job for good (:mod:`agent.mesh.retiring`): its records are retired too."""
        self.jobs.pop(job_id, None)
        self.submissions.pop(job_id, None)
        self._docs.pop(job_id, None)
        self._open.discard(job_id)
        self.pending.discard(job_id)
        self.generation += 1

    def published_as_owner(self, job_id: str, origin: str, gen: int) -> bool:
        """Has ``origin`` itself published, signed, the newest record of the job that anyone
        published, at ``gen``, naming itself the owner (believed here or not)?"""
        docs = self._docs.get(job_id, {})
        mine = docs.get(origin)
        if mine is None or mine.gen != gen:
            return False
        return all(d.gen < gen for o, d in docs.items() if o != origin)

    def membership_changed(self) -> list[str]:
        """Choose again where who may own a job can have changed; the jobs whose record did."""
        self.generation += 1  # the live agents changed
        return [job_id for job_id in list(self._open) if self._believe(job_id)]


def live_agents(members: Iterable[MemberInfo], roles: Mapping[str, str]) -> list[str]:
    """Node ids of members alive (or merely suspect) whose role is ``agent``.

    Suspect members still count: ownership must not flap while a suspicion is refuted.
    """
    return [
        m.node
        for m in members
        if m.state in (MemberState.ALIVE, MemberState.SUSPECT) and roles.get(m.node) == "agent"
    ]


STATE_NAMES = {
    MemberState.ALIVE: "alive",
    MemberState.SUSPECT: "suspect",
    MemberState.DEAD: "dead",
    MemberState.LEFT: "left",
}
