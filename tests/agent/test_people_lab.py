"""A team policy of a lab of hundreds on real agents: its body moves as content between them.

An admin's ``shoal user push`` puts the body to one agent and offers the small record; every
other agent fetches the body from the members that gossip the record, verifies it and applies
its rules. A record whose body is not its own, or that no admin signed, is refused and counted;
an agent restarted keeps the policy; a person's certificate reads nothing of the body."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.content.fetch import PATH as CONTENT_PATH
from agent.content.policybody import CHUNK_BYTES, pointer_of
from agent.operator import people
from agent.sandbox.localmesh import AgentProcess
from agent.wire.policy import (
    MAX_POLICY_BODY_BYTES,
    POLICY,
    POLICY_FILE,
    Person,
    PolicyBody,
    SignedPolicy,
    Team,
)
from tests.agent.agents import Mesh, started
from tests.agent.people_kit import PersonAt, policy_command, signed_by
from tests.agent.test_attacks import Intruder, metric
from tests.agent.test_people import submit
from tests.shoal_cli import shoal

pytestmark = pytest.mark.slow

LAB_PEOPLE = 500
LAB_TEAMS = 50


class Lab:
    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self.alice = PersonAt(mesh, "alice")  # a user the policy names
        self.nemo = PersonAt(mesh, "nemo")  # a certificate it does not name
        self.v1: SignedPolicy | None = None

    def body(self, version: int) -> PolicyBody:
        teams = tuple(Team(f"team-{t:02d}", None) for t in range(LAB_TEAMS))
        users = [
            Person("root", "team-00", "admin", self.mesh.operator.node_id),
            Person("alice", "team-07", "user", self.alice.node_id),
        ]
        users += [
            Person(f"p{n:04d}", f"team-{n % LAB_TEAMS:02d}", "user", f"{n:064x}")
            for n in range(LAB_PEOPLE)
        ]
        return PolicyBody(version, time.time(), teams, tuple(users), {"user": 10})


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    with started(tmp_path_factory.mktemp("lab"), ["h100:1", "h100:1", "h100:1"]) as m:
        yield m


@pytest.fixture(scope="module")
def lab(mesh: Mesh) -> Lab:
    """The lab's policy, version 1, as the admin's ``shoal user push`` offers it to agent 0."""
    lab = Lab(mesh)
    signed = signed_by(mesh.operator, lab.body(1))
    people.save(mesh.cluster_dir, signed)  # what the admin's last change left saved
    done = shoal(
        "user", "push", "--identity", str(mesh.cluster_dir), "--agent", mesh.agents[0].address
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    lab.v1 = signed
    return lab


def held(mesh: Mesh, a: AgentProcess) -> tuple[int, str | None, int]:
    """The version, body digest and number of people of the policy ``a`` holds."""
    answer = mesh.get(a, "/v1/policy")
    policy = answer["policy"] or {"users": []}
    return int(answer["version"]), answer["digest"], len(policy["users"])


def settled(mesh: Mesh) -> tuple[int, str | None, int]:
    """What every agent holds, once they all hold the same policy of the lab's size."""
    mesh.wait(
        "every agent holds one policy",
        lambda: (
            len({held(mesh, a) for a in mesh.agents}) == 1
            and held(mesh, mesh.agents[0])[2] == LAB_PEOPLE + 2
        ),
    )
    return held(mesh, mesh.agents[0])


def refused(mesh: Mesh, reason: str, agents: list[AgentProcess]) -> float:
    return sum(metric(mesh, a, "shoal_policy_refused_total", reason=reason) for a in agents)


def outrun_by_its_key(mesh: Mesh, owner: int, policy: tuple[int, str | None]) -> None:
    """Agent ``owner``, whose key gossiped a lie in its name, hears it and outruns it with its
    own record (the other agents refuse the lie, or take the newer record first), and every
    agent keeps ``policy`` (version, digest)."""
    mesh.wait(
        f"agent {owner} outruns it",
        lambda: metric(mesh, mesh.agents[owner], "shoal_gossip_records_refuted_total") >= 1,
    )
    mesh.wait(
        "every agent keeps the policy it held",
        lambda: all(held(mesh, a)[:2] == policy for a in mesh.agents),
    )


def restart(mesh: Mesh, i: int, before_start: Callable[[], object] = lambda: None) -> None:
    assert mesh.terminate(i) == 0
    before_start()
    # A life's gossip incarnation is the second it started in: the next life must start in a
    # later second, or its records read as the last life's older ones.
    time.sleep(1.1)
    mesh.start(i)


def test_a_policy_of_hundreds_reaches_every_agent_and_its_rules_hold(mesh: Mesh, lab: Lab) -> None:
    assert lab.v1 is not None
    version, digest, _ = settled(mesh)
    if version == 1:  # (another test of the module may have moved the mesh on since)
        assert digest == pointer_of(lab.v1).digest
    for a in mesh.agents:  # a body held whole in each agent's store
        items = mesh.get(a, "/v1/cache")["items"]
        assert any(i["kind"] == "policy" and i["digest"] == digest for i in items), items
    # Agent 2 learnt it only by gossip and a fetch of the body: its rules hold there.
    job_id, status, error = submit(lab.alice, mesh.agents[2])
    assert status == 200, error
    _, status, error = submit(lab.nemo, mesh.agents[2])
    assert status == 403 and "not a person of the team policy" in error, (status, error)
    mesh.command(mesh.agents[0], "cancel", {"job_id": job_id})


def test_a_record_whose_body_is_not_its_own_is_refused_and_counted(mesh: Mesh, lab: Lab) -> None:
    version, digest, _ = settled(mesh)
    before = refused(mesh, "body_mismatch", [mesh.agents[1]])
    # The next version, truly signed by the admin, but its digest names the body every agent
    # holds: gossiped by a member under its own name.
    held_record = mesh.get(mesh.agents[0], "/v1/policy")["record"]
    size = len(SignedPolicy.decode(base64.b64decode(held_record)).body_bytes)
    newer = signed_by(mesh.operator, lab.body(version + 1))
    lying = pointer_of(newer)._replace(digest=digest, size_bytes=size)
    intruder = Intruder(mesh, 2)
    assert intruder.gossip_record(mesh.agents[1], POLICY, lying.encode()) in (200, 204)
    mesh.wait(
        "agent 1 refuses it",
        lambda: refused(mesh, "body_mismatch", [mesh.agents[1]]) > before,
    )
    outrun_by_its_key(mesh, 2, (version, digest))


def test_a_record_a_non_admin_signed_is_still_refused(mesh: Mesh, lab: Lab) -> None:
    version, digest, _ = settled(mesh)
    before = refused(mesh, "not_admin", [mesh.agents[1]])
    promoted = lab.body(version + 1)
    promoted = promoted._replace(
        users=tuple(u._replace(role="admin") if u.name == "alice" else u for u in promoted.users)
    )
    forged = signed_by(lab.alice.identity, promoted)
    intruder = Intruder(mesh, 0)
    assert intruder.gossip_record(mesh.agents[1], POLICY, pointer_of(forged).encode()) in (
        200,
        204,
    )
    mesh.wait("agent 1 refuses it", lambda: refused(mesh, "not_admin", [mesh.agents[1]]) > before)
    outrun_by_its_key(mesh, 0, (version, digest))
    # Nor may she put a policy body to an agent: that is an admin's command.
    status, error = lab.alice.command(mesh.agents[0], "policy_missing", {"manifest": {}})
    assert status == 403 and "admins" in error, (status, error)
    assert held(mesh, mesh.agents[1])[:2] == (version, digest)


def test_a_persons_certificate_reads_nothing_of_the_body(mesh: Mesh, lab: Lab) -> None:
    _, digest, _ = settled(mesh)
    manifest = f"{CONTENT_PATH}/{digest}"
    for person in (lab.alice, lab.nemo):
        for path in (manifest, f"{manifest}/have", f"{manifest}/chunks?n=0"):
            status, body = person.request(mesh.agents[1], "GET", path)
            assert status == 403 and b"agent role required" in body, (path, status, body)
    # Nor an admin's: only agents read content (the other agents fetched it so).
    status, _ = mesh.request(mesh.agents[1], "GET", manifest)
    assert status == 403


def test_an_agent_restarted_keeps_the_policy(mesh: Mesh, lab: Lab) -> None:
    before = settled(mesh)
    restart(mesh, 1)
    assert held(mesh, mesh.agents[1]) == before
    job_id, status, error = submit(lab.alice, mesh.agents[1])
    assert status == 200, error
    mesh.command(mesh.agents[0], "cancel", {"job_id": job_id})


def test_a_policy_file_from_before_loads_and_the_others_fetch_its_body(
    mesh: Mesh, lab: Lab
) -> None:
    """An agent stopped with a newer whole record in its ``policy.bin`` (the form agents kept
    before the body moved apart) starts with it, puts its body in its store and gossips the small
    record; the other agents fetch the body from it alone."""
    version, _, _ = settled(mesh)
    newer = signed_by(mesh.operator, lab.body(version + 4))
    policy_file = mesh.agents[1].directory / POLICY_FILE  # no intruder took agent 1's gossip
    restart(mesh, 1, lambda: policy_file.write_bytes(newer.encode()))
    want = (version + 4, pointer_of(newer).digest, LAB_PEOPLE + 2)
    mesh.wait("every agent holds it", lambda: all(held(mesh, a) == want for a in mesh.agents))


def test_the_body_believed_is_never_evicted(tmp_path: Path) -> None:
    """One agent whose store's budget is so small that the policy's body alone is over the
    cache rules' high watermark: the rules run again and again, and the body stays."""
    config = tmp_path / "agent.toml"
    mesh = Mesh(
        tmp_path / "mesh", ["h100:1"], extra=("--config", str(config), "--datasets-rescan-s", "0.5")
    )
    a = mesh.agents[0]
    signed = signed_by(mesh.operator, Lab(mesh).body(1))
    budget = int(len(signed.body_bytes) / 0.95)  # the body: 95% of it, over the 90% watermark
    config.write_text(f"store_budget_bytes = {budget}\n")  # read when the agent starts
    mesh.start_all()
    try:
        status, answer = mesh.command(a, "policy", policy_command(signed))
        assert status == 200 and answer["applied"], answer
        digest = pointer_of(signed).digest

        def body_held() -> bool:
            items = mesh.get(a, "/v1/cache")["items"]
            return any(i["digest"] == digest and i["held_bytes"] > 0 for i in items)

        assert body_held()
        time.sleep(2.0)  # the cache rules run every 0.5 s meanwhile (a bounded wait)
        assert body_held()
    finally:
        mesh.stop_all()


def test_a_body_near_the_bound_goes_up_in_several_commands(tmp_path: Path) -> None:
    """8,000 people: a body of several chunks, over one command's envelope, put by ``shoal user
    push`` chunk by chunk; the agent holds every person."""
    mesh = Mesh(tmp_path, ["h100:1"])
    a = mesh.agents[0]
    lab = Lab(mesh)
    body = lab.body(1)
    many = tuple(
        Person(f"q{n:05d}", f"team-{n % LAB_TEAMS:02d}", "user", f"{n + 10**6:064x}")
        for n in range(8000 - len(body.users))
    )
    signed = signed_by(mesh.operator, body._replace(users=(*body.users, *many)))
    assert 3 * CHUNK_BYTES < len(signed.body_bytes) <= MAX_POLICY_BODY_BYTES
    people.save(mesh.cluster_dir, signed)
    mesh.start_all()
    try:
        done = shoal("user", "push", "--identity", str(mesh.cluster_dir), "--agent", a.address)
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert held(mesh, a) == (1, pointer_of(signed).digest, 8000)
    finally:
        mesh.stop_all()
