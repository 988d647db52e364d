"""Small fleets and jobs for the policy's tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent.policy.snapshot import Device, Job, Node, Placement, Running, Share

GIB = 1024**3
MEM = {"a100-80gb": 80, "h100": 80, "v100": 32, "p100": 16, "k80": 12, "l4": 24, "t4": 16}
VENDOR = {"rx-7900-xtx": ("amd", "rocm"), "m2-ultra": ("apple", "metal")}


def node(
    node_id: str,
    model: str,
    gpus: int = 8,
    *,
    busy: Sequence[int] = (),
    shares: dict[int, Sequence[tuple[str, int]]] | None = None,
    mem_gib: int | None = None,
    link: str | None = "nvlink",
    **kw: Any,
) -> Node:
    """``gpus`` devices of ``model``; ``busy``: indexes held whole by a job ``busy-<node>-<i>``;
    ``shares``: index -> [(job id, GiB)]."""
    vendor, backend = VENDOR.get(model, ("nvidia", "cuda"))
    mem = (mem_gib if mem_gib is not None else MEM.get(model, 24)) * GIB
    devices = []
    for i in range(gpus):
        held = tuple(Share(j, g * GIB, "c") for j, g in (shares or {}).get(i, ()))
        devices.append(
            Device(
                key=f"{node_id}/{i}",
                model=model,
                vendor=vendor,
                backend=backend,
                mem_total_bytes=mem,
                whole_job=f"busy-{node_id}-{i}" if i in busy else None,
                shares=held,
                link_domain="0" if link else None,
                link_kind=link,
                compute_capability="8.0" if vendor == "nvidia" else None,
                arch="Ampere" if vendor == "nvidia" else None,
            )
        )
    return Node(node_id, tuple(devices), **kw)


def job(job_id: str, **kw: Any) -> Job:
    kw.setdefault("job_class", "ResNet-50 (batch size 64)")
    kw.setdefault("kind", "training")
    return Job(job_id, **kw)


def running(
    j: Job,
    node_id: str,
    keys: Sequence[str],
    *,
    started_at: float = 0.0,
    model: str = "v100",
    checkpoint_at: float | None = None,
    progress: float | None = None,
    rate: float | None = None,
    progress_at: float | None = None,
) -> Running:
    return Running(
        job=j,
        placement=Placement((node_id,), (tuple(keys),)),
        started_at=started_at,
        device_model=model,
        progress=progress,
        progress_at=(started_at if progress_at is None else progress_at)
        if progress is not None
        else None,
        rate_per_s=rate,
        last_checkpoint_at=checkpoint_at,
    )


def holding(n: Node, j: Job, indexes: Sequence[int]) -> Node:
    """``n`` with ``j`` holding devices ``indexes`` whole."""
    from dataclasses import replace

    devices = tuple(
        replace(d, whole_job=j.job_id) if i in indexes else d for i, d in enumerate(n.devices)
    )
    return replace(n, devices=devices)
