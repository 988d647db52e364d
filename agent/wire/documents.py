"""What the HTTP API answers to operators: one definition per document.

Operator-facing (JSON): :class:`NodeDoc` (``GET /v1/nodes`` answers ``{"nodes": [...]}``, each
with its :class:`DeviceDoc` list), :class:`JobDoc` (``GET /v1/jobs`` answers ``{"jobs": [...]}``,
``GET /v1/jobs/{id}`` one), :class:`EventsDoc` (``GET /v1/events``); ``GET /healthz`` is
:class:`agent.wire.health.HealthDoc`. ``agent.operator.client.ApiClient`` decodes with these same
definitions, and the TUI's simulated mesh (``tui.simmesh.SimSource``) encodes with them, so every
reader sees one shape. An agent loads this module on the first read of its API (as it loads
``prometheus_client`` on the first scrape): an agent no operator reads does not hold it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from agent.wire import codec as c
from agent.wire.codec import EMPTY_MAP
from agent.wire.inventory import host_from_wire, host_to_wire
from agent.wire.place import HeldContent, HeldVersion
from agent.wire.records import GangMember, JobStatus, shares_from_wire
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


def links_from_json(value: Any, name: str = "links") -> tuple[Link, ...]:
    """A device document's ``links``."""
    return c.items(value, name, _link_from_json)


def mig_from_json(value: Any, name: str = "mig") -> tuple[MigDevice, ...]:
    """A device document's ``mig`` instances."""
    return c.items(value, name, _mig_from_json)


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
        links=links_from_json(d.get("links"), p + "links"),
        mig_devices=mig_from_json(d.get("mig"), p + "mig"),
    )


def device_sample_from_json(value: Any, key: str, name: str = "device") -> DeviceSample:
    """What one device document says the device is doing (read for every GPU at every refresh
    of the TUI: the usual types are checked at once, the readers name a field that is wrong)."""
    d = c.obj(value, name)
    get = d.get
    mem, util, temp = get("mem_used_bytes"), get("util_pct"), get("temp_c")
    power, limit, healthy = get("power_mw"), get("power_limit_mw"), get("healthy", True)
    if (
        (mem is None or type(mem) is int)
        and (util is None or type(util) is float)
        and (temp is None or type(temp) is float)
        and (power is None or type(power) is int)
        and (limit is None or type(limit) is int)
        and type(healthy) is bool
    ):
        return DeviceSample(key, mem, util, temp, power, limit, healthy)
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


def static_json(index: int, s: DeviceStatic) -> dict[str, Any]:
    """The static part of a device document (a writer may keep it, and add each sample)."""
    return {
        "index": index,
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
        "links": [_link_json(link) for link in s.links],
        "mig": [
            {"uuid": m.uuid, "name": m.name, "mem_total_bytes": m.mem_total_bytes}
            for m in s.mig_devices
        ],
    }


def sample_json(d: DeviceSample) -> dict[str, Any]:
    """The changing part of a device document."""
    return {
        "mem_used_bytes": d.mem_used_bytes,
        "util_pct": d.util_pct,
        "temp_c": d.temp_c,
        "power_mw": d.power_mw,
        "power_limit_mw": d.power_limit_mw,
        "healthy": d.healthy,
    }


@dataclass(frozen=True, slots=True)
class DeviceDoc:
    """One device in ``/v1/nodes``: the ``shoal probe --json`` device object, plus its key,
    source, compute capability, throttle point, health, link details and MIG instances."""

    index: int
    static: DeviceStatic
    sample: DeviceSample

    def to_wire(self) -> dict[str, Any]:
        return {**static_json(self.index, self.static), **sample_json(self.sample)}

    @classmethod
    def from_wire(cls, value: Any, name: str = "device") -> DeviceDoc:
        static = device_static_from_json(value, name)
        return cls(
            index=c.field(c.obj(value, name), "index", c.or_default(c.integer, 0), name + "."),
            static=static,
            sample=device_sample_from_json(value, static.key, name),
        )


class NodeDoc(NamedTuple):
    """One member of the mesh in ``/v1/nodes``, as the answering agent sees it."""

    node_id: str
    addr: str | None = None
    state: str = "unknown"
    """Membership: ``alive``, ``suspect``, ``dead``, ``left``."""
    role: str | None = None
    drain: str | None = None
    labels: Mapping[str, str] = EMPTY_MAP
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
    container_runtime: str | None = None
    """What runs its jobs that name an image (``podman``, ``docker``; ``None``: nothing)."""
    datasets: Mapping[str, int] = EMPTY_MAP
    """Dataset -> bytes the node holds (0: size not known)."""
    rtt_s: float | None = None
    """The estimated round trip from the answering agent to it (network coordinates)."""
    shares: Mapping[str, Mapping[str, int]] = EMPTY_MAP
    """Device key -> {job -> bytes of its memory the job holds}: the devices shared by jobs that
    each asked for a share of one GPU (as its node record says)."""
    dataset_versions: tuple[HeldVersion, ...] = ()
    """The dataset versions the node holds, whole or in part (its ``place`` record)."""
    fetch_rates: Mapping[str, float] = EMPTY_MAP
    """Member -> the bytes/s this node measured fetching content from it (its ``place``
    record; the scheduler's data term divides by these)."""
    content: tuple[HeldContent, ...] = ()
    """The images and Python environments the node holds whole (its ``place`` record)."""
    telemetry_every_s: float | None = None
    """The node sends its telemetry at least this often (its heartbeat, longer in a larger mesh;
    ``None``: not said, 60 s): older than one and a half of it, it is stale
    (``agent.wire.records.telemetry_stale``)."""

    def to_wire(self) -> dict[str, Any]:
        doc = {
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
            "container_runtime": self.container_runtime,
            "datasets": dict(self.datasets),
            "rtt_s": self.rtt_s,
            "shares": {k: dict(jobs) for k, jobs in self.shares.items()},
        }
        if self.dataset_versions:  # left out when none: a node doc as older agents write it
            doc["dataset_versions"] = [v._asdict() for v in self.dataset_versions]
        if self.fetch_rates:  # left out when none, as dataset_versions
            doc["fetch_rates"] = dict(self.fetch_rates)
        if self.content:  # left out when none, as dataset_versions
            doc["content"] = [h._asdict() for h in self.content]
        if self.telemetry_every_s is not None:  # left out when not said, as dataset_versions
            doc["telemetry_every_s"] = self.telemetry_every_s
        return doc

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
            container_runtime=c.field(d, "container_runtime", c.opt_text, p),
            datasets=c.field(d, "datasets", _sizes, p),
            rtt_s=c.field(d, "rtt_s", c.opt_number, p),
            shares=shares_from_wire(d.get("shares"), p + "shares"),
            dataset_versions=c.items(d.get("dataset_versions"), p + "dataset_versions", _version),
            fetch_rates=_rates(d.get("fetch_rates"), p + "fetch_rates"),
            content=c.items(d.get("content"), p + "content", _held_content),
            telemetry_every_s=c.field(d, "telemetry_every_s", c.opt_number, p),
        )


def _held_content(value: Any, name: str) -> HeldContent:
    d = c.obj(value, name)
    return HeldContent(
        kind=c.field(d, "kind", c.text, name + "."),
        name=c.field(d, "name", c.text, name + "."),
        digest=c.field(d, "digest", c.text, name + "."),
        total_bytes=c.field(d, "total_bytes", c.integer, name + "."),
    )


def _rates(value: Any, name: str) -> dict[str, float]:
    if value is None:
        return {}
    return {c.text(k, name): c.number(v, f"{name}.{k}") for k, v in c.obj(value, name).items()}


def _version(value: Any, name: str) -> HeldVersion:
    d = c.obj(value, name)
    p = name + "."
    return HeldVersion(
        name=c.field(d, "name", c.text, p),
        digest=c.field(d, "digest", c.text, p),
        total_bytes=c.field(d, "total_bytes", c.integer, p),
        held_bytes=c.field(d, "held_bytes", c.integer, p),
        created_s=c.field(d, "created_s", c.number, p),
    )


def _sizes(value: Any, name: str) -> dict[str, int]:
    """An object of byte counts; missing is empty."""
    if value is None:
        return {}
    return {k: c.integer(v, f"{name}.{k}") for k, v in c.obj(value, name).items()}


def nodes_to_wire(nodes: list[NodeDoc]) -> dict[str, Any]:
    return {"nodes": [n.to_wire() for n in nodes]}


def nodes_from_wire(value: Any) -> list[NodeDoc]:
    return list(c.items(c.obj(value).get("nodes"), "nodes", NodeDoc.from_wire))


# -- jobs ----------------------------------------------------------------------------------------


class JobDoc(NamedTuple):
    """A job in ``/v1/jobs``: its owner's record (every field of ``job/<id>``), the operator's
    spec, and its progress."""

    status: JobStatus
    spec: Mapping[str, Any] = EMPTY_MAP
    """The spec as the operator submitted it (``JobSpec.to_dict``)."""
    progress: float | None = None
    """Fraction done, as the job reports it (``SHOAL_PROGRESS``)."""
    eta_s: float | None = None

    @property
    def members(self) -> tuple[GangMember, ...]:
        """A gang's nodes by rank, each with its devices (its record's ``members``); empty for
        a job on one node."""
        return self.status.members

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


class EventDoc(NamedTuple):
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


class EventsDoc(NamedTuple):
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
