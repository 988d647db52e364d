"""Elastic jobs (a range of GPUs) on real agents: a ``2-4`` job is given the most GPUs that are
free on a node up to 4, never fewer than 2 (it waits, with its reason, while fewer are free);
it is told the devices it got, ``shoal jobs`` shows what it holds and its range, and a runner
refuses an offer outside the range.

The mesh: one agent simulating four H100s.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.jobspec import JobSpec, Resources
from tests.agent.agents import Mesh, started
from tests.agent.test_cli_ops import Operator
from tests.agent.test_shares import sleeper
from tests.shoal_cli import shoal

pytestmark = pytest.mark.slow


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    with started(tmp_path, ["h100:4"]) as m:
        yield m


def submit(op: Operator, gpus: str, out: Path) -> str:
    done = shoal("submit", *op.flags, "--json", "--gpus", gpus, "--", *sleeper(out))
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["job_id"])


def test_an_elastic_job_takes_what_is_free_in_its_range(mesh: Mesh, tmp_path: Path) -> None:
    op = Operator(mesh, mesh.agents[0])
    three = submit(op, "3", tmp_path / "three.json")
    mesh.wait("the plain job running", lambda: op.job(three)["state"] == "running")

    # One GPU free: the 2-4 job waits, and says for what.
    elastic = submit(op, "2-4", tmp_path / "elastic.json")
    mesh.wait(
        "the elastic job's reason",
        lambda: "2 free GPUs (it takes up to 4)" in (op.job(elastic).get("reason") or ""),
    )
    assert op.job(elastic)["state"] == "pending"

    # Four free: it takes all four, and is told them.
    assert mesh.command(mesh.agents[0], "cancel", {"job_id": three})[0] == 200
    mesh.wait("the elastic job running", lambda: op.job(elastic)["state"] == "running")
    held = op.job(elastic)["devices"]
    assert len(held) == 4, held
    mesh.wait("it wrote its env", (tmp_path / "elastic.json").exists)
    env = json.loads((tmp_path / "elastic.json").read_text())
    assert sorted(env["SHOAL_DEVICES"].split(",")) == sorted(held), env
    assert len(env["CUDA_VISIBLE_DEVICES"].split(",")) == 4, env
    rows = {line[:8]: line for line in op.ok("jobs").splitlines()[2:]}
    assert "4 (2-4)" in rows[elastic[:8]], rows

    # A runner takes no offer outside the range.
    job = JobSpec(command=("true",), resources=Resources(gpus_per_node=2, gpus_max_per_node=4))
    status, error = mesh.offer(0, 0, job, held[:1])
    assert (status, "offered 1 device(s) for a job of 2-4" in error) == (409, True), error

    # Two free: a second 2-4 job takes two.
    assert mesh.command(mesh.agents[0], "cancel", {"job_id": elastic})[0] == 200
    two = submit(op, "2", tmp_path / "two.json")
    mesh.wait("the two-GPU job running", lambda: op.job(two)["state"] == "running")
    second = submit(op, "2-4", tmp_path / "second.json")
    mesh.wait("the second elastic job running", lambda: op.job(second)["state"] == "running")
    assert len(op.job(second)["devices"]) == 2
    assert not set(op.job(second)["devices"]) & set(op.job(two)["devices"])
    rows = {line[:8]: line for line in op.ok("jobs").splitlines()[2:]}
    assert "2 (2-4)" in rows[second[:8]], rows
