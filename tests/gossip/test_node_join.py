"""Joining over real HTTPS on loopback: a node that starts a moment before its seed."""

from __future__ import annotations

import asyncio
import socket
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gossip.certtrust import CertTrust
from gossip.config import GossipConfig
from gossip.identity import enroll_node, init_cluster
from gossip.messages import MemberState
from gossip.node import SEED_RETRY_S, GossipNode


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_a_node_started_before_its_seed_joins_once_the_seed_listens(
    tmp_path: Path,
) -> None:
    now = datetime.now(UTC)
    cluster = init_cluster(tmp_path / "cluster", "join-test", "op", now)
    ids = [
        enroll_node(cluster.ca, tmp_path / n, "agent", ["127.0.0.1"], timedelta(hours=1), now)
        for n in ("seed", "joiner")
    ]
    seed_port = _free_port()
    # The core's own retries of its seeds are pushed out of reach: only the adapter's quick
    # retries of a refused seed can make this join happen.
    late = GossipConfig(
        node_id="", addr="", boot_incarnation=int(time.time()), catch_up_push_pull_s=600.0
    )
    joiner = GossipNode(
        ids[1],
        CertTrust(ids[1].ca_certificate),
        seeds=[f"127.0.0.1:{seed_port}"],
        config=late,
    )
    await joiner.start()  # its join push-pull is refused: nothing listens on the seed's port
    seed = GossipNode(ids[0], CertTrust(ids[0].ca_certificate), port=seed_port)
    try:
        await asyncio.sleep(SEED_RETRY_S[0] / 2)
        assert joiner.send_failures >= 1
        await seed.start()

        def joined() -> bool:
            m = joiner.peer.member(seed.node_id)
            return m is not None and m.state == MemberState.ALIVE

        for _ in range(200):
            if joined():
                break
            await asyncio.sleep(0.05)
        assert joined(), "the joiner never reached its seed"
        theirs = seed.peer.member(joiner.node_id)
        assert theirs is not None and theirs.state == MemberState.ALIVE
    finally:
        await joiner.stop(leave=False)
        await seed.stop(leave=False)
