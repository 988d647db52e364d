"""The mesh's one queue: an owner places its job behind the pending jobs ahead of it in the
policy's order, whoever owns them: room a job ahead takes is not offered, and the first job ahead
that cannot start holds a reservation that later jobs only backfill around."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agent.job.jobspec import JobSpec, Resources, new_job_id
from agent.owning.meshqueue import MAX_AHEAD, MeshQueue, QueueIndex, mesh_queue
from agent.owning.placement import FirstFit, ShoalPlacement
from agent.policy.adapt import job_from_spec
from agent.policy.snapshot import Placement, Running
from tests.agent.agents import spec, started
from tests.agent.nodeviews import node_view

NOW = 1000.0


def _spec(gpus: int, priority: int = 0, **extra: Any) -> JobSpec:
    return JobSpec(
        command=("x",), resources=Resources(gpus_per_node=gpus), priority=priority, **extra
    )


def _doc(job_id: str, state: str, submitted_at: float, **extra: Any) -> dict[str, Any]:
    return {"job_id": job_id, "state": state, "owner": "o2", "submitted_at": submitted_at, **extra}


def test_the_jobs_ahead_are_the_pending_ones_first_in_the_policy_order() -> None:
    me = job_from_spec("j-me", _spec(1, priority=5), owner="o1", submitted_at=50.0)
    jobs = {
        "j-me": _doc("j-me", "pending", 50.0),
        "j-urgent": _doc("j-urgent", "pending", 90.0),  # later, but of a higher priority
        "j-early": _doc("j-early", "pending", 10.0),  # same priority, earlier
        "j-late": _doc("j-late", "pending", 60.0),  # same priority, later: behind
        "j-low": _doc("j-low", "pending", 1.0),  # lower priority: behind
        "j-run": _doc("j-run", "running", 5.0, runner="n1", devices=["n1-0"], started_at=7.0),
        "j-done": _doc("j-done", "succeeded", 2.0),
        "j-unsigned": _doc("j-unsigned", "pending", 3.0),  # no submission held: left out
    }
    specs = {
        "j-me": _spec(1, priority=5),
        "j-urgent": _spec(2, priority=9),
        "j-early": _spec(1, priority=5),
        "j-late": _spec(1, priority=5),
        "j-low": _spec(1),
        "j-run": _spec(1),
        "j-done": _spec(1, priority=9),
    }
    queue = mesh_queue(me, jobs, specs, live={"n1"})
    assert [j.job_id for j in queue.ahead] == ["j-urgent", "j-early"]
    assert queue.ahead[0].owner == "o2" and queue.ahead[0].gpus_per_node == 2
    assert [r.job.job_id for r in queue.running] == ["j-run"]
    first = mesh_queue(job_from_spec("j-urgent", specs["j-urgent"]), jobs, specs, live={"n1"})
    assert first == MeshQueue(first.job)  # nothing ahead: nothing more is looked at


def test_only_the_first_jobs_ahead_are_taken() -> None:
    me = job_from_spec("j-me", _spec(1), submitted_at=1e6)
    jobs = {f"j-{i:05d}": _doc(f"j-{i:05d}", "pending", float(i)) for i in range(MAX_AHEAD + 50)}
    specs = dict.fromkeys(jobs, _spec(1))
    ahead = mesh_queue(me, jobs, specs, live=()).ahead
    assert [j.job_id for j in ahead] == sorted(jobs)[:MAX_AHEAD]


def _running(job_id: str, node_id: str, keys: tuple[str, ...], max_runtime_s: float) -> Running:
    job = job_from_spec(job_id, _spec(len(keys), max_runtime_s=max_runtime_s), submitted_at=0.0)
    return Running(job, Placement((node_id,), (keys,)), started_at=NOW)


def test_a_blocked_job_ahead_holds_its_reservation_and_a_later_job_waits_behind_it() -> None:
    # "a" has one of its two GPUs free (its other ends within a minute); "b" has none free.
    # The 2-GPU job ahead fits nowhere now: it is reserved "a", so the later 1-GPU job (whose
    # run would outlast that start) is not offered a's free GPU, though it fits there.
    views = [node_view("a", 2, busy=1), node_view("b", 2, busy=2)]
    running = (
        _running("r-a", "a", ("a-0",), 60.0),
        _running("r-b", "b", ("b-0", "b-1"), 3600.0),
    )
    blocked = job_from_spec("j-big", _spec(2, priority=5), owner="o2", submitted_at=1.0)
    spec = _spec(1)
    me = job_from_spec("j-small", spec, owner="o1", submitted_at=2.0)
    placement = ShoalPlacement(owner="o1", clock=lambda: NOW)

    assert [c.node_id for c in placement.candidates(spec, views)] == ["a"]  # its own queue
    queue = MeshQueue(me, (blocked,), running)
    assert placement.candidates(spec, views, queue=queue) == []
    line = placement.why_pending(spec, queue)
    assert line.startswith("waiting: it would delay job j-big"), line
    assert FirstFit().candidates(spec, views, queue=queue)[0].node_id == "a"  # the baseline

    # With room elsewhere, it runs there: the reservation names only "a".
    views.append(node_view("c", 1))
    assert [c.node_id for c in placement.candidates(spec, views, queue=queue)] == ["c"]


def test_room_a_job_ahead_takes_is_not_offered() -> None:
    views = [node_view("a", 2, busy=1)]
    ahead = job_from_spec("j-first", _spec(1, priority=5), owner="o2", submitted_at=1.0)
    spec = _spec(1)
    me = job_from_spec("j-next", spec, owner="o1", submitted_at=2.0)
    placement = ShoalPlacement(owner="o1", clock=lambda: NOW)
    running = (_running("r-a", "a", ("a-0",), 3600.0),)
    queue = MeshQueue(me, (ahead,), running)
    assert placement.candidates(spec, views, queue=queue) == []
    assert placement.why_pending(spec, queue).startswith("waiting: no node has 1 free GPU")
    views = [node_view("a", 3, busy=1)]  # room for both
    found = placement.candidates(spec, views, queue=queue)
    assert len(found) == 1 and found[0].node_id == "a"  # the other free GPU went ahead


def test_a_job_moved_by_the_operator_is_placed_on_its_own() -> None:
    views = [node_view("a", 2, busy=1), node_view("b", 1)]
    running = (_running("r-a", "a", ("a-0",), 60.0),)
    blocked = job_from_spec("j-big", _spec(2, priority=5), owner="o2", submitted_at=1.0)
    spec = _spec(1)
    queue = MeshQueue(job_from_spec("j-mv", spec, submitted_at=2.0), (blocked,), running)
    placement = ShoalPlacement(owner="o1", clock=lambda: NOW)
    assert [c.node_id for c in placement.candidates(spec, views, queue=queue)] == ["b"]
    moved = placement.candidates(spec, views, queue=queue, prefer="a")
    assert moved[0].node_id == "a"  # migrate --to a: the operator's word


def test_an_owners_jobs_among_the_first_share_one_decision_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The owner reads the queue once per change of its view (``QueueIndex``); its jobs among
    the first ``MAX_AHEAD`` get the same pass, which the placement runs once for all of them
    while the view, its held offers and the second stay the same."""
    import agent.owning.placement as placement_module

    passes: list[int] = []
    decide = placement_module.decide

    def counted(snapshot: Any, *args: Any, **kwargs: Any) -> Any:
        passes.append(len(snapshot.pending))
        return decide(snapshot, *args, **kwargs)

    monkeypatch.setattr(placement_module, "decide", counted)
    views = [node_view("a", 4, busy=1)]
    specs = {"j-0": _spec(2, priority=5), "j-1": _spec(1), "j-2": _spec(1), "j-3": _spec(1)}
    jobs = {j: _doc(j, "pending", float(i)) for i, j in enumerate(specs)}
    index = QueueIndex(jobs, specs, jobs, live={"a"}, generation=7)
    mine = [job_from_spec(j, specs[j], owner="o1", submitted_at=float(i + 1)) for i, j in
            enumerate(("j-1", "j-2", "j-3"))]  # fmt: skip
    queues = [index.queue(j) for j in mine]
    assert [len(q.ahead) for q in queues] == [1, 2, 3]
    assert {tuple(j.job_id for j in q.jobs) for q in queues} == {("j-0", "j-1", "j-2", "j-3")}
    placement = ShoalPlacement(owner="o1", clock=lambda: NOW)
    found = [placement.candidates(specs[q.job.job_id], views, queue=q) for q in queues]
    assert passes == [4]  # one pass answered all three
    # j-0 takes two of the three free GPUs, j-1 the last; j-2 and j-3 wait.
    assert [len(f) for f in found] == [1, 0, 0]
    index = QueueIndex(jobs, specs, jobs, live={"a"}, generation=8)  # the view changed
    placement.candidates(specs["j-1"], views, queue=index.queue(mine[0]))
    assert passes == [4, 4]
    alone = mesh_queue(mine[1], jobs, specs, live={"a"})  # read for one job: not kept
    assert alone.generation is None and alone.behind == ()
    placement.candidates(specs["j-2"], views, queue=alone)
    placement.candidates(specs["j-2"], views, queue=alone)
    assert passes == [4, 4, 3, 3]


def _held_until(path: Path) -> list[str]:
    """A job's command that runs until ``path`` exists."""
    code = f"import os, time\nwhile not os.path.exists({str(path)!r}): time.sleep(0.1)"
    return [sys.executable, "-c", code]


@pytest.mark.slow
def test_on_real_agents_a_later_job_of_another_owner_waits_behind_a_blocked_one(
    tmp_path: Path,
) -> None:
    """Two agents of two simulated GPUs: one full, the other with one GPU free. A 2-GPU job of
    priority 5 waits for the busy GPU there; a 1-GPU job submitted after it, whoever owns it,
    is not given the free GPU (it would delay the 2-GPU job) but waits behind it, with the
    line that says so; the 2-GPU job starts as soon as its GPU ends."""
    with started(tmp_path, ["h100:2", "h100:2"]) as mesh:
        a = mesh.agents[0]

        def submit(argv: list[str], gpus: int, priority: int = 0, **extra: Any) -> str:
            job_id = new_job_id()
            body = {"job_id": job_id, "spec": spec(argv, gpus=gpus, priority=priority, **extra)}
            status, answer = mesh.command(a, "submit", body)
            assert status == 200, answer
            return job_id

        def state(job_id: str) -> str:
            return str(mesh.job(a, job_id)["state"])

        # The half node's job has a time limit of ten minutes, so it is the one predicted to
        # end first: the 2-GPU job's reservation names its node.
        full = submit(_held_until(tmp_path / "end-full"), gpus=2)
        mesh.wait("the full node's job runs", lambda: state(full) == "running")
        half = submit(_held_until(tmp_path / "end-half"), gpus=1, max_runtime_s=600.0)
        mesh.wait("the half node's job runs", lambda: state(half) == "running")
        half_node = mesh.job(a, half)["runner"]
        assert half_node != mesh.job(a, full)["runner"]

        big = submit(_held_until(tmp_path / "end-big"), gpus=2, priority=5)
        mesh.wait(
            "the 2-GPU job is known to wait by every agent",
            lambda: all(mesh.job(x, big)["state"] == "pending" for x in mesh.agents),
        )
        small = submit(_held_until(tmp_path / "end-small"), gpus=1)
        line = f"waiting: it would delay job {big[:8]}"
        mesh.wait("the 1-GPU job says why", lambda: line in str(mesh.job(a, small).get("reason")))
        time.sleep(2.0)  # several placement passes of its owner
        assert state(small) == "pending" and state(big) == "pending"

        (tmp_path / "end-half").touch()
        mesh.wait("the 2-GPU job runs where the GPU ended", lambda: state(big) == "running")
        assert mesh.job(a, big)["runner"] == half_node
        # No room left anywhere: an offer of the 1-GPU job made from a view a moment old (the
        # GPU free, the 2-GPU job not yet on it) is declined, and it waits again, never run.
        mesh.wait("the 1-GPU job waits again", lambda: state(small) == "pending")
        assert mesh.job(a, small).get("started_at") is None
        (tmp_path / "end-full").touch()
        mesh.wait("the 1-GPU job runs once room frees", lambda: state(small) == "running")
        for path in ("end-big", "end-small"):
            (tmp_path / path).touch()
