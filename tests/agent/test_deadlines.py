"""Missed deadlines on real agents: the owner of a job whose deadline passes before it ends says
so once (an event with by how much, a counter), and ``shoal jobs`` marks it."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.job.deadlines import lateness_s, missed_line
from agent.job.jobspec import Resources, new_job_id
from tests.agent.agents import Mesh, spec, started
from tests.agent.test_attacks import metric
from tests.agent.test_cli_ops import Operator

pytestmark = pytest.mark.slow

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    with started(tmp_path, ["l4:1", "h100:1"]) as m:
        yield m


def submit(mesh: Mesh, argv: list[str], deadline: float, **extra: object) -> str:
    job_id = new_job_id()
    body = {"job_id": job_id, "spec": spec(argv, gpus=0, deadline=deadline, **extra)}
    status, answer = mesh.command(mesh.agents[0], "submit", body)
    assert status == 200, answer
    return job_id


def misses(mesh: Mesh, job_id: str) -> list[dict[str, object]]:
    """The ``deadline_missed`` events of ``job_id`` as each agent holds them (gossiped)."""
    return [
        e
        for a in mesh.agents
        for e in mesh.events(a)
        if e["kind"] == "deadline_missed" and e["job_id"] == job_id
    ]


def test_a_missed_deadline_is_said_once_counted_and_marked(mesh: Mesh) -> None:
    now = time.time()
    # Deadlines 6 s away: time for the first job to be running before its own passes, on a
    # loaded machine too.
    running = submit(mesh, SLEEPER, now + 6)
    waiting = submit(
        mesh, SLEEPER, now + 6, resources=Resources(gpus_per_node=1, backends=("rocm",))
    )
    in_time = submit(mesh, ["true"], now + 600)
    op = Operator(mesh, mesh.agents[0])
    mesh.wait("the quick job done", lambda: op.job(in_time)["state"] == "succeeded")
    mesh.wait("the sleeper running", lambda: op.job(running).get("state") == "running", 5.0)
    assert op.job(waiting)["state"] == "pending"
    for job_id, state in ((running, "running"), (waiting, "pending")):
        mesh.wait(
            f"the {state} job's miss", lambda j=job_id: len(misses(mesh, j)) == len(mesh.agents)
        )
        (event, *_) = misses(mesh, job_id)
        assert str(event["message"]).startswith("missed by ") and f"({state})" in str(
            event["message"]
        )
        assert op.job(job_id)["deadline_missed_s"] >= 0
    time.sleep(2.5)  # the owners look every second: nothing is said twice
    assert len(misses(mesh, running)) == len(misses(mesh, waiting)) == len(mesh.agents)
    assert misses(mesh, in_time) == []
    counted = sum(metric(mesh, a, "shoal_deadline_misses_total") for a in mesh.agents)
    assert counted == 2

    rows = {line[:8]: line for line in op.ok("jobs").splitlines()[2:]}
    assert " missed " in rows[running[:8]] and " missed " in rows[waiting[:8]]
    assert " missed " not in rows[in_time[:8]]
    assert re.search(r" in \d+m ", rows[in_time[:8]]), rows[in_time[:8]]
    for job_id in (running, waiting):
        assert mesh.command(mesh.agents[0], "cancel", {"job_id": job_id})[0] == 200
    mesh.wait(
        "cancelled", lambda: op.job(running)["state"] == op.job(waiting)["state"] == "cancelled"
    )
    assert " missed " in op.ok("jobs")  # an ended job that missed it stays marked


def test_lateness_and_its_words() -> None:
    assert lateness_s(None, "running", None, 10.0) is None
    assert lateness_s(20.0, "running", None, 10.0) is None
    assert lateness_s(5.0, "running", None, 10.0) == 5.0
    assert lateness_s(5.0, "succeeded", 4.0, 10.0) is None  # ended in time
    assert lateness_s(5.0, "succeeded", 9.0, 100.0) == 4.0  # ended 4 s late
    assert lateness_s(5.0, "cancelled", None, 100.0) is None
    assert missed_line(4.25, "running") == "missed by 4.2 s (running)"
    assert missed_line(180.0, "succeeded") == "missed by 3.0 min (ended succeeded)"
    assert missed_line(9000.0, "pending") == "missed by 2.5 h (pending)"
