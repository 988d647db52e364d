"""What a runner checks of an offer against its own node before it starts anything.

The owner chose the node from its gossip view with the policy's hard filters
(:mod:`agent.policy.filters`); the runner checks the same filters again against what it really
is, so an owner with a stale or partial view (or one of another version) cannot make it run a
job its node does not meet. It reads its own inventory, not gossip:

- the node filters (:func:`~agent.policy.filters.node_reason`): the job-spec features this agent
  runs, its OS, its labels for ``affinity`` and ``anti_affinity``, CPU and host memory;
- as many devices offered as the job asks for (an elastic job: any number in its range), each
  passing the device filters
  (:func:`~agent.policy.filters.device_reason`: backend, memory, compute capability, arch);
- for ``resources.interconnect``, the devices offered joined by that link in its own inventory
  (:func:`~agent.policy.filters.linked_groups` over :func:`agent.policy.adapt.link_domains`).

Then what runs there (:func:`admit`): a device given whole takes nothing else; a share of a GPU
(``resources.share_fraction`` or ``share_mem_bytes``) goes on a device no job holds whole, while
the memory of its shares (the policy's :meth:`~agent.policy.snapshot.Job.share_bytes_on`) fits.

Each problem is one line, worded as the decline the owner shows ("the job needs label
zone=eu-1"). Drain state and fencing are the runner's own checks.

Late binding (:func:`admit_or_rebind`): owners choose from gossip, which lags the runner by a
gossip round or two, so two owners may offer the same free device at once. When the devices an
offer names pass every check but are taken, and the offer allows it, the runner asks its
placement for other devices of the same models on itself as it is now (``Placement.rebind``),
admits the job there by the same checks and says which in its answer, instead of declining and
costing the owner another round trip and attempt.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from agent.job.jobspec import HOST_ONLY_FEATURES, SUPPORTED_FEATURES, JobSpec
from agent.policy.adapt import device_from_static, job_from_spec, link_domains
from agent.policy.filters import device_reason, gib, linked_groups, node_reason
from agent.policy.snapshot import Job, Node
from probers.records import DeviceStatic


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What this node is, beyond its devices: fixed for the agent's life."""

    os: str | None = None
    """As its inventory says (``platform.system().lower()``, or the simulated host's)."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Its labels as gossiped (``AgentConfig.all_labels``: free-form, zone, datasets, cost)."""
    features: frozenset[str] = SUPPORTED_FEATURES - HOST_ONLY_FEATURES
    """The job-spec features it runs, as its inventory says (``image`` only with a container
    runtime: ``agent.job.jobspec.HOST_ONLY_FEATURES``; the default has none)."""


class NotAdmitted(Exception):
    """An offer this node cannot take; the message says why, in one line."""


Rebind = Callable[[JobSpec, Node, tuple[str, ...]], tuple[str, ...] | None]
"""``Placement.rebind``: the devices of the same models to give the job on this node instead of
those an offer named, or ``None``."""


def local_node(
    node_id: str,
    facts: NodeFacts,
    statics: Sequence[DeviceStatic],
    held: Mapping[str, Mapping[str, int]] | None = None,
) -> Node:
    """This node as the policy sees it, from its own inventory; ``held``: device key -> {job ->
    bytes of a share it holds, or 0 for a job given the whole device}."""
    domains = link_domains(statics)
    held = held or {}

    def holder(key: str) -> str | None:
        return next((j for j, b in held.get(key, {}).items() if b == 0), None)

    def shares(key: str) -> dict[str, int]:
        return {j: b for j, b in held.get(key, {}).items() if b > 0}

    return Node(
        node_id=node_id,
        devices=tuple(
            device_from_static(s, None, holder(s.key), domains, shares(s.key)) for s in statics
        ),
        labels=dict(facts.labels),
        os=facts.os,
        features=facts.features,
    )


def wanted_devices(job: Job) -> tuple[int, int]:
    """The fewest and most devices an offer of ``job`` names on one node (a share: one; an
    elastic job: its range)."""
    if job.gpus_per_node == 0:
        return 0, 0
    if job.is_share:
        return 1, 1
    return job.gpus_per_node, job.gpus_max_per_node or job.gpus_per_node


def _job(spec: JobSpec) -> Job:
    job = job_from_spec("", spec)
    return job if job.nodes == 1 else replace(job, nodes=1)


def admit(spec: JobSpec, node: Node, keys: Sequence[str]) -> int:
    """The memory the job holds on its device when it is a share of one (0: devices given
    whole), once ``node`` (as it is now, with what runs there) can take it on ``keys``; raises
    :class:`NotAdmitted` otherwise. A device given whole takes no share, a shared one is not
    given whole, and the shares of a device fit in its memory."""
    problem = offer_problem(spec, node, keys)
    if problem is not None:
        raise NotAdmitted(problem)
    job = _job(spec)
    by_key = {d.key: d for d in node.devices}
    offered = [by_key[k] for k in keys]
    if not job.is_share:
        busy = next((d.key for d in offered if not d.is_free), None)
        if busy is not None:
            raise NotAdmitted(f"device {busy} is in use")
        return 0
    (device,) = offered
    need = job.share_bytes_on(device)
    if device.whole_job is not None:
        raise NotAdmitted(f"device {device.key} is in use, given whole")
    if device.mem_total_bytes <= 0 or need <= 0:
        raise NotAdmitted(f"device {device.key} has no known memory to share")
    if device.share_free_bytes < need:
        raise NotAdmitted(
            f"device {device.key} has {gib(device.share_free_bytes)} free of"
            f" {gib(device.mem_total_bytes)}; the share needs {gib(need)}"
        )
    return need


def offer_problem(spec: JobSpec, node: Node, keys: Sequence[str]) -> str | None:
    """Why ``node`` must decline an offer of ``spec`` on devices ``keys`` whatever runs there,
    or ``None``."""
    job = _job(spec)
    reason = node_reason(job, node, drained_too=True)
    if reason is not None:
        return f"the job needs {reason}"
    least, most = wanted_devices(job)
    if not least <= len(keys) <= most:
        want = str(least) if least == most else f"{least}-{most}"
        return f"offered {len(keys)} device(s) for a job of {want} on this node"
    by_key = {d.key: d for d in node.devices}
    offered = [by_key[k] for k in keys if k in by_key]
    if len(offered) != len(keys):
        missing = next(k for k in keys if k not in by_key)
        return f"no device {missing} here"
    for d in offered:
        reason = device_reason(job, d)
        if reason is not None:
            return f"device {d.key}: the job needs {reason}"
    if len(offered) > 1 and not any(
        len(group) == len(offered) for group in linked_groups(job, offered)
    ):
        return f"devices {', '.join(keys)} are not linked by {job.interconnect} here"
    return None


def admit_or_rebind(
    spec: JobSpec, node: Node, keys: tuple[str, ...], rebind: Rebind | None = None
) -> tuple[tuple[str, ...], int]:
    """:func:`admit` on ``keys``; when they pass every check but are taken and ``rebind`` is
    given, on the devices it chooses instead (admitted by the same checks). The devices, and the
    memory a share holds on its device (0: devices given whole)."""
    try:
        return keys, admit(spec, node, keys)
    except NotAdmitted:
        if rebind is None or offer_problem(spec, node, keys) is not None:
            raise
        other = rebind(spec, node, keys)
        if other is None or other == keys:
            raise
    return other, admit(spec, node, other)
