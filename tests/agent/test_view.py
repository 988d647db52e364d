"""The cluster view believes a job record only from an agent that may own the job, and only for
a job an operator submitted; placement turns its nodes into the policy's again only when their
records changed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import NamedTuple

import pytest

from agent.job.authority import Authority
from agent.job.jobspec import JobSpec, new_job_id
from agent.job.ownership import rank
from agent.mesh.view import ClusterView, NodeView, pack
from agent.policy import adapt
from agent.policy.adapt import NodeMemo
from agent.policy.snapshot import Share
from agent.wire.inventory import InventoryRecord
from agent.wire.records import NodeRecord
from gossip.certtrust import CertSigner, CertTrust
from gossip.revocation import issue_revocations
from probers.records import DeviceSample, DeviceStatic, HostInfo, Link
from tests.agent.authority_kit import Kit

SPEC = JobSpec(command=("true",))


def _doc(job_id: str, owner: str, gen: int, state: str = "running") -> bytes:
    return pack({"job_id": job_id, "owner": owner, "gen": gen, "state": state, "attempt": 1})


class _Four(NamedTuple):
    kit: Kit
    trust: CertTrust
    ids: list[str]
    live: list[str]
    """The agents the view reads as live (change it)."""
    view: ClusterView
    """The first agent's."""


def _four_agents(tmp_path: Path) -> _Four:
    kit = Kit(tmp_path)
    agents = [kit.agent(f"a{i}") for i in range(4)]
    ids = [a.node_id for a in agents]
    live = list(ids)
    trust = kit.trust(*agents)
    view = ClusterView(Authority(ids[0], trust, lambda: live, lambda node: 0.0, time.time))
    return _Four(kit, trust, ids, live, view)


def test_only_an_owners_records_of_a_submitted_job_are_believed(tmp_path: Path) -> None:
    kit, _, ids, live, view = _four_agents(tmp_path)
    job_id = new_job_id()
    first, second, third, last = rank(job_id, ids)
    # No submission yet: nothing is believed, whoever says it.
    assert view.apply(first, "job/" + job_id, _doc(job_id, first, 1), 0.0) is None
    assert job_id not in view.jobs
    assert view.apply(first, "sub/" + job_id, kit.submission(job_id, SPEC), 0.0) == job_id
    assert view.jobs[job_id]["owner"] == first
    assert view.jobs[job_id]["spec"] == SPEC.to_dict()
    # The last of the order says "cancelled", newer: not believed, and counted.
    assert view.apply(last, "job/" + job_id, _doc(job_id, last, 99, "cancelled"), 0.0) is None
    assert view.jobs[job_id]["state"] == "running"
    assert view.refused["not_an_owner"] == 1
    # A record that names another owner than its publisher is refused outright.
    assert view.apply(second, "job/" + job_id, _doc(job_id, first, 50), 0.0) is None
    assert view.refused["not_its_owner"] == 1
    # The replica, second in the order, takes over with a newer version: believed.
    assert view.apply(second, "job/" + job_id, _doc(job_id, second, 2), 0.0) == job_id
    assert view.jobs[job_id]["owner"] == second
    # The first two die: the third and the last are the owners now, and the lie is believed
    # only now that its publisher may own the job.
    live[:] = [third, last]
    assert view.membership_changed() == [job_id]
    assert view.jobs[job_id]["state"] == "cancelled"


def test_the_view_keeps_the_pending_jobs_and_counts_what_placement_reads(
    tmp_path: Path,
) -> None:
    kit = Kit(tmp_path)
    a = kit.agent("a")
    view = ClusterView(kit.authority(a.node_id, lambda: [a.node_id], a))
    job_id, me = new_job_id(), a.node_id
    seen = view.generation
    view.apply(me, "sub/" + job_id, kit.submission(job_id, SPEC), 0.0)
    assert view.generation == seen and view.pending == set()  # no record yet: nothing believed
    view.apply(me, "job/" + job_id, _doc(job_id, me, 1, "pending"), 0.0)
    assert view.pending == {job_id} and view.generation > seen
    seen = view.generation
    view.apply(me, "job/" + job_id, _doc(job_id, me, 2, "running"), 0.0)
    assert view.pending == set() and view.generation > seen
    seen = view.generation
    view.apply(me, "node", pack({"drain": "draining"}), 0.0)
    assert view.generation > seen
    seen = view.generation
    view.membership_changed()
    assert view.generation > seen


def test_a_submission_must_be_an_operators_and_of_that_job(tmp_path: Path) -> None:
    kit = Kit(tmp_path)
    a = kit.agent("a")
    view = ClusterView(kit.authority(a.node_id, lambda: [a.node_id], a))
    job_id, other = new_job_id(), new_job_id()
    forged = kit.submission(job_id, SPEC, signer=CertSigner(a))
    assert view.apply(a.node_id, "sub/" + job_id, forged, 0.0) is None
    assert view.apply(a.node_id, "sub/" + job_id, kit.submission(other, SPEC), 0.0) is None
    assert view.apply(a.node_id, "sub/" + job_id, b"garbage", 0.0) is None
    assert view.refused["submission"] == 3
    assert view.submissions == {}


def test_when_no_owner_speaks_the_last_believed_record_stays(tmp_path: Path) -> None:
    kit = Kit(tmp_path)
    agents = [kit.agent(f"a{i}") for i in range(3)]
    ids = [a.node_id for a in agents]
    live = list(ids)
    view = ClusterView(kit.authority(ids[0], lambda: live, *agents))
    job_id = new_job_id()
    owner = rank(job_id, ids)[0]
    view.apply(owner, "sub/" + job_id, kit.submission(job_id, SPEC), 0.0)
    view.apply(owner, "job/" + job_id, _doc(job_id, owner, 3), 0.0)
    live.remove(owner)  # it died; its successor has not spoken yet
    assert view.membership_changed() == []
    assert view.jobs[job_id]["owner"] == owner


def test_an_origin_that_published_the_newest_record_as_owner_is_known(tmp_path: Path) -> None:
    kit = Kit(tmp_path)
    agents = [kit.agent(f"a{i}") for i in range(4)]
    ids = [a.node_id for a in agents]
    view = ClusterView(kit.authority(ids[0], lambda: ids, *agents))
    job_id = new_job_id()
    *_, third, last = rank(job_id, ids)
    view.apply(third, "job/" + job_id, _doc(job_id, third, 4), 0.0)
    assert view.published_as_owner(job_id, third, 4)
    assert not view.published_as_owner(job_id, third, 5)  # not what it published
    assert not view.published_as_owner(job_id, last, 4)  # it published nothing
    view.apply(last, "job/" + job_id, _doc(job_id, last, 9), 0.0)
    assert not view.published_as_owner(job_id, third, 4)  # someone published a newer one


def test_the_placement_memo_rebuilds_only_the_nodes_whose_records_changed() -> None:
    def inventory(node_id: str) -> InventoryRecord:
        host = HostInfo(node_id, "linux", "x86_64", None, None)
        gpu = DeviceStatic(key="g0", vendor="nvidia", backend="cuda", name="H100", source="sim")
        return InventoryRecord(host, None, {}, 1, (gpu,))

    a, b = NodeView("a", inventory=inventory("a")), NodeView("b", inventory=inventory("b"))
    memo = NodeMemo()
    first = memo.nodes([a, b])
    assert memo.nodes([a, b]) == first and all(
        x is y for x, y in zip(memo.nodes([a, b]), first, strict=True)
    )
    b.status = NodeRecord(running=("job",), free=())  # its GPU is taken: a new record
    second = memo.nodes([a, b])
    assert second[0] is first[0]
    assert second[1] is not first[1] and second[1].devices[0].whole_job is not None
    assert first[1].devices[0].whole_job is None
    b.samples = {"g0": DeviceSample(key="g0", temp_c=91.0)}  # new telemetry
    assert memo.nodes([a, b])[1].devices[0].temp_c == 91.0
    # A node that left is forgotten; one that comes back is built again.
    assert [n.node_id for n in memo.nodes([b])] == ["b"]
    assert memo.nodes([a, b])[0] is not first[0]


def test_a_rebuilt_node_is_the_node_a_fresh_build_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node whose node record or telemetry changed is rebuilt from the parts its inventory
    decided (worked out again only when the inventory or place record is new), and comes out
    as the node built from nothing would."""

    def links(peer: str | None) -> tuple[Link, ...]:
        return (Link(peer=peer, kind="nvlink"),) if peer else ()

    host = HostInfo("b", "linux", "x86_64", None, None)
    gpus = tuple(
        DeviceStatic(
            key=k, vendor="nvidia", backend="cuda", name="H100", source="sim", links=links(p)
        )
        for k, p in (("g0", "g1"), ("g1", "g0"), ("g2", None))
    )
    b = NodeView("b", inventory=InventoryRecord(host, None, {"zone": "z1"}, 1, gpus))
    worked: list[str] = []
    real = adapt.host_parts

    def counted(view: NodeView) -> adapt.HostParts:
        worked.append(view.node_id)
        return real(view)

    monkeypatch.setattr(adapt, "host_parts", counted)
    memo = NodeMemo()
    memo.nodes([b])
    b.status = NodeRecord(running=("j1",), free=("g2",), shares={"g1": {"j2": 2**30}})
    b.samples = {"g0": DeviceSample(key="g0", temp_c=71.0, power_mw=300_000)}
    (node,) = memo.nodes([b])
    assert worked == ["b"]  # the first build only
    assert node == adapt.node_from_view(b)
    assert [d.whole_job for d in node.devices] == [adapt.BUSY, None, None]
    assert node.devices[1].shares == (Share("j2", 2**30),) and node.zone == "z1"
    assert node.devices[0].link_domain == node.devices[1].link_domain == "nvlink:g0"
    b.inventory = InventoryRecord(host, None, {"zone": "z2"}, 2, gpus)
    assert memo.nodes([b])[0].zone == "z2" and len(worked) == 3  # the fresh build, and now


def _third_takes_over(four: _Four, state: str) -> list[str]:
    """A job its first agent owned, taken over by its third (at gen 3, ``state``) while the
    first two were away; both back, the first publishes its old record again (a restart that
    had not heard of the takeover yet). Returns the job id, then the job's order."""
    kit, _, ids, live, view = four
    # The view's own agent last in the order: the others are judged by their certificates.
    job_id = next(j for j in iter(new_job_id, "") if rank(j, ids)[-1] == ids[0])
    first, _, third, last = order = rank(job_id, ids)
    view.apply(first, "sub/" + job_id, kit.submission(job_id, SPEC), 0.0)
    view.apply(first, "job/" + job_id, _doc(job_id, first, 2), 0.0)
    live[:] = [third, last]
    view.membership_changed()
    assert view.apply(third, "job/" + job_id, _doc(job_id, third, 3, state), 0.0) == job_id
    live[:] = ids  # the third is no longer among the job's owners
    assert view.membership_changed() == []
    view.apply(first, "job/" + job_id, _doc(job_id, first, 2), 0.0)
    return [job_id, *order]


def _ended_by_the_third(four: _Four) -> tuple[str, str, str]:
    """The job id, its first agent and its third, which ended it."""
    job_id, first, _, third, _ = _third_takes_over(four, "succeeded")
    return job_id, first, third


def test_an_ended_jobs_record_gives_way_only_to_a_newer_one(tmp_path: Path) -> None:
    four = _four_agents(tmp_path)
    view = four.view
    job_id, first, third = _ended_by_the_third(four)
    assert view.jobs[job_id]["state"] == "succeeded" and view.jobs[job_id]["owner"] == third
    assert view.membership_changed() == []
    assert view.jobs[job_id]["state"] == "succeeded"
    # A newer record is believed as before (each side of a partition may run a job: the owner
    # that ran it again says so at a newer generation).
    assert view.apply(first, "job/" + job_id, _doc(job_id, first, 4), 0.0) == job_id
    assert view.jobs[job_id]["state"] == "running" and view.jobs[job_id]["owner"] == first


def test_an_end_from_an_owner_revoked_since_is_not_kept(tmp_path: Path) -> None:
    four = _four_agents(tmp_path)
    view = four.view
    job_id, first, third = _ended_by_the_third(four)
    revoked = issue_revocations(four.kit.operator, [third], [], 1, time.time())
    assert four.trust.apply_revocations(revoked, time.time())
    assert view.membership_changed() == [job_id]
    assert view.jobs[job_id]["state"] == "running" and view.jobs[job_id]["owner"] == first
