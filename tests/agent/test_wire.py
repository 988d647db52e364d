"""The wire contract: every record kind round-trips, an inventory of any size arrives whole,
garbage is refused and counted, and records of the versions before and after are read."""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.job.jobspec import JobSpec, Resources, UnknownFeatures
from agent.mesh.view import ClusterView, NodeView
from agent.owning.placement import FirstFit
from agent.wire.calls import (
    AttemptResult,
    GangAbort,
    GangAborted,
    GangCommit,
    GangPrepare,
    GangPrepared,
    JobTransfer,
    OwnerDetail,
    ResumeFrom,
    StartAnswer,
    StartOffer,
    StatusAnswer,
    StopAnswer,
    StopRequest,
)
from agent.wire.ckptcalls import CheckpointNote
from agent.wire.codec import (
    MAX_RECORD_BYTES,
    MAX_WIRE_INT,
    WIRE_VERSION,
    WireError,
    pack,
    unpack,
)
from agent.wire.documents import DeviceDoc, EventDoc, EventsDoc, JobDoc, NodeDoc
from agent.wire.health import HealthDoc
from agent.wire.inventory import InventoryRecord
from agent.wire.records import (
    AttemptEntry,
    EventsRecord,
    GangMember,
    GossipedEvent,
    JobStatus,
    NodeRecord,
    TelemetryRecord,
    telemetry_stale,
)
from probers.records import DeviceSample, DeviceStatic, HostInfo, Link, MigDevice
from probers.sim import SimProber
from tests.agent.authority_kit import Kit

HOST = HostInfo("gpu-01", "linux", "x86_64", 64, 512 * 1024**3)
NODE = "n" * 32


def _view(tmp_path: Path) -> ClusterView:
    kit = Kit(tmp_path)
    a = kit.agent("a")
    return ClusterView(kit.authority(a.node_id, lambda: [a.node_id], a))


def _inventory(devices: tuple[DeviceStatic, ...], **kw: Any) -> InventoryRecord:
    return InventoryRecord(HOST, "127.0.0.1:7946", {"zone": "a"}, 3, devices, **kw)


def _with_mig(d: DeviceStatic, n: int = 7) -> DeviceStatic:
    mig = tuple(
        MigDevice(f"MIG-{d.key}-{i:02d}-0123456789abcdef01234567", "1g.10gb", 10 * 1024**3)
        for i in range(n)
    )
    return dataclasses.replace(d, mig_devices=mig)


def _apply_all(view: ClusterView, records: list[tuple[str, bytes]], seed: int = 0) -> None:
    shuffled = list(records)
    random.Random(seed).shuffle(shuffled)
    for kind, payload in shuffled:
        assert view.apply(NODE, kind, payload, 0.0) is None


# -- the inventory -------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", ["h100:8", "mi300x:8", "linux-a100"])
def test_an_8_gpu_baseboard_with_mig_arrives_whole_in_parts(tmp_path: Path, profile: str) -> None:
    devices = tuple(_with_mig(d) for d in SimProber(profile, host_id="abcdef12").discover())
    if profile != "linux-a100":
        assert all(len(d.links) == len(devices) - 1 for d in devices)  # a full NVLink/xGMI mesh
    record = _inventory(devices, features=("gang",))
    records = record.encode()
    assert [k for k, _ in records] == ["inventory"] + [
        f"inventory/{n}" for n in range(1, len(records))
    ]
    assert all(len(p) <= MAX_RECORD_BYTES for _, p in records)
    assert len(records) > 1 or profile == "linux-a100"
    view = _view(tmp_path)
    # Parts may come in any order: nothing is believed until the last one is here.
    *first, last = records
    for kind, payload in reversed(first):
        view.apply(NODE, kind, payload, 0.0)
    assert view.node(NODE).inventory is None or len(records) == 1
    view.apply(NODE, *last, 0.0)
    assert view.node(NODE).inventory == record
    assert view.refused == {}


def test_a_restart_with_fewer_parts_is_not_mixed_with_the_old_ones(tmp_path: Path) -> None:
    view = _view(tmp_path)
    big = _inventory(tuple(_with_mig(d) for d in SimProber("h100:8").discover()))
    small = _inventory(tuple(SimProber("l4:2").discover()))._replace(boot=4)
    _apply_all(view, big.encode())
    assert view.node(NODE).inventory == big
    _apply_all(view, small.encode())
    assert view.node(NODE).inventory == small
    # A part of the old set that arrives late changes nothing.
    view.apply(NODE, *big.encode()[-1], 0.0)
    assert view.node(NODE).inventory == small


def test_one_device_too_large_for_a_record_is_an_error_not_a_silent_loss() -> None:
    d = SimProber("h100:1").discover()[0]
    huge = dataclasses.replace(d, name="x" * MAX_RECORD_BYTES)
    with pytest.raises(WireError, match="device 0 does not fit"):
        _inventory((huge,)).encode()


# -- every kind round-trips ----------------------------------------------------------------------

_text = st.text(max_size=12)
_opt_int = st.none() | st.integers(min_value=0, max_value=MAX_WIRE_INT)
_opt_float = st.none() | st.floats(allow_nan=False, allow_infinity=False, width=64)


@st.composite
def _devices(draw: st.DrawFn) -> tuple[DeviceStatic, ...]:
    n = draw(st.integers(min_value=0, max_value=6))
    keys = [f"k{i}" for i in range(n)]
    out = []
    for i, key in enumerate(keys):
        peers = draw(st.lists(st.sampled_from(keys) | _text, max_size=4)) if keys else []
        links = tuple(
            Link(
                p,
                draw(st.sampled_from(["nvlink", "xgmi", "pcie"])),
                draw(_opt_int),
                draw(st.none() | _text),
            )
            for p in peers
        )
        mig = tuple(
            MigDevice(draw(_text), draw(st.none() | _text), draw(_opt_int))
            for _ in range(draw(st.integers(min_value=0, max_value=3)))
        )
        out.append(
            DeviceStatic(
                key=key,
                vendor=draw(st.sampled_from(["nvidia", "amd", "intel", "apple", "cpu", "sim"])),
                backend=draw(st.sampled_from(["cuda", "rocm", "xpu", "metal", "cpu"])),
                name=draw(_text),
                source=draw(_text),
                vendor_index=i,
                uuid=draw(st.none() | _text),
                pci_bus_id=draw(st.none() | _text),
                arch=draw(st.none() | _text),
                compute_capability=draw(st.none() | _text),
                unified_memory=draw(st.booleans()),
                mem_total_bytes=draw(_opt_int),
                mem_note=draw(st.none() | _text),
                compute_units=draw(_opt_int),
                temp_slowdown_c=draw(_opt_float),
                links=links,
                mig_devices=mig,
                driver_version=draw(st.none() | _text),
            )
        )
    return tuple(out)


@settings(max_examples=60, deadline=None)
@given(
    devices=_devices(),
    labels=st.dictionaries(_text, _text, max_size=3),
    runtime=st.sampled_from([None, "podman", "docker"]),
)
def test_inventory_round_trips(
    devices: tuple[DeviceStatic, ...], labels: dict[str, str], runtime: str | None
) -> None:
    features = ("gang", "image") if runtime else ("gang",)
    record = InventoryRecord(
        HOST, None, labels, 1, devices, features=features, container_runtime=runtime
    )
    view = ClusterView(authority=None)  # type: ignore[arg-type]  # no job records here
    for kind, payload in record.encode():
        view.apply(NODE, kind, payload, 0.0)
    assert view.node(NODE).inventory == record


_samples = st.lists(
    st.builds(
        DeviceSample,
        key=_text,
        mem_used_bytes=_opt_int,
        util_pct=_opt_float,
        temp_c=_opt_float,
        power_mw=_opt_int,
        power_limit_mw=_opt_int,
        healthy=st.booleans(),
    ),
    max_size=8,
).map(tuple)


@settings(max_examples=60, deadline=None)
@given(at=_opt_float, samples=_samples)
def test_telemetry_round_trips(at: float | None, samples: tuple[DeviceSample, ...]) -> None:
    record = TelemetryRecord(at, samples)
    assert TelemetryRecord.decode(unpack(record.encode())) == record


def test_telemetry_names_its_heartbeat_and_an_older_record_or_a_bad_one_is_told_apart() -> None:
    sent = TelemetryRecord(1.0, (), every_s=480.0)
    assert TelemetryRecord.decode(unpack(sent.encode())).every_s == 480.0
    assert TelemetryRecord.decode(unpack(TelemetryRecord(1.0, ()).encode())).every_s is None
    for bad in (0.0, -5.0, 86_401.0):
        with pytest.raises(WireError, match="every_s"):
            TelemetryRecord.decode({"v": 1, "at": 1.0, "s": [], "every_s": bad})
    assert not telemetry_stale(None, None)  # none yet: not stale, just not known
    assert telemetry_stale(91.0, None) and not telemetry_stale(89.0, None)  # 60 s, unsaid
    assert not telemetry_stale(700.0, 480.0) and telemetry_stale(721.0, 480.0)


@settings(max_examples=60, deadline=None)
@given(
    record=st.builds(
        NodeRecord,
        drain=_text,
        queue=st.integers(min_value=0, max_value=10**6),
        running=st.lists(_text, max_size=4).map(tuple),
        free=st.none() | st.lists(_text, max_size=4).map(tuple),
        progress=st.dictionaries(
            _text, st.tuples(st.floats(0, 1), st.none() | st.floats(0, 1e6)), max_size=3
        ),
        shares=st.dictionaries(
            _text,
            st.dictionaries(_text, st.integers(min_value=1, max_value=2**50), max_size=3),
            max_size=3,
        ),
        saved=st.dictionaries(_text, st.floats(0, 2e9), max_size=3),
        staging=st.dictionaries(_text, st.text(max_size=100), max_size=3),
    ),
    events=st.lists(
        st.builds(
            GossipedEvent,
            n=st.integers(min_value=1, max_value=10**9),
            at=_opt_float,
            kind=_text,
            job_id=st.none() | _text,
            message=_text,
        ),
        max_size=5,
    ).map(tuple),
    job=st.builds(
        JobStatus,
        job_id=_text,
        state=_text,
        attempt=st.integers(min_value=0, max_value=1000),
        owner=st.none() | _text,
        runner=st.none() | _text,
        devices=st.lists(_text, max_size=3).map(tuple),
        submitted_at=_opt_float,
        started_at=_opt_float,
        finished_at=_opt_float,
        exit_code=st.none() | st.integers(min_value=-255, max_value=255),
        signal=st.none() | _text,
        reason=st.none() | _text,
        gen=st.integers(min_value=0, max_value=10**9),
        attempts=st.lists(
            st.builds(
                AttemptEntry,
                attempt=st.integers(min_value=1, max_value=1000),
                node=st.none() | _text,
                started_at=_opt_float,
                finished_at=_opt_float,
                cause=st.none() | _text,
                exit_code=st.none() | st.integers(min_value=-255, max_value=255),
                rank=st.none() | st.integers(min_value=0, max_value=64),
            ),
            max_size=3,
        ).map(tuple),
        members=st.lists(
            st.tuples(_text, st.lists(_text, max_size=3).map(tuple)),
            max_size=4,
            unique_by=lambda m: m[0],
        ).map(lambda ms: tuple(GangMember(r, n, d) for r, (n, d) in enumerate(ms))),
        deadline_missed_s=_opt_float,
    ),
)
def test_node_events_and_job_records_round_trip(
    record: NodeRecord, events: tuple[GossipedEvent, ...], job: JobStatus
) -> None:
    assert NodeRecord.decode(unpack(record.encode())) == record
    assert EventsRecord.decode(unpack(EventsRecord(events).encode())) == EventsRecord(events)
    assert JobStatus.from_wire(unpack(job.encode())) == job


def test_api_documents_and_call_bodies_round_trip_and_ignore_unknown_fields() -> None:
    static = _with_mig(SimProber("h100:2").discover()[0])
    device = DeviceDoc(0, static, DeviceSample(static.key, 10, 5.0, 40.0, 100_000, 700_000))
    node = NodeDoc(
        NODE,
        "127.0.0.1:1",
        "alive",
        "agent",
        "schedulable",
        {"z": "a"},
        HOST,
        (device,),
        1.5,
        ("j",),
        2,
        2,
        ("gang",),
    )
    status = JobStatus(
        "j" * 32, "running", 1, NODE, NODE, ("k",), 1.0, 2.0, None, None, None, None, 3
    )
    docs: list[Any] = [
        node,
        node._replace(fetch_rates={"m" * 32: 1.5e8}),
        JobDoc(status, JobSpec(command=("true",)).to_dict(), 0.5, 10.0),
        JobDoc(
            status._replace(
                members=(GangMember(0, NODE, ("k",)), GangMember(1, "m" * 64, ("a", "b")))
            ),
            JobSpec(command=("true",)).to_dict(),
        ),
        EventsDoc((EventDoc(1, 2.0, "started", NODE, None, "hi"),), 1),
        HealthDoc(True, NODE, 3),
        JobTransfer(status, OwnerDetail(gen=3), b"sealed"),
        StartOffer("j" * 32, 1, NODE, ("k",), b"sealed"),
        StartOffer("j" * 32, 2, NODE, ("k",), b"sealed", ResumeFrom(1, "d" * 64)),
        StartOffer("j" * 32, 3, NODE, ("k",), b"sealed", None, ("v" * 32, "w" * 32)),
        StartOffer("j" * 32, 4, NODE, ("k",), b"sealed", rebind=True),
        StartOffer("j" * 32, 5, NODE, ("k",), b"sealed", None, ("v" * 32,), moves=("m" * 32,)),
        StartAnswer(True, 1.0, 42),
        StartAnswer(True, 1.0, 42, ("k1", "k2")),
        AttemptResult("j" * 32, 1, None, "SIGTERM", "preempt", 1.0, 2.0, "p" * 32),
        CheckpointNote("j" * 32, 2),
        StopRequest("j" * 32, 1, "drain", 5.0),
        StopAnswer(True, AttemptResult("j" * 32, 1, 0, None, "exit", 1.0, 2.0)),
        StatusAnswer(False, None, None),
        GangPrepare("j" * 32, 3, NODE, MEMBERS, b"sealed", 30.0),
        GangPrepare("j" * 32, 4, NODE, MEMBERS, b"sealed", 30.0, rebind=True),
        GangPrepared(True, "10.0.0.7", 29500),
        GangPrepared(True),
        GangPrepared(True, None, None, ("k1", "k2")),
        GangCommit("j" * 32, 3, "10.0.0.7", 29500),
        GangAbort("j" * 32, 3),
        GangAborted(False),
        status._replace(members=MEMBERS, attempts=(AttemptEntry(3, NODE, 1.0, rank=1),)),
        OwnerDetail(gen=4, members=MEMBERS),
        JobDoc(status._replace(members=MEMBERS), {}, None, None),
    ]
    for doc in docs:
        wire = doc.to_wire()
        assert type(doc).from_wire(wire) == doc
        newer = {**wire, "v": WIRE_VERSION + 1, "added_in_a_newer_version": {"x": [1]}}
        assert type(doc).from_wire(newer) == doc  # a rolling upgrade: unknown fields ignored


def test_a_preempting_offer_names_its_victims_and_a_report_whom_it_was_stopped_for() -> None:
    plain = StartOffer("j" * 32, 1, NODE, ("k",), b"sealed")
    assert "victims" not in plain.to_wire()  # an offer without victims reads as it always did
    offer = plain._replace(victims=("v" * 32,))
    assert offer.to_wire()["victims"] == ["v" * 32]
    assert StartOffer.from_wire(offer.to_wire()).victims == ("v" * 32,)
    for bad in ("v" * 32, [1], {"v": 1}):
        with pytest.raises(WireError, match="victims"):
            StartOffer.from_wire({**plain.to_wire(), "victims": bad})
        with pytest.raises(WireError, match="shrink"):
            StartOffer.from_wire({**plain.to_wire(), "shrink": bad})
        with pytest.raises(WireError, match="moves"):
            StartOffer.from_wire({**plain.to_wire(), "moves": bad})
    assert "moves" not in plain.to_wire()
    assert "shrink" not in plain.to_wire()
    shrinking = plain._replace(shrink=("e" * 32,))
    assert StartOffer.from_wire(shrinking.to_wire()) == shrinking
    ended = AttemptResult("j" * 32, 1, None, "SIGTERM", "preempt", 1.0, 2.0)
    assert "preempted_by" not in ended.to_wire()
    by = ended._replace(preempted_by="p" * 32)
    assert AttemptResult.from_wire(by.to_wire()).preempted_by == "p" * 32
    with pytest.raises(WireError, match="preempted_by"):
        AttemptResult.from_wire({**ended.to_wire(), "preempted_by": 7})


def test_a_gang_job_lists_its_members_and_a_one_node_job_has_none_on_the_wire() -> None:
    status = JobStatus("j" * 32, "running", 1, NODE, NODE, ("k",))
    spec = JobSpec(command=("true",), resources=Resources(gpus_per_node=1, nodes=2)).to_dict()
    one = JobDoc(status, spec).to_wire()
    assert "members" not in one and JobDoc.from_wire(one).members == ()
    gang = JobDoc(
        status._replace(members=(GangMember(0, NODE, ("k",)), GangMember(1, "m", ()))), spec
    )
    wire = gang.to_wire()
    assert wire["members"] == [
        {"rank": 0, "node": NODE, "devices": ["k"]},
        {"rank": 1, "node": "m", "devices": []},
    ]
    for bad in (
        [{"rank": "0", "node": NODE}],
        [{"rank": 0}],
        {"rank": 0},
        [{"rank": 0, "node": NODE, "devices": "k"}],
    ):
        with pytest.raises(WireError, match="members"):
            JobDoc.from_wire({**wire, "members": bad})


# -- refused and counted -------------------------------------------------------------------------


def test_garbage_and_oversized_records_of_every_kind_are_refused_and_counted(
    tmp_path: Path,
) -> None:
    view = _view(tmp_path)
    kinds = ["inventory", "inventory/1", "telemetry", "node", "events", "job/" + "a" * 32]
    bad_payloads = [
        b"\xc1 not msgpack",
        msgpack.packb([1, 2, 3]),
        b"\x00" * (MAX_RECORD_BYTES + 1),
        pack(
            {
                "host": "not a host",
                "s": "rows",
                "drain": 7,
                "e": [{"n": "one"}],
                "job_id": 5,
                "part": 0,
                "parts": 10**6,
            }
        ),
    ]
    for kind in kinds:
        for payload in bad_payloads:
            assert view.apply(NODE, kind, payload, 0.0) is None
    assert sum(view.refused.values()) == len(kinds) * len(bad_payloads)
    assert view.refused["oversized"] == len(kinds)
    assert view.refused_kinds == {
        "inventory": 2 * len(bad_payloads),
        "telemetry": len(bad_payloads),
        "node": len(bad_payloads),
        "events": len(bad_payloads),
        "job": len(bad_payloads),
    }
    # A node's good state stays what it was.
    node = view.node(NODE)
    assert node.inventory is None and node.status is None and node.samples == {}


def test_a_reading_that_is_not_a_number_goes_out_unknown_and_one_received_is_refused(
    tmp_path: Path,
) -> None:
    nan = float("nan")
    sample = DeviceSample("gpu0", util_pct=nan, temp_c=float("inf"), healthy=True)
    sent = TelemetryRecord(1.0, (sample,)).decode(unpack(TelemetryRecord(1.0, (sample,)).encode()))
    assert sent.samples[0].util_pct is None and sent.samples[0].temp_c is None
    view = _view(tmp_path)
    row = ["gpu0", nan, 0, 40.0, None, None, True]
    forged = pack({"v": WIRE_VERSION, "at": 1.0, "s": [row]})
    assert view.apply(NODE, "telemetry", forged, 0.0) is None
    assert view.refused_kinds == {"telemetry": 1}
    assert view.node(NODE).samples == {}  # nothing that is not JSON reaches /v1/nodes


# -- a rolling upgrade ---------------------------------------------------------------------------


def test_records_of_the_previous_version_are_read(tmp_path: Path) -> None:
    """Exactly what a version 1 agent publishes (no ``v``, devices without links, no parts)."""
    view = _view(tmp_path)
    v1_device = {
        "key": "GPU-1",
        "vendor": "nvidia",
        "backend": "cuda",
        "name": "NVIDIA A10",
        "source": "nvml",
        "vendor_index": 0,
        "uuid": "GPU-1",
        "pci_bus_id": "0000:01:00.0",
        "arch": "Ampere",
        "compute_capability": "8.6",
        "unified_memory": False,
        "mem_total_bytes": 24 * 1024**3,
        "temp_slowdown_c": None,
    }
    host = {
        "hostname": "old",
        "os": "linux",
        "arch": "x86_64",
        "cpu_count": 8,
        "mem_total_bytes": 1,
    }
    inventory = {
        "host": host,
        "api": "127.0.0.1:1",
        "labels": {},
        "devices": [v1_device],
        "boot": 2,
    }
    view.apply(NODE, "inventory", pack(inventory), 0.0)
    view.apply(
        NODE, "telemetry", pack({"at": 1.0, "s": [["GPU-1", 5.0, 1, 40.0, 9, 10, True]]}), 0.0
    )
    view.apply(
        NODE,
        "node",
        pack({"drain": "cordoned", "queue": 1, "running": [], "free": ["GPU-1"], "progress": {}}),
        0.0,
    )
    view.apply(
        NODE,
        "events",
        pack({"e": [{"at": 1.0, "kind": "x", "job_id": None, "message": "m", "n": 1}]}),
        0.0,
    )
    node = view.node(NODE)
    assert node.inventory is not None and node.inventory.version == 1
    assert [d.compute_capability for d in node.statics] == ["8.6"] and node.statics[0].links == ()
    assert node.samples["GPU-1"].util_pct == 5.0 and node.drain == "cordoned"
    assert view.events[NODE][0].message == "m" and view.refused == {}


def test_records_of_a_newer_version_are_read_for_what_this_one_knows(tmp_path: Path) -> None:
    view = _view(tmp_path)
    record = _inventory(tuple(SimProber("mi300x:8").discover()))
    newer = []
    for kind, payload in record.encode(limit=MAX_RECORD_BYTES - 1024):  # room for what's added
        doc = unpack(payload)
        doc.update(v=WIRE_VERSION + 5, cooling="liquid")
        for d in doc["devices"]:
            d["ecc"] = 0
            d["links"] = [[*row, 1] for row in d.get("links", ())]  # a fifth element per link
        newer.append((kind, pack(doc)))
    assert all(len(p) <= MAX_RECORD_BYTES for _, p in newer)
    _apply_all(view, newer)
    got = view.node(NODE).inventory
    assert got is not None and got.devices == record.devices and got.version == WIRE_VERSION + 5
    extra_row = ["k", 1.0, 2, 3.0, 4, 5, True, "power_avg_mw", 7]
    view.apply(NODE, "telemetry", pack({"v": 9, "at": 1.0, "s": [extra_row], "new": 1}), 0.0)
    assert view.node(NODE).samples["k"].power_limit_mw == 5
    assert view.refused == {}


# -- job-spec features ---------------------------------------------------------------------------


def test_a_spec_lists_the_features_it_uses_and_a_plain_one_stays_as_it_was() -> None:
    plain = JobSpec(command=("true",))
    assert plain.features == () and "features" not in plain.to_dict()
    gang = JobSpec(command=("true",), resources=Resources(nodes=2, interconnect="nvlink"))
    wire = gang.to_dict()
    assert wire["features"] == ["gang", "interconnect"] and wire["spec_version"] == 2
    assert JobSpec.from_dict(wire) == gang
    on_linux = JobSpec(command=("true",), resources=Resources(os="linux"))
    wire = on_linux.to_dict()
    assert JobSpec.from_dict({**wire, "resources": {"os": "Linux"}}) == on_linux
    assert wire["features"] == ["os"] and wire["spec_version"] == 3
    assert JobSpec.from_dict(wire) == on_linux
    assert "os" not in plain.to_dict()["resources"]  # a version 2 agent still reads a plain spec


def test_a_spec_with_an_unknown_feature_is_refused_naming_the_version_it_needs() -> None:
    wire = {**JobSpec(command=("true",)).to_dict(), "teleport": "mars"}
    with pytest.raises(ValueError, match="unknown key 'teleport'"):  # a typo stays a typo
        JobSpec.from_dict(wire)
    newer = {**wire, "features": ["teleport"], "spec_version": 7}
    with pytest.raises(
        UnknownFeatures,
        match=r"needs job-spec version 7 \(feature teleport\); this agent reads version 3",
    ):
        JobSpec.from_dict(newer)
    lying = {**JobSpec(command=("true",)).to_dict(), "features": ["gang"]}
    with pytest.raises(ValueError, match="declares"):
        JobSpec.from_dict(lying)


def test_an_owner_offers_a_job_only_to_agents_that_run_its_features() -> None:
    d = DeviceStatic(key="h0", vendor="nvidia", backend="cuda", name="H100", source="sim")
    older = NodeView("older", inventory=_inventory((d,)))
    newer = NodeView("newer", inventory=_inventory((d,), features=("gang",)))
    newest = NodeView("newest", inventory=_inventory((d,), features=("gang",)))
    gang = JobSpec(command=("x",), resources=Resources(gpus_per_node=1, nodes=2))
    sets = FirstFit().gang_candidates(gang, [older, newer, newest])
    assert [[c.node_id for c in s] for s in sets] == [["newer", "newest"]]
    assert FirstFit().gang_candidates(gang, [older, newer]) == []
    assert FirstFit().why_pending(gang) == "no 2 schedulable nodes have 1 free GPU each"


MEMBERS = (GangMember(0, "a" * 64, ("nvidia:0", "nvidia:1")), GangMember(1, "b" * 64, ("k",)))


def test_a_one_node_job_has_no_members_field_and_a_gang_lists_them_by_rank() -> None:
    plain = JobStatus("j" * 32, "running", 1, NODE, NODE, ("k",))
    assert "members" not in plain.to_wire()
    assert "rank" not in AttemptEntry(1, NODE, 1.0).to_wire()
    gang = plain._replace(members=MEMBERS)
    assert gang.to_wire()["members"] == [
        {"rank": 0, "node": "a" * 64, "devices": ["nvidia:0", "nvidia:1"]},
        {"rank": 1, "node": "b" * 64, "devices": ["k"]},
    ]
    assert JobStatus.from_wire(unpack(gang.encode())) == gang


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ([{"rank": 1, "node": "a", "devices": []}], "ranks must run 0..0 in order"),
        (
            [{"rank": 0, "node": "a", "devices": []}, {"rank": 1, "node": "a", "devices": []}],
            "a node appears twice",
        ),
        ([{"rank": 0, "devices": []}], "members\\[0\\].node"),
        ({"rank": 0}, "members: expected a list"),
    ],
)
def test_malformed_members_are_refused_naming_the_field(members: Any, message: str) -> None:
    doc = {**JobStatus("j" * 32, "running").to_wire(), "members": members}
    with pytest.raises(WireError, match=message):
        JobStatus.from_wire(doc)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"members": [MEMBERS[0].to_wire()]}, "a gang has at least two"),
        ({"ttl_s": 0}, "ttl_s"),
        ({"ttl_s": 3600}, "ttl_s"),
        ({"ttl_s": 30.5}, r"^ttl_s: a hold lasts more than 0 and at most 30 s, not 30.5 s$"),
        ({"ttl_s": 600}, "at most 30 s, not 600 s"),
        ({"ttl_s": math.nan}, "ttl_s: expected a finite number"),
        ({"submission": "not base64!"}, "submission: not base64"),
    ],
)
def test_a_malformed_prepare_is_refused(change: dict[str, Any], message: str) -> None:
    body = {**GangPrepare("j" * 32, 1, NODE, MEMBERS, b"s", 30.0).to_wire(), **change}
    with pytest.raises(WireError, match=message):
        GangPrepare.from_wire(body)


@pytest.mark.parametrize("value", [MAX_WIRE_INT + 1, -MAX_WIRE_INT - 1, 2**64 - 1, 2**64, -(2**70)])
def test_every_integer_field_is_bounded_and_one_beyond_is_refused_naming_it(value: int) -> None:
    """One reader bounds every integer, whatever record, call or document it is in."""
    detail = OwnerDetail(gen=MAX_WIRE_INT).to_wire()
    assert OwnerDetail.from_wire(detail).gen == MAX_WIRE_INT
    job = JobStatus("j" * 32, "running", attempt=1, owner=NODE, submitted_at=1.0)
    transfer = JobTransfer(job, OwnerDetail(), b"s").to_wire()
    cases: list[tuple[Any, dict[str, Any], str]] = [
        (OwnerDetail.from_wire, {**detail, "gen": value}, "detail.gen"),
        (
            JobTransfer.from_wire,
            {**transfer, "detail": {**detail, "failures": value}},
            "detail.failures",
        ),
        (JobStatus.from_wire, {**job.to_wire(), "gen": value}, "gen"),
        (
            StopRequest.from_wire,
            {**StopRequest("j" * 32, 1, "cancel").to_wire(), "attempt": value},
            "attempt",
        ),
        (StatusAnswer.from_wire, {"running": True, "attempt": value}, "attempt"),
        (NodeRecord.decode, {**unpack(NodeRecord().encode()), "queue": value}, "queue"),
        # An integer in a number field too (a float of it would overflow or lose digits).
        (JobStatus.from_wire, {**job.to_wire(), "started_at": value}, "started_at"),
    ]
    for decode, doc, name in cases:
        with pytest.raises(WireError, match=f"{name}: .*out of range"):
            decode(doc)
    with pytest.raises(ValueError, match=r"gpus_per_node: .*out of range"):
        JobSpec.from_dict(
            {**JobSpec(command=("true",)).to_dict(), "resources": {"gpus_per_node": value}}
        )


def test_a_commit_names_a_tcp_port() -> None:
    body = {**GangCommit("j" * 32, 1, "h", 1).to_wire(), "master_port": 70000}
    with pytest.raises(WireError, match="master_port: not a TCP port"):
        GangCommit.from_wire(body)


def test_a_node_record_names_a_shared_devices_jobs_by_their_place_in_running() -> None:
    a, b = "a" * 32, "b" * 32
    record = NodeRecord(running=(a, b), free=(), shares={"k0": {b: 5 << 30, a: 1 << 30}})
    doc = unpack(record.encode())
    assert doc["shares"] == {"k0": [[1, 5 << 30], [0, 1 << 30]]}  # a few bytes, not two ids
    assert NodeRecord.decode(doc) == record
    with pytest.raises(WireError, match="no running job 2"):
        NodeRecord.decode({**doc, "shares": {"k0": [[2, 1]]}})


def test_a_place_record_carries_the_images_and_environments_held() -> None:
    from agent.wire.place import HeldContent, PlaceRecord

    digest = "ab" * 32
    held = (HeldContent("image", "reg:5000/team/train:1", digest, 200 << 20),)
    record = PlaceRecord(content=(*held, HeldContent("env", "env-0123", "cd" * 32, 5 << 20)))
    payload, left_out = record.encode()
    assert left_out == 0
    from agent.wire import codec

    back = PlaceRecord.decode(codec.unpack(payload))
    assert back.content == record.content
    assert "content" not in codec.unpack(PlaceRecord().encode()[0])  # as older agents write it
    for bad in (["image", "x", "nothex", 1], ["dataset", "x", digest, 1], ["env", "x", digest, -1]):
        with pytest.raises(WireError):
            PlaceRecord.decode({"content": [bad]})
