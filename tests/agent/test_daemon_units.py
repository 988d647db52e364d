"""The daemon's pure parts: rendezvous ownership, first-fit placement, config, event log."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from agent.common.errors import UserError
from agent.daemon.config import OBJECTIVE_NAMES, AgentConfig, load_config
from agent.job.jobspec import JobSpec, Resources
from agent.job.ownership import RANKS_KEPT, owner_of, rank, replica_of, weight
from agent.mesh.events import GOSSIPED, GOSSIPED_FOR_S, EventLog
from agent.mesh.view import NodeView
from agent.owning.placement import PLACEMENTS, FirstFit, ShoalPlacement
from agent.policy.config import OBJECTIVES
from agent.wire.codec import unpack
from agent.wire.documents import EventsDoc
from agent.wire.inventory import InventoryRecord
from agent.wire.records import EventsRecord, GossipedEvent, NodeRecord
from probers.records import DeviceStatic, HostInfo

NODES = ["node-a", "node-b", "node-c", "node-d"]


def test_rendezvous_owner_moves_only_for_jobs_of_the_node_that_left() -> None:
    jobs = [f"{i:032x}" for i in range(200)]
    before = {j: owner_of(j, NODES) for j in jobs}
    after = {j: owner_of(j, NODES[:-1]) for j in jobs}
    moved = [j for j in jobs if before[j] != after[j]]
    assert moved and all(before[j] == "node-d" for j in moved)
    # The new owner of a moved job is its former replica.
    assert all(after[j] == replica_of(j, NODES, "node-d") for j in moved)
    assert rank(jobs[0], NODES) == rank(jobs[0], list(reversed(NODES)))
    assert replica_of(jobs[0], ["node-a"], "node-a") is None


def test_a_kept_order_is_the_order_the_nodes_give_whatever_was_asked_before() -> None:
    """:func:`rank` keeps orders; asked with other sets in between (members joining and
    leaving), more jobs than it keeps, and with duplicates, it gives what hashing and sorting
    give, and a caller that changes the list it got changes nothing kept."""
    rng = random.Random(7)
    nodes = [f"node-{i:02d}" for i in range(40)]
    jobs = [f"{rng.getrandbits(128):032x}" for _ in range(3 * RANKS_KEPT)]
    for _ in range(4000):
        job = rng.choice(jobs)
        live = rng.sample(nodes, rng.choice([1, 2, 31, 32, 32, 32]))
        want = sorted(set(live), key=lambda n: (-weight(job, n), n))
        got = rank(job, live + live[:3])
        assert got == want
        got.reverse()
        assert rank(job, live) == want


def _dev(key: str, vendor: str, backend: str, mem_gib: int, cc: str | None = None) -> DeviceStatic:
    return DeviceStatic(
        key=key,
        vendor=vendor,  # type: ignore[arg-type]
        backend=backend,  # type: ignore[arg-type]
        name=key,
        source="sim",
        compute_capability=cc,
        mem_total_bytes=mem_gib * 1024**3,
    )


def _inventory(*devices: DeviceStatic, features: tuple[str, ...] = ()) -> InventoryRecord:
    host = HostInfo("h", "linux", "x86_64", None, None)
    return InventoryRecord(host, None, {}, 1, devices, features=features)


def test_first_fit_applies_the_hard_filters() -> None:
    l4 = NodeView("n1", inventory=_inventory(_dev("l4", "nvidia", "cuda", 24, "8.9")))
    h100 = NodeView(
        "n2",
        inventory=_inventory(
            _dev("h0", "nvidia", "cuda", 80, "9.0"), _dev("h1", "nvidia", "cuda", 80, "9.0")
        ),
        status=NodeRecord(drain="schedulable", free=("h1",)),
    )
    mi = NodeView(
        "n3",
        inventory=_inventory(_dev("m0", "amd", "rocm", 192), _dev("m1", "amd", "rocm", 192)),
        status=NodeRecord(drain="cordoned"),
    )
    ff = FirstFit()
    big = JobSpec(command=("x",), resources=Resources(1, min_mem_per_gpu_bytes=40 * 1024**3))
    assert [(c.node_id, c.devices) for c in ff.candidates(big, [l4, h100, mi])] == [("n2", ("h1",))]
    two = JobSpec(command=("x",), resources=Resources(gpus_per_node=2))
    assert ff.candidates(two, [l4, h100, mi]) == []  # n2 has one free, n3 is cordoned
    assert ff.why_pending(two) == "no schedulable node has 2 free GPUs"
    cc = JobSpec(command=("x",), resources=Resources(1, min_compute_capability="9.0"))
    assert [c.node_id for c in ff.candidates(cc, [l4, h100])] == ["n2"]
    anyone = JobSpec(command=("x",))
    assert [c.node_id for c in ff.candidates(anyone, [l4, h100], prefer="n2")] == ["n2", "n1"]
    rocm = JobSpec(command=("x",), resources=Resources(gpus_per_node=2, backends=("rocm",)))
    assert ff.why_pending(rocm) == "no schedulable node has 2 free GPUs and backend rocm"


def test_config_file_and_its_mistakes(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(
        'listen = "127.0.0.1:9000"\njoin = ["10.0.0.1:7946"]\nzone = "rack-a"\n'
        'datasets = ["imagenet"]\ncost_per_hour = 2\n[labels]\nteam = "vision"\n'
    )
    config = load_config(path)
    assert config.listen == "127.0.0.1:9000"
    assert config.join == ("10.0.0.1:7946",)
    assert config.identity_path == AgentConfig().data_dir / "identity"
    assert config.all_labels() == {
        "team": "vision",
        "zone": "rack-a",
        "datasets": "imagenet",
        "cost_per_hour": "2",
    }
    path.write_text('listn = "x"\n')
    bad = tmp_path / "runtime.toml"
    bad.write_text('container_runtime = "lxc"\n')
    with pytest.raises(UserError, match="container_runtime must be one of podman, docker, none"):
        load_config(bad)
    bad.write_text('container_runtime = "none"\ninsecure_registries = ["127.0.0.1:5000"]\n')
    assert load_config(bad).insecure_registries == ("127.0.0.1:5000",)
    bad.write_text('insecure_registries = ["--tls-verify=false"]\n')
    with pytest.raises(UserError, match="is not HOST:PORT"):
        load_config(bad)
    with pytest.raises(UserError, match="unknown option 'listn'"):
        load_config(path)
    bad.write_text('objective = "packing"\n')
    assert load_config(bad).objective == "packing"
    bad.write_text('objective = "speed"\n')
    with pytest.raises(UserError, match="objective must be one of performance, energy, cost"):
        load_config(bad)
    bad.write_text("hints_every_s = 5\nhints_window_s = 120\n")
    assert (load_config(bad).hints_every_s, load_config(bad).hints_window_s) == (5.0, 120.0)
    bad.write_text("hints_window_s = 0\n")
    with pytest.raises(UserError, match="hints_window_s must be more than 0"):
        load_config(bad)


def test_the_config_names_the_policys_objectives_and_each_reaches_the_policy() -> None:
    assert OBJECTIVE_NAMES == OBJECTIVES
    for name in OBJECTIVE_NAMES:
        placement = PLACEMENTS["shoal"]("me", 600.0, name)
        assert isinstance(placement, ShoalPlacement) and placement.config.objective == name


def test_event_log_merges_gossiped_events_once() -> None:
    clock = iter(range(100, 200))
    log = EventLog("me", clock=lambda: float(next(clock)))
    log.add("started", "hello", job_id="j1")
    x, y, z = (GossipedEvent(n, None, kind, None, "") for n, kind in ((1, "x"), (2, "y"), (3, "z")))
    log.merge("other", [x, y])
    log.merge("other", [y, z])
    rows, nxt = log.since(0).events, log.since(0).next
    assert [(r.seq, r.node, r.kind) for r in rows] == [
        (1, "me", "started"),
        (2, "other", "x"),
        (3, "other", "y"),
        (4, "other", "z"),
    ]
    assert nxt == 4 and log.since(4) == EventsDoc((), 4)


def test_a_restarted_agents_events_are_merged_past_its_earlier_life() -> None:
    peer = EventLog("peer")
    first = EventLog("me", boot=1)
    for i in range(5):
        first.add("started", f"job {i}")
    peer.merge("me", first.gossip_record().events)
    again = EventLog("me", boot=2)  # restarted: its numbering starts over, above the last life's
    again.add("agent_started", "boot 2")
    peer.merge("me", again.gossip_record().events)
    assert [r.message for r in peer.since(0).events][-2:] == ["job 4", "boot 2"]
    record = again.gossip_record()
    assert EventsRecord.decode(unpack(record.encode())) == record  # within the wire's integers


def test_event_record_carries_recent_events_without_the_node_id() -> None:
    now = [1000.0]
    log = EventLog("me", clock=lambda: now[0])
    for i in range(GOSSIPED + 3):
        log.add("started", f"job {i}", job_id=f"j{i}")
        now[0] += 0.25
    rows = log.gossip_record().events
    # the latest GOSSIPED, oldest first, named by the record's origin rather than in each row
    assert [r.n for r in rows] == list(range(4, GOSSIPED + 4))
    assert all("node" not in r.to_wire() for r in rows)
    now[0] = 1000.0 + 0.25 * 12 + GOSSIPED_FOR_S  # all but the last three aged out of the record
    assert [r.n for r in log.gossip_record().events] == [13, 14, 15]
    peer = EventLog("peer")
    peer.merge("me", rows)
    assert {r.node for r in peer.since(0).events} == {"me"}
