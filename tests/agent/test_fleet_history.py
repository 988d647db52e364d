"""The fleet's history on synthetic series with known answers: busy and allocated shares by
vendor and by model, and the GPU-hours left idle while a job that could use them waited."""

from __future__ import annotations

from typing import Any

import pytest

from agent.job.jobspec import JobSpec, Resources
from agent.operator.fleet_history import (
    GpuTrack,
    Grid,
    Held,
    Wait,
    idle_while_waiting,
    utilization,
)
from agent.operator.fleet_inputs import FleetGpus, held, models_for, tracks, wait_spans, waits
from agent.wire.documents import JobDoc
from agent.wire.history import HistoryDoc, HistorySeries
from agent.wire.records import AttemptEntry, JobStatus
from agent.wire.usage import UsageRow
from probers.records import DeviceStatic

GRID = Grid.over(0, 600, 60)  # ten steps of a minute
H100, MI300X = "NVIDIA H100", "AMD MI300X"


def _wait(
    start: float, end: float | None, gpus: int = 2, nodes: int = 1, model: str = H100
) -> Wait:
    return Wait("j", gpus, nodes, frozenset({model}), start, end)


def test_grid_aligns_as_a_node_aligns_its_points_and_splits_spans_by_step() -> None:
    g = Grid.over(130, 400, 60)
    assert (g.from_s, g.steps, g.to_s) == (120, 5, 420)
    assert g.covered(150, 250) == [(0, 30), (1, 60), (2, 10)]
    assert g.covered(500, None) == []
    assert g.covered(0, 100) == []
    assert g.covered(400, None) == [(4, 20)]
    with pytest.raises(ValueError, match="step_s >= 1"):
        Grid.over(10, 10, 60)


def test_busy_and_allocated_shares_by_vendor_and_by_model() -> None:
    a = [
        GpuTrack("A", "g0", "nvidia", H100, (50.0,) * 10),
        GpuTrack("A", "g1", "nvidia", H100, (100.0,) * 10),
    ]
    b = [GpuTrack("B", "g0", "amd", MI300X, (20.0,) * 5 + (None,) * 5)]
    rows = [Held("A", H100, 1, 0, 300), Held("B", MI300X, 1, 0, None)]
    nvidia, amd = sorted(utilization(GRID, a + b, rows, "vendor"), key=lambda x: x.name)[::-1]
    assert nvidia.name == "nvidia" and amd.name == "amd"
    assert nvidia.gpus == (2,) * 10 and nvidia.busy == (0.75,) * 10
    assert nvidia.allocated == (0.5,) * 5 + (0.0,) * 5
    assert nvidia.allocated_avg == pytest.approx(0.25)
    # the AMD node stopped answering: its share is of what reported, nothing after
    assert amd.gpus == (1,) * 5 + (0,) * 5 and amd.gpus_last == 1
    assert amd.busy == (0.2,) * 5 + (None,) * 5
    assert amd.allocated == (1.0,) * 5 + (None,) * 5
    by_model = {line.name: line for line in utilization(GRID, a + b, rows, "model")}
    assert set(by_model) == {H100, MI300X} and by_model[H100].busy_avg == pytest.approx(0.75)


def test_a_row_over_part_of_a_step_counts_that_part_and_never_more_than_reports() -> None:
    a = [GpuTrack("A", f"g{i}", "nvidia", H100, (0.0,) * 10) for i in range(2)]
    rows = [Held("A", H100, 2, 30, 90), Held("A", H100, 5, 300, 360), Held("Z", H100, 8, 0, None)]
    (line,) = utilization(GRID, a, rows, "model")
    assert line.allocated[:2] == (0.5, 0.5)  # 2 GPUs for half of each step: 1 of 2
    assert line.allocated[5] == 1.0  # 5 held on a node of 2 reporting: capped
    assert line.allocated[2] == 0.0  # a node that did not answer (Z) adds nothing


def test_idle_counts_free_gpus_only_while_a_job_that_fits_them_waits() -> None:
    node = [GpuTrack("A", f"g{i}", "nvidia", H100, (1.0,) * 10) for i in range(4)]
    rows = [Held("A", H100, 4, 0, 300)]  # all four held for five minutes, then free
    got = idle_while_waiting(GRID, node, rows, [_wait(120, 420)])
    (line,) = got.lines
    # steps 2-4 had nothing free; steps 5 and 6 had four free GPUs for the whole minute
    assert line.idle_gpu_s == (0.0,) * 5 + (240.0, 240.0) + (0.0,) * 3
    assert got.total_gpu_s == 480.0 and line.free_gpu_s == 4 * 60 * 5 and got.waits == 1
    assert idle_while_waiting(GRID, node, rows, []).total_gpu_s == 0.0


@pytest.mark.parametrize(
    ("waits_", "expected_gpu_s"),
    [
        ([_wait(330, 345)], 4 * 15),  # part of a step
        ([_wait(330, 345), _wait(340, 350)], 4 * 20),  # two waits overlapping: counted once
        ([_wait(300, None, gpus=8)], 0),  # more than any node has free
        ([_wait(300, None, model=MI300X)], 0),  # a model the job does not accept
        ([_wait(300, None, gpus=2, nodes=2)], 0),  # a gang of two: one node only has them
        ([_wait(300, None, gpus=4)], 4 * 60 * 5),  # waits on past the end: the rest of it
    ],
)
def test_idle_while_waiting_known_answers(waits_: list[Wait], expected_gpu_s: float) -> None:
    node = [GpuTrack("A", f"g{i}", "nvidia", H100, (1.0,) * 10) for i in range(4)]
    got = idle_while_waiting(GRID, node, [Held("A", H100, 4, 0, 300)], waits_)
    assert got.total_gpu_s == pytest.approx(expected_gpu_s)


def test_a_gang_counts_when_enough_nodes_each_have_room_and_shares_are_not_whole_gpus() -> None:
    fleet = [GpuTrack(n, f"g{i}", "nvidia", H100, (0.0,) * 10) for n in "AB" for i in range(2)]
    gang = _wait(0, 60, gpus=2, nodes=2)
    assert idle_while_waiting(GRID, fleet, [], [gang]).total_gpu_s == 4 * 60
    half = [Held("A", H100, 1.5, 0, 60)]  # a whole GPU and a half share: 0.5 left on A
    got = idle_while_waiting(GRID, fleet, half, [gang, _wait(0, 60, gpus=1)])
    assert got.total_gpu_s == pytest.approx(2.5 * 60)  # the one-GPU job fits B: all free counts


def _doc(state: str, attempts: tuple[AttemptEntry, ...] = (), **kw: Any) -> JobDoc:
    return JobDoc(JobStatus("a" * 32, state, submitted_at=100.0, attempts=attempts, **kw))


def test_wait_spans_from_a_job_record() -> None:
    first = AttemptEntry(1, "n1", 200.0, 500.0, "lost")
    assert wait_spans(_doc("pending")) == [(100.0, None)]
    assert wait_spans(_doc("cancelled", finished_at=300.0)) == [(100.0, 300.0)]
    assert wait_spans(_doc("pending", (first,), attempt=1)) == [(100.0, 200.0), (500.0, None)]
    again = (first, AttemptEntry(2, "n2", 700.0))
    assert wait_spans(_doc("running", again, attempt=2)) == [(100.0, 200.0), (500.0, 700.0)]
    gang = (AttemptEntry(1, "n1", 210.0, rank=0), AttemptEntry(1, "n2", 205.0, rank=1))
    assert wait_spans(_doc("running", gang, attempt=1)) == [(100.0, 205.0)]
    assert wait_spans(_doc("running", started_at=250.0, attempt=1)) == [(100.0, 250.0)]
    assert wait_spans(JobDoc(JobStatus("b" * 32, "pending"))) == []


def _static(key: str, vendor: str, backend: str, name: str, mem_gib: int) -> DeviceStatic:
    return DeviceStatic(
        key=key, vendor=vendor, backend=backend, name=name, source="test",  # type: ignore[arg-type]
        mem_total_bytes=mem_gib * 1024**3,
    )  # fmt: skip


FLEET = FleetGpus(
    {
        ("A", "g0"): _static("g0", "nvidia", "cuda", H100, 80),
        ("B", "g0"): _static("g0", "amd", "rocm", MI300X, 192),
    }
)


def test_the_models_a_job_accepts_are_the_policy_device_filters_answer() -> None:
    def spec(**r: Any) -> JobSpec:
        return JobSpec(command=("x",), resources=Resources(gpus_per_node=1, **r))

    assert models_for(spec(), FLEET) == {H100, MI300X}
    assert models_for(spec(backends=("rocm",)), FLEET) == {MI300X}
    assert models_for(spec(min_mem_per_gpu_bytes=100 * 1024**3), FLEET) == {MI300X}


def test_inputs_from_the_agents_answers() -> None:
    grid = Grid.over(0, 180, 60)
    doc = HistoryDoc(
        "A", 0, 180,
        (
            HistorySeries("gpu.util_pct", "g0", None, "s", 30, (
                (0, 1.0, 10.0, 20.0), (30, None, 30.0, None), (60, None, None, None),
                (150, 5.0, 50.0, 90.0), (900, 0.0, 0.0, 0.0),
            )),
            HistorySeries("gpu.util_pct", "gone", None, "s", 30, ((0, 1.0, 1.0, 1.0),)),
            HistorySeries("gpu.temp_c", "g0", None, "s", 30, ((0, 1.0, 1.0, 1.0),)),
        ),
    )  # fmt: skip
    got = tracks(grid, doc, FLEET)
    assert [(t.device, t.model, t.util_pct) for t in got] == [
        ("g0", H100, (20.0, None, 50.0)),
        ("gone", "unknown", (1.0, None, None)),
    ]
    row = UsageRow("j", 1, "A", None, None, None, H100, 1.0, 5.0, None, None)
    cpu = row._replace(job_id="k", model="cpu")
    assert held([row, row, cpu]) == [Held("A", H100, 1.0, 5.0, None)]
    gpu_job = _doc("pending").to_wire() | {
        "spec": JobSpec(("x",), resources=Resources(1)).to_dict()
    }
    cpu_job = _doc("pending").to_wire() | {"spec": JobSpec(("x",)).to_dict()}
    found = waits([gpu_job, cpu_job, {"job_id": 3}], FLEET)
    assert found.unreadable == 1
    assert found.waits == (Wait("a" * 32, 1, 1, frozenset({H100, MI300X}), 100.0, None),)


def test_idle_is_exact_within_a_step_so_every_window_counts_the_same() -> None:
    def count(step_s: int) -> float:
        grid = Grid.over(0, 600, step_s)
        node = [GpuTrack("A", "g0", "nvidia", H100, (1.0,) * grid.steps)]
        rows = [Held("A", H100, 1, 0, 90), Held("A", H100, 1, 400, 450)]
        return idle_while_waiting(grid, node, rows, [_wait(30, 500, gpus=1)]).total_gpu_s

    # free while the job waited: [90, 400) and [450, 500), whatever the step (a GPU held for
    # part of a step is free for the rest of it, not a fraction free for all of it)
    assert count(1) == count(60) == count(600) == 310 + 50
