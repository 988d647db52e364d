"""Real agents on loopback: a job of higher priority preempts a preemptible one of lower priority
(past its minimum run time), which saves its checkpoint, is requeued and resumes from it; a job
that is not preemptible, or not of a lower priority, is never displaced; and a runner refuses an
offer whose victims lie."""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from agent.job.jobspec import new_job_id
from agent.job.ownership import rank
from agent.wire.calls import StartOffer
from gossip.identity import load_identity
from tests.agent.agents import Mesh, spec
from tests.agent.test_attacks import metric
from tests.agent.test_checkpoint_move import TRAINER, ckpt_dir, saved_step, starts
from tests.shoal_cli import shoal

pytestmark = pytest.mark.slow

MIN_RUN_S = 6.0
SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def mesh_with(tmp_path: Path, min_run_s: float) -> Mesh:
    """Two agents of one simulated GPU each, with this minimum run time in their config."""
    config = tmp_path / "agent.toml"
    config.write_text(f"preempt_min_run_s = {min_run_s}\n")
    mesh = Mesh(tmp_path, ["h100:1", "h100:1"], extra=("--config", str(config)))
    mesh.start_all()
    return mesh


def submit(mesh: Mesh, argv: list[str], **spec_kw: Any) -> str:
    job_id = new_job_id()
    body = {"job_id": job_id, "spec": spec(argv, gpus=1, **spec_kw)}
    status, answer = mesh.command(mesh.agents[0], "submit", body)
    assert status == 200, answer
    return job_id


def running(mesh: Mesh, job_id: str, attempt: int | None = None) -> bool:
    """The job runs (``attempt``: that attempt of it)."""
    job = mesh.job(mesh.agents[0], job_id)
    return job["state"] == "running" and attempt in (None, job["attempt"])


def test_a_higher_priority_job_preempts_a_checkpointing_one_which_resumes_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    mesh = mesh_with(tmp_path, MIN_RUN_S)
    try:
        a = mesh.agents[0]
        logs = {i: tmp_path / f"starts-{i}" for i in range(2)}
        low = [
            submit(mesh, [sys.executable, "-c", TRAINER, str(logs[i])], preemptible=True)
            for i in range(2)
        ]
        mesh.wait("both low jobs run", lambda: all(running(mesh, j) for j in low))
        runners = {j: mesh.job(a, j)["runner"] for j in low}
        assert len(set(runners.values())) == 2  # the fleet is full
        mesh.wait(
            "both saved a checkpoint",
            lambda: all(saved_step(ckpt_dir(mesh, runners[j], j)) >= 20 for j in low),
        )
        release = tmp_path / "release"  # the high job ends once the test has seen enough
        wait_for = f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.1)"
        flags = ["--agent", a.address, "--identity", str(mesh.cluster_dir)]
        submitted = shoal(
            "submit", "--gpus", "1", "--priority", "100", *flags, "--", sys.executable, "-c",
            wait_for,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        high = submitted.stdout.split()[1]
        assert (
            "it starts when one frees up, or sooner by preempting one of the 2 preemptible jobs "
            "of lower priority running there, once they have run the minimum time"
        ) in submitted.stdout, submitted.stdout

        attempts = {j: mesh.job(a, j)["attempt"] for j in low}

        # One low job is stopped for it, once it has run its minimum time, and requeued.
        def preempted() -> str | None:
            for j in low:
                job = mesh.job(a, j)
                if job["state"] == "pending" and job["attempts"][-1].get("cause") == "preempt":
                    return j
            return None

        mesh.wait("a victim requeued", lambda: preempted() is not None)
        victim = preempted()
        assert victim is not None
        other = next(j for j in low if j != victim)
        host = runners[victim]
        name = f"h100-{mesh.node_index(host):02d}"
        job = mesh.job(a, victim)
        assert job["reason"].startswith(f"preempted by {high[:8]} on {name}"), job["reason"]
        stopped = job["attempts"][-1]
        assert stopped["attempt"] == attempts[victim]
        assert stopped["finished_at"] - stopped["started_at"] >= MIN_RUN_S  # its minimum, kept
        mesh.wait("the high job runs where the victim ran", lambda: running(mesh, high))
        assert mesh.job(a, high)["runner"] == host
        assert running(mesh, other)  # one victim was enough

        # The operator sees why it waits: in full as JSON, and at the head of its table row.
        listed = shoal("jobs", "--json", *flags)
        assert listed.returncode == 0, listed.stderr
        said = next(j for j in json.loads(listed.stdout) if j["job_id"] == victim)["reason"]
        assert said.startswith(f"preempted by {high[:8]} on {name}"), said
        table = shoal("jobs", *flags).stdout.splitlines()
        assert "preempted by" in next(row for row in table if row.startswith(victim[:8]))

        # It resumes from the checkpoint it saved as it stopped, once the high job is done.
        left = saved_step(ckpt_dir(mesh, host, victim))
        assert left > 20
        release.touch()
        mesh.wait("the high job succeeded", lambda: mesh.job(a, high)["state"] == "succeeded")
        mesh.wait("the victim runs again", lambda: running(mesh, victim))
        again = mesh.job(a, victim)["attempt"]
        assert again > attempts[victim]
        log = logs[low.index(victim)]
        mesh.wait("its next attempt started", lambda: again in starts(log))
        assert starts(log)[again] == ("1", left)

        # Both the runner and the victim's owner say so, naming both jobs; the runner counts it.
        owner = mesh.job(a, victim)["owner"]
        events = [e for e in mesh.events(a) if e["kind"] == "preempted" and e["job_id"] == victim]
        assert any(e["node"] == host and high in e["message"] for e in events), events
        assert any(e["node"] == owner and high in e["message"] for e in events), events
        runner = mesh.agents[mesh.node_index(host)]
        assert metric(mesh, runner, "shoal_preemptions_total", outcome="preempted") == 1
    finally:
        mesh.stop_all()


def lying_offer(
    mesh: Mesh,
    runner: int,
    victims: tuple[str, ...],
    devices: tuple[str, ...],
    priority: int,
    moves: tuple[str, ...] = (),
) -> tuple[int, str]:
    """A start offer for a fresh job, sent to agent ``runner`` by an agent that may own that job
    (the first of its order), naming ``victims`` (and ``moves``): the status and the one-line
    answer."""
    job_id = new_job_id()
    body = {"job_id": job_id, "spec": spec(SLEEPER, gpus=1, priority=priority)}
    sealed = mesh.seal("submit", body)
    caller = rank(job_id, [x.node_id for x in mesh.agents])[0]
    identity = load_identity(mesh.agents[mesh.node_index(caller)].directory / "identity")
    mesh.write_ahead(mesh.node_index(caller), job_id, sealed, 1, mesh.agents[runner].node_id)
    offer = StartOffer(job_id, 1, caller, devices, sealed, None, victims, moves=moves)
    status, raw = mesh.request(
        mesh.agents[runner],
        "POST",
        "/v1/internal/start",
        json.dumps(offer.to_wire()).encode(),
        identity=identity,
    )
    return status, json.loads(raw).get("error", "")


def test_no_job_is_displaced_that_may_not_be_and_a_runner_refuses_offers_that_lie(
    tmp_path: Path,
) -> None:
    mesh = mesh_with(tmp_path, 1.0)
    try:
        a = mesh.agents[0]
        pinned = submit(mesh, SLEEPER, priority=0, preemptible=False)
        peer = submit(mesh, SLEEPER, priority=100, preemptible=True)
        mesh.wait("both run", lambda: running(mesh, pinned) and running(mesh, peer))
        urgent = submit(mesh, SLEEPER, priority=100)
        mesh.wait(
            "the urgent job waits, saying why",
            lambda: (j := mesh.job(a, urgent))["state"] == "pending" and bool(j["reason"]),
        )
        time.sleep(3.0)  # well past the minimum run time: still nothing is preempted
        assert running(mesh, pinned) and running(mesh, peer)
        job = mesh.job(a, urgent)
        assert job["state"] == "pending" and not job["attempts"], job
        assert job["reason"].startswith("waiting"), job["reason"]

        where = {j: mesh.job(a, j) for j in (pinned, peer)}
        at = {j: mesh.node_index(doc["runner"]) for j, doc in where.items()}
        devices = {j: tuple(doc["devices"]) for j, doc in where.items()}
        lies = [
            (at[pinned], (pinned,), devices[pinned], 100, f"victim {pinned} is not preemptible"),
            (
                at[peer],
                (peer,),
                devices[peer],
                100,
                f"victim {peer} has priority 100, not lower than 100",
            ),
            (at[peer], (peer,), devices[peer], 50, f"victim {peer} has priority 100, not lower"),
            (at[peer], (pinned,), devices[peer], 500, f"victim {pinned} does not run here"),
        ]
        for runner, victims, keys, priority, line in lies:
            status, error = lying_offer(mesh, runner, victims, keys, priority)
            assert status == 409 and f"preemption refused: {line}" in error, (status, error)
        # A move off for a job no team is owed (this mesh holds no team policy).
        status, error = lying_offer(mesh, at[pinned], (), devices[pinned], 0, moves=(pinned,))
        owed = f"victim {pinned} may be moved only for a job its team's guarantee is owed"
        assert status == 409 and f"preemption refused: {owed}" in error, (status, error)
        assert running(mesh, pinned) and running(mesh, peer)
        refused = sum(
            metric(mesh, x, "shoal_preemptions_total", outcome="refused") for x in mesh.agents
        )
        assert refused == len(lies) + 1
        assert not any(
            metric(mesh, x, "shoal_preemptions_total", outcome="preempted") for x in mesh.agents
        )

        # Two offers of a higher priority racing for one victim: one starts, the other is
        # refused (the victim is claimed, gone, or its device taken), and it is stopped once.
        with ThreadPoolExecutor(2) as pool:
            answers = list(
                pool.map(
                    lambda _: lying_offer(mesh, at[peer], (peer,), devices[peer], 200), range(2)
                )
            )
        assert sorted(status for status, _ in answers) == [200, 409], answers
        lost = next(error for status, error in answers if status == 409)
        assert lost.startswith("preemption refused: "), lost
        runner = mesh.agents[at[peer]]
        assert metric(mesh, runner, "shoal_preemptions_total", outcome="preempted") == 1
        mesh.wait(
            "the victim requeued, saying so",
            lambda: (mesh.job(a, peer)["reason"] or "").startswith("preempted by "),
        )
    finally:
        mesh.stop_all()
