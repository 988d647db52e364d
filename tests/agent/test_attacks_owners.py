"""Attacks on a job's ownership by a member outside its owner window, on real agent processes
(the kit of ``tests/agent/test_attacks.py``: one agent's stolen key, used over mutual TLS).

A member once left a copy of a job it did not own with both of the job's owners, naming itself
the owner at ``gen = 2**64 - 1``: the owners kept it, the hand-over overflowed msgpack when the
member left, the member-gone sweep stopped part-way, ``shoal cancel`` said "cancelled" while the
job ran on, and an owner restart did not heal it. Each layer is tested here: the copy is refused,
an integer out of range is refused on every call, a cancel says "cancelled" only once the job
stopped, and an owner restart heals a job whose stored copy is bad.
"""

from __future__ import annotations

import base64
import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.job.jobspec import Resources, new_job_id
from agent.job.ownership import rank
from agent.sandbox.localmesh import AgentProcess
from agent.wire.calls import AttemptResult
from gossip.identity import load_identity
from tests.agent.agents import Mesh, spec
from tests.agent.test_attacks import SLEEPER, Intruder, by_id, job_out_of_reach, metric

pytestmark = pytest.mark.slow

STOP_GRACE_S = 20.0
"""The agents' grace between a stop's SIGTERM and SIGKILL: longer than a cancel waits."""
STUBBORN = [
    sys.executable,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)",
]
"""A job that ignores SIGTERM: it stops only at the SIGKILL, ``STOP_GRACE_S`` later."""


def _internal_400s(mesh: Mesh, a: AgentProcess) -> float:
    """Agent ``a``'s count of internal calls answered 400 (a label with braces in it, which
    ``metric`` does not parse)."""
    status, body = mesh.request(a, "GET", "/metrics")
    assert status == 200
    line = 'shoal_api_refused_total{route="/v1/internal/{op}",status="400"} '
    found = [row for row in body.decode().splitlines() if row.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    root = tmp_path_factory.mktemp("owners")
    config = root / "agent.toml"
    config.write_text(f"stop_grace_s = {STOP_GRACE_S}\n")
    m = Mesh(root, ["h100:1", "mi300x:1", "l4:1", "h100:1"], extra=("--config", str(config)))
    m.start_all()
    try:
        yield m
    finally:
        m.stop_all()


@pytest.fixture(scope="module")
def intruder(mesh: Mesh) -> Intruder:
    return Intruder(mesh, 3)


def _submit(mesh: Mesh, job_id: str, argv: list[str]) -> dict[str, Any]:
    status, answer = mesh.command(
        mesh.agents[0], "submit", {"job_id": job_id, "spec": spec(argv, gpus=0)}
    )
    assert status == 200, answer
    mesh.wait("the job running", lambda: mesh.job(mesh.agents[0], job_id)["state"] == "running")
    return mesh.job(mesh.agents[0], job_id)


def _transfer(mesh: Mesh, job: dict[str, Any], **record: Any) -> dict[str, Any]:
    """A ``replicate`` body of the job, with an operator's genuine submission of it."""
    sealed = mesh.seal("submit", {"job_id": job["job_id"], "spec": spec(SLEEPER, gpus=0)})
    fields = ("job_id", "state", "attempt", "owner", "runner", "submitted_at", "gen")
    return {
        "record": {**{k: job[k] for k in fields}, **record},
        "detail": {"gen": record.get("gen", job["gen"])},
        "submission": base64.b64encode(sealed).decode(),
    }


def _stored(mesh: Mesh, a: AgentProcess, intruder: Intruder, job_id: str) -> dict[str, Any]:
    """The copy of the job agent ``a`` keeps in its store."""
    status, body = mesh.request(
        a,
        "POST",
        "/v1/internal/stored_job",
        json.dumps({"job_id": job_id}).encode(),
        identity=intruder.identity,
    )
    assert status == 200, body
    stored = json.loads(body)["job"]
    assert isinstance(stored, dict)
    return stored


def test_a_member_outside_a_jobs_owner_window_cannot_leave_a_copy_of_it(
    mesh: Mesh, intruder: Intruder
) -> None:
    job_id = job_out_of_reach(mesh, intruder)
    job = _submit(mesh, job_id, SLEEPER)
    owners = [by_id(mesh, n) for n in rank(job_id, [a.node_id for a in mesh.agents])[:2]]
    assert intruder.agent not in owners
    # The copy the attack left: the intruder as the owner, at a gen above every record.
    lie = _transfer(mesh, job, owner=intruder.node_id, gen=10**12)
    for a in owners:
        before = metric(mesh, a, "shoal_internal_refused_total", call="replicate")
        assert intruder.call(a, "replicate", lie) == 403
        assert metric(mesh, a, "shoal_internal_refused_total", call="replicate") == before + 1
        stored = _stored(mesh, a, intruder, job_id)
        assert stored["owner"] == job["owner"] and stored["gen"] < 10**12, stored
    # Nor may it name the real owner: only that owner sends its copies.
    assert intruder.call(owners[1], "replicate", _transfer(mesh, job, gen=10**12)) == 403
    assert _stored(mesh, owners[1], intruder, job_id)["gen"] < 10**12
    status, answer = mesh.command(mesh.agents[0], "cancel", {"job_id": job_id})
    assert (status, answer.get("state")) == (200, "cancelled"), answer


def test_an_integer_out_of_range_is_refused_on_every_call_and_counted(
    mesh: Mesh, intruder: Intruder
) -> None:
    victim = mesh.agents[1]
    job_id = new_job_id()
    job = {
        "job_id": job_id,
        "state": "running",
        "attempt": 1,
        "owner": intruder.node_id,
        "runner": victim.node_id,
        "submitted_at": time.time(),
        "gen": 1,
    }
    sealed = base64.b64encode(
        mesh.seal("submit", {"job_id": job_id, "spec": spec(SLEEPER, gpus=0)})
    ).decode()
    bodies = [
        ("replicate", _transfer(mesh, job, gen=2**64 - 1)),
        ("adopt", _transfer(mesh, job, attempt=2**64)),
        ("replicate", _transfer(mesh, job, submitted_at=10**400)),  # a number field's integer
        (
            "start",
            {
                "job_id": job_id,
                "attempt": 2**64 - 1,
                "owner": intruder.node_id,
                "devices": [],
                "submission": sealed,
            },
        ),
        ("stop", {"job_id": job_id, "attempt": -(2**63) - 1, "cause": "cancel"}),
        ("report", {**AttemptResult(job_id, 1, 2**70, None, "exit", 1.0, 2.0).to_wire()}),
    ]
    before = _internal_400s(mesh, victim)
    for op, body in bodies:
        assert intruder.call(victim, op, body) == 400, op
    assert _internal_400s(mesh, victim) == before + len(bodies)
    assert job_id not in {j["job_id"] for j in mesh.get(victim, "/v1/jobs")["jobs"]}


def test_an_operators_command_with_an_integer_out_of_range_is_refused_and_counted(
    mesh: Mesh,
) -> None:
    node = mesh.agents[2]
    body = {"node": node.node_id, "grace_s": 10**400}  # no float holds it
    before = metric(mesh, node, "shoal_commands_rejected_total", reason="bad_body")
    status = 0
    try:
        status, answer = mesh.command(node, "drain", body)
        assert status == 400 and "grace_s" in answer["error"], answer
    finally:
        if status == 200:
            mesh.command(node, "undrain", {"node": node.node_id})
    assert metric(mesh, node, "shoal_commands_rejected_total", reason="bad_body") == before + 1
    nodes = {n["node_id"]: n for n in mesh.get(node, "/v1/nodes")["nodes"]}
    assert nodes[node.node_id]["drain"] == "schedulable"


def _cli_cancel(mesh: Mesh, a: AgentProcess, job_id: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "agent.cli",
            "cancel",
            job_id,
            "--agent",
            a.address,
            "--identity",
            str(mesh.cluster_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cancel_says_cancelled_only_once_the_job_has_stopped(mesh: Mesh) -> None:
    job_id = new_job_id()
    job = _submit(mesh, job_id, STUBBORN)
    runner = by_id(mesh, job["runner"])
    # Through an agent that is not the job's owner: the command is forwarded to the owner.
    via = next(a for a in mesh.agents if a.node_id not in (job["owner"], job["runner"]))
    running = metric(mesh, runner, "shoal_jobs_running_here")
    started = time.monotonic()
    first = _cli_cancel(mesh, via, job_id)
    assert first.returncode != 0, first
    assert "has not stopped yet" in first.stderr and "cancelled" not in first.stdout, first
    assert time.monotonic() - started < STOP_GRACE_S  # it said so before the job was killed
    assert metric(mesh, runner, "shoal_jobs_running_here") == running  # and it still runs
    mesh.wait(
        "the runner to stop it",
        lambda: metric(mesh, runner, "shoal_jobs_running_here") == running - 1,
        deadline_s=STOP_GRACE_S + 20,
    )
    second = _cli_cancel(mesh, via, job_id)
    assert second.returncode == 0, second
    assert second.stdout.strip() == f"{job_id}: cancelled", second


def _corrupt_gen(a: AgentProcess, job_id: str, gen: int) -> None:
    """Set the ``gen`` of the job's stored copy in agent ``a``'s store (stopped) to ``gen``: a
    copy kept before integers on the wire were bounded."""
    with sqlite3.connect(a.directory / "agent.sqlite") as db:
        (detail,) = db.execute("SELECT detail FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        db.execute(
            "UPDATE jobs SET detail = ? WHERE job_id = ?",
            (json.dumps({**json.loads(detail), "gen": gen}), job_id),
        )
    db.close()


def test_an_owner_restart_heals_a_job_whose_stored_copy_is_bad(tmp_path: Path) -> None:
    """Agent 0 owns three jobs that only agent 2 can run (its ROCm GPUs); the first one's
    copy in agent 0's store holds a gen no counter can go past. Agent 0 restarts: every job is
    its again, the first one cancels (and stops), and when agent 2 dies the member-gone sweep
    requeues the other two."""
    mesh = Mesh(tmp_path, ["h100:1", "h100:1", "mi300x:4"])
    mesh.start_all()
    try:
        ids = [a.node_id for a in mesh.agents]
        job_ids: list[str] = []
        while len(job_ids) < 3:
            job_id = new_job_id()
            if rank(job_id, ids)[:2] == ids[:2]:
                job_ids.append(job_id)
        rocm = Resources(gpus_per_node=1, backends=("rocm",))
        owner, runner = mesh.agents[0], mesh.agents[2]
        for job_id in job_ids:
            body = {"job_id": job_id, "spec": spec(SLEEPER, resources=rocm)}
            assert mesh.command(owner, "submit", body)[0] == 200
        mesh.wait(
            "the three running on agent 2",
            lambda: all(
                (j := mesh.job(owner, job_id))["state"] == "running"
                and j["runner"] == runner.node_id
                for job_id in job_ids
            ),
        )
        assert mesh.terminate(0) == 0
        _corrupt_gen(owner, job_ids[0], 2**64 - 1)
        mesh.start(0)
        mesh.wait_converged()
        mesh.wait(
            "agent 0 owning the three again",
            lambda: all(
                (j := mesh.job(owner, job_id))["owner"] == owner.node_id and j["state"] == "running"
                for job_id in job_ids
            ),
            deadline_s=60,
        )
        status, answer = mesh.command(owner, "cancel", {"job_id": job_ids[0]})
        assert (status, answer.get("state")) == (200, "cancelled"), answer
        mesh.wait(
            "every agent to list it cancelled",
            lambda: all(mesh.job(a, job_ids[0])["state"] == "cancelled" for a in mesh.agents),
        )
        assert metric(mesh, runner, "shoal_jobs_running_here") == 2
        mesh.kill(2)
        mesh.wait(
            "the other two requeued by agent 0",
            lambda: all(
                (j := mesh.job(owner, job_id))["state"] == "pending" and j["owner"] == owner.node_id
                for job_id in job_ids[1:]
            ),
            deadline_s=60,
        )
        # Its stored copy is whole again (the restart took it back, or its owner's copy
        # replaced it), and nothing failed on the way.
        peer = load_identity(mesh.agents[1].directory / "identity")
        status, body = mesh.request(
            owner,
            "POST",
            "/v1/internal/stored_job",
            json.dumps({"job_id": job_ids[0]}).encode(),
            identity=peer,
        )
        assert status == 200 and json.loads(body)["job"]["gen"] < 2**53, body
        assert metric(mesh, owner, "shoal_job_step_errors_total", step="member_gone") == 0
        assert "Traceback" not in owner.log_path.read_text()
    finally:
        mesh.stop_all()


def test_the_attack_end_to_end_leaves_the_job_cancellable_once_the_member_leaves(
    tmp_path: Path,
) -> None:
    """The attack as it was made: the member's copies to both owners, then it leaves. Every
    copy is refused, the member-gone sweep runs clean, and a cancel through an agent that is
    not the owner says "cancelled" once the job has stopped."""
    mesh = Mesh(tmp_path, ["h100:1", "mi300x:1", "h100:1", "h100:1"])
    mesh.start_all()
    try:
        intruder = Intruder(mesh, 3)
        job_id = job_out_of_reach(mesh, intruder)
        rocm = Resources(gpus_per_node=1, backends=("rocm",))  # it runs on agent 1 alone
        body = {"job_id": job_id, "spec": spec(SLEEPER, resources=rocm)}
        assert mesh.command(mesh.agents[0], "submit", body)[0] == 200
        mesh.wait("it runs", lambda: mesh.job(mesh.agents[0], job_id)["state"] == "running")
        job = mesh.job(mesh.agents[0], job_id)
        owners = [by_id(mesh, n) for n in rank(job_id, [a.node_id for a in mesh.agents])[:2]]
        runner = by_id(mesh, job["runner"])
        running = metric(mesh, runner, "shoal_jobs_running_here")
        for a in owners:
            assert intruder.call(a, "replicate", _transfer(mesh, job, gen=2**64 - 1)) == 400
            lie = _transfer(mesh, job, owner=intruder.node_id, gen=2**53 - 1)
            assert intruder.call(a, "replicate", lie) == 403
        assert mesh.terminate(3) == 0  # the member leaves
        others = mesh.agents[:3]
        mesh.wait(
            "every agent to see it gone",
            lambda: all(mesh.get(a, "/healthz")["members"] == 3 for a in others),
        )
        via = next(a for a in others if a.node_id != job["owner"])
        done = _cli_cancel(mesh, via, job_id)
        assert (done.returncode, done.stdout.strip()) == (0, f"{job_id}: cancelled"), done
        assert metric(mesh, runner, "shoal_jobs_running_here") == running - 1
        for a in others:
            assert metric(mesh, a, "shoal_job_step_errors_total", step="member_gone") == 0
            assert "Traceback" not in a.log_path.read_text(), a.index
    finally:
        mesh.stop_all()
