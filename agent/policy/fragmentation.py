"""Fragmentation, measured as FGD measures it (Weng et al., USENIX ATC 2023).

A node's free GPU capacity is fragmented *for a task shape* when that task could not use it: all
of it when the task does not fit the node at all (too few whole GPUs, too little CPU), else the
partly used GPUs for a task that needs whole ones, or the GPUs with less free than the task's
fraction for a shared task. The node's fragmentation is the expectation over the workload's
shapes, weighted by how common each is. A placement is good when it adds little: among nodes
that fit, the one whose fragmentation grows least (FGD's "fragmentation gradient descent").

Free capacity is a tuple of per-GPU free fractions (1.0: idle; 0.0: given whole). Results are
memoized by the caller's cache (a plain dict): nodes in the same state share one entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Shape:
    """One kind of task in the workload: whole GPUs, or a fraction of one, and CPU."""

    gpus: int
    fraction: float = 1.0
    """Below 1.0: a share of one GPU."""
    cpu_milli: int = 0
    weight: float = 1.0


def normalize(shapes: Sequence[Shape]) -> tuple[Shape, ...]:
    """Shapes that use a GPU, with weights summing to 1 (a CPU-only task leaves every free GPU
    unused wherever it goes, which moves no placement's score)."""
    gpu = [s for s in shapes if s.gpus > 0 and s.weight > 0]
    total = sum(s.weight for s in gpu)
    if total <= 0:
        return ()
    return tuple(Shape(s.gpus, s.fraction, s.cpu_milli, s.weight / total) for s in gpu)


def shape_fragmentation(free: Sequence[float], cpu_free: int | None, shape: Shape) -> float:
    """Free GPU capacity (in GPUs) of one node that ``shape`` could not use."""
    total = sum(free)
    if total <= 0.0:
        return 0.0
    if cpu_free is not None and cpu_free < shape.cpu_milli:
        return total
    if shape.fraction < 1.0:
        if not any(f >= shape.fraction for f in free):
            return total
        return sum(f for f in free if f < shape.fraction)
    whole = sum(1 for f in free if f >= 1.0)
    if whole < shape.gpus:
        return total
    return sum(f for f in free if f < 1.0)


def node_fragmentation(
    free: tuple[float, ...],
    cpu_free: int | None,
    shapes: tuple[Shape, ...],
    cache: dict[tuple[tuple[float, ...], int | None], float],
) -> float:
    """Expected fragmentation of a node over ``shapes`` (normalized), memoized in ``cache``,
    which must hold results for these ``shapes`` only."""
    key = (free, cpu_free)
    held = cache.get(key)
    if held is not None:
        return held
    value = sum(s.weight * shape_fragmentation(free, cpu_free, s) for s in shapes)
    if len(cache) > 200_000:
        cache.clear()
    cache[key] = value
    return value
