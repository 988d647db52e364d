"""Dataset versions on the wire and in the policy: NAME and NAME@DIGEST, the place record's
versions (partial copies counted, old readers unaffected), and the missing bytes per node."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace
from typing import cast

import pytest

from agent.job.specreader import spec_from_mapping
from agent.mesh.view import ClusterView, NodeView
from agent.owning.datawait import unheld_reason
from agent.policy import adapt
from agent.policy.decision import context
from agent.policy.model import ThroughputModel
from agent.policy.scoring import transfer_s
from agent.policy.snapshot import Job, Node, Snapshot
from agent.wire.codec import MAX_RECORD_BYTES, WireError, pack, unpack
from agent.wire.place import (
    DatasetRef,
    HeldVersion,
    PlaceRecord,
    dataset_ref_problem,
    parse_dataset_ref,
)

D1 = hashlib.sha256(b"v1").hexdigest()
D2 = hashlib.sha256(b"v2").hexdigest()
GIB = 1 << 30


def test_a_dataset_is_named_alone_or_with_one_version() -> None:
    assert parse_dataset_ref("imagenet") == DatasetRef("imagenet")
    assert parse_dataset_ref(f"imagenet@{D1}") == DatasetRef("imagenet", D1)
    assert str(DatasetRef("imagenet", D1)) == f"imagenet@{D1}"
    for bad, why in [
        ("../x", "one path component"),
        ("imagenet@", "64 lowercase hex"),
        (f"imagenet@{D1.upper()}", "64 lowercase hex"),
        (f"imagenet@{D1}@{D2}", "64 lowercase hex"),
        ("@" + D1, "empty"),
    ]:
        problem = dataset_ref_problem(bad)
        assert problem is not None and why in problem and "\n" not in problem


def test_a_job_spec_names_versions_and_refuses_a_bad_one() -> None:
    spec = {"command": ["true"], "datasets": [f"imagenet@{D1}", "c4"]}
    assert spec_from_mapping(spec, human=False, now=None).datasets == (f"imagenet@{D1}", "c4")
    with pytest.raises(ValueError, match="64 lowercase hex"):
        spec_from_mapping(spec | {"datasets": ["imagenet@abc"]}, human=False, now=None)


def test_the_place_record_carries_versions_and_old_readers_still_read_it() -> None:
    versions = (
        HeldVersion("imagenet", D1, 100 * GIB, 100 * GIB, 1000.0),
        HeldVersion("imagenet", D2, 120 * GIB, 30 * GIB, 2000.0),
    )
    record = PlaceRecord({"imagenet": 100 * GIB}, None, versions)
    payload, left_out = record.encode()
    assert left_out == 0
    doc = unpack(payload)
    back = PlaceRecord.decode(doc)
    assert back.versions == (versions[0], versions[1]) and dict(back.datasets) == record.datasets
    # an older reader reads the fields it knows; a record from an older writer has no versions
    assert doc["datasets"] == [["imagenet", 100 * GIB]]
    old = PlaceRecord.decode(unpack(pack({"v": 1, "datasets": [["imagenet", 5]]})))
    assert old.versions == ()


def test_versions_that_do_not_fit_are_the_smallest() -> None:
    versions = tuple(
        HeldVersion(f"shard-{i:04d}", hashlib.sha256(str(i).encode()).hexdigest(), i + 1, i, 1.0)
        for i in range(400)
    )
    payload, left_out = PlaceRecord(versions=versions).encode()
    assert len(payload) <= MAX_RECORD_BYTES
    kept = PlaceRecord.decode(unpack(payload)).versions
    assert left_out == 400 - len(kept) > 0
    assert min(v.held_bytes for v in kept) > max(v.held_bytes for v in versions if v not in kept)


@pytest.mark.parametrize(
    "row",
    [
        ["../x", D1, 1, 1, 0.0],
        ["x", "abc", 1, 1, 0.0],
        ["x", D1, 1, 2, 0.0],
        ["x", D1, -1, -1, 0.0],
        ["x", D1, 1],
    ],
)
def test_a_bad_version_row_is_refused(row: list[object]) -> None:
    with pytest.raises(WireError):
        PlaceRecord.decode({"versions": [row]})


def _ctx(nodes: tuple[Node, ...], views: list[NodeView]) -> object:
    snapshot = Snapshot(
        now=0.0,
        nodes=nodes,
        dataset_bytes=adapt.dataset_bytes(views),
        dataset_newest=adapt.dataset_newest(views),
    )
    return context(snapshot, ThroughputModel())[0]


def test_placement_counts_the_bytes_each_node_lacks_partial_copies_included() -> None:
    whole = NodeView(
        "whole",
        place=PlaceRecord(versions=(HeldVersion("imagenet", D2, 100 * GIB, 100 * GIB, 2.0),)),
    )
    half = NodeView(
        "half", place=PlaceRecord(versions=(HeldVersion("imagenet", D2, 100 * GIB, 50 * GIB, 2.0),))
    )
    old = NodeView(
        "old", place=PlaceRecord(versions=(HeldVersion("imagenet", D1, 90 * GIB, 90 * GIB, 1.0),))
    )
    empty = NodeView("empty")
    views = [whole, half, old, empty]
    assert adapt.dataset_newest(views) == {"imagenet": D2}
    nodes = tuple(adapt.node_from_view(v) for v in views)
    ctx = _ctx(nodes, views)
    job = Job(job_id="j", datasets=("imagenet",))
    secs = {n.node_id: transfer_s(job, n, ctx) for n in nodes}  # type: ignore[arg-type]
    assert secs["whole"] == 0.0
    assert 0.0 < secs["half"] < secs["empty"]
    assert secs["half"] == pytest.approx(secs["empty"] / 2, rel=0.01)
    assert secs["old"] == pytest.approx(secs["empty"], rel=0.01)  # NAME is the newest version
    pinned = Job(job_id="k", datasets=(f"imagenet@{D1}",))
    assert transfer_s(pinned, nodes[2], ctx) == 0.0  # type: ignore[arg-type]
    assert transfer_s(pinned, nodes[0], ctx) > 0.0  # type: ignore[arg-type]


def test_a_job_waits_while_no_live_member_holds_its_dataset_whole() -> None:
    half = NodeView(
        "half", place=PlaceRecord(versions=(HeldVersion("imagenet", D2, 100 * GIB, 20 * GIB, 2.0),))
    )
    whole = NodeView(
        "whole",
        place=PlaceRecord(versions=(HeldVersion("imagenet", D2, 100 * GIB, 100 * GIB, 2.0),)),
    )
    view = cast(ClusterView, SimpleNamespace(nodes={"half": half, "whole": whole}))
    by_name = spec_from_mapping(
        {"command": ["true"], "datasets": ["imagenet"]}, human=False, now=None
    )
    by_digest = spec_from_mapping(
        {"command": ["true"], "datasets": [f"imagenet@{D2}"]}, human=False, now=None
    )
    for spec in (by_name, by_digest):
        assert unheld_reason(spec, view, {"half", "whole"}) is None
        reason = unheld_reason(spec, view, {"half"})
        assert reason is not None and reason.endswith(
            ": no member holds it whole (the fullest copy: 20%)"
        )
        assert unheld_reason(spec, view, set()) == (
            f"waiting: dataset {spec.datasets[0]}: no member holds it"
        )
