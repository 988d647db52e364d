"""Gossip streams between real members on loopback (mutual TLS): one stream per pair carries
gossip and calls both ways; a member without streams is sent POSTs; a call gets no answer from
a member that is gone."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gossip.certtrust import CertTrust
from gossip.identity import NodeIdentity, enroll_node, init_cluster
from gossip.messages import MemberState
from gossip.node import GossipNode
from gossip.server import GossipServer
from gossip.streamparts import CallFailed
from gossip.tls import PeerIdentity

NOW = datetime.now(UTC)
DAY = timedelta(days=1)


async def eventually(predicate: Callable[[], bool], tries: int = 1500) -> None:
    for _ in range(tries):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


@pytest.fixture
def ids(tmp_path: Path) -> list[NodeIdentity]:
    ca = init_cluster(tmp_path / "c", "streams", "op", NOW).ca
    return [enroll_node(ca, tmp_path / f"n{i}", "agent", ["127.0.0.1"], DAY, NOW) for i in range(3)]


def _node(identity: NodeIdentity, seeds: list[str] | None = None) -> GossipNode:
    return GossipNode(
        identity, CertTrust(identity.ca_certificate), host="127.0.0.1", port=0, seeds=seeds or []
    )


def _sees(node: GossipNode, other: GossipNode) -> bool:
    member = node.peer.member(other.node_id)
    return member is not None and member.state is MemberState.ALIVE


@pytest.fixture
async def pair(ids: list[NodeIdentity]) -> AsyncIterator[tuple[GossipNode, GossipNode]]:
    a = _node(ids[0])
    await a.start()
    b = _node(ids[1], [a.address])
    await b.start()
    try:
        await eventually(lambda: _sees(a, b) and _sees(b, a))
        yield a, b
    finally:
        await b.stop(leave=False)
        await a.stop(leave=False)


async def test_a_pair_talks_on_streams_not_posts(pair: tuple[GossipNode, GossipNode]) -> None:
    a, b = pair
    sent = a.stats()["stream_frames_sent"]
    await eventually(lambda: a.stats()["stream_frames_sent"] > sent + 4)  # probes and acks
    for node in (a, b):
        stats = node.stats()
        assert stats["stream_posted"] == 0
        assert node.open_streams <= 2  # one each way at most; a duplicate gives way
        assert stats["transport_accepted"] > 0  # every stream message passed the gate


async def test_a_call_reaches_the_handler_with_the_callers_identity_and_comes_back(
    pair: tuple[GossipNode, GossipNode],
) -> None:
    a, b = pair
    seen: list[tuple[str, str, str, str, bytes]] = []

    async def handler(
        peer: PeerIdentity, path: str, content_type: str, body: bytes
    ) -> tuple[int, bytes]:
        seen.append((peer.node_id, peer.role, path, content_type, body))
        return 201, b"answer:" + body

    b.serve_calls(handler)
    answers = await asyncio.gather(
        *(a.call(b.address, "/v1/x", "text/plain", b"%d" % i, 5.0) for i in range(20))
    )
    assert answers == [(201, b"answer:%d" % i) for i in range(20)]
    assert {s[:4] for s in seen} == {(a.node_id, "agent", "/v1/x", "text/plain")}
    # and the other way, on the same pair's stream, to a member that serves no calls
    assert await b.call(a.address, "/v1/y", "text/plain", b"", 5.0) == (
        404,
        b'{"error": "no calls served here"}',
    )
    assert a.stats()["stream_calls_sent"] == 20
    assert b.stats()["stream_calls_served"] == 20


async def test_a_call_to_a_member_that_is_gone_fails_without_waiting_for_its_timeout(
    pair: tuple[GossipNode, GossipNode],
) -> None:
    a, b = pair
    addr = b.address
    await b.stop(leave=False)
    with pytest.raises(CallFailed) as failed:
        await a.call(addr, "/v1/x", "text/plain", b"", 60.0)
    assert not failed.value.legacy


async def test_a_stream_the_peer_ended_makes_its_member_probed_next(
    ids: list[NodeIdentity],
) -> None:
    """A kill -9 closes a member's connections at once: the others look at it on their next
    probe tick instead of at its turn in their rounds (the probe decides, not the hint)."""
    a = _node(ids[0])
    await a.start()
    b, c = _node(ids[1], [a.address]), _node(ids[2], [a.address])
    await b.start()
    await c.start()
    try:
        await eventually(lambda: all(_sees(x, y) for x in (a, b, c) for y in (a, b, c) if x != y))
        await eventually(lambda: a.open_streams >= 2)
        hinted = a.peer.stats.probes_hinted
        await c.stop(leave=False)
        await eventually(lambda: a.peer.stats.probes_hinted > hinted)
        await eventually(lambda: not _sees(a, c))  # suspected, then dead: probes decided
        assert _sees(a, b)
    finally:
        await b.stop(leave=False)
        await a.stop(leave=False)


async def test_a_member_without_streams_is_sent_posts_and_calls_fall_back(
    ids: list[NodeIdentity],
) -> None:
    """A server that predates streams answers the upgrade 404: gossip goes to it as POSTs, and
    a call says it may go over HTTP (nothing was sent)."""
    got: list[tuple[str, bytes]] = []

    async def on_post(node_id: str, role: str, body: bytes) -> bytes | None:
        got.append((node_id, body))
        return None

    old = GossipServer(ids[1], ids[1].ca_certificate, on_post, "127.0.0.1", 0)
    await old.start()
    a = _node(ids[0])
    await a.start()
    try:
        a._streams.send(old.address, b"a gossip body")
        await eventually(lambda: len(got) == 1)
        assert got == [(a.node_id, b"a gossip body")]
        assert a.stats()["stream_posted"] == 1
        with pytest.raises(CallFailed) as failed:
            await a.call(old.address, "/v1/x", "text/plain", b"", 5.0)
        assert failed.value.legacy
    finally:
        await a.stop(leave=False)
        await old.stop()


async def test_a_peer_gone_before_the_upgrade_is_answered_is_counted_not_an_error(
    ids: list[NodeIdentity], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """In a large mesh on busy cores a dialer gives up (or is killed) while the listener is
    still getting to its upgrade: the answer then meets a closed connection. That is counted
    and logged at DEBUG, never an ERROR traceback from aiohttp."""
    a = _node(ids[0])
    await a.start()
    answer = web.WebSocketResponse.prepare

    async def after_the_peer_went(self: web.WebSocketResponse, request: web.BaseRequest) -> Any:
        assert request.transport is not None
        request.transport.abort()  # the dialer is gone by the time the answer is written
        await asyncio.sleep(0)
        return await answer(self, request)

    monkeypatch.setattr(web.WebSocketResponse, "prepare", after_the_peer_went)
    stats = await dialed_and_gone(a, ids[1], "transport_streams_peer_gone", caplog)
    assert stats["handshakes"] >= 2  # each dial was a TLS handshake, counted
    assert any("the peer went away" in r.getMessage() for r in caplog.records)


async def dialed_and_gone(
    a: GossipNode, dialer: NodeIdentity, counter: str, caplog: pytest.LogCaptureFixture
) -> dict[str, Any]:
    """A member joins ``a`` while ``a``'s listener finds each dial gone: ``counter`` counts
    them, no stream is accepted, and nothing is logged at ERROR. ``a``'s stats at the end."""
    b = _node(dialer, [a.address])
    caplog.set_level(logging.DEBUG)
    await b.start()
    try:
        await eventually(lambda: a.stats()[counter] >= 2)
        stats = a.stats()
        assert stats["transport_streams_accepted"] == 0
    finally:
        await b.stop(leave=False)
        await a.stop(leave=False)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    return stats


async def test_a_peer_gone_before_its_request_is_read_is_counted_not_an_error(
    ids: list[NodeIdentity], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Earlier still: the dialer's connection is closed before the listener reads its upgrade
    (a 128-agent mesh on two cores logged aiohttp ERROR tracebacks for it, asyncio's closed TLS
    transport having no certificate left to ask for). Counted, at DEBUG."""
    a = _node(ids[0])
    await a.start()
    admit = GossipServer._admit_gossip

    def after_the_peer_went(self: GossipServer, request: web.Request) -> Any:
        assert request.transport is not None
        request.transport.close()
        request.transport.close()  # closed twice: asyncio lets go of its TLS protocol
        return admit(self, request)

    monkeypatch.setattr(GossipServer, "_admit_gossip", after_the_peer_went)
    await dialed_and_gone(a, ids[1], "transport_requests_peer_gone", caplog)
    assert any("went away before it was read" in r.getMessage() for r in caplog.records)


async def test_a_member_counts_its_handshakes_streams_and_messages_by_kind(
    pair: tuple[GossipNode, GossipNode],
) -> None:
    a, b = pair
    await eventually(lambda: a.stats().get("messages_in_ack", 0) >= 3)
    for node in (a, b):
        stats = node.stats()
        assert stats["handshakes"] >= 1 and stats["streams_opened"] >= 1
        assert stats["streams_evicted"] == 0 and 1 <= stats["streams_open"] <= 2
        assert stats["messages_in_ping"] + stats["messages_in_ack"] > 0
        assert stats["cpu_us_ping"] + stats["cpu_us_ack"] > 0
