"""Before a job is submitted: could any node of the mesh ever run it, and could one now?

Read from the agent's own listings (``GET /v1/nodes`` and ``GET /v1/jobs``, decoded by the wire
contract) with the scheduling policy's own hard filters (:func:`agent.policy.filters.static_fit`
on each node made into the policy's snapshot by :mod:`agent.policy.adapt`), so the answer is the
placement's:

- **never**: no node of the mesh (alive or suspect) could host the job even idle and schedulable:
  not enough devices of one vendor that meet its per-GPU constraints, counting every device it
  has, busy or not. ``shoal submit`` refuses such a job (nothing is submitted) unless told to let
  it wait for a host that can.
- **not now**: some node could, but none that takes new work has them free (in use by running
  jobs, or the node cordoned or draining): the job is submitted and waits.
- **now**: a schedulable node has them free.

Job-spec features (gangs, images) are the agents' to answer: the agent that takes the
submission refuses one that no live agent runs, with its own reason.

:func:`asks` says in words what a job asks for, as ``shoal submit`` prints it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.job.jobspec import JobSpec
from agent.policy.adapt import BUSY, device_from_static, job_from_spec
from agent.policy.filters import device_reason, static_fit
from agent.policy.snapshot import SCHEDULABLE, Job, Node
from agent.wire.codec import WireError
from agent.wire.documents import DeviceDoc, NodeDoc

LIVE_STATES = ("alive", "suspect")
BUSY_JOB_STATES = ("placing", "running", "migrating")


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


def decode_node(doc: Mapping[str, Any]) -> tuple[NodeDoc, list[DeviceDoc]] | None:
    try:
        node = NodeDoc.from_wire(doc, devices=False)
    except WireError:
        return None
    devices = []
    for d in doc.get("devices") or ():
        try:
            devices.append(DeviceDoc.from_wire(d))
        except WireError:
            continue  # a device that does not decode is left out, as the TUI does
    return node, devices


def policy_node(
    doc: NodeDoc, devices: Sequence[DeviceDoc], holders: Mapping[str, str] | None = None
) -> Node:
    """The node as the policy sees it: idle, or with ``holders`` (the job holding each busy
    device) as it is now, with the shares of a GPU its node record lists; its agent's features
    are not checked here (the agent that takes the submission does)."""
    shares = doc.shares if holders is not None else {}
    holders = holders or {}
    return Node(
        node_id=doc.node_id,
        devices=tuple(
            device_from_static(
                d.static,
                d.sample,
                None if d.static.key in shares else holders.get(d.static.key),
                shares=shares.get(d.static.key),
            )
            for d in devices
        ),
        drain=doc.drain or SCHEDULABLE,
        labels=doc.labels,
        os=doc.host.os if doc.host else None,
    )


def _largest(job: Job, node: Node, devices: Sequence[DeviceDoc]) -> tuple[int, str]:
    """The most devices of one vendor on ``node`` that meet the job's per-GPU constraints."""
    names = {d.static.key: d.static.name.removesuffix(" (simulated)") for d in devices}
    by_vendor: dict[str, list[str]] = {}
    for d in node.devices:
        if d.backend != "cpu" and device_reason(job, d) is None:
            by_vendor.setdefault(d.vendor, []).append(d.key)
    group = max(by_vendor.values(), key=len, default=[])
    return len(group), (names.get(group[0], "?") if group else "?")


def fit(
    spec: JobSpec, nodes: Sequence[Mapping[str, Any]], jobs: Sequence[Mapping[str, Any]]
) -> Fit:
    """Where ``spec`` fits among ``nodes``, ever and now (see the module's docstring)."""
    job = dataclasses.replace(job_from_spec("", spec), nodes=1, features=())
    busy: dict[str, set[str]] = {}
    for j in jobs:
        if j.get("state") in BUSY_JOB_STATES and j.get("runner"):
            busy.setdefault(str(j["runner"]), set()).update(map(str, j.get("devices") or []))
    ever: list[str] = []
    now: list[str] = []
    live = 0
    best_count, best = 0, ""
    for raw in nodes:
        decoded = decode_node(raw)
        if decoded is None:
            continue
        doc, devices = decoded
        if doc.state not in LIVE_STATES or doc.role not in ("agent", None):
            continue
        live += 1
        name = (doc.host.hostname if doc.host else "") or doc.node_id[:8]
        idle = policy_node(doc, devices)
        count, model = _largest(job, idle, devices)
        if count > best_count:
            best_count, best = count, f"{count}x {model} on {name}"
        if static_fit(job, idle, drained_too=True) is not None:
            continue
        ever.append(name)
        current = policy_node(doc, devices, dict.fromkeys(busy.get(doc.node_id, ()), BUSY))
        free = dataclasses.replace(
            current,
            devices=tuple(
                d
                for d in current.devices
                if d.is_free or (job.is_share and d.share_free_bytes >= job.share_bytes_on(d))
            ),
        )
        if static_fit(job, free) is None:
            now.append(name)
    if spec.resources.gpus_per_node == 0:
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
        if r.share_fraction is not None:
            text = f"a {r.share_fraction:g} share of one GPU"
        elif r.share_mem_bytes is not None:
            text = f"a share of one GPU with {r.share_mem_bytes / 1024**3:g} GiB of its memory"
        elif r.gpus_max_per_node is not None:
            text = f"{r.gpus_text()} GPUs of one vendor on one node (elastic)"
        if what:
            text += f" ({', '.join(what)})"
    if r.nodes > 1:
        text += f" on each of {r.nodes} nodes"
    return text
