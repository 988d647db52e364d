"""What agents gossip about themselves and their jobs: one typed definition per record kind.

Every record is a msgpack map of at most :data:`~agent.wire.codec.MAX_RECORD_BYTES`, signed by
the node it describes, with ``v`` its :data:`~agent.wire.codec.WIRE_VERSION`:

- ``inventory`` (+ ``inventory/1`` .. ``inventory/<n-1>``): :class:`InventoryRecord`, the host, its
  API address, labels, boot count, the job-spec features the agent supports and every device's
  static facts with its links and MIG instances. What does not fit in one record goes on in
  parts; every part names the set it belongs to (``set``, a digest of all its devices) and the
  count (``parts``), so a reader knows when it holds the whole inventory (:func:`assemble`).
- ``telemetry``: :class:`TelemetryRecord`, one row per device (``[key, util_pct,
  mem_used_bytes, temp_c, power_mw, power_limit_mw, healthy]``; a reader ignores further
  elements, a version 1 reader refuses rows of another length, so rows keep these seven).
- ``node``: :class:`NodeRecord`, drain state, queue, running jobs, free devices, progress, and the
  memory each share of a GPU holds on its device.
- ``events``: :class:`EventsRecord`, the publisher's recent events.
- ``job/<id>``: :class:`JobStatus`, a job as its owner sees it (the spec travels in the
  operator's sealed ``sub/<id>``, never here).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple, cast

from agent.wire import codec as c
from agent.wire.codec import EMPTY_MAP, WIRE_VERSION, WireError
from probers.records import DeviceSample, DeviceStatic, HostInfo, Link, MigDevice

INVENTORY: Final = "inventory"
INVENTORY_PART_PREFIX: Final = "inventory/"
TELEMETRY: Final = "telemetry"
NODE: Final = "node"
EVENTS: Final = "events"
JOB_PREFIX: Final = "job/"
SUB_PREFIX: Final = "sub/"
MAX_INVENTORY_PARTS: Final = 64
"""More parts than this is not an inventory but a flood: refused."""


# -- host and devices ----------------------------------------------------------------------------


def host_to_wire(h: HostInfo) -> dict[str, Any]:
    return {
        "hostname": h.hostname,
        "os": h.os,
        "arch": h.arch,
        "cpu_count": h.cpu_count,
        "mem_total_bytes": h.mem_total_bytes,
    }


def host_from_wire(data: Any, name: str = "host") -> HostInfo:
    d = c.obj(data, name)
    p = name + "."
    return HostInfo(
        hostname=c.field(d, "hostname", c.text, p),
        os=c.field(d, "os", c.or_default(c.text, "unknown"), p),
        arch=c.field(d, "arch", c.or_default(c.text, "unknown"), p),
        cpu_count=c.field(d, "cpu_count", c.opt_integer, p),
        mem_total_bytes=c.field(d, "mem_total_bytes", c.opt_integer, p),
    )


_STATIC_OPTIONAL: Final = (
    "uuid",
    "pci_bus_id",
    "arch",
    "compute_capability",
    "mem_total_bytes",
    "mem_note",
    "compute_units",
    "temp_slowdown_c",
    "driver_version",
)


def static_to_wire(s: DeviceStatic, index_of: Mapping[str, int]) -> dict[str, Any]:
    """One device's static facts; ``index_of`` numbers the host's devices, so a link names its
    peer by number (a few bytes) where the peer is one of them. Unknown values are left out."""
    doc: dict[str, Any] = {
        "key": s.key,
        "vendor": s.vendor,
        "backend": s.backend,
        "name": s.name,
        "source": s.source,
        "vendor_index": s.vendor_index,
        "unified_memory": s.unified_memory,
    }
    for name in _STATIC_OPTIONAL:
        value = getattr(s, name)
        if value is not None:
            doc[name] = value
    if s.links:
        doc["links"] = [
            [index_of.get(link.peer, link.peer), link.kind, link.bandwidth_mbps, link.detail]
            for link in s.links
        ]
    if s.mig_devices:
        doc["mig"] = [[m.uuid, m.name, m.mem_total_bytes] for m in s.mig_devices]
    return doc


def _row(value: Any, name: str, least: int) -> Sequence[Any]:
    if not isinstance(value, list | tuple) or len(value) < least:
        raise WireError(f"{name}: expected a list of at least {least} values")
    return value


def _link_from_wire(value: Any, name: str, keys: Sequence[str]) -> Link:
    row = _row(value, name, 2)
    peer = row[0]
    if isinstance(peer, int) and not isinstance(peer, bool):
        if not 0 <= peer < len(keys):
            raise WireError(f"{name}: no device {peer} on this host")
        peer = keys[peer]
    return Link(
        peer=c.text(peer, name + ".peer"),
        kind=cast(Any, c.text(row[1], name + ".kind")),  # a newer kind is still a link
        bandwidth_mbps=c.opt_integer(row[2] if len(row) > 2 else None, name + ".bandwidth_mbps"),
        detail=c.opt_text(row[3] if len(row) > 3 else None, name + ".detail"),
    )


def _mig_from_wire(value: Any, name: str) -> MigDevice:
    row = _row(value, name, 1)
    return MigDevice(
        uuid=c.text(row[0], name + ".uuid"),
        name=c.opt_text(row[1] if len(row) > 1 else None, name + ".name"),
        mem_total_bytes=c.opt_integer(row[2] if len(row) > 2 else None, name + ".mem_total_bytes"),
    )


def static_from_wire(data: Any, name: str, keys: Sequence[str]) -> DeviceStatic:
    """One device's facts; ``keys``: the host's device keys in order (links name peers by
    number). A vendor, backend or link kind this version does not know is kept as it is."""
    d = c.obj(data, name)
    p = name + "."
    links = d.get("links")
    if links is not None and not isinstance(links, list | tuple):
        raise WireError(f"{p}links: expected a list")
    return DeviceStatic(
        key=c.field(d, "key", c.text, p),
        vendor=cast(Any, c.field(d, "vendor", c.text, p)),
        backend=cast(Any, c.field(d, "backend", c.text, p)),
        name=c.field(d, "name", c.text, p),
        source=c.field(d, "source", c.or_default(c.text, "unknown"), p),
        vendor_index=c.field(d, "vendor_index", c.or_default(c.integer, 0), p),
        uuid=c.field(d, "uuid", c.opt_text, p),
        pci_bus_id=c.field(d, "pci_bus_id", c.opt_text, p),
        arch=c.field(d, "arch", c.opt_text, p),
        compute_capability=c.field(d, "compute_capability", c.opt_text, p),
        unified_memory=c.field(d, "unified_memory", c.or_default(c.flag, False), p),
        mem_total_bytes=c.field(d, "mem_total_bytes", c.opt_integer, p),
        mem_note=c.field(d, "mem_note", c.opt_text, p),
        compute_units=c.field(d, "compute_units", c.opt_integer, p),
        temp_slowdown_c=c.field(d, "temp_slowdown_c", c.opt_number, p),
        links=tuple(
            _link_from_wire(row, f"{p}links[{i}]", keys) for i, row in enumerate(links or ())
        ),
        mig_devices=c.items(d.get("mig"), p + "mig", _mig_from_wire),
        driver_version=c.field(d, "driver_version", c.opt_text, p),
    )


# -- inventory -----------------------------------------------------------------------------------


class InventoryRecord(NamedTuple):
    """What a node is: published once per start, over as many records as its devices need."""

    host: HostInfo
    api: str | None
    labels: Mapping[str, str]
    boot: int
    devices: tuple[DeviceStatic, ...]
    features: tuple[str, ...] = ()
    """The job-spec features this agent can run (``agent.job.jobspec.SUPPORTED_FEATURES``)."""
    version: int = WIRE_VERSION
    """The wire version of the agent that wrote it (1: before ``v`` was written)."""

    def encode(self, limit: int = c.MAX_RECORD_BYTES) -> list[tuple[str, bytes]]:
        """``(kind, payload)`` of every record: ``inventory`` first, then its parts, each at most
        ``limit`` bytes. Raises :class:`WireError` when one device alone cannot fit."""
        index_of = {d.key: i for i, d in enumerate(self.devices)}
        rows = [static_to_wire(d, index_of) for d in self.devices]
        set_id = hashlib.sha256(c.pack({"d": rows})).hexdigest()[:12]
        head: dict[str, Any] = {
            "v": WIRE_VERSION,
            "host": host_to_wire(self.host),
            "api": self.api,
            "labels": dict(self.labels),
            "boot": self.boot,
            "features": list(self.features),
            "set": set_id,
            "parts": 1,
            "devices": [],
        }

        def fits(chunk: list[dict[str, Any]], first: bool) -> bool:
            # part numbers and counts are packed here at their widest (two digits)
            frame = head if first else _part_frame(set_id, 99, 99)
            return len(c.pack({**frame, "parts": 99, "devices": chunk})) <= limit

        chunks: list[list[dict[str, Any]]] = [[]]
        for i, row in enumerate(rows):
            chunks[-1].append(row)
            if fits(chunks[-1], len(chunks) == 1):
                continue
            chunks[-1].pop()
            chunks.append([row])
            if not fits(chunks[-1], False):
                raise WireError(f"device {i} does not fit in a {limit}-byte record")
        if len(chunks) > MAX_INVENTORY_PARTS:
            raise WireError(f"an inventory of {len(chunks)} records is more than allowed")
        out = [(INVENTORY, c.pack({**head, "parts": len(chunks), "devices": chunks[0]}))]
        for n, chunk in enumerate(chunks[1:], start=1):
            frame = _part_frame(set_id, n, len(chunks))
            out.append((f"{INVENTORY_PART_PREFIX}{n}", c.pack({**frame, "devices": chunk})))
        return out


def _part_frame(set_id: str, part: int, parts: int) -> dict[str, Any]:
    return {"v": WIRE_VERSION, "set": set_id, "part": part, "parts": parts}


class InventoryHead(NamedTuple):
    """The ``inventory`` record as read, before its parts are joined to it."""

    host: HostInfo
    api: str | None
    labels: Mapping[str, str]
    boot: int
    features: tuple[str, ...]
    set_id: str | None
    parts: int
    rows: tuple[Any, ...]
    version: int

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> InventoryHead:
        return cls(
            host=host_from_wire(doc.get("host")),
            api=c.field(doc, "api", c.opt_text),
            labels=c.field(doc, "labels", c.text_map),
            boot=c.field(doc, "boot", c.or_default(c.integer, 0)),
            features=c.field(doc, "features", c.texts),
            set_id=c.field(doc, "set", c.opt_text),
            parts=_part_count(doc),
            rows=c.items(doc.get("devices"), "devices", lambda v, n: c.obj(v, n)),
            version=c.field(doc, "v", c.or_default(c.integer, 1)),
        )


class InventoryPart(NamedTuple):
    """One ``inventory/<n>`` record as read."""

    set_id: str
    part: int
    parts: int
    rows: tuple[Any, ...]

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> InventoryPart:
        parts = _part_count(doc)
        part = c.field(doc, "part", c.integer)
        if not 1 <= part < parts:
            raise WireError(f"part: {part} is not within 1..{parts - 1}")
        return cls(
            set_id=c.field(doc, "set", c.text),
            part=part,
            parts=parts,
            rows=c.items(doc.get("devices"), "devices", lambda v, n: c.obj(v, n)),
        )


def _part_count(doc: Mapping[str, Any]) -> int:
    parts = c.field(doc, "parts", c.or_default(c.integer, 1))
    if not 1 <= parts <= MAX_INVENTORY_PARTS:
        raise WireError(f"parts: {parts} is not within 1..{MAX_INVENTORY_PARTS}")
    return parts


def assemble(head: InventoryHead, parts: Mapping[int, InventoryPart]) -> InventoryRecord | None:
    """The whole inventory once every part of the head's set is held; ``None`` until then.
    Raises :class:`WireError` when the joined devices do not decode."""
    rows: list[Any] = list(head.rows)
    for n in range(1, head.parts):
        part = parts.get(n)
        if part is None or part.set_id != head.set_id or part.parts != head.parts:
            return None
        rows.extend(part.rows)
    keys = [c.field(c.obj(r, f"devices[{i}]"), "key", c.text) for i, r in enumerate(rows)]
    devices = tuple(static_from_wire(r, f"devices[{i}]", keys) for i, r in enumerate(rows))
    return InventoryRecord(
        host=head.host,
        api=head.api,
        labels=head.labels,
        boot=head.boot,
        devices=devices,
        features=head.features,
        version=head.version,
    )


# -- telemetry -----------------------------------------------------------------------------------


def _opt_int_out(value: int | float | None) -> int | None:
    return None if value is None else int(value)


def _opt_float_out(value: float | None) -> float | None:
    """A reading as sent: one that is not a finite number (a driver's NaN) is not known."""
    return None if value is None or not math.isfinite(value) else float(value)


class TelemetryRecord(NamedTuple):
    """What every device is doing, sampled at ``at`` (epoch seconds, the publisher's clock)."""

    at: float | None
    samples: tuple[DeviceSample, ...]

    def encode(self) -> bytes:
        rows = [
            [
                s.key,
                _opt_float_out(s.util_pct),
                _opt_int_out(s.mem_used_bytes),
                _opt_float_out(s.temp_c),
                _opt_int_out(s.power_mw),
                _opt_int_out(s.power_limit_mw),
                bool(s.healthy),
            ]
            for s in self.samples
        ]
        return c.pack({"v": WIRE_VERSION, "at": self.at, "s": rows})

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> TelemetryRecord:
        return cls(
            at=c.field(doc, "at", c.opt_number),
            samples=c.items(doc.get("s"), "s", _sample_from_wire),
        )


def _sample_from_wire(value: Any, name: str) -> DeviceSample:
    row = _row(value, name, 7)
    return DeviceSample(
        key=c.text(row[0], name + ".key"),
        util_pct=c.opt_number(row[1], name + ".util_pct"),
        mem_used_bytes=c.opt_integer(row[2], name + ".mem_used_bytes"),
        temp_c=c.opt_number(row[3], name + ".temp_c"),
        power_mw=c.opt_integer(row[4], name + ".power_mw"),
        power_limit_mw=c.opt_integer(row[5], name + ".power_limit_mw"),
        healthy=c.flag(row[6], name + ".healthy"),
    )


# -- node ----------------------------------------------------------------------------------------


class NodeRecord(NamedTuple):
    """A node's scheduling state: what placement reads, and its running jobs' progress."""

    drain: str = "schedulable"
    queue: int = 0
    """Pending jobs this node owns."""
    running: tuple[str, ...] = ()
    free: tuple[str, ...] | None = None
    """Device keys no job holds; ``None`` (not said): every device."""
    progress: Mapping[str, tuple[float, float | None]] = EMPTY_MAP
    """Running job -> (fraction done, seconds left or ``None``)."""
    shares: Mapping[str, Mapping[str, int]] = EMPTY_MAP
    """Device key -> {job -> bytes of its memory the job holds}, for the devices that run shares
    of a GPU (never a device given whole). Such a device is not ``free``, so a reader that does
    not know this field takes it as busy."""
    saved: Mapping[str, float] = EMPTY_MAP
    """Running job -> when its checkpoint folder last changed here (epoch seconds): what a
    preemption would lose is the work since (``agent.policy.preempt``)."""

    def placement_view(
        self,
    ) -> tuple[str, int, tuple[str, ...], tuple[str, ...] | None, Mapping[str, Mapping[str, int]]]:
        """What placement reads: a change here is published at once."""
        return (self.drain, self.queue, self.running, self.free, self.shares)

    def encode(self) -> bytes:
        return c.pack(
            {
                "v": WIRE_VERSION,
                "drain": self.drain,
                "queue": self.queue,
                "running": list(self.running),
                "free": None if self.free is None else list(self.free),
                "progress": {j: [f, eta] for j, (f, eta) in self.progress.items()},
                "shares": _shares_to_rows(self.shares, self.running),
                **({"saved": dict(self.saved)} if self.saved else {}),
            }
        )

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> NodeRecord:
        free = doc.get("free")
        running = c.field(doc, "running", c.texts)
        return cls(
            drain=c.field(doc, "drain", c.or_default(c.text, "schedulable")),
            queue=c.field(doc, "queue", c.or_default(c.integer, 0)),
            running=running,
            free=None if free is None else c.texts(free, "free"),
            progress=_progress_from_wire(doc.get("progress")),
            shares=_shares_from_rows(doc.get("shares"), running),
            saved=_saved_from_wire(doc.get("saved")),
        )


def _shares_to_rows(
    shares: Mapping[str, Mapping[str, int]], running: Sequence[str]
) -> dict[str, list[list[Any]]]:
    """``{device: [[job, bytes], ...]}``, a job named by its place in ``running`` where it is
    there (a few bytes instead of its 32-character id: a node record is at most 4 KiB)."""
    index_of = {j: i for i, j in enumerate(running)}
    return {k: [[index_of.get(j, j), b] for j, b in jobs.items()] for k, jobs in shares.items()}


def _shares_from_rows(value: Any, running: Sequence[str]) -> dict[str, dict[str, int]]:
    if value is None:
        return {}
    out: dict[str, dict[str, int]] = {}
    for key, rows in c.obj(value, "shares").items():
        where = f"shares.{key}"
        if not isinstance(rows, list | tuple):
            raise WireError(f"{where}: expected a list")
        held: dict[str, int] = {}
        for n, row in enumerate(rows):
            pair = _row(row, f"{where}[{n}]", 2)
            job = pair[0]
            if isinstance(job, int) and not isinstance(job, bool):
                if not 0 <= job < len(running):
                    raise WireError(f"{where}[{n}]: no running job {job}")
                job = running[job]
            held[c.text(job, f"{where}[{n}]")] = c.integer(pair[1], f"{where}[{n}]")
        out[c.text(key, where)] = held
    return out


def shares_from_wire(value: Any, name: str = "shares") -> dict[str, dict[str, int]]:
    """Device key -> {job -> bytes}; missing is none."""
    if value is None:
        return {}
    out: dict[str, dict[str, int]] = {}
    for key, jobs in c.obj(value, name).items():
        where = f"{name}.{key}"
        out[c.text(key, where)] = {
            c.text(j, where): c.integer(b, f"{where}.{j}") for j, b in c.obj(jobs, where).items()
        }
    return out


def _saved_from_wire(value: Any) -> dict[str, float]:
    if value is None:
        return {}
    return {
        c.text(job_id, f"saved.{job_id}"): c.number(at, f"saved.{job_id}")
        for job_id, at in c.obj(value, "saved").items()
    }


def _progress_from_wire(value: Any) -> dict[str, tuple[float, float | None]]:
    if value is None:
        return {}
    out: dict[str, tuple[float, float | None]] = {}
    for job_id, pair in c.obj(value, "progress").items():
        name = f"progress.{job_id}"
        row = _row(pair, name, 2)
        out[c.text(job_id, name)] = (c.number(row[0], name), c.opt_number(row[1], name))
    return out


# -- events --------------------------------------------------------------------------------------


class GossipedEvent(NamedTuple):
    """One of the publisher's events; the record's origin names the node."""

    n: int
    """The publisher's own sequence number (each event is merged once per node and ``n``)."""
    at: float | None
    kind: str
    job_id: str | None
    message: str

    def to_wire(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "kind": self.kind,
            "job_id": self.job_id,
            "message": self.message,
            "n": self.n,
        }

    @classmethod
    def from_wire(cls, value: Any, name: str = "event") -> GossipedEvent:
        d = c.obj(value, name)
        p = name + "."
        return cls(
            n=c.field(d, "n", c.integer, p),
            at=c.field(d, "at", c.opt_number, p),
            kind=c.field(d, "kind", c.or_default(c.text, ""), p),
            job_id=c.field(d, "job_id", c.opt_text, p),
            message=c.field(d, "message", c.or_default(c.text, ""), p),
        )


class EventsRecord(NamedTuple):
    events: tuple[GossipedEvent, ...]

    def encode(self) -> bytes:
        return c.pack({"v": WIRE_VERSION, "e": [e.to_wire() for e in self.events]})

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> EventsRecord:
        return cls(events=c.items(doc.get("e"), "e", GossipedEvent.from_wire))


# -- jobs ----------------------------------------------------------------------------------------


class AttemptEntry(NamedTuple):
    """Where one attempt of a job ran and, once it ended, how."""

    attempt: int
    node: str | None
    started_at: float | None
    finished_at: float | None = None
    cause: str | None = None
    """``None`` while it runs; then ``exit``, ``timeout``, ``lost`` or a stop cause."""
    exit_code: int | None = None
    rank: int | None = None
    """A gang's member: its rank (one entry per member of the attempt); ``None`` for one node."""

    def to_wire(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "attempt": self.attempt,
            "node": self.node,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "cause": self.cause,
            "exit_code": self.exit_code,
        }
        if self.rank is not None:
            doc["rank"] = self.rank
        return doc

    @classmethod
    def from_wire(cls, value: Any, name: str = "attempt") -> AttemptEntry:
        d = c.obj(value, name)
        p = name + "."
        return cls(
            attempt=c.field(d, "attempt", c.integer, p),
            node=c.field(d, "node", c.opt_text, p),
            started_at=c.field(d, "started_at", c.opt_number, p),
            finished_at=c.field(d, "finished_at", c.opt_number, p),
            cause=c.field(d, "cause", c.opt_text, p),
            exit_code=c.field(d, "exit_code", c.opt_integer, p),
            rank=c.field(d, "rank", c.opt_integer, p),
        )


class GangMember(NamedTuple):
    """One member of a gang's attempt: rank ``rank`` runs on ``node`` with ``devices``."""

    rank: int
    node: str
    devices: tuple[str, ...]

    def to_wire(self) -> dict[str, Any]:
        return {"rank": self.rank, "node": self.node, "devices": list(self.devices)}

    @classmethod
    def from_wire(cls, value: Any, name: str = "member") -> GangMember:
        d = c.obj(value, name)
        p = name + "."
        return cls(
            rank=c.field(d, "rank", c.integer, p),
            node=c.field(d, "node", c.text, p),
            devices=c.field(d, "devices", c.texts, p),
        )


def members_from_wire(value: Any, name: str = "members") -> tuple[GangMember, ...]:
    """A gang's members, ranks ``0..n-1`` in order on distinct nodes (absent: none)."""
    members = c.items(value, name, GangMember.from_wire)
    if [m.rank for m in members] != list(range(len(members))):
        raise WireError(f"{name}: ranks must run 0..{len(members) - 1} in order")
    if len({m.node for m in members}) != len(members):
        raise WireError(f"{name}: a node appears twice")
    return members


def members_to_wire(doc: dict[str, Any], members: Sequence[GangMember]) -> dict[str, Any]:
    """``doc`` with ``members`` added when there are any (a one-node job's stays as it was)."""
    if members:
        doc["members"] = [m.to_wire() for m in members]
    return doc


class JobStatus(NamedTuple):
    """A job as its owner sees it (``job/<id>``), and the record part of a handover."""

    job_id: str
    state: str
    """A ``agent.job.jobstate.JobState`` value (a newer state is kept as it is)."""
    attempt: int = 0
    owner: str | None = None
    runner: str | None = None
    devices: tuple[str, ...] = ()
    submitted_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    reason: str | None = None
    gen: int = 0
    """Orders the versions of the record across successive owners (highest wins)."""
    attempts: tuple[AttemptEntry, ...] = ()
    """Where each attempt ran and how it ended (the last 20)."""
    members: tuple[GangMember, ...] = ()
    """A gang's current (or last) attempt: every member, rank 0 first (``runner`` and
    ``devices`` are rank 0's); empty for a one-node job, and then left out of the wire."""
    deadline_missed_s: float | None = None
    """How late the job was when its owner said it missed its deadline; ``None``: not missed
    (or not yet said)."""

    def to_wire(self) -> dict[str, Any]:
        return members_to_wire(self._fields_to_wire(), self.members)

    def _fields_to_wire(self) -> dict[str, Any]:
        return {
            "v": WIRE_VERSION,
            "job_id": self.job_id,
            "state": self.state,
            "attempt": self.attempt,
            "owner": self.owner,
            "runner": self.runner,
            "devices": list(self.devices),
            "submitted_at": self.submitted_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "reason": self.reason,
            "gen": self.gen,
            "attempts": [a.to_wire() for a in self.attempts],
            "deadline_missed_s": self.deadline_missed_s,
        }

    def encode(self) -> bytes:
        return c.pack(self.to_wire())

    @classmethod
    def from_wire(cls, value: Any, name: str = "record") -> JobStatus:
        d = c.obj(value, name)
        p = name + "."
        return cls(
            job_id=c.field(d, "job_id", c.text, p),
            state=c.field(d, "state", c.text, p),
            attempt=c.field(d, "attempt", c.or_default(c.integer, 0), p),
            owner=c.field(d, "owner", c.opt_text, p),
            runner=c.field(d, "runner", c.opt_text, p),
            devices=c.field(d, "devices", c.texts, p),
            submitted_at=c.field(d, "submitted_at", c.opt_number, p),
            started_at=c.field(d, "started_at", c.opt_number, p),
            finished_at=c.field(d, "finished_at", c.opt_number, p),
            exit_code=c.field(d, "exit_code", c.opt_integer, p),
            signal=c.field(d, "signal", c.opt_text, p),
            reason=c.field(d, "reason", c.opt_text, p),
            gen=c.field(d, "gen", c.or_default(c.integer, 0), p),
            attempts=c.items(d.get("attempts"), p + "attempts", AttemptEntry.from_wire),
            members=members_from_wire(d.get("members"), p + "members"),
            deadline_missed_s=c.field(d, "deadline_missed_s", c.opt_number, p),
        )
