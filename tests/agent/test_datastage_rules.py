"""The rules of a job's datasets that need no agent: the variable each name becomes, names that
would share one refused, the node record's staging lines bounded on the wire, and the wait
histogram's buckets."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agent.running.datastage import (
    BadDatasets,
    WaitHistogram,
    check_names,
    env_name,
    places_unheard,
)
from agent.wire.codec import WireError, unpack
from agent.wire.place import PlaceRecord
from agent.wire.records import MAX_STAGING_LINE_CHARS, MAX_STAGING_LINES, NodeRecord


def test_the_variable_of_a_dataset_name() -> None:
    assert env_name("imagenet") == "SHOAL_DATA_IMAGENET"
    assert env_name("imagenet-1k.v2") == "SHOAL_DATA_IMAGENET_1K_V2"
    assert env_name("C4_en") == "SHOAL_DATA_C4_EN"


def test_names_that_share_a_variable_or_repeat_are_refused() -> None:
    assert [r.name for r in check_names(["a", "b@" + "0" * 64])] == ["a", "b"]
    for refs in (["a.b", "a-b"], ["Data", "data"], ["x", "x@" + "1" * 64]):
        with pytest.raises(BadDatasets):
            check_names(refs)


def test_staging_lines_travel_bounded_in_the_node_record() -> None:
    line = "staging imagenet 43% (1.2 GB/s from 3 holders, ~40 s)"
    record = NodeRecord(staging={"j1": line})
    assert NodeRecord.decode(unpack(record.encode())).staging == {"j1": line}
    assert NodeRecord.decode(unpack(NodeRecord().encode())).staging == {}
    many = {f"j{i:02d}": "x" * 500 for i in range(MAX_STAGING_LINES + 5)}
    sent = NodeRecord.decode(unpack(NodeRecord(staging=many).encode())).staging
    assert len(sent) == MAX_STAGING_LINES
    assert all(len(v) == MAX_STAGING_LINE_CHARS for v in sent.values())
    doc = unpack(NodeRecord().encode())
    for bad in ({"j": "x" * (MAX_STAGING_LINE_CHARS + 1)}, {"j": 3}, "lines"):
        with pytest.raises(WireError):
            NodeRecord.decode({**doc, "staging": bad})
    too_many = {f"j{i}": "x" for i in range(MAX_STAGING_LINES + 1)}
    with pytest.raises(WireError):
        NodeRecord.decode({**doc, "staging": too_many})


def test_the_wait_histogram_is_cumulative() -> None:
    h = WaitHistogram(buckets_s=(0.0, 1.0, 10.0))
    for s in (0.0, 0.5, 3.0, 100.0):
        h.observe(s)
    assert h.cumulative() == [("0.0", 1), ("1.0", 2), ("10.0", 3), ("+Inf", 4)]
    assert h.sum_s == 103.5


def test_a_view_fills_until_every_live_member_has_said_what_it_holds() -> None:
    """What a stage that found no holder asks before it stops looking (``Stager.view_filling``):
    a live member with no ``place`` record yet might hold it; a dead one is not waited for."""
    said = SimpleNamespace(place=PlaceRecord())
    unsaid = SimpleNamespace(place=None)
    view = SimpleNamespace(nodes={"me": unsaid, "a": said, "b": unsaid})
    assert places_unheard(view, lambda: ["me", "a", "b"], "me")  # type: ignore[arg-type]
    assert not places_unheard(view, lambda: ["me", "a"], "me")  # type: ignore[arg-type]
    assert places_unheard(view, lambda: ["me", "a", "new"], "me")  # type: ignore[arg-type]
