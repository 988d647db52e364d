"""Nodes as they would be after the policy's own decisions, for the rest of one pass."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from agent.policy.index import ClusterIndex
from agent.policy.snapshot import Device, Job, Node, Placement, Running, Share


def with_job(node: Node, job: Job, keys: Iterable[str], share_bytes: int) -> Node:
    """``node`` with ``job`` holding ``keys`` (whole, or a share of ``share_bytes``)."""
    wanted = set(keys)
    devices: list[Device] = []
    for d in node.devices:
        if d.key not in wanted:
            devices.append(d)
        elif share_bytes:
            share = Share(job.job_id, share_bytes, job.job_class)
            devices.append(dataclasses.replace(d, shares=(*d.shares, share)))
        else:
            devices.append(dataclasses.replace(d, whole_job=job.job_id))
    return dataclasses.replace(
        node,
        devices=tuple(devices),
        cpu_milli_used=node.cpu_milli_used + job.cpu_milli,
        host_mem_used_bytes=node.host_mem_used_bytes + job.host_mem_bytes,
    )


def without_job(node: Node, job: Job) -> Node:
    """``node`` with everything ``job`` held on it released."""
    devices: list[Device] = []
    held = False
    for d in node.devices:
        if d.whole_job == job.job_id:
            devices.append(dataclasses.replace(d, whole_job=None))
            held = True
        elif any(s.job_id == job.job_id for s in d.shares):
            shares = tuple(s for s in d.shares if s.job_id != job.job_id)
            devices.append(dataclasses.replace(d, shares=shares))
            held = True
        else:
            devices.append(d)
    if not held and job.gpus_per_node > 0:
        return node
    return dataclasses.replace(
        node,
        devices=tuple(devices),
        cpu_milli_used=max(0, node.cpu_milli_used - job.cpu_milli),
        host_mem_used_bytes=max(0, node.host_mem_used_bytes - job.host_mem_bytes),
    )


def take(index: ClusterIndex, job: Job, placement: Placement) -> None:
    """Index ``placement`` as held by ``job``."""
    for node_id, keys in zip(placement.node_ids, placement.devices, strict=True):
        node = index.node(node_id)
        if node is not None:
            index.put(with_job(node, job, keys, placement.share_mem_bytes))


def release(index: ClusterIndex, job: Job, placement: Placement) -> None:
    """Index what ``job`` held on ``placement`` as free."""
    for node_id in placement.node_ids:
        node = index.node(node_id)
        if node is not None:
            index.put(without_job(node, job))


Stopping = dict[tuple[str, str], str]
"""Devices this pass frees by stopping a job (a preemption's victims), by (node id, device key):
the job that holds them until it has stopped (its grace period)."""


def stopping(victims: Iterable[Running], into: Stopping) -> None:
    """Note the devices of ``victims`` as stopping."""
    for r in victims:
        for node_id, keys in zip(r.placement.node_ids, r.placement.devices, strict=True):
            for key in keys:
                into[(node_id, key)] = r.job.job_id


def waits_for(placement: Placement, held: Stopping) -> tuple[str, ...]:
    """The stopping jobs whose devices ``placement`` takes: a start or a move there waits for
    them to stop (``after``); nothing else frees those devices sooner."""
    if not held:
        return ()
    found = {
        held[(node_id, key)]
        for node_id, keys in zip(placement.node_ids, placement.devices, strict=True)
        for key in keys
        if (node_id, key) in held
    }
    return tuple(sorted(found))
