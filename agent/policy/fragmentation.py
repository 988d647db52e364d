"""Fragmentation, measured as FGD measures it (Weng et al., USENIX ATC 2023).

A node's free GPU capacity is fragmented *for a task shape* when that task could not use it: all
of it when the task does not fit the node at all (too few whole GPUs, too little CPU), else the
partly used GPUs for a task that needs whole ones, or the GPUs with less free than the task's
fraction for a shared task. The node's fragmentation is the expectation over the workload's
shapes, weighted by how common each is. A placement is good when it adds little: among nodes
that fit, the one whose fragmentation grows least (FGD's "fragmentation gradient descent").

Free capacity is a tuple of per-GPU free fractions (1.0: idle; 0.0: given whole), with the
GPUs' models beside it where a shape names models. Results are memoized by the caller's cache
(a plain dict): nodes in the same state share one entry.
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
    models: tuple[str, ...] = ()
    """The GPU models it accepts (a job's ``models``); empty: any."""


def normalize(shapes: Sequence[Shape]) -> tuple[Shape, ...]:
    """Shapes that use a GPU, with weights summing to 1 (a CPU-only task leaves every free GPU
    unused wherever it goes, which moves no placement's score)."""
    gpu = [s for s in shapes if s.gpus > 0 and s.weight > 0]
    total = sum(s.weight for s in gpu)
    if total <= 0:
        return ()
    return tuple(Shape(s.gpus, s.fraction, s.cpu_milli, s.weight / total, s.models) for s in gpu)


def constrained(shapes: Sequence[Shape]) -> bool:
    """Whether any of ``shapes`` accepts only some GPU models (then fragmentation needs the
    GPUs' models)."""
    return any(s.models for s in shapes)


def shape_fragmentation(
    free: Sequence[float],
    cpu_free: int | None,
    shape: Shape,
    models: Sequence[str] | None = None,
) -> float:
    """Free GPU capacity (in GPUs) of one node that ``shape`` could not use; ``models``: the
    model of each GPU of ``free`` (``None``: every shape may use every GPU)."""
    total = sum(free)
    if total <= 0.0:
        return 0.0
    if cpu_free is not None and cpu_free < shape.cpu_milli:
        return total
    if shape.models and models is not None:
        return _constrained(free, models, shape, total)
    if shape.fraction < 1.0:
        if not any(f >= shape.fraction for f in free):
            return total
        return sum(f for f in free if f < shape.fraction)
    whole = sum(1 for f in free if f >= 1.0)
    if whole < shape.gpus:
        return total
    return sum(f for f in free if f < 1.0)


def _constrained(free: Sequence[float], models: Sequence[str], shape: Shape, total: float) -> float:
    """:func:`shape_fragmentation` of a shape that accepts only ``shape.models``: the GPUs of
    other models are fragmented for it like the ones too full for it."""
    ok = shape.models
    if shape.fraction < 1.0:
        usable = [f for f, m in zip(free, models, strict=True) if m in ok and f >= shape.fraction]
        if not usable:
            return total
        return total - sum(usable)
    idle = sum(1 for f, m in zip(free, models, strict=True) if m in ok and f >= 1.0)
    if idle < shape.gpus:
        return total
    return sum(f for f, m in zip(free, models, strict=True) if not (m in ok and f >= 1.0))


FragKey = tuple[tuple[float, ...], int | None, tuple[str, ...] | None]
"""A node's free capacity as fragmentation reads it: per-GPU free fractions, free CPU, and the
GPUs' models when a shape names models (else ``None``)."""


def node_fragmentation(
    free: tuple[float, ...],
    cpu_free: int | None,
    shapes: tuple[Shape, ...],
    cache: dict[FragKey, float],
    vectors: dict[FragKey, tuple[float, ...]] | None = None,
    models: tuple[str, ...] | None = None,
) -> float:
    """Expected fragmentation of a node over ``shapes`` (normalized), memoized in ``cache``,
    which must hold results for these ``shapes`` only. ``vectors``, if given, holds each state's
    per-shape figures (:func:`shape_values`) for shapes of these sizes in this order, whatever
    their weights: it can outlive a change of weights (see :class:`FragVectors`). ``models``:
    each GPU's model, for shapes that accept only some (:func:`constrained`); else ``None``."""
    key = (free, cpu_free, models)
    held = cache.get(key)
    if held is not None:
        return held
    values = None if vectors is None else vectors.get(key)
    if values is None:
        values = shape_values(free, cpu_free, shapes, models)
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
    free: tuple[float, ...],
    cpu_free: int | None,
    shapes: tuple[Shape, ...],
    models: tuple[str, ...] | None = None,
) -> tuple[float, ...]:
    """``shape_fragmentation(free, cpu_free, s, models)`` for each of ``shapes``, to the last
    bit, with what every shape reads of ``free`` (its total, largest part, idle GPUs, partly
    used capacity) worked out once instead of once per shape."""
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
        elif s.models and models is not None:
            out.append(_constrained(free, models, s, total))
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
        self._sizes: tuple[tuple[int, float, int, tuple[str, ...]], ...] | None = None
        self._table: dict[FragKey, tuple[float, ...]] = {}

    def for_shapes(self, shapes: tuple[Shape, ...]) -> dict[FragKey, tuple[float, ...]]:
        sizes = tuple((s.gpus, s.fraction, s.cpu_milli, s.models) for s in shapes)
        if sizes != self._sizes:
            self._sizes = sizes
            self._table = {}
        return self._table
