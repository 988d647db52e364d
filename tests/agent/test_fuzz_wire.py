"""Fuzzing the wire contract: every record, API document and call body decoder, and a cluster
view fed hostile gossip records. Each returns its typed value or raises ``WireError``; a view
refuses and counts what does not decode, and raises nothing."""

from __future__ import annotations

import contextlib
from typing import Any

import msgpack
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from agent.job.jobspec import JobSpec
from agent.mesh.view import ClusterView
from agent.wire import codec as c
from agent.wire.calls import (
    AttemptResult,
    JobTransfer,
    OwnerDetail,
    StartAnswer,
    StartOffer,
    StatusAnswer,
    StatusRequest,
    StopAnswer,
    StopRequest,
)
from agent.wire.codec import WireError, pack
from agent.wire.documents import (
    DeviceDoc,
    EventDoc,
    EventsDoc,
    JobDoc,
    NodeDoc,
    jobs_from_wire,
    nodes_from_wire,
)
from agent.wire.health import HealthDoc
from agent.wire.inventory import InventoryRecord
from agent.wire.records import (
    AttemptEntry,
    EventsRecord,
    GossipedEvent,
    JobStatus,
    NodeRecord,
    TelemetryRecord,
)
from probers.records import DeviceSample, HostInfo
from probers.sim import SimProber
from tests.agent.authority_kit import Kit
from tests.hostile import ANY, FUZZ, FUZZ_EACH, JSON, mutated

HOST = HostInfo("gpu-01", "linux", "x86_64", 64, 512 * 1024**3)
NODE = "n" * 32
JOB = "a" * 32

_STATIC = SimProber("h100:2").discover()[0]
_DEVICE = DeviceDoc(0, _STATIC, DeviceSample(_STATIC.key, 10, 5.0, 40.0, 100_000, 700_000))
_ENTRY = AttemptEntry(1, NODE, 1.0, 2.0, "exit", 0)
_STATUS = JobStatus(
    JOB, "running", 1, NODE, NODE, ("k",), 1.0, 2.0, None, None, None, None, 3, (_ENTRY,)
)
_RESULT = AttemptResult(JOB, 1, 0, None, "exit", 1.0, 2.0)
_NODE = NodeDoc(
    NODE,
    "127.0.0.1:1",
    "alive",
    "agent",
    "schedulable",
    {"z": "a"},
    HOST,
    (_DEVICE,),
    1.5,
    ("j",),
    2,
    2,
    ("gang",),
)
_JOBDOC = JobDoc(_STATUS, JobSpec(command=("true",)).to_dict(), 0.5, 10.0)
_EVENTS = EventsDoc((EventDoc(1, 2.0, "started", NODE, None, "hi"),), 1)

# (decoder, a valid wire form): each decoder of the API documents and the agent-to-agent calls
DOCUMENTS: list[tuple[Any, Any]] = [
    (NodeDoc.from_wire, _NODE.to_wire()),
    (DeviceDoc.from_wire, _DEVICE.to_wire()),
    (JobDoc.from_wire, _JOBDOC.to_wire()),
    (EventsDoc.from_wire, _EVENTS.to_wire()),
    (HealthDoc.from_wire, HealthDoc(True, NODE, 3).to_wire()),
    (nodes_from_wire, {"nodes": [_NODE.to_wire()]}),
    (jobs_from_wire, {"jobs": [_JOBDOC.to_wire()]}),
    (JobTransfer.from_wire, JobTransfer(_STATUS, OwnerDetail(gen=3), b"sealed").to_wire()),
    (OwnerDetail.from_wire, OwnerDetail(("k",), 1.0, attempts=(_ENTRY,)).to_wire()),
    (StartOffer.from_wire, StartOffer(JOB, 1, NODE, ("k",), b"sealed").to_wire()),
    (StartAnswer.from_wire, StartAnswer(True, None, 123).to_wire()),
    (StopRequest.from_wire, StopRequest(JOB, 1, "drain", 5.0).to_wire()),
    (StopAnswer.from_wire, StopAnswer(True, _RESULT).to_wire()),
    (StatusRequest.from_wire, StatusRequest(JOB).to_wire()),
    (StatusAnswer.from_wire, StatusAnswer(True, 1, _RESULT).to_wire()),
    (AttemptResult.from_wire, _RESULT.to_wire()),
    (JobStatus.from_wire, _STATUS.to_wire()),
    (AttemptEntry.from_wire, _ENTRY.to_wire()),
    (GossipedEvent.from_wire, GossipedEvent(1, 2.0, "x", None, "m").to_wire()),
]


def _decodes_or_wire_error(decode: Any, value: Any) -> None:
    with contextlib.suppress(WireError):
        decode(value)


@pytest.mark.parametrize(("decode", "valid"), DOCUMENTS, ids=[d.__qualname__ for d, _ in DOCUMENTS])
@FUZZ_EACH
@given(data=st.data())
def test_a_document_or_call_body_decodes_or_is_a_wire_error(
    decode: Any, valid: Any, data: st.DataObject
) -> None:
    decode(valid)  # the valid form decodes
    value = data.draw(mutated(valid, JSON) | JSON, label="value")
    _decodes_or_wire_error(decode, value)


@FUZZ
@given(value=JSON)
@example(value={"submission": "ü"})  # not ASCII: base64 refused it with a ValueError of its own
@example(value={"submission": "QQ"})  # base64 missing its padding
def test_a_sealed_field_that_is_not_base64_is_a_wire_error(value: Any) -> None:
    doc = {**StartOffer(JOB, 1, NODE, ("k",), b"sealed").to_wire()}
    doc.update(value if isinstance(value, dict) else {"submission": value})
    _decodes_or_wire_error(StartOffer.from_wire, doc)


# -- gossip records, through a cluster view ------------------------------------------------------

_INVENTORY = InventoryRecord(HOST, "127.0.0.1:7946", {"zone": "a"}, 3, (_STATIC,))
RECORDS: list[tuple[str, bytes]] = [
    *_INVENTORY.encode(),
    ("telemetry", TelemetryRecord(1.0, (_DEVICE.sample,)).encode()),  # type: ignore[arg-type]
    ("node", NodeRecord("schedulable", 1, (JOB,), ("k",), {JOB: (0.5, 10.0)}).encode()),
    ("events", EventsRecord((GossipedEvent(1, 2.0, "x", JOB, "m"),)).encode()),
    ("job/" + JOB, _STATUS.encode()),
]


@pytest.fixture(scope="module")
def view(tmp_path_factory: pytest.TempPathFactory) -> ClusterView:
    kit = Kit(tmp_path_factory.mktemp("kit"))
    a = kit.agent("a")
    return ClusterView(kit.authority(a.node_id, lambda: [a.node_id], a))


def test_every_record_kind_is_fuzzed() -> None:
    kinds = {kind.split("/")[0] for kind, _ in RECORDS}
    assert kinds == {"inventory", "telemetry", "node", "events", "job"}


@pytest.mark.parametrize(("kind", "payload"), RECORDS, ids=[k for k, _ in RECORDS])
@FUZZ_EACH
@given(data=st.data())
def test_a_hostile_gossip_record_is_refused_and_counted_never_raised(
    view: ClusterView, kind: str, payload: bytes, data: st.DataObject
) -> None:
    valid = msgpack.unpackb(payload, raw=False)
    value = data.draw(mutated(valid, ANY) | ANY, label="value")
    try:
        hostile = msgpack.packb(value, use_bin_type=True)
    except (OverflowError, ValueError, TypeError):  # msgpack cannot carry it
        return
    before = sum(view.refused.values())
    try:
        c.unpack(hostile)
        decodes = True
    except WireError:
        decodes = False
    view.apply(NODE, kind, hostile, 1.0)
    if not decodes:
        assert sum(view.refused.values()) == before + 1


@FUZZ
@given(payload=st.binary(max_size=300))
def test_garbage_bytes_are_a_wire_error(payload: bytes) -> None:
    with contextlib.suppress(WireError):
        c.unpack(payload)


def test_a_record_larger_than_the_limit_is_not_unpacked() -> None:
    with pytest.raises(WireError):
        c.unpack(pack({"x": "y" * 10}) + b"\x00")
