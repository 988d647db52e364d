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


FragKey = tuple[tuple[float, ...], int | None]
"""A node's free capacity as fragmentation reads it: per-GPU free fractions and free CPU."""


def node_fragmentation(
    free: tuple[float, ...],
    cpu_free: int | None,
    shapes: tuple[Shape, ...],
    cache: dict[FragKey, float],
    vectors: dict[FragKey, tuple[float, ...]] | None = None,
) -> float:
    """Expected fragmentation of a node over ``shapes`` (normalized), memoized in ``cache``,
    which must hold results for these ``shapes`` only. ``vectors``, if given, holds each state's
    per-shape figures (:func:`shape_values`) for shapes of these sizes in this order, whatever
    their weights: it can outlive a change of weights (see :class:`FragVectors`)."""
    key = (free, cpu_free)
    held = cache.get(key)
    if held is not None:
        return held
    values = None if vectors is None else vectors.get(key)
    if values is None:
        values = shape_values(free, cpu_free, shapes)
        if vectors is not None:
            if len(vectors) > 200_000:
                vectors.clear()
            vectors[key] = values
    value = sum([s.weight * v for s, v in zip(shapes, values, strict=True)])
    if len(cache) > 200_000:
        cache.clear()
    cache[key] = value
    return value


def shape_values(
    free: tuple[float, ...], cpu_free: int | None, shapes: tuple[Shape, ...]
) -> tuple[float, ...]:
    """``shape_fragmentation(free, cpu_free, s)`` for each of ``shapes``, to the last bit, with
    what every shape reads of ``free`` (its total, largest part, idle GPUs, partly used
    capacity) worked out once instead of once per shape."""
    total = sum(free)
    if total <= 0.0:
        return (0.0,) * len(shapes)
    top = max(free)
    whole = sum(1 for f in free if f >= 1.0)
    partial = sum(f for f in free if f < 1.0)
    below: dict[float, float] = {}
    out: list[float] = []
    for s in shapes:
        if cpu_free is not None and cpu_free < s.cpu_milli:
            out.append(total)
        elif s.fraction < 1.0:
            if top < s.fraction:
                out.append(total)
            else:
                held = below.get(s.fraction)
                if held is None:
                    held = below[s.fraction] = sum(f for f in free if f < s.fraction)
                out.append(held)
        else:
            out.append(total if whole < s.gpus else partial)
    return tuple(out)


class FragVectors:
    """:func:`shape_values` by node state, kept across decision passes for as long as the
    workload's shapes keep their sizes and order (their weights may change: each pass weighs the
    figures afresh). A decider keeps one; :meth:`for_shapes` hands the right table to a pass."""

    def __init__(self) -> None:
        self._sizes: tuple[tuple[int, float, int], ...] | None = None
        self._table: dict[FragKey, tuple[float, ...]] = {}

    def for_shapes(self, shapes: tuple[Shape, ...]) -> dict[FragKey, tuple[float, ...]]:
        sizes = tuple((s.gpus, s.fraction, s.cpu_milli) for s in shapes)
        if sizes != self._sizes:
            self._sizes = sizes
            self._table = {}
        return self._table
