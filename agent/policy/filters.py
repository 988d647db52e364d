"""Hard filters: what a device or a node must be for a job to run there at all.

Each filter answers ``None`` (passes) or a short reason, worded for the "why waiting" line
("backend rocm", "80 GiB per GPU"). Device filters look at one GPU's facts; node filters at the
host (drain state, OS, labels, cost, CPU and memory, the link between its GPUs). None of them
looks at what is busy: that is the capacity the index tracks, and it is what tells a job that
waits for busy capacity from one that can never fit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from agent.job.jobspec import IMAGE_HOST
from agent.policy.snapshot import SCHEDULABLE, Device, Job, Node

GIB: Final = 1024**3


def _cc(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(p) for p in text.split("."))
    except ValueError:
        return None


def gib(n: int) -> str:
    return f"{n / GIB:g} GiB"


# -- one device ----------------------------------------------------------------------------------


def backend_filter(job: Job, d: Device) -> str | None:
    if job.backends and d.backend not in job.backends:
        return "backend " + "/".join(job.backends)
    if not job.backends and d.backend == "cpu" and job.gpus_per_node > 0:
        return "a GPU"
    return None


def model_filter(job: Job, d: Device) -> str | None:
    if job.models and d.model not in job.models:
        return "model " + "/".join(job.models)
    return None


def memory_filter(job: Job, d: Device) -> str | None:
    need = job.min_mem_per_gpu_bytes or 0
    if job.share_mem_bytes is not None:
        need = max(need, job.share_mem_bytes)
    if need and d.mem_total_bytes < need:
        return f"{gib(need)} per GPU"
    return None


def compute_capability_filter(job: Job, d: Device) -> str | None:
    if job.min_compute_capability is None:
        return None
    want, have = _cc(job.min_compute_capability), _cc(d.compute_capability)
    if d.vendor != "nvidia" or want is None or have is None or have < want:
        return f"compute capability >= {job.min_compute_capability}"
    return None


def arch_filter(job: Job, d: Device) -> str | None:
    if job.archs and (d.arch or "").lower() not in {a.lower() for a in job.archs}:
        return "arch " + "/".join(job.archs)
    return None


def health_filter(job: Job, d: Device) -> str | None:
    return None if d.healthy else "a healthy GPU"


DEVICE_FILTERS: Final[tuple[Callable[[Job, Device], str | None], ...]] = (
    backend_filter,
    model_filter,
    memory_filter,
    compute_capability_filter,
    arch_filter,
    health_filter,
)


def device_reason(job: Job, d: Device) -> str | None:
    """Why ``d`` can never serve ``job``, or ``None``."""
    for check in DEVICE_FILTERS:
        reason = check(job, d)
        if reason is not None:
            return reason
    return None


# -- one node ------------------------------------------------------------------------------------


def drain_filter(job: Job, n: Node) -> str | None:
    return None if n.drain == SCHEDULABLE else f"a schedulable node ({n.node_id} is {n.drain})"


def image_filter(job: Job, n: Node) -> str | None:
    if "image" not in job.features:
        return None
    if n.os is not None and n.os.lower() != "linux":
        return IMAGE_HOST
    if n.features is not None and "image" not in n.features:
        return IMAGE_HOST
    return None


def features_filter(job: Job, n: Node) -> str | None:
    if n.features is None or not job.features:
        return None
    lacking = [f for f in job.features if f not in n.features]
    if lacking:
        return f"an agent that runs feature{'s' * (len(lacking) > 1)} {', '.join(lacking)}"
    return None


def os_filter(job: Job, n: Node) -> str | None:
    if job.os is not None and (n.os or "").lower() != job.os.lower():
        return f"OS {job.os}"
    return None


def affinity_filter(job: Job, n: Node) -> str | None:
    for k, v in job.affinity.items():
        if n.labels.get(k) != v:
            return f"label {k}={v}"
    for k, v in job.anti_affinity.items():
        if n.labels.get(k) == v:
            return f"no label {k}={v}"
    return None


def cost_filter(job: Job, n: Node) -> str | None:
    cap = job.max_cost_per_hour
    if cap is not None and n.cost_per_hour is not None and n.cost_per_hour > cap:
        return f"cost <= {cap:g}/h"
    return None


def host_filter(job: Job, n: Node) -> str | None:
    if job.cpu_milli and n.cpu_milli_total is not None and n.cpu_milli_total < job.cpu_milli:
        return f"{job.cpu_milli / 1000:g} CPUs"
    total = n.host_mem_total_bytes
    if job.host_mem_bytes and total is not None and total < job.host_mem_bytes:
        return f"{gib(job.host_mem_bytes)} of host memory"
    return None


NODE_FILTERS: Final[tuple[Callable[[Job, Node], str | None], ...]] = (
    drain_filter,
    image_filter,
    features_filter,
    os_filter,
    affinity_filter,
    cost_filter,
    host_filter,
)


def node_reason(job: Job, n: Node, *, drained_too: bool = False) -> str | None:
    """Why node ``n`` cannot host ``job`` whatever runs there, or ``None``; ``drained_too``
    asks of the node as if it took work (a cordon or a drain is lifted, a GPU is not added)."""
    for check in NODE_FILTERS:
        if drained_too and check is drain_filter:
            continue
        reason = check(job, n)
        if reason is not None:
            return reason
    return None


def host_room(job: Job, n: Node, leaving: Sequence[Job] = ()) -> bool:
    """Whether ``n``'s free CPU and host memory take ``job`` now, once ``leaving`` (jobs that
    run there and go) have gone, as a runner checks before it starts it; a node that does not
    account them always has room."""
    cpu, mem = n.cpu_milli_free, n.host_mem_free_bytes
    for gone in leaving:
        cpu = None if cpu is None else cpu + gone.cpu_milli
        mem = None if mem is None else mem + gone.host_mem_bytes
    if job.cpu_milli and cpu is not None and cpu < job.cpu_milli:
        return False
    return not (job.host_mem_bytes and mem is not None and mem < job.host_mem_bytes)


def linked_groups(job: Job, devices: Sequence[Device]) -> list[list[Device]]:
    """``devices`` split into the groups the job's GPUs may be chosen from together: one group
    when the job needs no interconnect (or one GPU), else one group per link domain of the
    required kind (NVLink, xGMI; PCIe is every device's)."""
    if job.interconnect is None or job.gpus_per_node <= 1 or job.interconnect == "pcie":
        return [list(devices)]
    groups: dict[str, list[Device]] = {}
    for d in devices:
        if d.link_kind == job.interconnect and d.link_domain is not None:
            groups.setdefault(d.link_domain, []).append(d)
    return list(groups.values())


def static_fit(job: Job, n: Node, *, drained_too: bool = False) -> str | None:
    """Why ``n`` cannot host (its part of) ``job`` even when idle, or ``None`` (``drained_too``:
    even idle and schedulable, which is what "never fits" means)."""
    reason = node_reason(job, n, drained_too=drained_too)
    if reason is not None:
        return reason
    if job.gpus_per_node == 0:
        return None
    fitting = [d for d in n.devices if device_reason(job, d) is None]
    if not fitting:
        reasons = [device_reason(job, d) for d in n.devices]
        return next((r for r in reasons if r is not None), "a GPU")
    by_vendor: dict[str, list[Device]] = {}
    for d in fitting:
        by_vendor.setdefault(d.vendor, []).append(d)
    want = 1 if job.is_share else job.gpus_per_node
    for group in by_vendor.values():
        if any(len(g) >= want for g in linked_groups(job, group)):
            return None
    if job.interconnect is not None and job.gpus_per_node > 1:
        return f"{job.gpus_per_node} GPUs linked by {job.interconnect}"
    return f"{job.gpus_per_node} matching GPUs on one node"
