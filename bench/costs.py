"""Unit costs of the real transport, for the cost model: CPU per message, per handshake, per
signature; memory per stream and per member.

``python -m bench.costs [--handshakes 200] [--messages 3000] [--seconds 10] --json``

Everything runs in this one process, both ends of every connection included, and CPU is this
process's time (``time.process_time``), so each figure is the cost to the two ends together:

- handshake_full_ms / handshake_resumed_ms: open a stream (TCP, mutual TLS 1.3, the WebSocket
  upgrade, both certificates checked again), carry one message and close it; without and with
  the dialer's TLS session from the previous stream;
- frame_us: one opaque 100-byte message over an open stream, written and read;
- gossip_message_us: one gossip message between two real members (codec, core, stream, TLS),
  from two members probing each other every few milliseconds (CPU / messages sent);
- sign_us, verify_us: an Ed25519 signature made and checked (``CertSigner``, ``CertTrust``);
  certificate_admit_us: a certificate not seen before, parsed and checked against the CA;
- stream_kb: resident memory per stream end (RSS growth over many open streams);
- member_bytes: the core's memory per member it holds (tracemalloc over a preloaded view, with
  certificate-sized credentials).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gossip.budgets import RateLimit
from gossip.certtrust import CertSigner, CertTrust
from gossip.codec import signing_bytes
from gossip.config import GossipConfig
from gossip.identity import NodeIdentity, Role, enroll_node, init_cluster, issue_certificate
from gossip.messages import Alive
from gossip.node import GossipNode
from gossip.peer import Peer
from gossip.server import GossipServer
from gossip.streams import StreamPool
from gossip.tls import shrink_tls_read_buffers

UNLIMITED = RateLimit(rate_per_s=1e9, burst=1e9)


class _Counter:
    """A stream delegate that counts what arrives."""

    def __init__(self) -> None:
        self.frames = 0
        self.waiter: asyncio.Future[None] | None = None
        self.want = 0

    def stream_frame(self, node_id: str, role: Role, body: bytes) -> None:
        self.frames += 1
        if self.waiter is not None and self.frames >= self.want and not self.waiter.done():
            self.waiter.set_result(None)

    def node_at(self, addr: str) -> str | None:
        return None

    async def stream_call(
        self, peer: object, path: str, content_type: str, body: bytes
    ) -> tuple[int, bytes]:
        return 404, b""

    def post(self, addr: str, body: bytes) -> None:
        raise AssertionError("no POST expected")

    def undelivered(self, addr: str, bodies: object) -> None:
        raise AssertionError(f"undelivered to {addr}")

    def connection_lost(self, node_id: str | None, addr: str) -> None:
        pass  # the measurement closes its own streams at the end

    async def until(self, count: int) -> None:
        if self.frames >= count:
            return
        self.want = count
        self.waiter = asyncio.get_running_loop().create_future()
        await asyncio.wait_for(self.waiter, 30.0)


async def _endpoint(identity: NodeIdentity) -> tuple[GossipServer, StreamPool, _Counter]:
    counter = _Counter()
    trust = CertTrust(identity.ca_certificate)
    holder: list[StreamPool] = []

    async def accept(peer: object, ws: object) -> None:
        await holder[0].serve(peer, ws)  # type: ignore[arg-type]

    server = GossipServer(
        identity,
        identity.ca_certificate,
        _no_post,
        trust=trust,
        stream_acceptor=accept,
        rate_limit=UNLIMITED,  # the per-peer bound would drop a benchmark's flood
    )
    pool = StreamPool(identity, identity.ca_certificate, server.gate, counter, trust=trust)
    holder.append(pool)
    await server.start()
    return server, pool, counter


async def _no_post(node_id: str, role: Role, body: bytes) -> bytes | None:
    return None


async def _until(check: Callable[[], bool]) -> None:
    for _ in range(3000):
        if check():
            return
        await asyncio.sleep(0.001)
    raise TimeoutError("condition not reached")


async def _handshakes(
    a: StreamPool, b: tuple[GossipServer, StreamPool, _Counter], n: int, resumed: bool, node_b: str
) -> float:
    server, pool_b, counter = b
    got = counter.frames
    a.send(server.address, b"warm")  # one first, so that a session exists to resume
    got += 1
    await counter.until(got)
    a.forget_node(node_b)
    await _until(lambda: a.open_streams == 0 and pool_b.open_streams == 0)
    started = time.process_time()
    for _ in range(n):
        if not resumed:
            a.forget_sessions()
        a.send(server.address, b"x" * 100)
        got += 1
        await counter.until(got)
        a.forget_node(node_b)
        await _until(lambda: a.open_streams == 0 and pool_b.open_streams == 0)
    return (time.process_time() - started) / n


async def _frames(a: StreamPool, b: tuple[GossipServer, StreamPool, _Counter], n: int) -> float:
    server, _, counter = b
    a.send(server.address, b"open")
    got = counter.frames + 1
    await counter.until(got)
    body = b"y" * 100
    started = time.process_time()
    for i in range(n):
        a.send(server.address, body)
        if i % 50 == 49:  # let the writer and reader run, as a steady flow does
            await counter.until(got + i + 1)
    await counter.until(got + n)
    return (time.process_time() - started) / n


async def _gossip_messages(ids: list[NodeIdentity], seconds: float) -> float:
    """Two real members probing each other every 5 ms: CPU per message sent."""
    fast = GossipConfig(
        node_id="", addr="", boot_incarnation=int(time.time()), probe_interval_s=0.005,
        probe_timeout_s=0.004, reliable_probe_wait_s=0.0, membership_budget_bytes=8192,
        records_budget_bytes=32768,
    )  # fmt: skip
    a = GossipNode(ids[0], CertTrust(ids[0].ca_certificate), config=fast)
    await a.start()
    b = GossipNode(ids[1], CertTrust(ids[1].ca_certificate), config=fast, seeds=[a.address])
    await b.start()
    await _until(lambda: len(a.members()) == 2 and len(b.members()) == 2)
    await asyncio.sleep(1.0)
    sent0 = a.peer.stats.messages_out + b.peer.stats.messages_out
    started = time.process_time()
    await asyncio.sleep(seconds)
    used = time.process_time() - started
    sent = a.peer.stats.messages_out + b.peer.stats.messages_out - sent0
    await b.stop(leave=False)
    await a.stop(leave=False)
    return used / max(1, sent)


def _rss_kb() -> int:
    match = re.search(r"VmRSS:\s+(\d+)", Path("/proc/self/status").read_text())
    return int(match.group(1)) if match else 0


async def _stream_memory(ids: list[NodeIdentity], clients: int, servers: int) -> float:
    """RSS growth per stream end, over ``clients`` x ``servers`` open streams."""
    ends_c = [await _endpoint(i) for i in ids[:clients]]
    ends_s = [await _endpoint(i) for i in ids[clients : clients + servers]]
    await asyncio.sleep(0.5)
    before = _rss_kb()
    for _, pool, _ in ends_c:
        for server, _, _ in ends_s:
            pool.send(server.address, b"hello")
    await _until(lambda: all(c.frames >= clients for _, _, c in ends_s))
    await asyncio.sleep(0.5)
    grown = _rss_kb() - before
    for server, pool, _ in ends_c + ends_s:
        await pool.close()
        await server.stop()
    return grown / (2 * clients * servers)


CERTIFICATE_BYTES = 600
"""About a node certificate's size (the run reports the real one)."""


def _member_bytes(credential: bytes, members: int) -> float:
    """The core's memory per member held (tracemalloc), over ``members`` preloaded Alives."""

    class _Anyone:
        node_id = "self"
        credential = b"c" * CERTIFICATE_BYTES

        def sign(self, data: bytes) -> bytes:
            return b"s" * 64

        def admit(self, node_id: str, credential: bytes, now: float) -> bool:
            return True

        def verify(self, node_id: str, data: bytes, signature: bytes) -> bool:
            return True

        def is_revoked(self, node_id: str) -> bool:
            return False

    anyone = _Anyone()
    import random

    alives = [
        Alive(f"node{i:05d}" + "x" * 24, 1_700_000_000, f"10.0.{i // 250}.{i % 250}:7946",
              bytes(credential), os.urandom(64))
        for i in range(members)
    ]  # fmt: skip
    cfg = GossipConfig(node_id="self", addr="self:1", boot_incarnation=1)
    tracemalloc.start()
    peer = Peer(cfg, anyone, anyone, [], 0.0, random.Random(1))
    base = tracemalloc.get_traced_memory()[0]
    peer.preload(alives, 0.0)
    peer._member_digest()  # the digest lines every push-pull builds
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    credentials = members * len(credential)  # shared here, one copy per member for real
    return (held + credentials) / members


def _signatures(identity: NodeIdentity, ca_key_holder: object, n: int) -> dict[str, float]:
    trust = CertTrust(identity.ca_certificate)
    signer = CertSigner(identity)
    trust.admit(identity.node_id, identity.certificate_der, time.time())
    unsigned = Alive(identity.node_id, 1, "127.0.0.1:7946", identity.certificate_der, b"")
    data = signing_bytes(unsigned)
    started = time.process_time()
    for _ in range(n):
        signature = signer.sign(data)
    sign_s = (time.process_time() - started) / n
    started = time.process_time()
    for _ in range(n):
        assert trust.verify(identity.node_id, data, signature)
    verify_s = (time.process_time() - started) / n
    return {"sign_us": round(sign_s * 1e6, 1), "verify_us": round(verify_s * 1e6, 1)}


def _admissions(cluster_ca: object, ca_cert: object, n: int) -> float:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding

    from gossip.identity import node_id_for

    now = datetime.now(UTC)
    certs = []
    for _ in range(n):
        key = Ed25519PrivateKey.generate().public_key()
        cert = issue_certificate(cluster_ca, key, "agent", [], timedelta(days=1), now)  # type: ignore[arg-type]
        certs.append((node_id_for(key), cert.public_bytes(Encoding.DER)))
    trust = CertTrust(ca_cert)  # type: ignore[arg-type]
    wall = time.time()
    started = time.process_time()
    for node_id, der in certs:
        assert trust.admit(node_id, der, wall)
    return (time.process_time() - started) / n


async def _run(handshakes: int, messages: int, seconds: float) -> dict[str, object]:
    shrink_tls_read_buffers()
    with tempfile.TemporaryDirectory(prefix="shoal-costs-") as tmp:
        root = Path(tmp)
        now = datetime.now(UTC)
        cluster = init_cluster(root / "cluster", "costs", "op", now)
        ids = [
            enroll_node(cluster.ca, root / f"n{i}", "agent", ["127.0.0.1"], timedelta(hours=1), now)
            for i in range(20)
        ]
        a = await _endpoint(ids[0])
        b = await _endpoint(ids[1])
        full_s = await _handshakes(a[1], b, handshakes, False, ids[1].node_id)
        resumed_s = await _handshakes(a[1], b, handshakes, True, ids[1].node_id)
        frame_s = await _frames(a[1], b, messages)
        stats = a[1].stats.snapshot()
        for server, pool, _ in (a, b):
            await pool.close()
            await server.stop()
        gossip_s = await _gossip_messages(ids[2:4], seconds)
        stream_kb = await _stream_memory(ids[4:20], 8, 8)
        result: dict[str, object] = {
            "handshake_full_ms": round(full_s * 1e3, 3),
            "handshake_resumed_ms": round(resumed_s * 1e3, 3),
            "resumed_dials": stats["dialed_resumed"],
            "frame_us": round(frame_s * 1e6, 1),
            "gossip_message_us": round(gossip_s * 1e6, 1),
            "stream_kb": round(stream_kb, 1),
        }
        result.update(_signatures(ids[0], cluster.ca, 2000))
        result["certificate_admit_us"] = round(
            _admissions(cluster.ca, cluster.ca.certificate, 200) * 1e6, 1
        )
        result["member_bytes"] = round(_member_bytes(ids[0].certificate_der, 2000))
        result["certificate_bytes"] = len(ids[0].certificate_der)
    return result


def main(argv: list[str] | None = None) -> int:
    doc = (__doc__ or "").split("\n")[0]
    ap = argparse.ArgumentParser(prog="python -m bench.costs", description=doc)
    ap.add_argument("--handshakes", type=int, default=200)
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--seconds", type=float, default=10.0, help="of the two-member probe run")
    ap.add_argument("--json", action="store_true", help="print one JSON object (the default)")
    a = ap.parse_args(argv)
    load = os.getloadavg()
    result = asyncio.run(_run(a.handshakes, a.messages, a.seconds))
    result["load_avg"] = [round(x, 2) for x in load]
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
