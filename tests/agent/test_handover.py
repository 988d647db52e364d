"""Ownership follows the rendezvous order on real agents: a job goes to the agent that joins
ahead of its owner, without stopping it, and the new owner answers for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.jobspec import new_job_id
from agent.ownership import rank
from tests.agent.agents import Mesh, spec

pytestmark = pytest.mark.slow


def test_a_job_is_handed_to_the_agent_that_joins_ahead_of_its_owner(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, ["h100:1", "h100:1", "h100:1", "h100:1"])
    try:
        for i in range(3):
            mesh.start(i)
        mesh.wait_converged()
        late = mesh.agents[3]
        everyone = [a.node_id for a in mesh.agents]
        while True:
            job_id = new_job_id()
            if rank(job_id, everyone)[0] == late.node_id:
                break
        body = {"job_id": job_id, "spec": spec(["sleep", "120"], gpus=1)}
        status, answer = mesh.command(mesh.agents[0], "submit", body)
        assert status == 200, answer
        mesh.wait("it runs", lambda: mesh.job(mesh.agents[0], job_id)["state"] == "running")
        first = mesh.job(mesh.agents[0], job_id)
        assert first["owner"] != late.node_id
        mesh.start(3)
        mesh.wait_converged()
        mesh.wait(
            "the late agent owns it, as everyone sees",
            lambda: all(mesh.job(a, job_id)["owner"] == late.node_id for a in mesh.agents),
            deadline_s=30,
        )
        now = mesh.job(late, job_id)
        assert (now["state"], now["runner"], now["attempt"]) == (
            "running",
            first["runner"],
            first["attempt"],
        )
        # The new owner answers for it: a cancel sent anywhere ends it.
        assert mesh.command(mesh.agents[1], "cancel", {"job_id": job_id})[0] == 200
        mesh.wait(
            "cancelled everywhere",
            lambda: all(mesh.job(a, job_id)["state"] == "cancelled" for a in mesh.agents),
        )
    finally:
        mesh.stop_all()
