"""A member restarted at once, or under a clock stepped back, is not taken for its older self:
over real HTTPS on loopback its peer takes its new Alive and its new records."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gossip.certtrust import CertTrust
from gossip.identity import NodeIdentity, enroll_node, init_cluster
from gossip.messages import MemberState
from gossip.node import GossipNode
from tests.gossip.test_revocation_mesh import eventually

pytestmark = pytest.mark.slow

KIND = "test/state"


def _identities(tmp_path: Path) -> list[NodeIdentity]:
    now = datetime.now(UTC)
    cluster = init_cluster(tmp_path / "cluster", "incarnation-test", "op", now)
    return [
        enroll_node(cluster.ca, tmp_path / n, "agent", ["127.0.0.1"], timedelta(hours=1), now)
        for n in ("seed", "restarted")
    ]


def _life(identity: NodeIdentity, seed: GossipNode, wall_s: float, kept: Path) -> GossipNode:
    """One life of the restarted member: its clock stands at ``wall_s``."""
    return GossipNode(
        identity,
        CertTrust(identity.ca_certificate),
        seeds=[seed.address],
        wall_clock=lambda: wall_s,
        incarnation_path=kept,
    )


async def _restart_seen(tmp_path: Path, first_s: float, second_s: float) -> None:
    """The second member lives a first life at wall clock ``first_s`` (three records), crashes,
    and starts again at ``second_s`` from the same state folder: the seed must take its new
    record and its new address."""
    ids = _identities(tmp_path)
    kept = tmp_path / "restarted" / "incarnation"
    seed = GossipNode(ids[0], CertTrust(ids[0].ca_certificate))
    await seed.start()
    lives: list[GossipNode] = []
    try:
        node = _life(ids[1], seed, first_s, kept)
        lives.append(node)
        await node.start()
        for payload in (b"one", b"two", b"three"):
            node.publish(KIND, payload)

        def holds(payload: bytes) -> Callable[[], bool]:
            def check() -> bool:
                r = seed.record(ids[1].node_id, KIND)
                return r is not None and r.record.payload == payload

            return check

        await eventually("the first life's last record", holds(b"three"))
        first, first_addr = node.peer.incarnation, node.address
        await node.stop(leave=False)  # a crash: no leave
        again = _life(ids[1], seed, second_s, kept)
        lives.append(again)
        await again.start()
        assert again.address != first_addr
        again.publish(KIND, b"after the restart")
        await eventually("the second life's record", holds(b"after the restart"))
        assert again.peer.incarnation > first

        def moved() -> bool:
            m = seed.peer.member(ids[1].node_id)
            return m is not None and m.state == MemberState.ALIVE and m.addr == again.address

        await eventually("the second life's address", moved)
    finally:
        for life in lives:
            await life.stop(leave=False)
        await seed.stop(leave=False)


async def test_a_member_restarted_within_the_same_second_is_taken_for_its_new_life(
    tmp_path: Path,
) -> None:
    now_s = time.time()
    await _restart_seen(tmp_path, now_s, now_s)


async def test_a_member_restarted_under_a_clock_stepped_back_is_taken_for_its_new_life(
    tmp_path: Path,
) -> None:
    now_s = time.time()
    await _restart_seen(tmp_path, now_s, now_s - 120.0)
