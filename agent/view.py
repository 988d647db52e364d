"""What an agent knows of the mesh: the gossip records it holds, decoded.

Record kinds (msgpack maps, each at most 4 KiB, signed by the node that publishes them):

- ``inventory``: ``host`` (HostInfo JSON), ``api`` (address), ``labels``, ``devices`` (static
  facts, :func:`static_to_wire`).
- ``telemetry``: ``at`` (epoch s) and ``s``, one ``[key, util_pct, mem_used_bytes, temp_c,
  power_mw, power_limit_mw, healthy]`` per device.
- ``node``: ``drain`` state, ``queue`` (pending jobs it owns), ``running`` (job ids), ``free``
  (device keys not given to a job).
- ``events``: the publisher's latest events (see ``agent.events``).
- ``sub/<id>``: the operator's sealed submission of a job (``agent.authority``), published by
  each agent that owns the job. A job is believed to exist only once its submission verifies.
- ``job/<id>``: a job as its owner sees it (``OwnedJob.to_json``, without the spec, which the
  submission holds); several origins may hold one (an old owner's, the new owner's). Only the
  records of origins that may own the job (``Authority.may_own``) and that name themselves as its
  owner are believed; among them the highest ``gen`` wins. When no origin may own it right now
  (a membership change in flight), the record believed last stays.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack

from agent.authority import Submission, SubmissionRefused
from gossip.membership import MemberInfo
from gossip.messages import MemberState
from probers.records import DeviceSample, DeviceStatic

MAX_PAYLOAD_BYTES = 4096
JOB_PREFIX = "job/"
SUB_PREFIX = "sub/"
_ENDED = frozenset({"succeeded", "failed", "cancelled"})

_STATIC_FIELDS = (
    "key",
    "vendor",
    "backend",
    "name",
    "source",
    "vendor_index",
    "uuid",
    "pci_bus_id",
    "arch",
    "compute_capability",
    "unified_memory",
    "mem_total_bytes",
    "temp_slowdown_c",
)


def pack(doc: Mapping[str, Any]) -> bytes:
    data: bytes = msgpack.packb(dict(doc), use_bin_type=True)
    return data


def unpack(payload: bytes) -> dict[str, Any] | None:
    try:
        doc = msgpack.unpackb(payload, raw=False)
    except Exception:  # msgpack raises several unrelated types on garbage
        return None
    return doc if isinstance(doc, dict) else None


def static_to_wire(s: DeviceStatic) -> dict[str, Any]:
    return {name: getattr(s, name) for name in _STATIC_FIELDS}


def static_from_wire(doc: Mapping[str, Any]) -> DeviceStatic | None:
    try:
        values: dict[str, Any] = {k: doc.get(k) for k in _STATIC_FIELDS if k in doc}
        return DeviceStatic(**values)
    except TypeError:
        return None


def sample_to_wire(s: DeviceSample) -> list[Any]:
    return [s.key, s.util_pct, s.mem_used_bytes, s.temp_c, s.power_mw, s.power_limit_mw, s.healthy]


def sample_from_wire(row: Any) -> DeviceSample | None:
    if not isinstance(row, list) or len(row) != 7 or not isinstance(row[0], str):
        return None
    return DeviceSample(
        key=row[0],
        util_pct=row[1],
        mem_used_bytes=row[2],
        temp_c=row[3],
        power_mw=row[4],
        power_limit_mw=row[5],
        healthy=bool(row[6]),
    )


@dataclass(slots=True)
class NodeView:
    """One node as gossip tells it (any part may be missing while the records travel)."""

    node_id: str
    inventory: dict[str, Any] | None = None
    statics: list[DeviceStatic] = field(default_factory=list)
    samples: dict[str, DeviceSample] = field(default_factory=dict)
    telemetry_received_at: float | None = None
    status: dict[str, Any] | None = None

    @property
    def drain(self) -> str:
        return str((self.status or {}).get("drain", "schedulable"))

    @property
    def free(self) -> list[str]:
        value = (self.status or {}).get("free")
        if value is None:
            return [s.key for s in self.statics]
        return [str(k) for k in value]

    @property
    def running(self) -> list[str]:
        return [str(j) for j in (self.status or {}).get("running", [])]

    @property
    def api(self) -> str | None:
        value = (self.inventory or {}).get("api")
        return value if isinstance(value, str) else None


def job_gen(doc: Mapping[str, Any]) -> int:
    value = doc.get("gen", 0)
    return value if isinstance(value, int) else 0


class JobAuthority(Protocol):
    """What the view asks of ``agent.authority.Authority``."""

    def submission(self, sealed: bytes, job_id: str | None = None) -> Submission: ...

    def may_own(self, job_id: str, node: str) -> bool: ...


class ClusterView:
    """Decoded records by node and by job; fed every gossip ``RecordChanged``."""

    def __init__(self, authority: JobAuthority) -> None:
        self.authority = authority
        self.nodes: dict[str, NodeView] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        """The believed record of each job, with its spec from the submission."""
        self.submissions: dict[str, Submission] = {}
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.refused: Counter[str] = Counter()
        """Job records and submissions not believed, by reason."""
        self._docs: dict[str, dict[str, dict[str, Any]]] = {}
        """Every origin's latest record of each job."""
        self._open: set[str] = set()
        """Jobs whose believed record may change with membership (several origins' records, or
        a record not believed yet)."""

    def node(self, node_id: str) -> NodeView:
        view = self.nodes.get(node_id)
        if view is None:
            view = self.nodes[node_id] = NodeView(node_id)
        return view

    def apply(self, origin: str, kind: str, payload: bytes, now: float) -> str | None:
        """Take one record in; returns the job id when it was a job record that changed."""
        if kind.startswith(SUB_PREFIX):
            return self._apply_submission(kind[len(SUB_PREFIX) :], payload)
        doc = unpack(payload)
        if doc is None:
            self.refused["malformed"] += 1
            return None
        if kind.startswith(JOB_PREFIX):
            job_id = kind[len(JOB_PREFIX) :]
            if doc.get("owner") != origin:
                self.refused["not_its_owner"] += 1
                return None
            if not self.authority.may_own(job_id, origin):
                self.refused["not_an_owner"] += 1  # kept: it may be a view that lags behind
            self._docs.setdefault(job_id, {})[origin] = doc
            return job_id if self._believe(job_id) else None
        view = self.node(origin)
        if kind == "inventory":
            view.inventory = doc
            devices = doc.get("devices")
            statics = (
                [static_from_wire(d) for d in devices if isinstance(d, dict)]
                if isinstance(devices, list)
                else []
            )
            view.statics = [s for s in statics if s is not None]
        elif kind == "telemetry":
            rows = doc.get("s")
            samples = [sample_from_wire(r) for r in rows] if isinstance(rows, list) else []
            view.samples = {s.key: s for s in samples if s is not None}
            view.telemetry_received_at = now
        elif kind == "node":
            view.status = doc
        elif kind == "events":
            rows = doc.get("e")
            if isinstance(rows, list):
                self.events[origin] = [r for r in rows if isinstance(r, dict)]
        return None

    def _apply_submission(self, job_id: str, sealed: bytes) -> str | None:
        held = self.submissions.get(job_id)
        if held is not None and held.sealed == sealed:
            return None
        try:
            self.submissions[job_id] = self.authority.submission(sealed, job_id)
        except SubmissionRefused:
            self.refused["submission"] += 1
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
            (job_gen(doc), origin)
            for origin, doc in docs.items()
            if self.authority.may_own(job_id, origin)
        ]
        if not entitled:
            self._open.add(job_id)
            return False
        gen, origin = max(entitled)
        doc = docs[origin]
        if len(docs) == 1 or (
            doc.get("state") in _ENDED and gen >= max(job_gen(d) for d in docs.values())
        ):
            self._open.discard(job_id)  # nothing membership can change any more
        else:
            self._open.add(job_id)
        held = self.jobs.get(job_id)
        if held is not None and held.get("gen") == doc.get("gen") and held.get("owner") == origin:
            return False
        believed = dict(doc)
        believed["spec"] = sub.spec.to_dict()
        self.jobs[job_id] = believed
        return True

    def published_as_owner(self, job_id: str, origin: str, gen: int) -> bool:
        """Has ``origin`` itself published, signed, the newest record of the job that anyone
        published, at ``gen``, naming itself the owner (believed here or not)?"""
        docs = self._docs.get(job_id, {})
        mine = docs.get(origin)
        if mine is None or job_gen(mine) != gen:
            return False
        return all(job_gen(d) < gen for o, d in docs.items() if o != origin)

    def membership_changed(self) -> list[str]:
        """Choose again where who may own a job can have changed; the jobs whose record did."""
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


def device_json(index: int, s: DeviceStatic, sample: DeviceSample | None) -> dict[str, Any]:
    """The probe's device JSON (``shoal probe --json``) plus ``key``."""
    d = sample or DeviceSample(key=s.key)
    return {
        "index": index,
        "key": s.key,
        "vendor": s.vendor,
        "backend": s.backend,
        "name": s.name,
        "uuid": s.uuid,
        "pci_bus_id": s.pci_bus_id,
        "arch": s.arch,
        "compute_capability": s.compute_capability,
        "unified_memory": s.unified_memory,
        "mem_total_bytes": s.mem_total_bytes,
        "mem_used_bytes": d.mem_used_bytes,
        "util_pct": d.util_pct,
        "temp_c": d.temp_c,
        "power_mw": d.power_mw,
        "power_limit_mw": d.power_limit_mw,
        "healthy": d.healthy,
        "links": [],
    }
