"""Revocation sticks, on real agent processes: every agent keeps and gossips the operator's list,
it outlives restarts and its first publisher, and a revoked agent learns it, stops its jobs,
takes nothing over and exits."""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.job.jobspec import Resources, new_job_id
from agent.job.ownership import rank
from gossip import revocation
from gossip.certtrust import CertSigner
from gossip.revocation import REVOCATIONS_FILE, RevocationList, issue_revocations
from tests.agent.agents import Mesh, spec

pytestmark = pytest.mark.slow


def revoke(mesh: Mesh, via: int, node_id: str, version: int = 1) -> RevocationList:
    signed = issue_revocations(CertSigner(mesh.operator), {node_id}, (), version, time.time())
    body = {"revocations": base64.b64encode(revocation.encode(signed)).decode()}
    status, answer = mesh.command(mesh.agents[via], "revoke", body)
    assert status == 200, answer
    return signed


def members(mesh: Mesh, i: int) -> dict[str, str]:
    return {n["node_id"]: n["state"] for n in mesh.get(mesh.agents[i], "/v1/nodes")["nodes"]}


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    m = Mesh(tmp_path, ["h100:1", "h100:1", "h100:1", "h100:1"])
    m.start_all()
    try:
        yield m
    finally:
        m.stop_all()


def test_a_revoked_agent_stops_its_jobs_takes_nothing_over_and_exits(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, ["h100:1", "h100:1", "h100:1", "mi300x:1"])
    mesh.start_all()
    try:
        victim = mesh.agents[3]
        live = [a.node_id for a in mesh.agents]
        # A job the revoked agent holds the replica of (second in its order), running on an
        # NVIDIA node; and one running on it (the only AMD GPU).
        while True:
            replicated = new_job_id()
            if rank(replicated, live)[1] == victim.node_id:
                break
        pidfile = tmp_path / "pid"
        on_victim = new_job_id()
        for job_id, backend, argv in (
            (replicated, "cuda", ["sleep", "120"]),
            (on_victim, "rocm", ["sh", "-c", f"echo $$ > {pidfile}; exec sleep 120"]),
        ):
            body = {
                "job_id": job_id,
                "spec": spec(argv, resources=Resources(gpus_per_node=1, backends=(backend,))),
            }
            assert mesh.command(mesh.agents[0], "submit", body)[0] == 200
        mesh.wait(
            "both run",
            lambda: all(
                mesh.job(mesh.agents[0], j)["state"] == "running" for j in (replicated, on_victim)
            ),
        )
        # "running" once its process started: the shell writes its pid a moment later.
        mesh.wait("the job on the victim wrote its pid", lambda: bool(pidfile.read_text()))
        pid = int(pidfile.read_text())
        before = mesh.job(mesh.agents[0], replicated)
        revoke(mesh, 0, victim.node_id)
        # It learns from the list it is shown (gossip, or a peer refusing it), and exits 0.
        assert victim.process is not None
        assert victim.process.wait(timeout=30) == 0
        assert "was revoked" in victim.log_path.read_text()
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        # The job it held a copy of runs once, where it ran: not taken over, not placed again.
        time.sleep(3.0)
        job = mesh.job(mesh.agents[0], replicated)
        assert (job["state"], job["runner"], job["attempt"]) == (
            "running",
            before["runner"],
            before["attempt"],
        )
        # Every agent kept the list, and lists the node no more (not with its last readings).
        for i, a in enumerate(mesh.agents[:3]):
            kept = revocation.load(a.directory / REVOCATIONS_FILE)
            assert kept is not None and victim.node_id in kept.node_ids
            assert victim.node_id not in members(mesh, i)
        # Started again, it refuses to run.
        mesh.local.start_agent(victim)
        assert victim.process is not None
        assert victim.process.wait(timeout=30) == 0
        assert "is revoked" in victim.log_path.read_text()
    finally:
        mesh.stop_all()


def test_the_list_outlives_restarts_and_its_first_publisher(mesh: Mesh) -> None:
    victim = mesh.agents[3]
    revoke(mesh, 0, victim.node_id)
    assert victim.process is not None and victim.process.wait(timeout=30) == 0
    kept = [a.directory / REVOCATIONS_FILE for a in mesh.agents]
    mesh.wait("every agent keeps the list", lambda: all(p.exists() for p in kept[:3]))
    for i in (0, 1, 2):
        mesh.terminate(i)
    # Agent 0, the only one the operator gave the list to, never comes back. Agent 1 comes back
    # alone with the list it kept; agent 2 comes back having lost it, and joins through agent 1.
    kept[2].unlink()
    mesh.start(1)
    mesh.start(2)
    mesh.wait("agent 2 holds the list again", kept[2].exists)
    held = revocation.load(kept[2])
    assert held is not None and victim.node_id in held.node_ids
    # The revoked agent, made to forget the list too, is refused, shown the list, and exits.
    kept[3].unlink(missing_ok=True)
    mesh.local.start_agent(victim)
    assert victim.process is not None and victim.process.wait(timeout=30) == 0
    assert "was revoked" in victim.log_path.read_text()
    for i in (1, 2):
        assert members(mesh, i).get(victim.node_id) != "alive"
