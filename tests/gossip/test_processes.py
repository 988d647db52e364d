"""Real gossip members as separate processes on loopback, over mutual TLS."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gossip.certtrust import CertSigner
from gossip.client import GossipClient
from gossip.codec import frame, signing_bytes
from gossip.identity import NodeIdentity, enroll_node, init_cluster, load_identity
from gossip.messages import Compound, Dead
from tests.gossip.procs import Member, start, wait_until

pytestmark = pytest.mark.slow

MEMBERS = 16


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[list[Path], list[Member]]]:
    now = datetime.now(UTC)
    ca = init_cluster(tmp_path / "cluster", "proc-test", "op", now).ca
    dirs = [tmp_path / f"n{i}" for i in range(MEMBERS)]
    for d in dirs:
        enroll_node(ca, d, "agent", ["127.0.0.1"], timedelta(hours=1), now)
    running: list[Member] = []
    yield dirs, running
    for m in running:
        m.stop()


def test_sixteen_processes_see_all_detect_a_kill_and_take_a_restart_back(
    cluster: tuple[list[Path], list[Member]],
) -> None:
    dirs, running = cluster
    first = start(dirs[0], "127.0.0.1:0")
    running.append(first)
    wait_until([first], "the seed to listen", lambda m: bool(m.addr))
    running += [start(d, "127.0.0.1:0", [first.addr]) for d in dirs[1:]]

    wait_until(running, "a full view", lambda m: m.sees_all_alive(MEMBERS))
    ids = {m.node_id for m in running}
    assert len(ids) == MEMBERS
    assert all(set(m.view) == ids for m in running)

    victim = running[5]
    victim.process.send_signal(signal.SIGKILL)
    victim.process.wait(timeout=10)
    survivors = [m for m in running if m is not victim]
    detect_s = wait_until(
        survivors, "the kill to be detected", lambda m: m.view.get(victim.node_id) == "dead"
    )
    assert detect_s < 15, f"kill -9 detected by all only after {detect_s:.1f} s"
    others_alive = [
        state for m in survivors for node, state in m.view.items() if node != victim.node_id
    ]
    assert set(others_alive) == {"alive"}, "no live member may be declared dead"

    reborn = start(victim.directory, "127.0.0.1:0", [first.addr])
    running.append(reborn)
    wait_until([reborn], "the restarted member to listen", lambda m: bool(m.addr))
    assert reborn.node_id == victim.node_id
    wait_until(
        [*survivors, reborn],
        "the restarted member to be alive everywhere",
        lambda m: m.sees_all_alive(MEMBERS),
    )


def _signed_dead(identity: NodeIdentity, node: str, incarnation: int) -> Dead:
    """A Dead about ``node`` accused in ``identity``'s name, signed with its own key."""
    unsigned = Dead(node, incarnation, identity.node_id, b"")
    return Dead(
        node, incarnation, identity.node_id, CertSigner(identity).sign(signing_bytes(unsigned))
    )


async def _post(identity: NodeIdentity, addrs: Sequence[str], body: bytes) -> None:
    async with GossipClient(identity, identity.ca_certificate) as client:
        for addr in addrs:
            await client.send(addr, body, timeout_s=10.0)


def test_one_members_signed_dead_kills_no_live_member(
    cluster: tuple[list[Path], list[Member]],
) -> None:
    """With one member's certificate and key, an attacker posts a signed Dead about a live member
    to every other member: nobody declares it dead, it refutes, and the refusal is counted."""
    dirs, running = cluster
    first = start(dirs[0], "127.0.0.1:0")
    running.append(first)
    wait_until([first], "the seed to listen", lambda m: bool(m.addr))
    running += [start(d, "127.0.0.1:0", [first.addr]) for d in dirs[1:5]]
    wait_until(running, "a full view", lambda m: m.sees_all_alive(5))

    victim, forger = running[2], running[3]
    identity = load_identity(forger.directory)
    forged = _signed_dead(identity, victim.node_id, int(time.time()) + 100)  # outranks its life
    targets = [m for m in running if m is not victim and m is not forger]
    body = frame(forger.addr, Compound((forged,)), 1 << 20)
    asyncio.run(_post(identity, [m.addr for m in targets], body))

    watched_until = time.monotonic() + 5.0  # the suspicion's minimum timeout is 1.5 s at N=5
    while time.monotonic() < watched_until:
        for m in running:
            m.drain()
            assert victim.node_id not in m.declared_dead, f"{m.node_id[:6]} declared it dead"
            assert m.view.get(victim.node_id) != "dead"
        time.sleep(0.1)
    wait_until(
        running,
        "the victim's refutation everywhere and the Dead counted as held back",
        lambda m: m.sees_all_alive(5) and (m not in targets or m.stats["dead_deferred"] >= 1),
    )
    assert victim.stats["refutations"] >= 1
    assert all(victim.node_id not in m.declared_dead for m in running)


TIGHT_STREAMS = 12
"""A stream bound below the mesh's size (16 members), as 64 is below a fleet of hundreds."""


def test_past_the_stream_bound_probes_open_no_streams(
    cluster: tuple[list[Path], list[Member]],
) -> None:
    """With fewer streams allowed than there are members, probes on the rings keep to the
    ring neighbours' streams: over forty more probes per member, members open 1-4 streams
    each (push-pulls with random partners), the busiest up to ~9 (26 once, at load 12, its
    probes timing out and their indirect probes reaching beyond its neighbours). In SWIM's order
    (``--probe-rings 0``) nearly every probe opened one: 42-60 handshakes each, 15-35
    streams evicted."""
    dirs, running = cluster
    extra = ["--max-streams", str(TIGHT_STREAMS)]
    first = start(dirs[0], "127.0.0.1:0", extra=extra)
    running.append(first)
    wait_until([first], "the seed to listen", lambda m: bool(m.addr))
    running += [start(d, "127.0.0.1:0", [first.addr], extra=extra) for d in dirs[1:]]
    wait_until(running, "a full view", lambda m: m.sees_all_alive(MEMBERS))
    wait_until(running, "the catch-up to end", lambda m: m.stats.get("probes_sent", 0) >= 40)
    before = {m.node_id: dict(m.stats) for m in running}
    wait_until(
        running,
        "forty more probes each",
        lambda m: m.stats["probes_sent"] >= before[m.node_id]["probes_sent"] + 40,
        deadline_s=120.0,
    )
    handshakes = []
    for m in running:
        grew = {k: m.stats[k] - before[m.node_id][k] for k in ("handshakes", "streams_evicted")}
        # on busy cores probes time out and their indirect probes reach beyond the neighbours
        assert grew["handshakes"] <= 30 and grew["streams_evicted"] <= 30, grew
        assert m.stats["streams_open"] <= TIGHT_STREAMS
        handshakes.append(grew["handshakes"])
    assert sum(handshakes) / len(handshakes) <= 8, handshakes
