"""One member keeps accusing a live node (one agent's stolen key, over mutual TLS): the mesh
must not lose that node. The accused refutes, a Dead needs more than one member's word, and an
accusation about a life further ahead than any the node could have lived is refused and counted,
so that no accusation can leave a live node without a refutation it can still send."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import pytest

from gossip.codec import frame, signing_bytes
from gossip.messages import Compound, Dead, Suspect
from gossip.transport import CONTENT_TYPE, PATH
from tests.agent.agents import Mesh, spec
from tests.agent.test_attacks import Intruder, job_out_of_reach, metric

pytestmark = pytest.mark.slow

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
LAST_INCARNATION = (1 << 63) - 1
"""The highest incarnation the wire carries: a node accused at it has none left to refute with."""


@pytest.fixture
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    m = Mesh(tmp_path_factory.mktemp("accusations"), ["h100:1", "l4:1", "mi300x:1", "h100:1"])
    m.start_all()
    try:
        yield m
    finally:
        m.stop_all()


def accuse(intruder: Intruder, mesh: Mesh, node_id: str, incarnations: list[int]) -> list[int]:
    """A Suspect and a Dead about ``node_id`` at each incarnation, signed by the intruder, sent
    in one message to every agent (the accused too); the statuses."""
    parts: list[Suspect | Dead] = []
    for incarnation in incarnations:
        for kind in (Suspect, Dead):
            unsigned = kind(node_id, incarnation, intruder.node_id, b"")
            signature = intruder.signer.sign(signing_bytes(unsigned))
            parts.append(kind(node_id, incarnation, intruder.node_id, signature))
    message = frame(intruder.agent.address, Compound(tuple(parts)), 1 << 20)
    return [
        intruder.post(a, PATH, message, CONTENT_TYPE)
        for a in mesh.agents
        if a is not intruder.agent
    ]


def states(mesh: Mesh, node_id: str) -> list[str]:
    out = []
    for a in mesh.agents:
        nodes = {n["node_id"]: n["state"] for n in mesh.get(a, "/v1/nodes")["nodes"]}
        out.append(nodes.get(node_id, "absent"))
    return out


def _victim_running_a_job(mesh: Mesh, intruder: Intruder) -> tuple[str, dict[str, object], int]:
    job_id = job_out_of_reach(mesh, intruder)
    body = {"job_id": job_id, "spec": spec(SLEEPER, gpus=0)}
    assert mesh.command(mesh.agents[0], "submit", body)[0] == 200
    mesh.wait("the job running", lambda: mesh.job(mesh.agents[0], job_id)["state"] == "running")
    job = mesh.job(mesh.agents[0], job_id)
    victim = mesh.node_index(str(job["runner"]))
    if victim == intruder.agent.index:  # its own agent runs it: accuse another
        victim = next(a.index for a in mesh.agents if a.index not in (intruder.agent.index,))
    return job_id, job, victim


def _stays_up(mesh: Mesh, node_id: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen = states(mesh, node_id)
        assert all(s in ("alive", "suspect") for s in seen), seen
        time.sleep(0.3)
    mesh.wait("the accused alive everywhere", lambda: set(states(mesh, node_id)) == {"alive"})


def test_an_accusation_at_the_last_incarnation_kills_no_live_node(mesh: Mesh) -> None:
    intruder = Intruder(mesh, 3)
    job_id, job, victim = _victim_running_a_job(mesh, intruder)
    accused = mesh.agents[victim].node_id
    before = sum(metric(mesh, a, "shoal_gossip_rejected_ahead_total") for a in mesh.agents)
    assert all(s in (200, 204) for s in accuse(intruder, mesh, accused, [LAST_INCARNATION]))
    _stays_up(mesh, accused, 8.0)  # past the suspicion's timeout at N=4, with its last looks
    after = sum(metric(mesh, a, "shoal_gossip_rejected_ahead_total") for a in mesh.agents)
    assert after >= before + 2 * 3  # a Suspect and a Dead, at each of the three it reached
    now = mesh.job(mesh.agents[0], job_id)
    assert (now["state"], now["attempt"], now["runner"]) == (
        "running",
        job["attempt"],
        job["runner"],
    )
    assert mesh.command(mesh.agents[0], "cancel", {"job_id": job_id})[0] == 200


def test_a_member_accusing_a_live_node_again_and_again_does_not_lose_it(mesh: Mesh) -> None:
    intruder = Intruder(mesh, 3)
    job_id, job, victim = _victim_running_a_job(mesh, intruder)
    accused = mesh.agents[victim].node_id
    base = int(time.time())
    refuted = metric(mesh, mesh.agents[victim], "shoal_gossip_refutations_total")
    statuses: list[int] = []
    started = time.monotonic()
    for round_ in range(60):  # bounded in count and in time
        if time.monotonic() - started > 20.0:
            break
        # each round a life just ahead of any it may have refuted with, and one far ahead
        statuses += accuse(intruder, mesh, accused, [base + 2 * round_, base + 10**12])
        seen = states(mesh, accused)
        assert all(s in ("alive", "suspect") for s in seen), (round_, seen)
        time.sleep(0.1)
    assert set(statuses) <= {200, 204, 429}, statuses
    assert metric(mesh, mesh.agents[victim], "shoal_gossip_refutations_total") > refuted
    _stays_up(mesh, accused, 3.0)
    now = mesh.job(mesh.agents[0], job_id)
    assert (now["state"], now["attempt"]) == ("running", job["attempt"])
    assert mesh.command(mesh.agents[0], "cancel", {"job_id": job_id})[0] == 200
