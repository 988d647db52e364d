"""Property: whatever the fleet and the queue, no decision ever over-commits a GPU's memory or
count, nor a node's CPU; a placement has exactly the GPUs and nodes its job asks for."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.policy.config import PolicyConfig
from agent.policy.decision import Decisions, decide
from agent.policy.model import ThroughputModel
from agent.policy.snapshot import Device, Job, Node, Placement, Running, Share, Snapshot

GIB = 1024**3
MODELS = ("v100", "p100", "k80", "a100-80gb", "t4")


@st.composite
def fleets(draw: st.DrawFn) -> Snapshot:
    nodes: list[Node] = []
    running: list[Running] = []
    n_nodes = draw(st.integers(1, 6))
    serial = 0
    for i in range(n_nodes):
        model = draw(st.sampled_from(MODELS))
        n_dev = draw(st.integers(1, 8))
        mem = draw(st.sampled_from((16, 32))) * GIB
        devices: list[Device] = []
        k = 0
        while k < n_dev:
            state = draw(st.sampled_from(("free", "whole", "shared")))
            key = f"n{i}/{k}"
            if state == "whole":
                width = draw(st.integers(1, n_dev - k))
                serial += 1
                j = Job(
                    f"r{serial}",
                    job_class=draw(st.sampled_from(("A3C", "ResNet-50 (batch size 64)", "x"))),
                    gpus_per_node=width,
                    priority=draw(st.integers(0, 2)),
                    preemptible=draw(st.booleans()),
                )
                keys = tuple(f"n{i}/{k + w}" for w in range(width))
                for w in range(width):
                    devices.append(
                        Device(f"n{i}/{k + w}", model, mem_total_bytes=mem, whole_job=j.job_id)
                    )
                running.append(
                    Running(j, Placement((f"n{i}",), (keys,)), started_at=0.0, device_model=model)
                )
                k += width
                continue
            shares: tuple[Share, ...] = ()
            if state == "shared":
                used = 0
                for _ in range(draw(st.integers(1, 3))):
                    size = draw(st.integers(1, 8)) * GIB
                    if used + size > mem:
                        break
                    serial += 1
                    j = Job(
                        f"r{serial}",
                        job_class="x",
                        share_mem_bytes=size,
                        priority=0,
                        preemptible=True,
                    )
                    shares += (Share(j.job_id, size, "x"),)
                    used += size
                    running.append(
                        Running(j, Placement((f"n{i}",), ((key,),), size), 0.0, device_model=model)
                    )
            devices.append(Device(key, model, mem_total_bytes=mem, shares=shares))
            k += 1
        cpu_total = draw(st.sampled_from((None, 16000)))
        nodes.append(
            Node(
                f"n{i}",
                tuple(devices),
                cpu_milli_total=cpu_total,
                zone=draw(st.sampled_from(("a", "b"))),
            )
        )
    pending: list[Job] = []
    for p in range(draw(st.integers(1, 10))):
        shape = draw(st.sampled_from(("whole", "frac", "mem", "gang", "cpu")))
        base = dict(
            job_class=draw(st.sampled_from(("A3C", "ResNet-50 (batch size 64)", "x"))),
            priority=draw(st.integers(0, 3)),
            submitted_at=float(p),
            cpu_milli=draw(st.sampled_from((0, 2000, 9000))),
        )
        if shape == "whole":
            pending.append(Job(f"p{p}", gpus_per_node=draw(st.integers(1, 8)), **base))  # type: ignore[arg-type]
        elif shape == "frac":
            pending.append(
                Job(f"p{p}", share_fraction=draw(st.sampled_from((0.25, 0.5, 0.9))), **base)
            )  # type: ignore[arg-type]
        elif shape == "mem":
            pending.append(Job(f"p{p}", share_mem_bytes=draw(st.integers(1, 20)) * GIB, **base))  # type: ignore[arg-type]
        elif shape == "gang":
            pending.append(
                Job(
                    f"p{p}",
                    gpus_per_node=draw(st.integers(1, 4)),
                    nodes=draw(st.integers(2, 3)),
                    **base,
                )  # type: ignore[arg-type]
            )
        else:
            pending.append(Job(f"p{p}", gpus_per_node=0, **base))  # type: ignore[arg-type]
    # CPU already in use on the node is that of its running jobs (none ask for CPU here)
    return Snapshot(
        now=10_000.0, nodes=tuple(nodes), pending=tuple(pending), running=tuple(running)
    )


def check(snapshot: Snapshot, d: Decisions) -> None:
    nodes = {n.node_id: n for n in snapshot.nodes}
    whole: dict[str, str | None] = {}
    shares: dict[str, dict[str, int]] = defaultdict(dict)
    mem: dict[str, int] = {}
    where: dict[str, str] = {}
    for n in snapshot.nodes:
        for dev in n.devices:
            whole[dev.key] = dev.whole_job
            mem[dev.key] = dev.mem_total_bytes
            where[dev.key] = n.node_id
            for s in dev.shares:
                shares[dev.key][s.job_id] = s.mem_bytes
    cpu = {n.node_id: n.cpu_milli_used for n in snapshot.nodes}
    jobs = {j.job_id: j for j in snapshot.pending}
    runs = {r.job.job_id: r for r in snapshot.running}

    def release(job_id: str) -> None:
        for key, holder in list(whole.items()):
            if holder == job_id:
                whole[key] = None
        for held in shares.values():
            held.pop(job_id, None)

    def take(job: Job, p: Placement) -> None:
        assert len(p.node_ids) == job.nodes == len(set(p.node_ids)), (job, p)
        for node_id, keys in zip(p.node_ids, p.devices, strict=True):
            assert node_id in nodes
            want = 1 if job.is_share else job.gpus_per_node
            assert len(keys) == want == len(set(keys)), (job, p)
            for key in keys:
                assert where[key] == node_id
                assert whole[key] is None, f"{key} given twice"
                if p.share_mem_bytes:
                    assert sum(shares[key].values()) + p.share_mem_bytes <= mem[key]
                    shares[key][job.job_id] = p.share_mem_bytes
                else:
                    assert not shares[key], f"{key} shared and given whole"
                    whole[key] = job.job_id
            total = nodes[node_id].cpu_milli_total
            cpu[node_id] += job.cpu_milli
            assert total is None or cpu[node_id] <= total

    for p in d.preemptions:
        for victim in p.victims:
            assert runs[victim].job.priority < jobs[p.job_id].priority
            assert runs[victim].job.preemptible
            release(victim)
    for m in d.moves:
        release(m.job_id)
    for m in d.moves:
        take(runs[m.job_id].job, m.placement)
    for a in d.assignments:
        take(jobs[a.job_id], a.placement)
    assert len({a.job_id for a in d.assignments}) == len(d.assignments)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets(), st.booleans(), st.booleans())
def test_no_decision_over_commits(snapshot: Snapshot, backfill: bool, moves: bool) -> None:
    config = PolicyConfig(backfill=backfill, moves=moves, min_run_s=0.0)
    check(snapshot, decide(snapshot, ThroughputModel(), config, forecasts=True))
