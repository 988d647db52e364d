"""Real agent processes on loopback: submit, run, logs, success; cancel; signed commands only."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.job.jobspec import Resources, new_job_id
from tests.agent.agents import Mesh, spec

pytestmark = pytest.mark.slow


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    m = Mesh(tmp_path, ["h100:1", "mi300x:2"])
    m.start_all()
    try:
        yield m
    finally:
        m.stop_all()


def test_submit_runs_on_a_node_that_fits_and_succeeds(mesh: Mesh) -> None:
    nvidia, amd = mesh.agents
    job_id = new_job_id()
    script = (
        "import os; print('hello', os.environ['SHOAL_ATTEMPT'], os.environ['ROCR_VISIBLE_DEVICES'])"
    )
    body = {
        "job_id": job_id,
        "spec": spec(
            [sys.executable, "-c", script],
            resources=Resources(gpus_per_node=2, backends=("rocm",)),
        ),
    }
    # Sent to the NVIDIA node: it forwards to the owner, which places on the only node that fits.
    status, answer = mesh.command(nvidia, "submit", body)
    assert status == 200, answer
    assert answer["job_id"] == job_id
    assert answer["replicas"] == 2
    assert answer["owner"] in {nvidia.node_id, amd.node_id}
    mesh.wait(
        "job succeeded, seen everywhere",
        lambda: all(mesh.job(a, job_id)["state"] == "succeeded" for a in mesh.agents),
    )
    job = mesh.job(amd, job_id)
    assert job["runner"] == amd.node_id
    assert job["attempt"] == 1
    assert job["exit_code"] == 0
    assert len(job["devices"]) == 2
    assert job["spec"]["resources"]["backends"] == ["rocm"]
    # Logs are proxied to the runner from any agent; HIP numbering starts at 0 for the grant.
    status, text = mesh.request(nvidia, "GET", f"/v1/jobs/{job_id}/logs?lines=50")
    assert status == 200
    assert "hello 1 0,1" in text.decode()
    # Submitting the same job id again is idempotent.
    status, again = mesh.command(amd, "submit", body)
    assert status == 200 and again["job_id"] == job_id and again["state"] == "succeeded"
    listed = mesh.get(nvidia, "/v1/jobs")["jobs"]
    assert [j["job_id"] for j in listed] == [job_id]


def test_a_job_that_fits_nowhere_stays_pending_with_its_reason(mesh: Mesh) -> None:
    job_id = new_job_id()
    body = {"job_id": job_id, "spec": spec(["true"], gpus=4)}
    status, _ = mesh.command(mesh.agents[0], "submit", body)
    assert status == 200
    # every agent has 2 GPUs: the policy says the job can never fit, not that it waits
    mesh.wait(
        "a pending reason",
        lambda: (
            (mesh.job(mesh.agents[1], job_id).get("reason") or "")
            == "never fits: no node has 4 matching GPUs on one node"
        ),
    )
    assert mesh.job(mesh.agents[1], job_id)["state"] == "pending"


def test_cancel_stops_the_running_job(mesh: Mesh) -> None:
    a = mesh.agents[0]
    job_id = new_job_id()
    body = {"job_id": job_id, "spec": spec(["sleep", "30"], gpus=1)}
    assert mesh.command(a, "submit", body)[0] == 200
    mesh.wait("running", lambda: mesh.job(a, job_id)["state"] == "running")
    runner = mesh.agents[mesh.node_index(mesh.job(a, job_id)["runner"])]
    status, answer = mesh.command(mesh.agents[1], "cancel", {"job_id": job_id})
    assert status == 200, answer
    assert answer == {"job_id": job_id, "state": "cancelled"}
    mesh.wait(
        "the runner to stop it",
        lambda: job_id not in _running_on(mesh, runner.node_id),
    )
    mesh.wait(
        "the runner to see it cancelled", lambda: mesh.job(runner, job_id)["state"] == "cancelled"
    )


def _running_on(mesh: Mesh, node_id: str) -> list[str]:
    nodes = mesh.get(mesh.agents[0], "/v1/nodes")["nodes"]
    return next(n["running_jobs"] for n in nodes if n["node_id"] == node_id)


def test_unsigned_forged_and_replayed_commands_are_refused(mesh: Mesh) -> None:
    a = mesh.agents[0]
    body = {"job_id": new_job_id(), "spec": spec(["true"], gpus=0)}
    sealed = mesh.seal("submit", body)
    status, answer = mesh.command(a, "submit", body, sealed=b"\x80not an envelope")
    assert status == 400 and "malformed" in answer["error"]
    import msgpack

    doc = msgpack.unpackb(sealed, raw=False)
    unsigned = msgpack.packb({**doc, "sig": b""}, use_bin_type=True)
    status, answer = mesh.command(a, "submit", body, sealed=unsigned)
    assert (status, answer["error"].split(":")[0]) == (401, "unsigned")
    forged_body = json.dumps({**body, "spec": spec(["rm", "-rf", "/"], gpus=0)}).encode()
    forged = msgpack.packb({**doc, "body": forged_body}, use_bin_type=True)
    status, answer = mesh.command(a, "submit", body, sealed=forged)
    assert (status, answer["error"].split(":")[0]) == (401, "forged")
    stale = mesh.seal("submit", body, now=time.time() - 3600)
    status, answer = mesh.command(a, "submit", body, sealed=stale)
    assert (status, answer["error"].split(":")[0]) == (400, "skewed")
    status, _ = mesh.command(a, "submit", body, sealed=sealed)
    assert status == 200
    status, answer = mesh.command(a, "submit", body, sealed=sealed)
    assert (status, answer["error"].split(":")[0]) == (409, "replayed")
    metrics = mesh.request(a, "GET", "/metrics")[1].decode()
    assert 'shoal_commands_rejected_total{reason="forged"} 1.0' in metrics
    assert 'shoal_commands_rejected_total{reason="unsigned"} 1.0' in metrics
    assert 'shoal_commands_accepted_total{kind="submit"} 1.0' in metrics
    assert "# TYPE shoal_commands_accepted_total counter" in metrics
    assert 'shoal_gpu_mem_total_bytes{device="' in metrics  # simulated GPUs, labelled by device
    assert "shoal_gossip_messages_in_total " in metrics
    assert "# TYPE shoal_gossip_messages_in_total counter" in metrics  # it only grows
    assert "# TYPE shoal_gossip_transport_handshake_slowest_ms gauge" in metrics


def test_a_spec_no_agent_runs_is_refused_at_submission(tmp_path: Path) -> None:
    # No agent has a container runtime: a job with an image is refused, not left waiting.
    mesh = Mesh(tmp_path, ["h100:1", "mi300x:2"], extra=("--container-runtime", "none"))
    mesh.start_all()
    try:
        _refused_image(mesh)
    finally:
        mesh.stop_all()


def _refused_image(mesh: Mesh) -> None:
    job_id = new_job_id()
    boxed = spec(["true"], image="docker.io/library/python:3.12")
    status, answer = mesh.command(mesh.agents[0], "submit", {"job_id": job_id, "spec": boxed})
    assert status == 400, answer
    assert "no agent of this mesh runs it" in answer["error"]
    assert "no live agent is a Linux host with a container runtime" in answer["error"]
    nodes = mesh.get(mesh.agents[0], "/v1/nodes")["nodes"]
    assert all("image" not in n["features"] for n in nodes)
    assert all(n["container_runtime"] is None for n in nodes)
    assert job_id not in {j["job_id"] for j in mesh.get(mesh.agents[1], "/v1/jobs")["jobs"]}
