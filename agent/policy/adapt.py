"""The one place that turns what agents and the TUI hold today into the policy's snapshot types.

Sources: an agent's gossip view (``agent.mesh.view.NodeView``: inventory, telemetry, node record), a
job's spec (``agent.job.jobspec.JobSpec``), and the TUI's hosts (``tui.model.HostView``). Each is
read through a small Protocol of the fields used, so this module imports neither the view nor the
TUI, and repointing it at the typed wire contract touches only the few ``_field`` reads below.

A job's class is its spec's ``class`` or ``model`` label, else its program's name. Whether a job
whose deadline cannot be met is refused or queued with a warning is its ``on_late`` label
(``refuse`` or ``queue``, the default). Both move to spec fields with the wire contract.
"""

from __future__ import annotations

import os.path
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Final, NamedTuple, Protocol

from agent.job.jobspec import JobSpec
from agent.policy.snapshot import SCHEDULABLE, Device, Job, Node, Placement, Running, Share
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
    def status(self) -> Any: ...
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
    @property
    def shares(self) -> Mapping[str, Mapping[str, int]]: ...


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


_FABRICS = ("nvlink", "xgmi")


def _link(static: DeviceStatic) -> tuple[str | None, str | None]:
    kinds = {link.kind for link in getattr(static, "links", ())}
    for kind in _FABRICS:
        if kind in kinds:
            return kind, kind
    return None, ("pcie" if kinds else None)


def link_domains(statics: Sequence[DeviceStatic]) -> dict[str, str]:
    """Device key -> its link domain among ``statics`` (one host's devices): the devices joined
    by NVLink or xGMI links to one another, directly or through their peers, named by the
    fabric and the first key of the group (``nvlink:<key>``). A device with no such link to a
    device of the host has none."""
    keys = {s.key for s in statics}
    parent = {k: k for k in keys}

    def root(k: str) -> str:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    fabric: dict[str, str] = {}
    for s in statics:
        for link in getattr(s, "links", ()):
            if link.kind in _FABRICS and link.peer in keys and link.peer != s.key:
                fabric[s.key] = fabric.get(s.key) or link.kind
                a, b = root(s.key), root(link.peer)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    return {k: f"{kind}:{root(k)}" for k, kind in fabric.items()}


def device_from_static(
    static: DeviceStatic,
    sample: DeviceSample | None,
    holder: str | None,
    domain_of: Mapping[str, str] | None = None,
    shares: Mapping[str, int] | None = None,
) -> Device:
    """One device; ``domain_of`` (:func:`link_domains` of its host) splits its fabric into the
    groups really linked, else every device of one fabric on a host is taken as one group;
    ``shares``: job -> bytes of the shares of it that run (then ``holder`` is ``None``)."""
    return device_in_use(bare_device(static, domain_of), sample, holder, shares)


def bare_device(static: DeviceStatic, domain_of: Mapping[str, str] | None = None) -> Device:
    """A device's static facts alone (nothing on it, no readings); ``domain_of``: see
    :func:`device_from_static`."""
    domain, kind = _link(static)
    if domain_of is not None:
        domain = domain_of.get(static.key)
    return Device(
        key=static.key,
        model=device_model(static.name, static.backend),
        vendor=static.vendor,
        backend=static.backend,
        arch=static.arch,
        compute_capability=static.compute_capability,
        mem_total_bytes=static.mem_total_bytes or 0,
        link_domain=domain,
        link_kind=kind,
        temp_slowdown_c=static.temp_slowdown_c,
    )


def device_in_use(
    bare: Device,
    sample: DeviceSample | None,
    holder: str | None,
    shares: Mapping[str, int] | None = None,
) -> Device:
    """``bare`` (a device's static facts alone, :class:`HostParts`) with what runs on it now and
    its readings: the one place a device's state is put on its facts."""
    return Device(
        key=bare.key,
        model=bare.model,
        vendor=bare.vendor,
        backend=bare.backend,
        arch=bare.arch,
        compute_capability=bare.compute_capability,
        mem_total_bytes=bare.mem_total_bytes,
        whole_job=holder,
        shares=tuple(Share(j, b) for j, b in sorted(shares.items())) if shares else (),
        link_domain=bare.link_domain,
        link_kind=bare.link_kind,
        temp_c=sample.temp_c if sample else None,
        temp_slowdown_c=bare.temp_slowdown_c,
        power_mw=sample.power_mw if sample else None,
        power_limit_mw=sample.power_limit_mw if sample else None,
        healthy=sample.healthy if sample else True,
    )


class HostParts(NamedTuple):
    """What a node's inventory and ``place`` records alone decide of its policy node, worked out
    once per pair of records (:class:`NodeMemo`) rather than at every decision: each device's
    static facts (a :class:`Device` with nothing on it and no readings), the labels and what
    they say, and the datasets, images and fetch rates the place record lists."""

    inventory: object
    place: object
    devices: tuple[Device, ...]
    labels: dict[str, str]
    zone: str | None
    os: str | None
    cost_per_hour: float | None
    features: frozenset[str]
    datasets: frozenset[str]
    dataset_held: dict[str, int]
    fetch_rates: Mapping[str, float]
    coord: Any

    def fits(self, view: NodeFacts) -> bool:
        """Whether these are ``view``'s parts still (its records are the same objects)."""
        return self.inventory is view.inventory and self.place is view.place


def host_parts(view: NodeFacts) -> HostParts:
    """The parts of ``view``'s policy node that its inventory and place records decide."""
    domains = link_domains(view.statics)
    labels = _labels(view.inventory)
    zone, _, cost = _place_facts(labels)
    return HostParts(
        inventory=view.inventory,
        place=view.place,
        devices=tuple(bare_device(s, domains) for s in view.statics),
        labels=labels,
        zone=zone,
        os=_os(view.inventory),
        cost_per_hour=cost,
        features=view.features,
        datasets=frozenset(view.datasets)  # the place record's, else the datasets label
        | {f"{v.name}@{v.digest}" for v in _versions(view) if v.held_bytes >= v.total_bytes}
        | {image_key(h.name) for h in _images(view)},
        dataset_held={
            **{f"{v.name}@{v.digest}": v.held_bytes for v in _versions(view)},
            **{image_key(h.name): h.total_bytes for h in _images(view)},
        },
        fetch_rates=_field(view.place, "rates") or {},
        coord=_field(view.place, "coord"),
    )


def node_from_view(
    view: NodeFacts, holders: Mapping[str, str] | None = None, parts: HostParts | None = None
) -> Node:
    """An agent's view of one node; ``holders`` maps device keys to the jobs holding them;
    ``parts``: :func:`host_parts` of the view, when held from before (else worked out)."""
    if parts is None or not parts.fits(view):
        parts = host_parts(view)
    free = set(view.free)
    holders = holders or {}
    shared = view.shares
    samples = view.samples
    devices = tuple(
        device_in_use(
            bare,
            samples.get(bare.key),
            None if bare.key in free or bare.key in shared else holders.get(bare.key, BUSY),
            shared.get(bare.key),
        )
        for bare in parts.devices
    )
    return Node(
        node_id=view.node_id,
        devices=devices,
        drain=view.drain if view.inventory is not None else "unknown",
        labels=parts.labels,
        zone=parts.zone,
        os=parts.os,
        datasets=parts.datasets,
        dataset_held=parts.dataset_held,
        fetch_rates=parts.fetch_rates,
        coord=parts.coord,
        cost_per_hour=parts.cost_per_hour,
        features=parts.features,
    )


def nodes_from_views(
    views: Iterable[NodeFacts], holders: Mapping[str, Mapping[str, str]] | None = None
) -> tuple[Node, ...]:
    """``holders``: by node, the device keys held by each running job (see :func:`holders`)."""
    held = holders or {}
    return tuple(node_from_view(v, held.get(v.node_id)) for v in views)


class NodeMemo:
    """The policy's nodes of an agent's views, kept from one decision to the next: a view whose
    records (inventory, node record, place, telemetry) are the same objects as last time gives
    back the same :class:`Node`, so the policy's index re-indexes only the nodes that changed
    (:meth:`agent.policy.index.ClusterIndex.refresh`) and nothing is rebuilt for the others. A
    node whose node record or telemetry changed (a job started or ended there) is rebuilt from
    its :class:`HostParts`, which its inventory and place record alone decide."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[tuple[object, ...], Node, HostParts]] = {}

    def nodes(self, views: Iterable[NodeFacts]) -> tuple[Node, ...]:
        held: dict[str, tuple[tuple[object, ...], Node, HostParts]] = {}
        out: list[Node] = []
        for view in views:
            facts = (view.inventory, view.status, view.place, view.samples)
            last = self._held.get(view.node_id)
            if last is not None and all(a is b for a, b in zip(last[0], facts, strict=True)):
                node, parts = last[1], last[2]
            else:
                parts = last[2] if last is not None and last[2].fits(view) else host_parts(view)
                node = node_from_view(view, parts=parts)
            held[view.node_id] = (facts, node, parts)
            out.append(node)
        self._held = held
        return tuple(out)


def job_from_record(job_id: str, doc: Mapping[str, Any], spec: JobSpec) -> Job:
    """The job a gossiped job record (``agent.mesh.view.ClusterView.jobs``) names, as the policy
    sees it: its signed submission's ``spec``, and the owner and submission time the record
    says (0 when it says none)."""
    owner, submitted = doc.get("owner"), doc.get("submitted_at")
    return job_from_spec(
        job_id,
        spec,
        owner=owner if isinstance(owner, str) else None,
        submitted_at=float(submitted) if isinstance(submitted, int | float) else 0.0,
    )


def running_from_jobs(
    jobs: Mapping[str, Mapping[str, Any]],
    specs: Mapping[str, JobSpec],
    *,
    live: Collection[str],
    checkpoints: Mapping[str, float] | None = None,
) -> tuple[Running, ...]:
    """The jobs that run now, as the gossiped job records say
    (``agent.mesh.view.ClusterView.jobs``): state ``running`` on a live runner, on its devices,
    since ``started_at``. Priority and preemptible come from each job's own signed submission
    (``specs``, by job id); a job whose submission is not held is left out. ``checkpoints``: when a
    job last saved one, where known (else the policy counts the work lost since it started)."""
    out: list[Running] = []
    saved = checkpoints or {}
    for job_id, doc in jobs.items():
        runner, started = doc.get("runner"), doc.get("started_at")
        spec = specs.get(job_id)
        if doc.get("state") != "running" or spec is None:
            continue
        if not isinstance(runner, str) or runner not in live:
            continue
        if isinstance(started, bool) or not isinstance(started, int | float):
            continue
        devices = doc.get("devices")
        keys = tuple(str(k) for k in devices) if isinstance(devices, list | tuple) else ()
        out.append(
            Running(
                job=job_from_record(job_id, doc, spec),
                placement=Placement((runner,), (keys,)),
                started_at=float(started),
                last_checkpoint_at=saved.get(job_id),
            )
        )
    return tuple(out)


def holders(running: Iterable[Running]) -> dict[str, dict[str, str]]:
    """By node, device key -> the running job holding it."""
    out: dict[str, dict[str, str]] = {}
    for r in running:
        for node_id, keys in zip(r.placement.node_ids, r.placement.devices, strict=True):
            for key in keys:
                out.setdefault(node_id, {})[key] = r.job.job_id
    return out


def dataset_bytes(views: Iterable[NodeFacts]) -> dict[str, int]:
    """How big each dataset is: the most any node holding it says (0 where none knows), by
    name and by ``NAME@DIGEST`` for each version a node holds whole or in part."""
    sizes: dict[str, int] = {}
    for view in views:
        for name, size in view.datasets.items():
            sizes[name] = max(size, sizes.get(name, 0))
        for v in _versions(view):
            sizes[f"{v.name}@{v.digest}"] = v.total_bytes
        for h in _images(view):
            key = image_key(h.name)
            sizes[key] = max(h.total_bytes, sizes.get(key, 0))
    return sizes


def dataset_newest(views: Iterable[NodeFacts]) -> dict[str, str]:
    """Dataset name -> the digest of its newest version any node holds (what ``NAME`` means)."""
    best: dict[str, tuple[float, str]] = {}
    for view in views:
        for v in _versions(view):
            held = best.get(v.name)
            if held is None or (v.created_s, v.digest) > held:
                best[v.name] = (v.created_s, v.digest)
    return {name: digest for name, (_t, digest) in best.items()}


IMAGE_KEY_PREFIX: Final = "image:"


def image_key(ref: str) -> str:
    """The data term's name for a container image: its bytes count as a dataset's do (missing
    where no member's archive of it is held; ``agent.running.peerimages``)."""
    return IMAGE_KEY_PREFIX + ref


def _images(view: NodeFacts) -> tuple[Any, ...]:
    """The image archives a node's ``place`` record lists (none from an older agent)."""
    return tuple(h for h in _field(view.place, "content") or () if h.kind == "image")


def _versions(view: NodeFacts) -> tuple[Any, ...]:
    """The dataset versions of a node's ``place`` record (none from an older agent)."""
    return tuple(_field(view.place, "versions") or ())


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
        gpus_max_per_node=r.gpus_max_per_node,
        min_mem_per_gpu_bytes=r.min_mem_per_gpu_bytes,
        share_mem_bytes=r.share_mem_bytes,
        share_fraction=r.share_fraction,
        backends=tuple(r.backends),
        min_compute_capability=r.min_compute_capability,
        archs=tuple(r.archs),
        interconnect=r.interconnect,
        os=r.os,
        affinity=dict(spec.affinity),
        anti_affinity=dict(spec.anti_affinity),
        datasets=tuple(spec.datasets) + ((image_key(spec.image),) if spec.image else ()),
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
    "NodeMemo",
    "dataset_newest",
    "holders",
    "job_class",
    "job_from_spec",
    "node_from_host",
    "node_from_view",
    "nodes_from_views",
    "running_from_jobs",
]
