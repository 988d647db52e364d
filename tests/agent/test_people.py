"""People and roles on real agent processes: every rule of ``agent.people.rules`` is checked by
the agent that executes the command, refused in one line and counted; the team policy is
believed only from an admin, only when newer, and kept across restarts."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.content.policybody import pointer_of
from agent.job.jobspec import new_job_id
from agent.sandbox.localmesh import AgentProcess
from agent.wire.policy import POLICY, POLICY_FILE, Person
from tests.agent.agents import Mesh, spec
from tests.agent.people_kit import (
    REFUSED,
    PersonAt,
    body,
    held_version,
    policy_command,
    signed_by,
)
from tests.agent.test_attacks import Intruder, metric

pytestmark = pytest.mark.slow

SLEEPER = [sys.executable, "-c", "import time; print('hello', flush=True); time.sleep(120)"]


class Cast:
    """The people of the module's mesh, and the policy that names them."""

    def __init__(self, mesh: Mesh) -> None:
        self.alice = PersonAt(mesh, "alice")  # a user of team vision (ceiling 5)
        self.bob = PersonAt(mesh, "bob")  # a user of team nlp (the user role's ceiling, 10)
        self.vera = PersonAt(mesh, "vera")  # a viewer
        self.nemo = PersonAt(mesh, "nemo")  # a certificate the policy does not name
        self.ursula = PersonAt(mesh, "ursula", "operator")  # an admin's kind of key, a user here
        self.people = (
            Person("root", "ops", "admin", mesh.operator.node_id),
            Person("alice", "vision", "user", self.alice.node_id),
            Person("bob", "nlp", "user", self.bob.node_id),
            Person("vera", "nlp", "viewer", self.vera.node_id),
            Person("ursula", "nlp", "user", self.ursula.node_id),
        )


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    m = Mesh(tmp_path_factory.mktemp("people"), ["h100:1", "h100:1", "h100:1"])
    m.start_all()
    try:
        yield m
    finally:
        m.stop_all()


@pytest.fixture(scope="module")
def cast(mesh: Mesh) -> Cast:
    cast = Cast(mesh)
    policy = signed_by(mesh.operator, body(1, *cast.people, ceilings={"user": 10}))
    status, answer = mesh.command(mesh.agents[0], "policy", policy_command(policy))
    assert status == 200, answer
    mesh.wait(
        "every agent holds policy 1", lambda: all(held_version(mesh, a) == 1 for a in mesh.agents)
    )
    return cast


def refused(mesh: Mesh, why: str) -> float:
    """``shoal_refused_total{why}`` summed over the mesh."""
    return sum(metric(mesh, a, "shoal_refused_total", why=why) for a in mesh.agents)


def submit(person: PersonAt, a: AgentProcess, **extra: Any) -> tuple[str, int, str]:
    job_id = new_job_id()
    status, error = person.command(
        a, "submit", {"job_id": job_id, "spec": spec(SLEEPER, gpus=0, **extra)}
    )
    return job_id, status, error


def running(mesh: Mesh, job_id: str) -> None:
    mesh.wait(f"{job_id} runs", lambda: mesh.job(mesh.agents[0], job_id)["state"] == "running")


def test_a_user_cancels_and_migrates_only_their_own_jobs(mesh: Mesh, cast: Cast) -> None:
    job_id, status, error = submit(cast.alice, mesh.agents[1])
    assert status == 200, error
    running(mesh, job_id)
    before = refused(mesh, "not_owner")
    for a in mesh.agents:  # whichever agent bob asks, the job's owner refuses him
        for kind in ("cancel", "migrate"):
            status, error = cast.bob.command(a, kind, {"job_id": job_id})
            assert status == 403, (kind, status, error)
            assert "did not submit it" in error and "\n" not in error
    assert refused(mesh, "not_owner") == before + 2 * len(mesh.agents)
    assert mesh.job(mesh.agents[0], job_id)["state"] == "running"
    status, error = cast.alice.command(mesh.agents[2], "cancel", {"job_id": job_id})
    assert status == 200, error
    mesh.wait("the job cancelled", lambda: mesh.job(mesh.agents[0], job_id)["state"] == "cancelled")


def test_an_admin_may_cancel_anyones_job(mesh: Mesh, cast: Cast) -> None:
    job_id, status, error = submit(cast.bob, mesh.agents[0])
    assert status == 200, error
    running(mesh, job_id)
    status, answer = mesh.command(mesh.agents[1], "cancel", {"job_id": job_id})
    assert status == 200, answer
    assert answer["state"] == "cancelled"


def test_a_viewer_reads_everything_and_changes_nothing(mesh: Mesh, cast: Cast) -> None:
    job_id, status, error = submit(cast.alice, mesh.agents[0])
    assert status == 200, error
    running(mesh, job_id)
    node = mesh.agents[2].node_id
    attempts: list[tuple[str, dict[str, Any]]] = [
        ("submit", {"job_id": new_job_id(), "spec": spec(SLEEPER, gpus=0)}),
        ("cancel", {"job_id": job_id}),
        ("migrate", {"job_id": job_id}),
        ("cordon", {"node": node}),
        ("drain", {"node": node}),
        ("undrain", {"node": node}),
        ("revoke", {"revocations": ""}),
        ("policy", policy_command(b"")),
    ]
    before = refused(mesh, "viewer")
    for kind, command in attempts:
        status, error = cast.vera.command(mesh.agents[1], kind, command)
        assert status == 403, (kind, status, error)
        assert "a viewer only reads" in error
    assert refused(mesh, "viewer") == before + len(attempts)
    assert mesh.job(mesh.agents[0], job_id)["state"] == "running"
    assert all(n["drain"] == "schedulable" for n in mesh.get(mesh.agents[0], "/v1/nodes")["nodes"])
    # Reads work: the jobs, the nodes, the policy, and anyone's log.
    for path in ("/v1/jobs", "/v1/nodes", "/v1/policy", f"/v1/jobs/{job_id}"):
        status, _ = cast.vera.request(mesh.agents[1], "GET", path)
        assert status == 200, path
    mesh.wait(
        "the log has its line",
        lambda: (
            b"hello"
            in cast.vera.request(mesh.agents[1], "GET", f"/v1/jobs/{job_id}/logs?lines=5")[1]
        ),
    )
    mesh.command(mesh.agents[0], "cancel", {"job_id": job_id})


def test_a_user_reads_the_logs_of_their_own_jobs_only(mesh: Mesh, cast: Cast) -> None:
    job_id, status, error = submit(cast.alice, mesh.agents[2])
    assert status == 200, error
    running(mesh, job_id)
    path = f"/v1/jobs/{job_id}/logs?lines=5"
    mesh.wait(
        "alice reads her log",
        lambda: b"hello" in cast.alice.request(mesh.agents[1], "GET", path)[1],
    )
    before = refused(mesh, "not_owner")
    status, answer = cast.bob.request(mesh.agents[1], "GET", path)
    assert status == 403 and b"did not submit it" in answer, (status, answer)
    assert b"hello" not in answer
    assert refused(mesh, "not_owner") == before + 1
    cast.alice.command(mesh.agents[0], "cancel", {"job_id": job_id})


def test_node_and_people_commands_are_for_admins(mesh: Mesh, cast: Cast) -> None:
    node = mesh.agents[2].node_id
    before = refused(mesh, "admin_only")
    kinds = ("cordon", "drain", "undrain", "revoke", "policy")
    for kind in kinds:
        command = {"node": node} if kind in ("cordon", "drain", "undrain") else {}
        for user in (cast.alice, cast.ursula):  # ursula's key is an admin's kind; not her role
            status, error = user.command(mesh.agents[0], kind, command)
            assert status == 403 and "is for admins" in error, (kind, status, error)
    assert refused(mesh, "admin_only") == before + 2 * len(kinds)
    status, answer = mesh.command(mesh.agents[0], "cordon", {"node": node})
    assert status == 200, answer
    status, answer = mesh.command(mesh.agents[0], "undrain", {"node": node})
    assert status == 200, answer


def test_a_priority_above_the_ceiling_is_refused_at_the_agent(mesh: Mesh, cast: Cast) -> None:
    before = refused(mesh, "priority")
    _, status, error = submit(cast.alice, mesh.agents[0], priority=6)  # vision's ceiling: 5
    assert status == 403 and "above alice's ceiling of 5" in error, (status, error)
    _, status, error = submit(cast.bob, mesh.agents[1], priority=11)  # the user role's: 10
    assert status == 403 and "ceiling of 10" in error, (status, error)
    assert refused(mesh, "priority") == before + 2
    job_id, status, error = submit(cast.alice, mesh.agents[0], priority=5)
    assert status == 200, error
    mesh.command(mesh.agents[0], "cancel", {"job_id": job_id})


def test_a_person_the_policy_does_not_name_may_do_nothing(mesh: Mesh, cast: Cast) -> None:
    before = refused(mesh, "not_in_policy")
    _, status, error = submit(cast.nemo, mesh.agents[0])
    assert status == 403 and "not a person of the team policy" in error, (status, error)
    assert refused(mesh, "not_in_policy") == before + 1


def test_a_policy_from_a_non_admin_is_not_believed(mesh: Mesh, cast: Cast) -> None:
    # A user's key (even the admin's kind, ursula's) signs a policy making its holder an admin.
    promoted = tuple(
        p._replace(role="admin") if p.name in ("alice", "ursula") else p for p in cast.people
    )
    before = sum(
        metric(mesh, a, "shoal_policy_refused_total", reason="not_admin") for a in mesh.agents
    )
    for signer in (cast.alice.identity, cast.ursula.identity):
        forged = signed_by(signer, body(9, *promoted))
        # Carried by the admin's own command: the record's signer is what counts.
        status, answer = mesh.command(mesh.agents[0], "policy", policy_command(forged))
        assert status == 400 and "admin" in answer["error"], answer
    # Gossiped by a member (an agent's stolen key) as its own record: every agent that hears
    # it refuses it.
    intruder = Intruder(mesh, 2)
    assert intruder.gossip_record(mesh.agents[1], POLICY, pointer_of(forged).encode()) in (
        200,
        204,
    )
    mesh.wait(
        "the gossiped one refused too",
        lambda: (
            sum(
                metric(mesh, a, "shoal_policy_refused_total", reason="not_admin")
                for a in mesh.agents
            )
            >= before + 3
        ),
    )
    assert all(held_version(mesh, a) == 1 for a in mesh.agents)
    status, error = cast.alice.command(mesh.agents[0], "cordon", {"node": mesh.agents[0].node_id})
    assert status == 403, error


def test_a_revoked_user_is_refused_everywhere(mesh: Mesh, cast: Cast) -> None:
    from tests.agent.test_revocation import revoke

    casualty = PersonAt(mesh, "carol")
    people = (*cast.people, Person("carol", "nlp", "user", casualty.node_id))
    policy = signed_by(mesh.operator, body(2, *people, ceilings={"user": 10}))
    status, answer = mesh.command(mesh.agents[0], "policy", policy_command(policy))
    assert status == 200, answer
    mesh.wait("policy 2 everywhere", lambda: all(held_version(mesh, a) == 2 for a in mesh.agents))
    job_id, status, error = submit(casualty, mesh.agents[1])
    assert status == 200, error
    revoke(mesh, 0, casualty.node_id)
    for a in mesh.agents:
        # Once the list reaches an agent (gossip), it refuses her at the door: her reads too.
        # (A command's 403 alone proves nothing: it may be the owner's, forwarded.)
        mesh.wait(
            f"agent {a.index} refuses carol",
            lambda a=a: casualty.request(a, "GET", "/v1/jobs")[0] in (REFUSED, 403),  # type: ignore[misc]
        )
        assert submit(casualty, a)[1] in (REFUSED, 403)
        status, _ = casualty.command(a, "cancel", {"job_id": job_id})
        assert status in (REFUSED, 403)
    # An admin still cancels the revoked person's job (its submission no longer verifies).
    status, answer = mesh.command(mesh.agents[0], "cancel", {"job_id": job_id})
    assert status == 200 and answer["state"] == "cancelled", answer


@pytest.fixture
def lone(tmp_path: Path) -> Iterator[Mesh]:
    m = Mesh(tmp_path, ["h100:1"])
    m.start_all()
    try:
        yield m
    finally:
        m.stop_all()


def test_the_policy_survives_a_restart_and_an_older_one_is_not_believed(lone: Mesh) -> None:
    agent = lone.agents[0]
    alice = PersonAt(lone, "alice")
    # No policy held: the operator is an admin (clusters from before people and roles work on),
    # a user's certificate has no standing yet.
    assert held_version(lone, agent) == 0
    status, error = alice.command(
        agent, "submit", {"job_id": new_job_id(), "spec": spec(SLEEPER, gpus=0)}
    )
    assert status == 403 and "no team policy" in error, (status, error)
    root = Person("root", "ops", "admin", lone.operator.node_id)
    viewer = Person("alice", "vision", "viewer", alice.node_id)
    user = viewer._replace(role="user")
    v2 = signed_by(lone.operator, body(2, root, user))
    status, answer = lone.command(agent, "policy", policy_command(v2))
    assert status == 200 and answer["applied"], answer
    assert (agent.directory / POLICY_FILE).exists()
    # An older version (alice a viewer again) is not believed, and is counted.
    v1 = signed_by(lone.operator, body(1, root, viewer))
    status, answer = lone.command(agent, "policy", policy_command(v1))
    assert status == 200 and not answer["applied"] and answer["version"] == 2, answer
    assert metric(lone, agent, "shoal_policy_refused_total", reason="older") == 1
    assert lone.terminate(0) == 0
    lone.start(0)
    assert held_version(lone, agent) == 2  # a mesh of one: nobody gossiped it back
    job_id = new_job_id()
    status, error = alice.command(
        agent, "submit", {"job_id": job_id, "spec": spec(SLEEPER, gpus=0)}
    )
    assert status == 200, error  # alice is a user by version 2
    lone.command(agent, "cancel", {"job_id": job_id})


def test_a_revocation_list_a_user_signed_is_not_believed(mesh: Mesh, cast: Cast) -> None:
    import base64

    from gossip import revocation
    from gossip.certtrust import CertSigner

    victim = mesh.agents[2].node_id
    signed = revocation.issue_revocations(
        CertSigner(cast.ursula.identity), {victim}, (), 99, time.time()
    )
    body = {"revocations": base64.b64encode(revocation.encode(signed)).decode()}
    # Carried by the admin's own revoke command: the list's signer is what counts.
    status, answer = mesh.command(mesh.agents[0], "revoke", body)
    assert status == 400 and "may not revoke" in answer["error"], answer
    # Gossiped by a member as its own record.
    intruder = Intruder(mesh, 1)
    assert intruder.gossip_record(
        mesh.agents[0], "shoal/revocations", revocation.encode(signed)
    ) in (
        200,
        204,
    )
    states = {n["node_id"]: n["state"] for n in mesh.get(mesh.agents[0], "/v1/nodes")["nodes"]}
    assert states[victim] == "alive"
    status, _ = mesh.request(mesh.agents[2], "GET", "/healthz")
    assert status == 200
