"""One member floods a runner with gang prepares (one agent's stolen key, over mutual TLS): for
a gang it may own, with its operator's genuine submission, it asks again and again for holds of
every device of the node, each a newer attempt, and never commits. The holds it may make are
bounded by what they cost (``agent.running.reservations.HoldBudget``): it holds every device for a
minute at most, then the node's devices are free for the operators' jobs again."""

from __future__ import annotations

import base64
import sys
from collections.abc import Iterator

import pytest

from agent.job.jobspec import Resources, new_job_id
from agent.job.ownership import rank
from tests.agent.agents import Mesh, spec
from tests.agent.test_attacks import Intruder, metric

pytestmark = pytest.mark.slow

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


@pytest.fixture
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    m = Mesh(tmp_path_factory.mktemp("gangflood"), ["h100:4", "l4:1", "mi300x:1", "h100:1"])
    m.start_all()
    try:
        yield m
    finally:
        m.stop_all()


def test_a_member_that_holds_a_nodes_devices_again_and_again_is_cut_off(mesh: Mesh) -> None:
    intruder, victim = Intruder(mesh, 3), mesh.agents[0]
    live = [a.node_id for a in mesh.agents]
    # A gang its operator submitted that the intruder may own (it ranks first in its order):
    # two nodes of four GPUs each, which this mesh cannot place, so it waits, pending.
    job_id = next(j for j in iter(new_job_id, "") if rank(j, live)[0] == intruder.node_id)
    gang = Resources(gpus_per_node=4, nodes=2)
    sealed = mesh.seal("submit", {"job_id": job_id, "spec": spec(SLEEPER, resources=gang)})
    assert mesh.command(mesh.agents[0], "submit", {}, sealed=sealed)[0] == 200
    nodes = {n["node_id"]: n for n in mesh.get(victim, "/v1/nodes")["nodes"]}
    keys = [d["key"] for d in nodes[victim.node_id]["devices"]]
    assert len(keys) == 4
    refused = metric(mesh, victim, "shoal_gang_holds_total", outcome="refused")
    statuses = []
    for attempt in range(1, 9):  # bounded: each a newer attempt, renewing the hold
        prepare = {
            "job_id": job_id,
            "attempt": attempt,
            "owner": intruder.node_id,
            "members": [
                {"rank": 0, "node": victim.node_id, "devices": keys},
                {"rank": 1, "node": intruder.node_id, "devices": []},
            ],
            "submission": base64.b64encode(sealed).decode(),
            "ttl_s": 30.0,
        }
        # As the gang's owner it may write each attempt ahead to the job's other owner, which
        # then confirms the prepare (a start needs two members' word): the holds stay its own.
        mesh.write_ahead(3, job_id, sealed, attempt, victim.node_id, members=prepare["members"])
        statuses.append(intruder.call(victim, "gang_prepare", prepare))
        if statuses[-1] != 200:
            break
    assert statuses[0] == 200, statuses  # a prepare of a gang it owns is honoured
    assert statuses[-1] == 409 and len(statuses) <= 3, statuses  # a minute's worth at most
    assert metric(mesh, victim, "shoal_gang_holds_total", outcome="refused") == refused + 1
    # The devices come back to the operators' jobs once the last hold it got runs out.
    job = new_job_id()
    body = {"job_id": job, "spec": spec(SLEEPER, gpus=4)}
    assert mesh.command(mesh.agents[1], "submit", body)[0] == 200
    mesh.wait(
        "the operator's job running on the held node",
        lambda: mesh.job(victim, job)["state"] == "running",
        deadline_s=60,
    )
    assert mesh.job(victim, job)["runner"] == victim.node_id
    for j in (job, job_id):
        assert mesh.command(mesh.agents[0], "cancel", {"job_id": j})[0] == 200
