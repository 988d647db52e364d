"""Codec: round trips for every message kind, and one DecodeError for anything malformed."""

from __future__ import annotations

import contextlib
import tracemalloc

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gossip.codec import (
    LIVE_REMEMBERED_UPDATES,
    PROTOCOL_VERSION,
    DecodeError,
    EncodeError,
    decode,
    encode,
    encoded_size,
    remember_updates,
    signing_bytes,
    wire_size,
)
from gossip.messages import (
    Ack,
    Alive,
    Compound,
    Dead,
    IndirectPingReq,
    MemberDigest,
    MemberState,
    Message,
    Nack,
    Ping,
    PushPull,
    Record,
    RecordDigest,
    Suspect,
    Update,
)
from gossip.sim import Simulation
from gossip.vivaldi import Coordinate

ids = st.text(min_size=1, max_size=40)
ints = st.integers(min_value=0, max_value=(1 << 63) - 1)
blobs = st.binary(max_size=200)
floats = st.floats(allow_nan=False, allow_infinity=False)
coords = st.builds(
    Coordinate, st.lists(floats, min_size=8, max_size=8).map(tuple), floats, floats, floats
)
updates: st.SearchStrategy[Update] = st.one_of(
    st.builds(Alive, ids, ints, ids, blobs, blobs),
    st.builds(Suspect, ids, ints, ids, blobs),
    st.builds(Dead, ids, ints, ids, blobs),
    st.builds(Record, ids, ids, ints, ints, blobs, blobs),
)
probes: st.SearchStrategy[Message] = st.one_of(
    st.builds(Ping, ints, ids, ids),
    st.builds(Ack, ints, ids, st.none() | coords),
    st.builds(Nack, ints, ids),
    st.builds(IndirectPingReq, ints, ids, ids, ids, st.booleans()),
)
push_pulls = st.builds(
    PushPull,
    ids,
    st.integers(0, 2),
    st.lists(st.builds(MemberDigest, ids, ints, st.sampled_from(MemberState)), max_size=5).map(
        tuple
    ),
    st.lists(st.builds(RecordDigest, ids, ids, ints, ints), max_size=5).map(tuple),
    st.lists(updates, max_size=5).map(tuple),
)
messages: st.SearchStrategy[Message] = st.one_of(
    probes,
    updates,
    push_pulls,
    st.builds(Compound, st.lists(st.one_of(probes, updates), min_size=1, max_size=6).map(tuple)),
)


@settings(max_examples=300, deadline=None)
@given(messages)
def test_round_trip(m: Message) -> None:
    assert decode(encode(m)) == m


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_raises_only_decode_error(data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        decode(data)


@settings(max_examples=300, deadline=None)
@given(messages, st.data())
def test_corrupted_messages_raise_only_decode_error(m: Message, data: st.DataObject) -> None:
    raw = bytearray(encode(m))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] = data.draw(st.integers(0, 255))
    with contextlib.suppress(DecodeError):
        decode(bytes(raw))


def _pack(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",  # reserved msgpack byte
        _pack({"v": 1}),
        _pack([PROTOCOL_VERSION + 1, 1, 5, "a", "b"]),  # future protocol version
        _pack([True, 1, 5, "a", "b"]),  # version must be an int, not a bool
        _pack([PROTOCOL_VERSION, 1, 5, "a"]),  # ping with a missing field
        _pack([PROTOCOL_VERSION, 1, -5, "a", "b"]),  # negative seq
        _pack([PROTOCOL_VERSION, 1, 5, b"a", "b"]),  # bytes where a str belongs
        _pack([PROTOCOL_VERSION, 1, 5, "", "b"]),  # empty node id
        _pack([PROTOCOL_VERSION, 1, 5, "a" * 300, "b"]),  # node id too long
        _pack([PROTOCOL_VERSION, 99, 5]),  # unknown kind
        _pack([PROTOCOL_VERSION, 3, 1, "a", [[1.0], 0.1, 0.0, float("nan")]]),  # nan in coord
        _pack([PROTOCOL_VERSION, 10, [[10, [[1, 1, "a", "b"]]]]]),  # nested compound
        _pack([PROTOCOL_VERSION, 10, []]),  # empty compound
        _pack([PROTOCOL_VERSION, 9, "a", 7, [], [], []]),  # bad push-pull phase
        _pack([PROTOCOL_VERSION, 9, "a", 0, [["n", 1, 9]], [], []]),  # bad member state
        _pack([PROTOCOL_VERSION, 9, "a", 0, [], [], [[1, 1, "a", "b"]]]),  # ping as an update
        _pack([PROTOCOL_VERSION, 5, "n", 1, "a", b"c" * 20000, b"s"]),  # oversized credential
        _pack(msgpack.ExtType(5, b"xx")),
        _pack([PROTOCOL_VERSION, 1, 5, "a", "b"])[:-1],  # truncated
        _pack([PROTOCOL_VERSION, 1, 5, "a", "b"]) + b"\x00",  # trailing bytes
    ],
)
def test_malformed_is_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        decode(data)


def test_size_limits() -> None:
    big = Record("o", "k", 1, 1, b"x" * 5000, b"s")
    data = encode(big)
    with pytest.raises(DecodeError):
        decode(data, max_bytes=4096)
    with pytest.raises(EncodeError):
        encode(big, max_bytes=4096)


def test_wire_layout_is_versioned_arrays() -> None:
    assert msgpack.unpackb(encode(Ping(7, "a", "b"))) == [PROTOCOL_VERSION, 1, 7, "a", "b"]


@settings(max_examples=300, deadline=None)
@given(messages)
def test_wire_size_is_the_encoded_length(m: Message) -> None:
    assert wire_size(m) == len(encode(m))


def test_wire_size_of_large_digests_and_compounds() -> None:
    members = tuple(MemberDigest(f"n{i:04d}", 1_000_000 + i, MemberState(i % 4)) for i in range(40))
    records = tuple(RecordDigest(f"n{i:04d}", "inv", 1, i) for i in range(17))
    ups = tuple(Suspect(f"n{i:04d}", 7, "acc", b"s" * 32) for i in range(18))
    pp = PushPull("n0001", 1, members, records, ups)
    assert wire_size(pp) == len(encode(pp))
    comp = Compound((Ping(70000, "a", "b"), *ups))
    assert wire_size(comp) == len(encode(comp))
    # 18 parts need msgpack's 3-byte array header: 1 + 1 + 1 + 3 + parts
    assert (
        wire_size(comp)
        == 6 + len(encode(Ping(70000, "a", "b"))) - 1 + 18 * len(encode(ups[0])) - 18
    )


def test_a_live_member_keeps_only_a_few_of_the_updates_it_sized_or_verified() -> None:
    """Sizes and signing bytes are remembered by identity, each entry holding its update: a live
    member must not keep every record it has seen (an agent under load kept ~4 KB per job
    record, for hours)."""
    records = 4 * LIVE_REMEMBERED_UPDATES
    payload_bytes = 4000
    remember_updates(LIVE_REMEMBERED_UPDATES)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(records):
            r = Record("n1", f"job/{i}", 1, 1, bytes(payload_bytes), b"s" * 64)
            signing_bytes(r)
            encoded_size(r)
        del r
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    everything = records * 2 * payload_bytes  # each payload, and the signing bytes holding it
    assert held < everything / 2


def test_the_simulator_remembers_many_updates() -> None:
    """Its cores all size and verify the very same update objects."""
    try:
        Simulation(n=3, seed=1)
        records = [Record("n1", f"job/{i}", 1, 1, b"x", b"s") for i in range(2000)]
        first = [signing_bytes(r) for r in records]
        assert all(signing_bytes(r) is b for r, b in zip(records, first, strict=True))
    finally:
        remember_updates(LIVE_REMEMBERED_UPDATES)
