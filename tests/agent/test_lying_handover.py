"""A member forges a job record under its own name, claiming to own a job beyond its reach, and
hands the job, so described, to its rightful owner (``adopt``): the record it published itself is
the only authority it shows. The owner must take neither the lie nor the job from it."""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agent.mesh.view import pack
from tests.agent.agents import Mesh, spec
from tests.agent.test_attacks import Intruder, job_out_of_reach, metric

pytestmark = pytest.mark.slow

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    m = Mesh(tmp_path_factory.mktemp("handover"), ["h100:1", "l4:1", "mi300x:1", "h100:1"])
    m.start_all()
    try:
        yield m
    finally:
        m.stop_all()


def _forged(job: dict[str, Any], intruder: Intruder, **change: Any) -> dict[str, Any]:
    """The job's record as its owner publishes it, with ``change``, naming the intruder as owner
    at a generation far beyond the owner's."""
    fields = ("job_id", "state", "attempt", "runner", "devices", "submitted_at", "started_at")
    record = {k: job.get(k) for k in fields}
    record.update(owner=intruder.node_id, gen=int(job.get("gen") or 0) + 10**6, **change)
    return record


def _hand_over(
    intruder: Intruder, mesh: Mesh, to: int, record: dict[str, Any], sealed: bytes
) -> int:
    """Publish ``record`` signed as the intruder everywhere, then hand the job to agent ``to``."""
    for a in mesh.agents:
        if a is not intruder.agent:
            status = intruder.gossip_record(a, "job/" + record["job_id"], pack(record))
            assert status in (200, 204)
    body = {
        "record": record,
        "detail": {"gen": record["gen"]},
        "submission": base64.b64encode(sealed).decode(),
    }
    return intruder.call(mesh.agents[to], "adopt", body)


def test_a_forged_record_handed_to_the_owner_ends_no_running_job(mesh: Mesh) -> None:
    intruder = Intruder(mesh, 3)
    job_id = job_out_of_reach(mesh, intruder)
    sealed = mesh.seal("submit", {"job_id": job_id, "spec": spec(SLEEPER, gpus=0)})
    assert mesh.command(mesh.agents[0], "submit", {}, sealed=sealed)[0] == 200
    mesh.wait("the job running", lambda: mesh.job(mesh.agents[0], job_id)["state"] == "running")
    job = mesh.job(mesh.agents[0], job_id)
    owner = mesh.node_index(job["owner"])
    before = metric(mesh, mesh.agents[owner], "shoal_internal_refused_total", call="adopt")
    # "Cancelled" by its "owner", the intruder, at a generation beyond every other.
    lie = _forged(job, intruder, state="cancelled", finished_at=job["started_at"] + 1)
    assert _hand_over(intruder, mesh, owner, lie, sealed) == 403
    # Nor a new attempt of it, "pending" again, to be placed afresh (the running one fenced).
    again = _forged(job, intruder, state="pending", attempt=job["attempt"] + 5, runner=None)
    assert _hand_over(intruder, mesh, owner, again, sealed) == 403
    after = metric(mesh, mesh.agents[owner], "shoal_internal_refused_total", call="adopt")
    assert after == before + 2
    time.sleep(2.0)  # time for the lies to spread, were they believed
    for a in mesh.agents:
        now = mesh.job(a, job_id)
        assert (now["state"], now["attempt"], now["runner"], now["owner"]) == (
            "running",
            job["attempt"],
            job["runner"],
            job["owner"],
        ), (a.index, json.dumps(now)[:400])
    assert mesh.command(mesh.agents[0], "cancel", {"job_id": job_id})[0] == 200
