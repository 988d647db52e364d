"""Signed records: accepted by version, and forged, replayed, oversized, unknown, revoked or
malformed input rejected and counted; how many times a core sends each."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace

from gossip.codec import DecodeError, decode, encode
from gossip.config import GossipConfig
from gossip.events import RecordChanged
from gossip.incarnation import MAX_INCARNATION
from gossip.messages import Alive, Compound, Record
from gossip.peer import Peer
from gossip.records import Offer, RecordStore
from gossip.simkeys import SimSigner, SimTrust
from tests.gossip.helpers import KEYRING, alive, make_peer, record


def _peer() -> Peer:
    p = make_peer()
    p.preload([alive("o", 5), alive("evil", 5)], 0.0)
    p.events()
    return p


def test_newer_version_accepted_with_received_at() -> None:
    p = _peer()
    p.receive("o:1", record("o", "telemetry", 5, 1, b"v1"), 1.0)
    p.receive("o:1", record("o", "telemetry", 5, 2, b"v2"), 2.5)
    got = p.record("o", "telemetry")
    assert got is not None and got.record.payload == b"v2" and got.received_at == 2.5
    assert got.age_s(4.0) == 1.5
    assert [e.payload for e in p.events() if isinstance(e, RecordChanged)] == [b"v1", b"v2"]


def test_forged_signature_rejected() -> None:
    p = _peer()
    p.receive("evil:1", record("o", "inventory", 5, 1, b"fake", signer="evil"), 1.0)
    assert p.record("o", "inventory") is None
    assert p.stats.rejected_signature == 1
    good = record("o", "inventory", 5, 1, b"real")
    altered = Record(good.origin, good.kind, 5, 1, b"altered", good.signature)
    p.receive("evil:1", altered, 1.0)
    assert p.stats.rejected_signature == 2


def test_replay_of_older_version_rejected() -> None:
    p = _peer()
    old = record("o", "job", 5, 1, b"old")
    p.receive("o:1", record("o", "job", 5, 3, b"new"), 1.0)
    p.receive("evil:1", old, 2.0)
    p.receive("evil:1", record("o", "job", 5, 3, b"same-version-other-bytes"), 2.0)
    held = p.record("o", "job")
    assert held is not None and held.record.payload == b"new"
    assert p.stats.rejected_replay == 2
    p.receive("o:1", record("o", "job", 5, 3, b"new"), 3.0)
    assert p.stats.duplicates == 1 and p.stats.rejected_replay == 2


def test_oversize_rejected() -> None:
    p = _peer()
    p.receive("o:1", record("o", "telemetry", 5, 1, b"x" * 5000), 1.0)
    assert p.stats.rejected_oversize == 1 and p.record("o", "telemetry") is None


def test_unknown_origin_and_revoked() -> None:
    p = _peer()
    p.receive("o:1", record("stranger", "telemetry", 1, 1, b"x"), 1.0)
    assert p.stats.rejected_unknown_origin == 1
    KEYRING.revoked.add("evil")
    try:
        p.receive("evil:1", record("evil", "telemetry", 5, 1, b"x"), 1.0)
        p.receive("evil:1", alive("evil", 6), 1.0)
    finally:
        KEYRING.revoked.discard("evil")
    assert p.stats.rejected_revoked == 2


def test_bad_credential_not_admitted() -> None:
    p = _peer()
    a = alive("mallory", 1)
    p.receive("m:1", Alive(a.node, 1, a.addr, b"not-a-cert", a.signature), 1.0)
    assert p.member("mallory") is None and p.stats.rejected_credential == 1


def test_malformed_bytes_and_nesting() -> None:
    p = _peer()
    raw = bytearray(encode(record("o", "k", 5, 1, b"abc")))
    raw[3] ^= 0xFF
    try:
        p.receive("o:1", decode(bytes(raw)), 1.0)
    except DecodeError:
        p.stats.rejected_malformed += 1  # what the transport does
    assert p.stats.rejected_malformed == 1
    p.receive("o:1", Compound((Compound((record("o", "k", 5, 1, b"a"),)),)), 1.0)
    assert p.stats.rejected_malformed == 2


def test_publish_is_signed_and_versioned() -> None:
    p = make_peer(boot=77)
    r1 = p.publish("inventory", b"a", 1.0)
    r2 = p.publish("inventory", b"b", 2.0)
    assert (r1.incarnation, r1.counter, r2.counter) == (77, 1, 2)
    q = make_peer("other")
    q.preload([alive("me", 77)], 0.0)
    q.receive("me:1", r2, 3.0)
    q.receive("me:1", r1, 3.0)
    assert q.record("me", "inventory").record.payload == b"b"  # type: ignore[union-attr]
    assert q.stats.rejected_replay == 1


def _sends_of_one_update(records_retransmit_min: int | None) -> tuple[int, int]:
    """How many times a 32-member core sends one record of its own, and one alive it learns,
    over a minute of rounds (probes and gossip alike)."""
    cfg = GossipConfig(
        node_id="me",
        addr="me:1",
        boot_incarnation=100,
        records_retransmit_min=records_retransmit_min,
    )
    p = Peer(cfg, SimSigner("me", KEYRING), SimTrust(KEYRING), [], 0.0, random.Random(1))
    p.preload([alive(f"n{i}", 5) for i in range(31)], 0.0)
    p.publish("job", b"placed", 0.0)
    p.receive("n0:1", alive("late", 5), 0.0)
    records = alives = 0
    now = 0.0
    while now < 60.0:
        p.handle_timer(now)
        for _, message in p.messages_to_send():
            parts = message.parts if isinstance(message, Compound) else (message,)
            records += sum(isinstance(m, Record) and m.kind == "job" for m in parts)
            alives += sum(isinstance(m, Alive) and m.node == "late" for m in parts)
        now += 0.05
    return records, alives


def test_records_go_by_memberlists_formula_on_streams_and_membership_keeps_its_floor() -> None:
    plain = GossipConfig(node_id="a", addr="a:1", boot_incarnation=1)
    streams = replace(plain, records_retransmit_min=0)  # what the real transport runs
    assert _limits(plain, 32) == (12, 12)
    assert _limits(streams, 32) == (12, 8)
    assert _limits(streams, 1000) == (16, 16)
    relay = 1  # and once to its ring successor (gossip/relay.py)
    assert _sends_of_one_update(None) == (12 + relay, 12 + relay)
    assert _sends_of_one_update(0) == (8 + relay, 12 + relay)


def _limits(cfg: GossipConfig, n: int) -> tuple[int, int]:
    return cfg.retransmit_limit(n), cfg.records_retransmit_limit(n)


def test_a_retired_kind_leaves_the_store_and_its_copies_do_not_come_back() -> None:
    p = _peer()
    p.preload([alive("o2", 5)], 0.0)
    p.receive("o:1", record("o", "job/j1", 5, 3, b"ended"), 1.0)
    p.receive("o2:1", record("o2", "job/j1", 5, 7, b"handed over"), 1.0)
    p.receive("o:1", record("o", "job/j2", 5, 4, b"running"), 1.0)
    p.events()
    assert p.retire({"job/j1"}) == 2
    assert p.record("o", "job/j1") is None and p.record("o2", "job/j1") is None
    assert p.record("o", "job/j2") is not None  # another kind stays
    assert {d.kind for d in p._records.digest()} == {"job/j2"}  # push-pulls no longer name it
    # a lagging member gossips its copies, or older ones: refused, not counted as replays
    p.receive("x:1", record("o", "job/j1", 5, 3, b"ended"), 2.0)
    p.receive("x:1", record("o", "job/j1", 5, 2, b"running"), 2.0)
    assert p.record("o", "job/j1") is None
    assert p.stats.retired_refused == 2 and p.stats.rejected_replay == 0
    assert p.stats.records_retired == 2
    assert not [e for e in p.events() if isinstance(e, RecordChanged)]
    # the origin writes the kind again: a newer version is taken in as usual
    p.receive("o:1", record("o", "job/j1", 5, 9, b"again"), 3.0)
    got = p.record("o", "job/j1")
    assert got is not None and got.record.payload == b"again"


def test_a_store_keeps_a_bounded_number_of_tombstones() -> None:
    store = RecordStore(max_retired=3)
    for i in range(5):
        store.put(record("o", f"job/{i}", 5, i + 1, b"x"), 0.0)
    store.retire({f"job/{i}" for i in range(5)})
    assert store.retired == 3
    assert store.classify(record("o", "job/4", 5, 5, b"x")) is Offer.RETIRED
    assert store.classify(record("o", "job/0", 5, 1, b"x")) is Offer.NEWER  # its tombstone went


def test_a_record_in_our_name_past_our_version_is_outrun_not_taken_in() -> None:
    # A stolen key's record of ours at a version we never reached, heard back from a member.
    me = make_peer("me", boot=77)
    me.preload([alive("other", 5)], 0.0)
    mine = me.publish("node", b"running: [b]", 1.0)
    me.events()
    forged = record("me", "node", 2**40, 1, b"running: [a]")
    me.receive("other:1", forged, 2.0)
    held = me.record("me", "node")
    assert held is not None and held.record.payload == b"running: [b]"
    assert held.record.version > forged.version > mine.version
    assert [e.payload for e in me.events() if isinstance(e, RecordChanged)] == [b"running: [b]"]
    assert me.stats.records_refuted == 1 and me.stats.refutations == 1
    assert me.incarnation > 2**40  # the Alive that goes out says so too
    # A member that took the forgery in takes ours back: it is newer.
    other = make_peer("other")
    other.preload([alive("me", 77)], 0.0)
    other.receive("me:1", forged, 2.0)
    other.receive("me:1", held.record, 3.0)
    assert other.record("me", "node").record.payload == b"running: [b]"  # type: ignore[union-attr]
    # Our own older copies, echoed back, are only stale; an unsigned one changes nothing.
    me.receive("other:1", mine, 4.0)
    me.receive("other:1", record("me", "node", 2**41, 1, b"x", signer="other"), 4.0)
    assert me.stats.records_refuted == 1 and me.stats.rejected_signature == 1


def test_a_kind_we_do_not_hold_from_a_lost_life_of_ours_is_taken_in_and_outrun() -> None:
    me = make_peer("me", boot=77)
    me.preload([alive("other", 5)], 0.0)
    earlier = record("me", "job/1", 90, 3, b"placed")  # a life whose incarnation was lost
    me.receive("other:1", earlier, 1.0)
    assert me.record("me", "job/1").record.payload == b"placed"  # type: ignore[union-attr]
    assert me.stats.records_refuted == 1 and me.incarnation == 91
    assert me.publish("job/1", b"ended", 2.0).version > earlier.version


def test_a_lie_in_our_name_below_our_raised_incarnation_is_still_not_taken_in() -> None:
    # A first lie (a kind we do not hold) raised our incarnation past 2**40; a second, about a
    # kind we hold, is below our incarnation but newer than our record: still not ours.
    me = make_peer("me", boot=77)
    me.preload([alive("other", 5)], 0.0)
    me.publish("node", b"running: []", 1.0)
    me.receive("other:1", record("me", "job/9", 2**40, 1, b"lie"), 2.0)
    assert me.incarnation == 2**40 + 1
    me.events()
    lie = record("me", "node", 2**40, 5, b"running: [9]")
    me.receive("other:1", lie, 3.0)
    held = me.record("me", "node")
    assert held is not None and held.record.payload == b"running: []"
    assert held.record.version > lie.version
    assert [e.payload for e in me.events() if isinstance(e, RecordChanged)] == [b"running: []"]
    assert me.stats.records_refuted == 2


def test_a_lie_in_our_name_at_the_last_incarnation_is_refused_without_passing_it() -> None:
    # No life follows the last incarnation a message may carry: ours stays one we can send.
    me = make_peer("me", boot=77)
    me.preload([alive("other", 5)], 0.0)
    me.publish("node", b"running: []", 1.0)
    last = record("me", "node", MAX_INCARNATION, 1, b"running: [9]")
    me.receive("other:1", last, 2.0)
    held = me.record("me", "node")
    assert held is not None and held.record.payload == b"running: []"
    assert me.incarnation == 77 and me.stats.records_refuted == 1
    decode(encode(held.record))  # what it sends still decodes everywhere


def test_an_alive_about_us_at_the_last_incarnation_leaves_ours_one_we_can_send() -> None:
    me = make_peer("me", boot=77)
    me.preload([alive("other", 5)], 0.0)
    me.receive("other:1", alive("me", MAX_INCARNATION), 1.0)
    assert me.incarnation == 77 and me.stats.rejected_ahead == 1
    me.receive("other:1", alive("me", 90), 2.0)  # one it can pass still raises it
    assert me.incarnation == 91


def _round_times(spaced: bool) -> tuple[list[float], list[float]]:
    """When a 64-member core's gossip rounds (not its probes, nor the relay to its ring
    successor, which carries whatever news a round has) carry a record, and when they carry a
    membership update, over 4 s of a record published every 50 ms and a member's news every
    50 ms."""
    cfg = GossipConfig(
        node_id="me",
        addr="me:1",
        boot_incarnation=100,
        records_retransmit_min=0,
        records_spaced=spaced,
    )
    p = Peer(cfg, SimSigner("me", KEYRING), SimTrust(KEYRING), [], 0.0, random.Random(1))
    p.preload([alive(f"n{i}", 5) for i in range(63)], 0.0)
    with_records: list[float] = []
    with_members: list[float] = []
    now = 0.0
    for step in range(80):
        now = step * 0.05
        p.publish("job", str(step).encode(), now)
        p.receive("n0:1", alive(f"n{step % 63}", 6 + step), now)  # news of a member
        p.handle_timer(now)
        rounds, _ = p.take_outgoing()  # the relay to the ring successor is reliable
        for _, message in rounds:
            parts = message.parts if isinstance(message, Compound) else (message,)
            if any(not isinstance(m, Record | Alive) for m in parts):
                continue  # a probe's ping or ack: not a gossip round
            if any(isinstance(m, Record) for m in parts):
                with_records.append(now)
            if any(isinstance(m, Alive) for m in parts):
                with_members.append(now)
    return sorted(set(with_records)), sorted(set(with_members))


def _gaps(times: list[float]) -> list[float]:
    return [round(b - a, 2) for a, b in itertools.pairwise(times)]


def test_past_16_members_records_ride_spaced_rounds_and_membership_every_round() -> None:
    cfg = GossipConfig(node_id="a", addr="a:1", boot_incarnation=1, records_spaced=True)
    assert cfg.records_interval_s(16) == cfg.gossip_interval_s
    assert math.isclose(cfg.records_interval_s(64), 3 * cfg.gossip_interval_s)
    assert math.isclose(cfg.records_interval_s(128), 4 * cfg.gossip_interval_s)
    assert replace(cfg, records_spaced=False).records_interval_s(128) == cfg.gossip_interval_s

    records, members = _round_times(spaced=True)
    # log2(64 / 8) = 3 rounds apart; the membership updates go every 0.2 s round all along.
    assert len(records) >= 5 and set(_gaps(records)) == {0.6}
    assert len(members) >= 15 and set(_gaps(members)) == {0.2}
    # Unspaced (the simulator), records ride every round as membership does.
    records, members = _round_times(spaced=False)
    assert set(_gaps(records)) == {0.2} and set(_gaps(members)) == {0.2}
