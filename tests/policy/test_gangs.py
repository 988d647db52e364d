"""Gangs: all members start or none, also when two owners decide at once from a lagging view."""

from __future__ import annotations

from agent.policy.decision import decide
from agent.policy.model import ThroughputModel
from agent.policy.snapshot import Snapshot
from bench.sched.cluster import NodeSpec
from bench.sched.engine import Simulation
from bench.sched.policies import ShoalMesh
from bench.sched.simtypes import SimConfig
from bench.sched.traces import TraceJob
from bench.sched.truth import Truth
from tests.policy.helpers import job, node

GANG = "ResNet-50 (batch size 64)"


def test_a_gang_gets_every_member_or_nothing() -> None:
    nodes = (node("a", "v100", 2), node("b", "v100", 2), node("c", "v100", 2, busy=[0]))
    gang = job("g", gpus_per_node=2, nodes=3)
    d = decide(Snapshot(now=0.0, nodes=nodes, pending=(gang,)), ThroughputModel())
    assert d.assignments == ()
    assert (d.waiting_line("g") or "").startswith("waiting: no node has 2 free GPUs")
    free = (*nodes[:2], node("c", "v100", 2))
    d = decide(Snapshot(now=0.0, nodes=free, pending=(gang,)), ThroughputModel())
    (a,) = d.assignments
    assert sorted(a.placement.node_ids) == ["a", "b", "c"]
    assert all(len(keys) == 2 for keys in a.placement.devices)


def test_a_gang_stays_in_one_zone_when_one_zone_can_hold_it() -> None:
    nodes = (
        node("a1", "v100", 1, zone="a"),
        node("b1", "v100", 1, zone="b"),
        node("b2", "v100", 1, zone="b"),
        node("a2", "v100", 1, zone="a"),
    )
    d = decide(Snapshot(now=0.0, nodes=nodes, pending=(job("g", nodes=2),)), ThroughputModel())
    (a,) = d.assignments
    assert sorted(a.placement.node_ids) in (["a1", "a2"], ["b1", "b2"])


def test_a_gang_mixes_models_only_when_no_model_has_enough_nodes_and_runs_at_the_slowest() -> None:
    mixed = (node("h", "h100", 2), node("a", "a100", 2), node("p", "p100", 2))
    gang = job("g", job_class=GANG, kind="training", gpus_per_node=2, nodes=2)
    d = decide(Snapshot(now=0.0, nodes=mixed, pending=(gang,)), ThroughputModel())
    (a,) = d.assignments
    assert sorted(a.placement.node_ids) == ["a", "h"]  # the two fastest, not the P100
    alike = (*mixed, node("p2", "p100", 2))
    d = decide(Snapshot(now=0.0, nodes=alike, pending=(gang,)), ThroughputModel())
    (a,) = d.assignments
    assert sorted(a.placement.node_ids) == ["p", "p2"]  # one model where one model can hold it


class _Checked(Simulation):
    """After every event: no device held twice, and a gang holds all of its members or none."""

    violations: list[str]

    def _flush(self) -> None:
        super()._flush()
        holders: dict[str, str] = {}
        for n in self.nodes.values():
            for d in n.devices.values():
                if d.whole is not None:
                    if d.key in holders:
                        self.violations.append(f"{d.key} held twice")
                    holders[d.key] = d.whole
        for sj in self.jobs.values():
            held = sum(1 for h in holders.values() if h == sj.job.job_id)
            if held not in (0, sj.job.gpus):
                self.violations.append(f"{sj.job.job_id} holds {held} of {sj.job.gpus}")


def test_two_owners_two_gangs_contending_never_hold_part_of_one() -> None:
    """Four nodes of two GPUs; two gangs of three nodes each arrive together, owned by two
    owners deciding from a view 2 s old. One runs, then the other: never half of each."""
    nodes = [NodeSpec(f"n{i}", "v100", 2, 32 * 1024**3) for i in range(4)]
    trace = [TraceJob(i, 0.0, GANG, 2, 3, work=3600.0 * 30.0, preemptible=False) for i in range(2)]
    sim = _Checked(nodes, trace, ShoalMesh(), Truth(), SimConfig(owners=2, gossip_delay_s=2.0))
    sim.violations = []
    owners = {sj.owner for sj in sim.jobs.values()}
    assert len(owners) == 2  # the two gangs have different owners
    sim.run()
    assert sim.violations == []
    done = sorted(sim.finished(), key=lambda sj: sj.finish_at or 0.0)
    assert len(done) == 2
    first, second = done
    assert second.first_start is not None and first.finish_at is not None
    assert second.first_start >= first.finish_at  # the second waited for the whole set
