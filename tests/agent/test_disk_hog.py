"""A job that fills its agent's disk (a real one: a small tmpfs mounted under the agent's data
folder, so the disk that fills is the test's own). The agent stops the job, says why (a reason
the user sees in ``shoal jobs``), and frees what the job wrote, so it keeps working: it stays in
the mesh, its store takes writes again, and it runs the next job; no acknowledged job is lost."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.job.jobspec import Resources, new_job_id
from tests.agent.agents import Mesh, spec
from tests.agent.test_disk_full import small_disk_mesh

pytestmark = [pytest.mark.slow, pytest.mark.system]

HOG = """
import os, sys, time
folder = sys.argv[1]
started = time.monotonic()
n = 0
while time.monotonic() - started < 120:  # bounded: the agent should stop it long before
    try:
        with open(os.path.join(folder, f"fill{n % 64}"), "ab") as f:
            f.write(b"\\0" * (1 << 20))
        n += 1
    except OSError:  # the disk is full: try again, as a careless job would
        time.sleep(0.01)
"""
ROCM = Resources(gpus_per_node=1, backends=("rocm",))
"""Only agent 0 (the two ROCm GPUs, the one on the small disk) runs these."""


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    yield from small_disk_mesh(tmp_path, ["mi300x:2", "h100:1", "l4:1"], "24m")


def _submit(mesh: Mesh, via: int, argv: list[str]) -> str:
    job_id = new_job_id()
    body = {"job_id": job_id, "spec": spec(argv, resources=ROCM)}
    status, answer = mesh.command(mesh.agents[via], "submit", body)
    assert status == 200, answer
    return job_id


SPEW = """
import sys, time
started = time.monotonic()
line = b"x" * 1023 + b"\\n"
while time.monotonic() - started < 120:  # bounded: the agent should stop it long before
    sys.stdout.buffer.write(line * 1024)
"""
WAYS = {
    # Into its checkpoint folder, which the agent made in the job's own folder.
    "checkpoint": ["sh", "-c", f'exec {sys.executable} -c "$0" "$SHOAL_CHECKPOINT_DIR"', HOG],
    # Into its working folder (its own folder: its spec names no other).
    "workdir": [sys.executable, "-c", HOG, "."],
    # Into its log: rotated within 40 MiB, more than this disk has.
    "log": [sys.executable, "-c", SPEW],
}


@pytest.mark.parametrize("way", sorted(WAYS))
def test_a_job_that_fills_the_disk_is_stopped_with_its_reason_and_the_agent_works_on(
    mesh: Mesh, way: str
) -> None:
    full = mesh.agents[0]
    # Another job on the same agent, whose folder holds next to nothing: it runs on.
    other = _submit(mesh, 2, [sys.executable, "-c", "import time; time.sleep(120)"])
    mesh.wait("the other job running", lambda: mesh.job(full, other)["state"] == "running")
    hog = _submit(mesh, 1, WAYS[way])
    mesh.wait(
        "the job that fills the disk failed, everywhere",
        lambda: all(mesh.job(a, hog)["state"] == "failed" for a in mesh.agents),
        deadline_s=60,
    )
    for a in mesh.agents:
        job = mesh.job(a, hog)
        assert job["runner"] == full.node_id
        assert "disk" in str(job["reason"]), job
    assert mesh.job(full, hog)["attempt"] == 1  # not offered again: it would fill it again
    # The agent works on: in the mesh, its store takes writes, it runs the other job and the
    # next one.
    assert (mesh.job(full, other)["state"], mesh.job(full, other)["attempt"]) == ("running", 1)
    assert all(mesh.get(a, "/healthz")["members"] == 3 for a in mesh.agents)
    after = _submit(mesh, 0, [sys.executable, "-c", "print('fine')"])
    mesh.wait(
        "the next job succeeded on the same agent",
        lambda: all(mesh.job(a, after)["state"] == "succeeded" for a in (full, mesh.agents[2])),
        deadline_s=60,
    )  # as both agents see it: a record reaches each in its own time
    assert mesh.job(full, after)["runner"] == full.node_id
    # The job's log is kept: the user reads why.
    status, body = mesh.request(full, "GET", f"/v1/jobs/{hog}/logs")
    assert status == 200 and b"disk" in body, body[-400:]
    assert mesh.command(mesh.agents[0], "cancel", {"job_id": other})[0] == 200
