"""An operator's revocation list spreads through the mesh and every member shuns the node."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gossip.certtrust import CertSigner, CertTrust
from gossip.identity import ClusterIdentity, enroll_node, init_cluster
from gossip.messages import MemberState
from gossip.node import REVOCATIONS_KIND, GossipNode
from gossip.revocation import RevocationError, encode, issue_revocations

pytestmark = pytest.mark.slow


async def eventually(what: str, check: Callable[[], bool], deadline_s: float = 30.0) -> None:
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
async def mesh(tmp_path: Path) -> AsyncIterator[tuple[ClusterIdentity, list[GossipNode]]]:
    now = datetime.now(UTC)
    cluster = init_cluster(tmp_path / "cluster", "revoke-test", "op", now)
    nodes: list[GossipNode] = []
    for i in range(4):
        identity = enroll_node(
            cluster.ca, tmp_path / f"n{i}", "agent", ["127.0.0.1"], timedelta(hours=1), now
        )
        seeds = [nodes[0].address] if nodes else []
        node = GossipNode(identity, CertTrust(identity.ca_certificate), seeds=seeds)
        await node.start()
        nodes.append(node)
    await eventually(
        "a full view",
        lambda: all(
            sum(m.state == MemberState.ALIVE for m in n.members()) == len(nodes) for n in nodes
        ),
    )
    try:
        yield cluster, nodes
    finally:
        for node in nodes:
            await node.stop(leave=False)


async def test_a_revoked_node_is_shunned_by_every_member(
    mesh: tuple[ClusterIdentity, list[GossipNode]],
) -> None:
    cluster, nodes = mesh
    a, b, c, victim = nodes
    operator = CertSigner(cluster.operator)
    revocations = issue_revocations(operator, [victim.node_id], [], 1, time.time())

    assert a.revoke(revocations)
    assert not a.revoke(revocations), "the same version again changes nothing"
    for node in (b, c):
        await eventually(
            "the list to reach every member", lambda n=node: n.revocations.version == 1
        )
    for node in (a, b, c):
        await eventually(
            "the revoked node to be declared dead",
            lambda n=node: (
                (m := n.peer.member(victim.node_id)) is not None and m.state == MemberState.DEAD
            ),
        )
    others = {a.node_id, b.node_id, c.node_id}
    for node in (a, b, c):
        states = {m.node: m.state for m in node.members() if m.node in others}
        assert set(states.values()) == {MemberState.ALIVE}
        # Every member gossips the list as its own: it outlives the one it was first given to.
        assert node.record(node.node_id, REVOCATIONS_KIND) is not None


async def test_a_revoked_node_is_shown_the_list_that_revokes_it(
    mesh: tuple[ClusterIdentity, list[GossipNode]],
) -> None:
    cluster, nodes = mesh
    victim = nodes[3]
    learned: list[int] = []
    victim._on_revocations_changed = lambda revocations: learned.append(revocations.version)
    # Applied everywhere but on the victim, which hears of it only when it is refused.
    revocations = issue_revocations(CertSigner(cluster.operator), [victim.node_id], [], 1, 0.0)
    for node in nodes[:3]:
        node._trust.apply_revocations(revocations, time.time())
    await eventually("the victim to learn it is revoked", lambda: learned == [1])
    assert victim.revocations.revokes(victim.node_id)
    assert sum(n.stats()["transport_revoked"] for n in nodes[:3]) >= 1  # whoever refused it


async def test_a_list_not_signed_by_an_operator_is_refused_and_counted(
    mesh: tuple[ClusterIdentity, list[GossipNode]],
) -> None:
    _, nodes = mesh
    rogue, others = nodes[0], nodes[1:]
    forged = issue_revocations(CertSigner(rogue.identity), [others[0].node_id], [], 1, time.time())
    with pytest.raises(RevocationError):
        rogue.revoke(forged)
    # A rogue agent can still gossip the record itself: every member must refuse it.
    rogue.publish(REVOCATIONS_KIND, encode(forged))
    await eventually(
        "every member to refuse the forged list",
        lambda: all(n.revocations_rejected >= 1 for n in others),
    )
    assert all(n.revocations.version == 0 for n in nodes)
