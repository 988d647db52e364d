"""The fast fragmentation figures are FGD's formula to the last bit, whatever the weights."""

from __future__ import annotations

import random

from agent.policy.context import workload_shapes
from agent.policy.fragmentation import (
    FragVectors,
    Shape,
    node_fragmentation,
    normalize,
    shape_fragmentation,
)
from agent.policy.snapshot import Snapshot
from tests.policy.helpers import job


def _shapes(rng: random.Random) -> tuple[Shape, ...]:
    shapes = []
    for _ in range(rng.randint(0, 24)):
        if rng.random() < 0.4:
            shape = Shape(1, rng.choice((0.1, 0.25, 0.5, 0.7, 0.999)), rng.choice((0, 4000, 32000)))
        else:
            shape = Shape(rng.choice((0, 1, 2, 4, 8)), 1.0, rng.choice((0, 8000, 64000)))
        shapes.append(Shape(shape.gpus, shape.fraction, shape.cpu_milli, rng.random() * 50))
    return normalize(shapes)


def _free(rng: random.Random) -> tuple[float, ...]:
    return tuple(
        rng.choice((0.0, 1.0, 1.0, rng.random(), 0.5, 0.25)) for _ in range(rng.randint(0, 8))
    )


def test_node_fragmentation_equals_the_weighted_sum_of_each_shapes() -> None:
    rng = random.Random(7)
    vectors = FragVectors()
    for _ in range(3000):
        shapes = _shapes(rng)
        free = _free(rng)
        cpu = rng.choice((None, 0, 4000, 16000, 96000))
        want = sum(s.weight * shape_fragmentation(free, cpu, s) for s in shapes)
        assert node_fragmentation(free, cpu, shapes, {}) == want
        table = vectors.for_shapes(shapes)
        assert node_fragmentation(free, cpu, shapes, {}, table) == want
        assert node_fragmentation(free, cpu, shapes, {}, table) == want  # from the table


def test_kept_figures_are_reweighed_and_dropped_when_the_shapes_change() -> None:
    vectors = FragVectors()
    free, cpu = (1.0, 0.5, 0.0, 1.0), 8000
    a = normalize([Shape(1, weight=3), Shape(2, weight=1), Shape(1, 0.5, weight=1)])
    b = normalize([Shape(1, weight=1), Shape(2, weight=3), Shape(1, 0.5, weight=1)])
    table = vectors.for_shapes(a)
    node_fragmentation(free, cpu, a, {}, table)
    assert vectors.for_shapes(b) is table  # the same sizes in the same order: weights differ
    got = node_fragmentation(free, cpu, b, {}, vectors.for_shapes(b))
    assert got == sum(s.weight * shape_fragmentation(free, cpu, s) for s in b)
    c = normalize([Shape(2, weight=3), Shape(1, weight=1)])
    assert vectors.for_shapes(c) is not table
    got = node_fragmentation(free, cpu, c, {}, vectors.for_shapes(c))
    assert got == sum(s.weight * shape_fragmentation(free, cpu, s) for s in c)


def test_a_shape_that_accepts_some_models_counts_the_others_fragmented() -> None:
    """FGD's "no access": a T4-only task can use nothing of a V100 node, and of a mixed node
    only the T4s; a task that takes any model sees every GPU."""
    t4_only = Shape(1, 1.0, models=("t4",))
    half_t4 = Shape(1, 0.5, models=("t4",))
    anything = Shape(1)
    free = (1.0, 1.0, 0.25, 1.0)
    assert shape_fragmentation(free, None, t4_only, ("v100",) * 4) == 3.25
    assert shape_fragmentation(free, None, anything, ("v100",) * 4) == 0.25
    mixed = ("t4", "v100", "t4", "v100")
    assert shape_fragmentation(free, None, t4_only, mixed) == 2.25  # all but the idle T4
    assert shape_fragmentation(free, None, half_t4, mixed) == 2.25
    assert shape_fragmentation(free, None, Shape(2, models=("t4",)), mixed) == 3.25
    assert shape_fragmentation(free, None, t4_only, None) == 0.25  # models unknown: any


def test_models_enter_the_kept_figures_and_the_fast_path_matches() -> None:
    rng = random.Random(11)
    vectors = FragVectors()
    for _ in range(2000):
        shapes = tuple(
            Shape(s.gpus, s.fraction, s.cpu_milli, s.weight, rng.choice(((), ("t4",), ("a", "b"))))
            for s in _shapes(rng)
        )
        free = _free(rng)
        models = tuple(rng.choice(("t4", "a", "b", "v100")) for _ in free)
        cpu = rng.choice((None, 0, 16000))
        want = sum(s.weight * shape_fragmentation(free, cpu, s, models) for s in shapes)
        table = vectors.for_shapes(shapes)
        assert node_fragmentation(free, cpu, shapes, {}, table, models) == want
        assert node_fragmentation(free, cpu, shapes, {}, table, models) == want


def test_the_workload_names_gpu_models_only_where_they_are_read_and_in_one_order() -> None:
    """Under ``packing`` a shape keeps the models it accepts, one shape whatever order a job
    lists them in; otherwise the models are not read, and shapes that differ only there are
    one (fewer shapes a pass, and one set of fragmentation vectors)."""
    pending = (
        job("a", gpus_per_node=1, models=("A100", "H100")),
        job("b", gpus_per_node=1, models=("H100", "A100")),
        job("c", gpus_per_node=1),
    )
    snap = Snapshot(now=0.0, nodes=(), pending=pending)
    assert [(s.models, round(s.weight, 3)) for s in workload_shapes(snap)] == [
        (("A100", "H100"), 0.667),
        ((), 0.333),
    ]
    assert [(s.models, s.weight) for s in workload_shapes(snap, models=False)] == [((), 1.0)]
