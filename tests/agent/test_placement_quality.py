"""The placement a context-aware scheduler must get right, on real agents: small inference jobs
go to the GPUs with the most inference per watt (the L4s), not to the fast NVLink host, so the
8-GPU NVLink training job that comes next starts at once on that host.

The mesh: an 8x H100 host whose GPUs are joined by NVLink, a host with four L4 on PCIe, and a
host with two A100.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.job.jobspec import Resources, new_job_id
from tests.agent.agents import Mesh, spec, started

pytestmark = pytest.mark.slow

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
H100, L4, A100 = 0, 1, 2


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    with started(tmp_path, ["h100:8", "l4:4", "a100:2"]) as m:
        yield m


def submit(mesh: Mesh, resources: Resources, **extra: Any) -> str:
    job_id = new_job_id()
    body = {"job_id": job_id, "spec": spec(SLEEPER, resources=resources, **extra)}
    status, answer = mesh.command(mesh.agents[0], "submit", body)
    assert status == 200, answer
    return job_id


def running(mesh: Mesh, job_id: str) -> dict[str, Any]:
    mesh.wait(
        f"job {job_id[:8]} running", lambda: mesh.job(mesh.agents[0], job_id)["state"] == "running"
    )
    return mesh.job(mesh.agents[0], job_id)


def test_inference_on_the_l4s_and_the_nvlink_job_at_once_on_the_h100s(mesh: Mesh) -> None:
    small = [
        submit(mesh, Resources(gpus_per_node=1, share_fraction=0.25), kind="inference"),
        submit(mesh, Resources(gpus_per_node=1, share_fraction=0.25), kind="inference"),
        submit(mesh, Resources(gpus_per_node=1), kind="inference"),
    ]
    l4 = mesh.agents[L4].node_id
    for job_id in small:
        assert running(mesh, job_id)["runner"] == l4
    big = submit(mesh, Resources(gpus_per_node=8, interconnect="nvlink"), kind="training")
    job = running(mesh, big)
    assert job["runner"] == mesh.agents[H100].node_id
    assert len(job["devices"]) == 8
    for job_id in [*small, big]:
        assert mesh.command(mesh.agents[0], "cancel", {"job_id": job_id})[0] == 200
