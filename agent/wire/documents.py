"""What the HTTP API answers, and the bodies of the calls between agents: one definition each.

Operator-facing (JSON): :class:`NodeDoc` (``GET /v1/nodes`` answers ``{"nodes": [...]}``, each
with its :class:`DeviceDoc` list), :class:`JobDoc` (``GET /v1/jobs`` answers ``{"jobs": [...]}``,
``GET /v1/jobs/{id}`` one), :class:`EventsDoc` (``GET /v1/events``), :class:`HealthDoc`
(``GET /healthz``). ``agent.client.ApiClient`` decodes with these same definitions, and the TUI's
simulated mesh (``tui.source.SimSource``) encodes with them, so every reader sees one shape.

Agent to agent (JSON, ``POST /v1/internal/<call>``): :class:`JobTransfer` (``replicate``,
``adopt``), :class:`StartOffer` and :class:`StartAnswer` (``start``), :class:`StopRequest` and
:class:`StopAnswer` (``stop``), :class:`StatusRequest` and :class:`StatusAnswer` (``status``),
:class:`AttemptResult` (``report``, and inside the stop and status answers).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.wire import codec as c
from agent.wire.codec import WireError
from agent.wire.records import JobStatus, host_from_wire, host_to_wire
from probers.records import DeviceSample, DeviceStatic, HostInfo, Link, MigDevice

# -- devices and nodes ---------------------------------------------------------------------------


def _link_json(link: Link) -> dict[str, Any]:
    return {
        "peer": link.peer,
        "kind": link.kind,
        "bandwidth_mbps": link.bandwidth_mbps,
        "detail": link.detail,
    }


def _link_from_json(value: Any, name: str) -> Link:
    d = c.obj(value, name)
    p = name + "."
    return Link(
        peer=c.field(d, "peer", c.text, p),
        kind=c.field(d, "kind", c.text, p),  # type: ignore[arg-type]  # a newer kind is kept
        bandwidth_mbps=c.field(d, "bandwidth_mbps", c.opt_integer, p),
        detail=c.field(d, "detail", c.opt_text, p),
    )


def _mig_from_json(value: Any, name: str) -> MigDevice:
    d = c.obj(value, name)
    p = name + "."
    return MigDevice(
        uuid=c.field(d, "uuid", c.text, p),
        name=c.field(d, "name", c.opt_text, p),
        mem_total_bytes=c.field(d, "mem_total_bytes", c.opt_integer, p),
    )


STATIC_KEYS: tuple[str, ...] = (
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
    "compute_units",
    "temp_slowdown_c",
    "power_limit_mw",
    "links",
    "mig",
)
"""The keys of a device document that do not change while its host is up (a reader that keeps
the facts it decoded compares these raw, and decodes again only when one changed)."""


def device_static_from_json(value: Any, name: str = "device") -> DeviceStatic:
    """The static facts of one device document."""
    d = c.obj(value, name)
    p = name + "."
    return DeviceStatic(
        key=c.field(d, "key", c.text, p),
        vendor=c.field(d, "vendor", c.text, p),  # type: ignore[arg-type]
        backend=c.field(d, "backend", c.text, p),  # type: ignore[arg-type]
        name=c.field(d, "name", c.or_default(c.text, "?"), p),
        source=c.field(d, "source", c.or_default(c.text, "unknown"), p),
        vendor_index=c.field(d, "vendor_index", c.or_default(c.integer, 0), p),
        uuid=c.field(d, "uuid", c.opt_text, p),
        pci_bus_id=c.field(d, "pci_bus_id", c.opt_text, p),
        arch=c.field(d, "arch", c.opt_text, p),
        compute_capability=c.field(d, "compute_capability", c.opt_text, p),
        unified_memory=c.field(d, "unified_memory", c.or_default(c.flag, False), p),
        mem_total_bytes=c.field(d, "mem_total_bytes", c.opt_integer, p),
        compute_units=c.field(d, "compute_units", c.opt_integer, p),
        temp_slowdown_c=c.field(d, "temp_slowdown_c", c.opt_number, p),
        links=c.items(d.get("links"), p + "links", _link_from_json),
        mig_devices=c.items(d.get("mig"), p + "mig", _mig_from_json),
    )


def device_sample_from_json(value: Any, key: str, name: str = "device") -> DeviceSample:
    """What one device document says the device is doing."""
    d = c.obj(value, name)
    p = name + "."
    return DeviceSample(
        key=key,
        mem_used_bytes=c.field(d, "mem_used_bytes", c.opt_integer, p),
        util_pct=c.field(d, "util_pct", c.opt_number, p),
        temp_c=c.field(d, "temp_c", c.opt_number, p),
        power_mw=c.field(d, "power_mw", c.opt_integer, p),
        power_limit_mw=c.field(d, "power_limit_mw", c.opt_integer, p),
        healthy=c.field(d, "healthy", c.or_default(c.flag, True), p),
    )


@dataclass(frozen=True, slots=True)
class DeviceDoc:
    """One device in ``/v1/nodes``: the ``shoal probe --json`` device object, plus its key,
    source, compute capability, throttle point, health, link details and MIG instances."""

    index: int
    static: DeviceStatic
    sample: DeviceSample

    def to_wire(self) -> dict[str, Any]:
        s, d = self.static, self.sample
        return {
            "index": self.index,
            "key": s.key,
            "vendor": s.vendor,
            "backend": s.backend,
            "name": s.name,
            "source": s.source,
            "vendor_index": s.vendor_index,
            "uuid": s.uuid,
            "pci_bus_id": s.pci_bus_id,
            "arch": s.arch,
            "compute_capability": s.compute_capability,
            "unified_memory": s.unified_memory,
            "mem_total_bytes": s.mem_total_bytes,
            "compute_units": s.compute_units,
            "temp_slowdown_c": s.temp_slowdown_c,
            "mem_used_bytes": d.mem_used_bytes,
            "util_pct": d.util_pct,
            "temp_c": d.temp_c,
            "power_mw": d.power_mw,
            "power_limit_mw": d.power_limit_mw,
            "healthy": d.healthy,
            "links": [_link_json(link) for link in s.links],
            "mig": [
                {"uuid": m.uuid, "name": m.name, "mem_total_bytes": m.mem_total_bytes}
                for m in s.mig_devices
            ],
        }

    @classmethod
    def from_wire(cls, value: Any, name: str = "device") -> DeviceDoc:
        static = device_static_from_json(value, name)
        return cls(
            index=c.field(c.obj(value, name), "index", c.or_default(c.integer, 0), name + "."),
            static=static,
            sample=device_sample_from_json(value, static.key, name),
        )


@dataclass(frozen=True, slots=True)
class NodeDoc:
    """One member of the mesh in ``/v1/nodes``, as the answering agent sees it."""

    node_id: str
    addr: str | None = None
    state: str = "unknown"
    """Membership: ``alive``, ``suspect``, ``dead``, ``left``."""
    role: str | None = None
    drain: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    host: HostInfo | None = None
    """The host's name, OS, CPU architecture, CPU count and memory (``None`` until its
    inventory has arrived)."""
    devices: tuple[DeviceDoc, ...] = ()
    telemetry_age_s: float | None = None
    running_jobs: tuple[str, ...] = ()
    queue: int = 0
    wire_version: int | None = None
    """The wire version its agent writes (from its inventory)."""
    features: tuple[str, ...] = ()
    """The job-spec features its agent can run."""

    def to_wire(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "addr": self.addr,
            "state": self.state,
            "role": self.role,
            "drain": self.drain,
            "labels": dict(self.labels),
            "host": None if self.host is None else host_to_wire(self.host),
            "devices": [d.to_wire() for d in self.devices],
            "telemetry_age_s": self.telemetry_age_s,
            "running_jobs": list(self.running_jobs),
            "queue": self.queue,
            "wire_version": self.wire_version,
            "features": list(self.features),
        }

    @classmethod
    def from_wire(cls, value: Any, name: str = "node", *, devices: bool = True) -> NodeDoc:
        """``devices=False`` leaves the devices to the caller (a reader that keeps them)."""
        d = c.obj(value, name)
        p = name + "."
        host = d.get("host")
        return cls(
            node_id=c.field(d, "node_id", c.text, p),
            addr=c.field(d, "addr", c.opt_text, p),
            state=c.field(d, "state", c.or_default(c.text, "unknown"), p),
            role=c.field(d, "role", c.opt_text, p),
            drain=c.field(d, "drain", c.opt_text, p),
            labels=c.field(d, "labels", c.text_map, p),
            host=None if host is None else host_from_wire(host, p + "host"),
            devices=c.items(d.get("devices"), p + "devices", DeviceDoc.from_wire)
            if devices
            else (),
            telemetry_age_s=c.field(d, "telemetry_age_s", c.opt_number, p),
            running_jobs=c.field(d, "running_jobs", c.texts, p),
            queue=c.field(d, "queue", c.or_default(c.integer, 0), p),
            wire_version=c.field(d, "wire_version", c.opt_integer, p),
            features=c.field(d, "features", c.texts, p),
        )


def nodes_to_wire(nodes: list[NodeDoc]) -> dict[str, Any]:
    return {"nodes": [n.to_wire() for n in nodes]}


def nodes_from_wire(value: Any) -> list[NodeDoc]:
    return list(c.items(c.obj(value).get("nodes"), "nodes", NodeDoc.from_wire))


# -- jobs ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobDoc:
    """A job in ``/v1/jobs``: its owner's record (every field of ``job/<id>``), the operator's
    spec, and its progress."""

    status: JobStatus
    spec: Mapping[str, Any] = field(default_factory=dict)
    """The spec as the operator submitted it (``JobSpec.to_dict``)."""
    progress: float | None = None
    """Fraction done, as the job reports it (``SHOAL_PROGRESS``)."""
    eta_s: float | None = None

    @property
    def job_id(self) -> str:
        return self.status.job_id

    @property
    def state(self) -> str:
        return self.status.state

    def to_wire(self) -> dict[str, Any]:
        doc = self.status.to_wire()
        del doc["v"]
        doc.update(spec=dict(self.spec), progress=self.progress, eta_s=self.eta_s)
        return doc

    @classmethod
    def from_wire(cls, value: Any, name: str = "job") -> JobDoc:
        d = c.obj(value, name)
        p = name + "."
        spec = d.get("spec")
        return cls(
            status=JobStatus.from_wire(d, name),
            spec={} if spec is None else dict(c.obj(spec, p + "spec")),
            progress=c.field(d, "progress", c.opt_number, p),
            eta_s=c.field(d, "eta_s", c.opt_number, p),
        )


def jobs_to_wire(jobs: list[JobDoc]) -> dict[str, Any]:
    return {"jobs": [j.to_wire() for j in jobs]}


def jobs_from_wire(value: Any) -> list[JobDoc]:
    return list(c.items(c.obj(value).get("jobs"), "jobs", JobDoc.from_wire))


# -- events and health ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EventDoc:
    """One line of the mesh's event log, numbered by the answering agent (``seq``)."""

    seq: int
    at: float | None
    kind: str
    node: str | None
    job_id: str | None
    message: str

    def to_wire(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "at": self.at,
            "kind": self.kind,
            "node": self.node,
            "job_id": self.job_id,
            "message": self.message,
        }

    @classmethod
    def from_wire(cls, value: Any, name: str = "event") -> EventDoc:
        d = c.obj(value, name)
        p = name + "."
        return cls(
            seq=c.field(d, "seq", c.or_default(c.integer, 0), p),
            at=c.field(d, "at", c.opt_number, p),
            kind=c.field(d, "kind", c.or_default(c.text, "?"), p),
            node=c.field(d, "node", c.opt_text, p),
            job_id=c.field(d, "job_id", c.opt_text, p),
            message=c.field(d, "message", c.or_default(c.text, ""), p),
        )


@dataclass(frozen=True, slots=True)
class EventsDoc:
    """``GET /v1/events?since=N``: the events after ``N``, and the ``next`` to ask for."""

    events: tuple[EventDoc, ...]
    next: int

    def to_wire(self) -> dict[str, Any]:
        return {"events": [e.to_wire() for e in self.events], "next": self.next}

    @classmethod
    def from_wire(cls, value: Any) -> EventsDoc:
        d = c.obj(value)
        return cls(
            events=c.items(d.get("events"), "events", EventDoc.from_wire),
            next=c.field(d, "next", c.or_default(c.integer, 0)),
        )


@dataclass(frozen=True, slots=True)
class HealthDoc:
    """``GET /healthz``: the agent answers, and how many live members it counts."""

    ok: bool
    node_id: str
    members: int

    def to_wire(self) -> dict[str, Any]:
        return {"ok": self.ok, "node_id": self.node_id, "members": self.members}

    @classmethod
    def from_wire(cls, value: Any) -> HealthDoc:
        d = c.obj(value)
        return cls(
            ok=c.field(d, "ok", c.or_default(c.flag, False)),
            node_id=c.field(d, "node_id", c.or_default(c.text, "")),
            members=c.field(d, "members", c.or_default(c.integer, 0)),
        )


# -- calls between agents ------------------------------------------------------------------------


def _b64_out(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _b64_in(value: Any, name: str) -> bytes:
    try:
        return base64.b64decode(c.or_default(c.text, "")(value, name), validate=True)
    except binascii.Error:
        raise WireError(f"{name}: not base64") from None


@dataclass(frozen=True, slots=True)
class OwnerDetail:
    """What an owner keeps of a job beyond its record (persisted, and handed on with it)."""

    devices: tuple[str, ...] = ()
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    reason: str | None = None
    gen: int = 0
    failures: int = 0
    prefer: str | None = None
    avoid: str | None = None
    launch_failures: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {
            "devices": list(self.devices),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "reason": self.reason,
            "gen": self.gen,
            "failures": self.failures,
            "prefer": self.prefer,
            "avoid": self.avoid,
            "launch_failures": self.launch_failures,
        }

    @classmethod
    def from_wire(cls, value: Any, name: str = "detail") -> OwnerDetail:
        d = c.obj({} if value is None else value, name)
        p = name + "."
        return cls(
            devices=c.field(d, "devices", c.texts, p),
            started_at=c.field(d, "started_at", c.opt_number, p),
            finished_at=c.field(d, "finished_at", c.opt_number, p),
            exit_code=c.field(d, "exit_code", c.opt_integer, p),
            signal=c.field(d, "signal", c.opt_text, p),
            reason=c.field(d, "reason", c.opt_text, p),
            gen=c.field(d, "gen", c.or_default(c.integer, 0), p),
            failures=c.field(d, "failures", c.or_default(c.integer, 0), p),
            prefer=c.field(d, "prefer", c.opt_text, p),
            avoid=c.field(d, "avoid", c.opt_text, p),
            launch_failures=c.field(d, "launch_failures", c.or_default(c.integer, 0), p),
        )


@dataclass(frozen=True, slots=True)
class JobTransfer:
    """``replicate`` and ``adopt``: a job's record and details, with the operator's sealed
    submission (the receiver runs the spec inside the submission it verified, never one here)."""

    record: JobStatus
    detail: OwnerDetail
    submission: bytes

    def to_wire(self) -> dict[str, Any]:
        return {
            "record": self.record.to_wire(),
            "detail": self.detail.to_wire(),
            "submission": _b64_out(self.submission),
        }

    @classmethod
    def from_wire(cls, value: Any) -> JobTransfer:
        d = c.obj(value, "body")
        return cls(
            record=JobStatus.from_wire(d.get("record"), "record"),
            detail=OwnerDetail.from_wire(d.get("detail"), "detail"),
            submission=_b64_in(d.get("submission"), "submission"),
        )


@dataclass(frozen=True, slots=True)
class StartOffer:
    """``start``: run attempt ``attempt`` of the job on ``devices``, for its owner ``owner``."""

    job_id: str
    attempt: int
    owner: str
    devices: tuple[str, ...]
    submission: bytes

    def to_wire(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "devices": list(self.devices),
            "owner": self.owner,
            "submission": _b64_out(self.submission),
        }

    @classmethod
    def from_wire(cls, value: Any) -> StartOffer:
        d = c.obj(value, "body")
        return cls(
            job_id=c.field(d, "job_id", c.text),
            attempt=c.field(d, "attempt", c.integer),
            owner=c.field(d, "owner", c.text),
            devices=c.field(d, "devices", c.texts),
            submission=_b64_in(d.get("submission"), "submission"),
        )


@dataclass(frozen=True, slots=True)
class StartAnswer:
    ok: bool
    started_at: float | None
    pid: int | None

    def to_wire(self) -> dict[str, Any]:
        return {"ok": self.ok, "started_at": self.started_at, "pid": self.pid}

    @classmethod
    def from_wire(cls, value: Any) -> StartAnswer:
        d = c.obj(value, "answer")
        return cls(
            ok=c.field(d, "ok", c.or_default(c.flag, False)),
            started_at=c.field(d, "started_at", c.opt_number),
            pid=c.field(d, "pid", c.opt_integer),
        )


@dataclass(frozen=True, slots=True)
class AttemptResult:
    """How an attempt ended on its runner (``report``; inside stop and status answers)."""

    job_id: str
    attempt: int
    exit_code: int | None
    signal: str | None
    cause: str
    """``exit``, ``timeout``, ``lost`` or a stop cause (``cancel``, ``drain``, ``fenced``...)."""
    started_at: float | None
    finished_at: float | None

    def to_wire(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "cause": self.cause,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }

    @classmethod
    def from_wire(cls, value: Any, name: str = "result") -> AttemptResult:
        d = c.obj(value, name)
        p = name + "."
        return cls(
            job_id=c.field(d, "job_id", c.text, p),
            attempt=c.field(d, "attempt", c.integer, p),
            exit_code=c.field(d, "exit_code", c.opt_integer, p),
            signal=c.field(d, "signal", c.opt_text, p),
            cause=c.field(d, "cause", c.or_default(c.text, "exit"), p),
            started_at=c.field(d, "started_at", c.opt_number, p),
            finished_at=c.field(d, "finished_at", c.opt_number, p),
        )


@dataclass(frozen=True, slots=True)
class StopRequest:
    """``stop``: stop (and fence) attempt ``attempt``; ``grace_s`` ``None``: the runner's own."""

    job_id: str
    attempt: int
    cause: str = "cancel"
    grace_s: float | None = None

    def to_wire(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "cause": self.cause,
            "grace_s": self.grace_s,
        }

    @classmethod
    def from_wire(cls, value: Any) -> StopRequest:
        d = c.obj(value, "body")
        return cls(
            job_id=c.field(d, "job_id", c.text),
            attempt=c.field(d, "attempt", c.integer),
            cause=c.field(d, "cause", c.or_default(c.text, "cancel")),
            grace_s=c.field(d, "grace_s", c.opt_number),
        )


@dataclass(frozen=True, slots=True)
class StopAnswer:
    """Whether the attempt was stopped here, and how it ended when it was."""

    stopped: bool
    exit: AttemptResult | None = None

    def to_wire(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"stopped": self.stopped}
        if self.exit is not None:
            doc["exit"] = self.exit.to_wire()
        return doc

    @classmethod
    def from_wire(cls, value: Any) -> StopAnswer:
        d = c.obj(value, "answer")
        result = d.get("exit")
        return cls(
            stopped=c.field(d, "stopped", c.or_default(c.flag, False)),
            exit=None if result is None else AttemptResult.from_wire(result, "exit"),
        )


@dataclass(frozen=True, slots=True)
class StatusRequest:
    job_id: str

    def to_wire(self) -> dict[str, Any]:
        return {"job_id": self.job_id}

    @classmethod
    def from_wire(cls, value: Any) -> StatusRequest:
        return cls(job_id=c.field(c.obj(value, "body"), "job_id", c.text))


@dataclass(frozen=True, slots=True)
class StatusAnswer:
    """What runs, or last ran, of a job on the answering runner."""

    running: bool
    attempt: int | None
    result: AttemptResult | None

    def to_wire(self) -> dict[str, Any]:
        return {
            "running": self.running,
            "attempt": self.attempt,
            "result": None if self.result is None else self.result.to_wire(),
        }

    @classmethod
    def from_wire(cls, value: Any) -> StatusAnswer:
        d = c.obj(value, "answer")
        result = d.get("result")
        return cls(
            running=c.field(d, "running", c.or_default(c.flag, False)),
            attempt=c.field(d, "attempt", c.opt_integer),
            result=None if result is None else AttemptResult.from_wire(result, "result"),
        )
