"""The one place that turns what agents and the TUI hold today into the policy's snapshot types.

Sources: an agent's gossip view (``agent.view.NodeView``: inventory, telemetry, node record), a
job's spec (``agent.jobspec.JobSpec``), and the TUI's hosts (``tui.model.HostView``). Each is read
through a small Protocol of the fields used, so this module imports neither the view nor the TUI,
and repointing it at the typed wire contract touches only the few ``_field`` reads below.

A job's class is its spec's ``class`` or ``model`` label, else its program's name. Whether a job
whose deadline cannot be met is refused or queued with a warning is its ``on_late`` label
(``refuse`` or ``queue``, the default). Both move to spec fields with the wire contract.
"""

from __future__ import annotations

import os.path
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from agent.jobspec import JobSpec
from agent.policy.snapshot import SCHEDULABLE, Device, Job, Node
from probers.catalog import device_model
from probers.records import DeviceSample, DeviceStatic

BUSY = "(busy)"
"""The holder of a device the node record lists as not free, when the policy is not told which
job holds it."""


class NodeFacts(Protocol):
    """What the adapter reads of an agent's ``NodeView``."""

    @property
    def node_id(self) -> str: ...
    @property
    def inventory(self) -> Any: ...
    @property
    def statics(self) -> Sequence[DeviceStatic]: ...
    @property
    def samples(self) -> Mapping[str, DeviceSample]: ...
    @property
    def drain(self) -> str: ...
    @property
    def free(self) -> list[str]: ...
    @property
    def features(self) -> frozenset[str]: ...
    @property
    def datasets(self) -> Mapping[str, int]: ...
    @property
    def place(self) -> Any: ...


class HostDeviceFacts(Protocol):
    """What the adapter reads of the TUI's ``DeviceView``."""

    @property
    def key(self) -> str: ...
    @property
    def vendor(self) -> str: ...
    @property
    def backend(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def arch(self) -> str | None: ...
    @property
    def compute_capability(self) -> str | None: ...
    @property
    def mem_total_bytes(self) -> int | None: ...
    @property
    def temp_c(self) -> float | None: ...
    @property
    def temp_slowdown_c(self) -> float | None: ...
    @property
    def power_mw(self) -> int | None: ...
    @property
    def power_limit_mw(self) -> int | None: ...


class HostFacts(Protocol):
    """What the adapter reads of the TUI's ``HostView``."""

    @property
    def node_id(self) -> str: ...
    @property
    def drain(self) -> str: ...
    @property
    def labels(self) -> Mapping[str, str]: ...
    @property
    def os(self) -> str | None: ...
    @property
    def devices(self) -> Sequence[HostDeviceFacts]: ...
    @property
    def features(self) -> Sequence[str]: ...


def _field(doc: Any, name: str) -> Any:
    """A field of a record: a dict today, a typed record with the wire contract."""
    if doc is None:
        return None
    if isinstance(doc, Mapping):
        return doc.get(name)
    return getattr(doc, name, None)


def _labels(doc: Any) -> dict[str, str]:
    raw = _field(doc, "labels")
    if isinstance(raw, Mapping):
        return {str(k): str(v) for k, v in raw.items()}
    return {}


def _os(doc: Any) -> str | None:
    host = _field(doc, "host")
    value = _field(host, "os")
    return value if isinstance(value, str) else None


def _place_facts(labels: Mapping[str, str]) -> tuple[str | None, frozenset[str], float | None]:
    zone = labels.get("zone")
    datasets = frozenset(d for d in labels.get("datasets", "").split(",") if d)
    cost: float | None
    try:
        cost = float(labels["cost_per_hour"])
    except (KeyError, ValueError):
        cost = None
    return zone, datasets, cost


def _link(static: DeviceStatic) -> tuple[str | None, str | None]:
    kinds = {link.kind for link in getattr(static, "links", ())}
    for kind in ("nvlink", "xgmi"):
        if kind in kinds:
            return kind, kind
    return None, ("pcie" if kinds else None)


def device_from_static(
    static: DeviceStatic, sample: DeviceSample | None, holder: str | None
) -> Device:
    domain, kind = _link(static)
    return Device(
        key=static.key,
        model=device_model(static.name, static.backend),
        vendor=static.vendor,
        backend=static.backend,
        arch=static.arch,
        compute_capability=static.compute_capability,
        mem_total_bytes=static.mem_total_bytes or 0,
        whole_job=holder,
        link_domain=domain,
        link_kind=kind,
        temp_c=sample.temp_c if sample else None,
        temp_slowdown_c=static.temp_slowdown_c,
        power_mw=sample.power_mw if sample else None,
        power_limit_mw=sample.power_limit_mw if sample else None,
        healthy=sample.healthy if sample else True,
    )


def node_from_view(view: NodeFacts, holders: Mapping[str, str] | None = None) -> Node:
    """An agent's view of one node; ``holders`` maps device keys to the jobs holding them."""
    free = set(view.free)
    holders = holders or {}
    devices = tuple(
        device_from_static(
            s,
            view.samples.get(s.key),
            None if s.key in free else holders.get(s.key, BUSY),
        )
        for s in view.statics
    )
    labels = _labels(view.inventory)
    zone, _, cost = _place_facts(labels)
    return Node(
        node_id=view.node_id,
        devices=devices,
        drain=view.drain if view.inventory is not None else "unknown",
        labels=labels,
        zone=zone,
        os=_os(view.inventory),
        datasets=frozenset(view.datasets),  # the place record's, else the datasets label
        coord=_field(view.place, "coord"),
        cost_per_hour=cost,
        features=view.features,
    )


def nodes_from_views(views: Iterable[NodeFacts]) -> tuple[Node, ...]:
    return tuple(node_from_view(v) for v in views)


def dataset_bytes(views: Iterable[NodeFacts]) -> dict[str, int]:
    """How big each dataset is: the most any node holding it says (0 where none knows)."""
    sizes: dict[str, int] = {}
    for view in views:
        for name, size in view.datasets.items():
            sizes[name] = max(size, sizes.get(name, 0))
    return sizes


def node_from_host(host: HostFacts, busy: Iterable[str]) -> Node:
    """The TUI's view of one host; ``busy``: its device keys held by live jobs."""
    taken = set(busy)
    devices = tuple(
        Device(
            key=d.key,
            model=device_model(d.name.replace("(simulated)", ""), d.backend),
            vendor=d.vendor,
            backend=d.backend,
            arch=d.arch,
            compute_capability=d.compute_capability,
            mem_total_bytes=d.mem_total_bytes or 0,
            whole_job=BUSY if d.key in taken else None,
            temp_c=d.temp_c,
            temp_slowdown_c=d.temp_slowdown_c,
            power_mw=d.power_mw,
            power_limit_mw=d.power_limit_mw,
        )
        for d in host.devices
    )
    labels = dict(host.labels)
    zone, datasets, cost = _place_facts(labels)
    return Node(
        node_id=host.node_id,
        devices=devices,
        drain=host.drain,
        labels=labels,
        zone=zone,
        os=host.os,
        datasets=datasets,
        cost_per_hour=cost,
        features=frozenset(host.features),
    )


def job_class(spec: JobSpec) -> str:
    """The spec's ``class`` or ``model`` label, else the name of the program it runs."""
    named = spec.labels.get("class") or spec.labels.get("model")
    if named:
        return named
    program = os.path.basename(spec.command[0])
    if program.startswith("python") and len(spec.command) > 1:
        return os.path.basename(spec.command[1])
    return program


def job_from_spec(
    job_id: str, spec: JobSpec, *, owner: str | None = None, submitted_at: float = 0.0
) -> Job:
    r = spec.resources
    on_late = spec.labels.get("on_late", "queue")
    return Job(
        job_id=job_id,
        job_class=job_class(spec),
        kind=spec.kind,
        owner=owner,
        gpus_per_node=r.gpus_per_node,
        nodes=r.nodes,
        min_mem_per_gpu_bytes=r.min_mem_per_gpu_bytes,
        backends=tuple(r.backends),
        min_compute_capability=r.min_compute_capability,
        archs=tuple(r.archs),
        interconnect=r.interconnect,
        affinity=dict(spec.affinity),
        anti_affinity=dict(spec.anti_affinity),
        datasets=tuple(spec.datasets),
        priority=spec.priority,
        preemptible=spec.preemptible,
        deadline=spec.deadline,
        deadline_action="refuse" if on_late == "refuse" else "queue",
        submitted_at=submitted_at,
        max_runtime_s=spec.max_runtime_s,
        features=spec.features,
    )


__all__ = [
    "BUSY",
    "SCHEDULABLE",
    "HostFacts",
    "NodeFacts",
    "job_class",
    "job_from_spec",
    "node_from_host",
    "node_from_view",
    "nodes_from_views",
]
