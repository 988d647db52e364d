"""A peer that accepts connections and never answers (a SIGSTOPped agent: the kernel completes
every TCP handshake, nothing else happens) stalls nobody: the others keep answering, and every
call that involves it ends within its timeout, with an answer that says so.

No timed asserts: each request here carries the client's own timeout, and a request that does
not end within it fails the test.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator

import pytest

from agent.job.jobspec import Resources, new_job_id
from agent.job.ownership import rank
from agent.sandbox.localmesh import AgentProcess
from tests.agent.agents import Mesh, spec, started

pytestmark = pytest.mark.slow

SLEEPER = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)"]


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    with started(tmp_path_factory.mktemp("stalled"), ["h100:1", "l4:1", "mi300x:1"]) as m:
        yield m


def _pid(a: AgentProcess) -> int:
    assert a.process is not None
    return a.process.pid


def test_a_stopped_peer_stalls_neither_reads_nor_commands(mesh: Mesh) -> None:
    entry, stalled = mesh.agents[0], mesh.agents[2]
    # A job running on the peer about to stall: the only one with a ROCm GPU.
    running = new_job_id()
    rocm = Resources(gpus_per_node=1, backends=("rocm",))
    body = {"job_id": running, "spec": spec(SLEEPER, resources=rocm)}
    assert mesh.command(entry, "submit", body)[0] == 200
    mesh.wait("running", lambda: mesh.job(entry, running)["state"] == "running")
    assert mesh.job(entry, running)["runner"] == stalled.node_id
    # Its log, read once through the entry agent: the entry now holds a warm connection to it.
    status, log = mesh.request(entry, "GET", f"/v1/jobs/{running}/logs")
    assert status == 200 and b"up" in log
    os.kill(_pid(stalled), signal.SIGSTOP)
    try:
        # The entry agent answers at once what it holds itself.
        assert mesh.get(entry, "/healthz")["ok"] is True
        assert mesh.get(entry, "/v1/nodes")["nodes"]
        # A log that only the stalled peer holds: the request ends, saying the stream ended.
        status, log = mesh.request(entry, "GET", f"/v1/jobs/{running}/logs", timeout_s=30)
        assert status in (200, 503), (status, log)
        assert status == 503 or b"log stream ended" in log, log
        # A command whose owner is the stalled peer: answered (forwarded, then given up on).
        live = [a.node_id for a in mesh.agents]
        job_id = next(j for j in iter(new_job_id, None) if rank(j, live)[0] == stalled.node_id)
        status, answer = mesh.command(entry, "submit", {"job_id": job_id, "spec": spec(["true"])})
        assert status in (200, 503), answer
        # A job the others can run still runs, placed away from the stalled peer.
        other = next(j for j in iter(new_job_id, None) if rank(j, live)[0] == entry.node_id)
        body = {"job_id": other, "spec": spec(["true"], gpus=0)}
        assert mesh.command(entry, "submit", body)[0] == 200
        mesh.wait("done", lambda: mesh.job(entry, other)["state"] == "succeeded")
    finally:
        os.kill(_pid(stalled), signal.SIGCONT)
    mesh.wait_converged()
