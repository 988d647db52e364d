"""Before a job is submitted: could any node of the mesh ever run it, and could one now?

Read from the agent's own listings (``GET /v1/nodes`` and ``GET /v1/jobs``) with the agents'
own per-GPU filter (:func:`agent.placement.device_fits`), so the answer is the placement's:

- **never**: no node of the mesh (alive or suspect) has enough devices of one vendor that meet
  the job's per-GPU constraints, counting every device it has, busy or not. ``shoal submit``
  refuses such a job (nothing is submitted) unless told to let it wait for a host that can.
- **not now**: some node has them, but none that takes new work has them free (in use by running
  jobs, or the node cordoned or draining): the job is submitted and waits.
- **now**: a schedulable node has them free.

:func:`asks` says in words what a job asks for, as ``shoal submit`` prints it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.jobspec import JobSpec
from agent.placement import device_fits

LIVE_STATES = ("alive", "suspect")
BUSY_JOB_STATES = ("placing", "running", "migrating")


@dataclass(frozen=True, slots=True)
class _Device:
    """The facts :func:`device_fits` reads, from a device of ``GET /v1/nodes``."""

    key: str
    vendor: str
    backend: str
    mem_total_bytes: int | None
    compute_capability: str | None
    arch: str | None

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> _Device:
        mem = doc.get("mem_total_bytes")
        return cls(
            key=str(doc.get("key", "")),
            vendor=str(doc.get("vendor", "")),
            backend=str(doc.get("backend", "")),
            mem_total_bytes=int(mem) if mem is not None else None,
            compute_capability=doc.get("compute_capability"),
            arch=doc.get("arch"),
        )


@dataclass(frozen=True, slots=True)
class Fit:
    """How a job fits the mesh: ``ever`` and ``now`` name the nodes (host names)."""

    ever: tuple[str, ...]
    now: tuple[str, ...]
    nodes: int
    """Live agents looked at."""
    best: str
    """The most of what the job asks for that one node has (``2x NVIDIA L4 on gpu1``); empty
    when no node has any."""

    @property
    def never(self) -> bool:
        return not self.ever


def _hostname(node: Mapping[str, Any]) -> str:
    host = node.get("host") or {}
    return str(host.get("hostname") or str(node.get("node_id", ""))[:8])


def _fitting(spec: JobSpec, node: Mapping[str, Any]) -> dict[str, list[_Device]]:
    """The node's devices that meet the job's per-GPU constraints, by vendor."""
    out: dict[str, list[_Device]] = {}
    for doc in node.get("devices") or []:
        device = _Device.from_json(doc)
        if device.backend != "cpu" and device_fits(spec, device):
            out.setdefault(device.vendor, []).append(device)
    return out


def _names(devices: Sequence[_Device], docs: Sequence[Mapping[str, Any]]) -> str:
    names = {str(d.get("key")): str(d.get("name", "?")) for d in docs}
    return names.get(devices[0].key, "?").removesuffix(" (simulated)") if devices else "?"


def fit(
    spec: JobSpec, nodes: Sequence[Mapping[str, Any]], jobs: Sequence[Mapping[str, Any]]
) -> Fit:
    """Where ``spec`` fits among ``nodes``, ever and now (see the module's docstring)."""
    want = spec.resources.gpus_per_node
    busy: dict[str, set[str]] = {}
    for job in jobs:
        if job.get("state") in BUSY_JOB_STATES and job.get("runner"):
            busy.setdefault(str(job["runner"]), set()).update(map(str, job.get("devices") or []))
    ever: list[str] = []
    now: list[str] = []
    live = 0
    best_count, best = 0, ""
    for node in nodes:
        if node.get("state") not in LIVE_STATES or node.get("role") not in ("agent", None):
            continue
        live += 1
        name = _hostname(node)
        groups = _fitting(spec, node)
        largest = max(groups.values(), key=len, default=[])
        if largest and len(largest) > best_count:
            best_count = len(largest)
            best = f"{len(largest)}x {_names(largest, node.get('devices') or [])} on {name}"
        if len(largest) < want:
            continue
        ever.append(name)
        used = busy.get(str(node.get("node_id")), set())
        free = max((sum(d.key not in used for d in g) for g in groups.values()), default=0)
        if node.get("drain") in ("schedulable", None) and free >= want:
            now.append(name)
    if want == 0:
        best = f"{live} live agent{'s' * (live != 1)}"
    gangs = spec.resources.nodes
    return Fit(
        ever=tuple(ever) if len(ever) >= gangs else (),
        now=tuple(now) if len(now) >= gangs else (),
        nodes=live,
        best=best,
    )


def asks(spec: JobSpec) -> str:
    """What the job asks for, in words: ``no GPU (any host)``, ``2 GPUs (cuda, >= 40 GiB)``."""
    r = spec.resources
    if r.gpus_per_node == 0:
        text = "no GPU (runs on any host)"
    else:
        what = []
        if r.backends:
            what.append("/".join(r.backends))
        if r.min_mem_per_gpu_bytes is not None:
            what.append(f">= {r.min_mem_per_gpu_bytes / 1024**3:g} GiB each")
        if r.min_compute_capability is not None:
            what.append(f"compute capability >= {r.min_compute_capability}")
        if r.archs:
            what.append("arch " + "/".join(r.archs))
        text = f"{r.gpus_per_node} GPU{'s' * (r.gpus_per_node != 1)} of one vendor"
        if what:
            text += f" ({', '.join(what)})"
    if r.nodes > 1:
        text += f" on each of {r.nodes} nodes"
    return text
