"""The CLI without ``--agent``: the fleet of ``fleet.toml`` and its fail-over; ``shoal submit``
saying what it asks for and refusing a job no node could ever run; ``shoal logs -f`` waiting for
a pending job. The real ``shoal`` in a subprocess, against real agent processes on loopback."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.cli.submit_cmd import lost_answer
from agent.job.jobspec import new_job_id
from agent.operator.client import AgentUnreachable
from agent.operator.fleet import Fleet, FleetAgent, save_fleet
from tests.agent.agents import DEADLINE_S, Mesh
from tests.shoal_cli import SHOAL, one_line_error, shoal

pytestmark = pytest.mark.slow


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    m = Mesh(tmp_path, ["h100:2", "l4:1"])
    m.start_all()
    try:
        yield m
    finally:
        m.stop_all()


def refused_address() -> str:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def env_without_agent() -> dict[str, str]:
    return {"SHOAL_AGENT": ""}


def fleet_shoal(mesh: Mesh, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """``shoal ARGS --identity CLUSTER``: no ``--agent``, no ``$SHOAL_AGENT``."""
    command, *rest = args
    return shoal(
        command,
        "--identity",
        str(mesh.cluster_dir),
        *rest,
        env=env_without_agent(),
        timeout_s=timeout_s,
    )


def state_of(mesh: Mesh, job_id: str) -> str:
    jobs = json.loads(ok(fleet_shoal(mesh, "jobs", "--json")))
    return str(next(j["state"] for j in jobs if j["job_id"] == job_id))


def follow(mesh: Mesh, job: str) -> subprocess.Popen[str]:
    """``shoal logs -f JOB`` through the fleet, running."""
    return subprocess.Popen(
        [*SHOAL, "logs", "-f", job, "--identity", str(mesh.cluster_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env_without_agent()},
    )


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    return done.stdout


def test_commands_use_the_fleet_file_and_fail_over_between_its_agents(mesh: Mesh) -> None:
    # No fleet yet, no --agent: say how to get one.
    error = one_line_error(fleet_shoal(mesh, "nodes"))
    assert "no agent to talk to: pass --agent HOST:PORT, set $SHOAL_AGENT" in error
    assert "shoal bootstrap" in error and str(mesh.cluster_dir / "fleet.toml") in error

    dead = refused_address()
    save_fleet(
        mesh.cluster_dir,
        Fleet((FleetAgent(dead), *(FleetAgent(a.address) for a in mesh.agents))),
    )
    table = ok(fleet_shoal(mesh, "nodes"))  # the first refuses: the next one answers
    assert all(a.node_id[:8] in table for a in mesh.agents), table

    # Every agent gone: one line naming each and why, exit 2.
    save_fleet(mesh.cluster_dir, Fleet((FleetAgent(dead), FleetAgent(refused_address()))))
    error = one_line_error(fleet_shoal(mesh, "jobs"))
    assert re.fullmatch(
        rf"shoal: no agent of the fleet answered: {dead} \(refused\), 127\.0\.0\.1:\d+ "
        r"\(refused\)",
        error,
    ), error
    assert "Errno" not in error

    # --agent still wins over the fleet, and its failure is a phrase, not an errno.
    error = one_line_error(fleet_shoal(mesh, "nodes", "--agent", dead))
    assert error == (
        f"shoal: cannot reach the agent at {dead}: connection refused: nothing listens there"
    )


def test_submit_says_what_it_asks_for_and_refuses_what_can_never_run(mesh: Mesh) -> None:
    save_fleet(mesh.cluster_dir, Fleet(tuple(FleetAgent(a.address) for a in mesh.agents)))
    out = ok(fleet_shoal(mesh, "submit", "--", "echo", "hi"))
    assert re.match(r"submitted [0-9a-f]{32} \(owner \S+, durable on 2 agents\)\n", out), out
    assert "asks for no GPU (runs on any host)\n" in out

    # Two GPUs of a CUDA node: the h100 node has them, the l4 node has one.
    out = ok(fleet_shoal(mesh, "submit", "--gpus", "2", "--backend", "cuda", "--", "true"))
    assert "asks for 2 GPUs of one vendor (cuda)\n" in out

    # More than any node has: refused, nothing submitted.
    before = ok(fleet_shoal(mesh, "jobs", "--json"))
    error = one_line_error(fleet_shoal(mesh, "submit", "--gpus", "4", "--", "true"))
    assert error == (
        "shoal: no node of the mesh could ever run this job: it asks for 4 GPUs of one vendor, "
        "and the most any of its 2 live agents has is 2x NVIDIA H100 SXM on h100-00; "
        "nothing submitted (--anyway submits it to wait for such a host)"
    )
    error = one_line_error(fleet_shoal(mesh, "submit", "--backend", "rocm", "--", "true"))
    assert "asks for 1 GPU of one vendor (rocm)" in error
    assert ok(fleet_shoal(mesh, "jobs", "--json")).count('"job_id"') == before.count('"job_id"')
    out = ok(fleet_shoal(mesh, "submit", "--gpus", "4", "--anyway", "--", "true"))
    assert "waits: no node of the mesh could run it yet (submitted with --anyway)" in out

    # A deadline is answered at submission: met, missed and queued, or missed and refused.
    out = ok(fleet_shoal(mesh, "submit", "--deadline", "30d", "--max-runtime", "10m", "--", "true"))
    assert "deadline met: starts now, ends in ~10 min (p50)" in out
    out = ok(fleet_shoal(mesh, "submit", "--deadline", "1s", "--", "true"))
    assert "deadline cannot be met: predicted end" in out and "; queued with a warning" in out
    before = ok(fleet_shoal(mesh, "jobs", "--json"))
    late = ("submit", "--deadline", "1s", "--on-late", "refuse", "--", "true")
    refused = fleet_shoal(mesh, *late)
    assert refused.returncode == 2
    error = one_line_error(refused)
    assert error.startswith("shoal: deadline cannot be met: predicted end ~")
    assert error.endswith("; refused; nothing submitted (--anyway submits it)")
    assert ok(fleet_shoal(mesh, "jobs", "--json")).count('"job_id"') == before.count('"job_id"')


def test_a_submission_sent_again_under_its_job_id_is_one_job(mesh: Mesh) -> None:
    save_fleet(mesh.cluster_dir, Fleet(tuple(FleetAgent(a.address) for a in mesh.agents)))
    job_id = new_job_id()
    first = ok(fleet_shoal(mesh, "submit", "--job-id", job_id, "--", "true"))
    again = ok(fleet_shoal(mesh, "submit", "--job-id", job_id.upper(), "--", "true"))
    assert first.split()[1] == again.split()[1] == job_id
    listed = json.loads(ok(fleet_shoal(mesh, "jobs", "--json")))
    assert [j["job_id"] for j in listed].count(job_id) == 1
    error = one_line_error(fleet_shoal(mesh, "submit", "--job-id", "12ab", "--", "true"))
    assert error == "shoal: --job-id: job id must be 32 lowercase hex digits, got '12ab'"


def test_a_lost_answer_says_the_job_may_exist_and_how_to_send_it_again() -> None:
    job_id = new_job_id()
    line = lost_answer(AgentUnreachable("10.0.0.7:7946", "closed the connection"), job_id)
    assert line == (
        "cannot reach the agent at 10.0.0.7:7946: closed the connection; job "
        f"{job_id} may have been accepted: 'shoal jobs {job_id[:12]}' tells, and "
        f"'shoal submit --job-id {job_id} ...' sends it again without making a second one"
    )


def test_logs_follow_waits_for_a_pending_job_then_streams_it(mesh: Mesh) -> None:
    save_fleet(mesh.cluster_dir, Fleet(tuple(FleetAgent(a.address) for a in mesh.agents)))
    blocker = ok(fleet_shoal(mesh, "submit", "--gpus", "2", "--", "sleep", "600")).split()[1]
    mesh.wait("the blocker running", lambda: state_of(mesh, blocker) == "running")
    out = ok(fleet_shoal(mesh, "submit", "--gpus", "2", "--", "echo", "finally"))
    assert "pending: the one node that could run it (h100-00) is busy" in out, out
    waiting = out.split()[1]
    follower = follow(mesh, waiting[:10])
    try:
        assert follower.stderr is not None
        line = follower.stderr.readline()
        assert line.startswith(f"[shoal] job {waiting[:8]} waits: pending: "), line
        assert "2 free GPUs" in line
        assert follower.poll() is None  # still waiting, not done at once
        ok(fleet_shoal(mesh, "cancel", blocker))
        out_text, err_text = follower.communicate(timeout=DEADLINE_S)
        assert follower.returncode == 0, err_text
        assert "finally" in out_text.splitlines(), out_text
        assert out_text.startswith("=== attempt 1 on h100-00 ")
        assert "Traceback" not in err_text
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()


def test_a_job_that_ends_before_it_ever_ran_ends_the_wait(mesh: Mesh) -> None:
    save_fleet(mesh.cluster_dir, Fleet(tuple(FleetAgent(a.address) for a in mesh.agents)))
    out = ok(fleet_shoal(mesh, "submit", "--gpus", "8", "--anyway", "--", "true"))
    job_id = out.split()[1]
    follower = follow(mesh, job_id)
    try:
        assert follower.stderr is not None
        assert "waits: pending: never fits: no node has 8" in follower.stderr.readline()
        ok(fleet_shoal(mesh, "cancel", job_id))
        _, err_text = follower.communicate(timeout=DEADLINE_S)
        assert follower.returncode == 0
        assert f"job {job_id[:8]} ended cancelled" in err_text and "without running" in err_text
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
