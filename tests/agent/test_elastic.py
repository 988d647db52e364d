"""Elastic jobs (a range of GPUs) on real agents: a ``2-4`` job is given the most GPUs that are
free on a node up to 4, never fewer than 2 (it waits, with its reason, while fewer are free);
it is told the devices it got, ``shoal jobs`` shows what it holds and its range, and a runner
refuses an offer outside the range. One running above its fewest is shrunk for a job that
waits (no priority needed), and restarts from its checkpoint with fewer GPUs; a runner refuses
a shrink that is not one. One running below its most grows onto GPUs left idle on its node,
restarting from its checkpoint with more.

The mesh: one agent simulating four H100s.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from agent.job.jobspec import JobSpec, Resources
from tests.agent.agents import Mesh, started
from tests.agent.test_checkpoint_move import TRAINER, ckpt_dir, saved_step, starts
from tests.agent.test_cli_ops import Operator
from tests.agent.test_shares import sleeper
from tests.shoal_cli import shoal

pytestmark = pytest.mark.slow

MIN_RUN_S = 3.0


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    with started(tmp_path, ["h100:4"]) as m:
        yield m


def submit(op: Operator, gpus: str, out: Path, argv: list[str] | None = None) -> str:
    command = argv if argv is not None else sleeper(out)
    done = shoal("submit", *op.flags, "--json", "--gpus", gpus, "--", *command)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    if "-" in gpus:
        assert answer["asks"] == f"{gpus} GPUs of one vendor on one node (elastic)", answer
    return str(answer["job_id"])


@contextmanager
def configured(tmp_path: Path, config: str) -> Iterator[tuple[Mesh, Operator]]:
    """One agent of four H100s with this agent config, and its operator."""
    path = tmp_path / "agent.toml"
    path.write_text(config)
    with started(tmp_path, ["h100:4"], extra=("--config", str(path))) as mesh:
        yield mesh, Operator(mesh, mesh.agents[0])


def trainer(mesh: Mesh, op: Operator, log: Path, gpus: int) -> str:
    """A checkpointing ``2-4`` job, running on ``gpus`` GPUs and past its first checkpoint."""
    elastic = submit(op, "2-4", log, [sys.executable, "-c", TRAINER, str(log)])
    mesh.wait("the elastic job running", lambda: op.job(elastic)["state"] == "running")
    assert len(op.job(elastic)["devices"]) == gpus
    node = op.job(elastic)["runner"]
    mesh.wait("it saved", lambda: saved_step(ckpt_dir(mesh, node, elastic)) >= 20)
    return elastic


def resumed_and_said(mesh: Mesh, op: Operator, log: Path, elastic: str, resized: str) -> None:
    """Its second attempt resumed from its checkpoint, and its owner said the resize."""
    mesh.wait("its second attempt started", lambda: 2 in starts(log))
    resume, step = starts(log)[2]
    assert resume == "1" and step >= 20
    said = [json.loads(line) for line in op.ok("events", "--json").splitlines()]
    assert [(e["job_id"], e["message"]) for e in said if e["kind"] == "resized"] == [
        (elastic, resized)
    ], said
    assert "resized" in op.ok("events")  # the table shows it too


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
    assert env["SHOAL_GPUS"] == "4", env
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


def test_an_elastic_job_is_shrunk_for_a_job_that_waits_and_resumes_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    with configured(tmp_path, f"preempt_min_run_s = {MIN_RUN_S}\n") as (mesh, op):
        log = tmp_path / "starts"
        elastic = trainer(mesh, op, log, 4)
        started_at = float(op.job(elastic)["started_at"])
        mesh.wait("its minimum run time", lambda: time.time() - started_at > MIN_RUN_S + 0.5)

        # A runner refuses to shrink a job that is not elastic, or for more than it frees.
        held = op.job(elastic)["devices"]
        job = JobSpec(command=("true",), resources=Resources(gpus_per_node=3))
        status, error = mesh.offer(0, 0, job, held[:3], shrink=(elastic,))
        assert status == 409 and f"takes 3 of {elastic}'s GPUs; a shrink frees 2" in error, error

        # A plain job of the same priority waits for 2 GPUs: the elastic one gives back two.
        plain = submit(op, "2", tmp_path / "plain.json")
        mesh.wait("the plain job running", lambda: op.job(plain)["state"] == "running")
        assert op.job(elastic)["attempts"][0]["cause"] == "shrink"
        mesh.wait(
            "the elastic job running again",
            lambda: op.job(elastic)["state"] == "running" and op.job(elastic)["attempt"] == 2,
        )
        assert len(op.job(elastic)["devices"]) == 2
        assert not set(op.job(elastic)["devices"]) & set(op.job(plain)["devices"])
        resumed_and_said(mesh, op, log, elastic, f"from 4 to 2 GPUs (shrunk for {plain[:8]})")


def test_an_elastic_job_grows_onto_gpus_left_idle_and_resumes_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    config = f"preempt_min_run_s = {MIN_RUN_S}\nelastic_grow_idle_s = 2\n"
    with configured(tmp_path, config) as (mesh, op):
        plain = submit(op, "2", tmp_path / "plain.json")
        mesh.wait("the plain job running", lambda: op.job(plain)["state"] == "running")
        log = tmp_path / "starts"
        elastic = trainer(mesh, op, log, 2)
        assert op.job(elastic)["attempt"] == 1  # nothing idle: it keeps its size

        # A job that waits for two GPUs comes first: the plain job ends, the waiting one takes
        # its GPUs, and the elastic job does not grow (it runs at its fewest: not shrunk either).
        waiting = submit(op, "2", tmp_path / "waiting.json")
        mesh.wait("the job's reason", lambda: op.job(waiting).get("reason") is not None)
        assert mesh.command(mesh.agents[0], "cancel", {"job_id": plain})[0] == 200
        mesh.wait("the waiting job running", lambda: op.job(waiting)["state"] == "running")
        time.sleep(3 * 2)  # three times elastic_grow_idle_s: nothing of the node sits idle
        assert (op.job(elastic)["state"], op.job(elastic)["attempt"]) == ("running", 1)

        # That job ends: its GPUs sit idle, and the elastic job grows onto them.
        assert mesh.command(mesh.agents[0], "cancel", {"job_id": waiting})[0] == 200
        mesh.wait(
            "the elastic job running on 4",
            lambda: op.job(elastic)["state"] == "running" and len(op.job(elastic)["devices"]) == 4,
        )
        assert op.job(elastic)["attempt"] == 2
        resumed_and_said(mesh, op, log, elastic, "from 2 to 4 GPUs (grown onto idle GPUs)")
        rows = {line[:8]: line for line in op.ok("jobs").splitlines()[2:]}
        assert "4 (2-4)" in rows[elastic[:8]], rows
