"""Real aiohttp servers on loopback with real mutual TLS from Shoal certificates."""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest
from cryptography.hazmat.primitives.serialization import Encoding

from gossip.admission import ConnectionLimits
from gossip.budgets import RateLimit
from gossip.certtrust import CertSigner, CertTrust
from gossip.client import GossipClient
from gossip.identity import (
    ClusterIdentity,
    NodeIdentity,
    Role,
    enroll_node,
    init_cluster,
    issue_certificate,
)
from gossip.revocation import decode, issue_revocations
from gossip.server import GossipServer
from gossip.transport import (
    CONTENT_TYPE,
    PATH,
    PROTOCOL_HEADER,
    HandlerRejected,
    PeerMismatch,
    RemoteRejected,
    RevokedByPeer,
    TransportError,
    TransportStats,
    Unreachable,
)

NOW = datetime.now(UTC)  # TLS checks validity against the real clock
DAY = timedelta(days=1)
TIMEOUT_S = 5.0


@dataclass
class Lab:
    cluster: ClusterIdentity
    a: NodeIdentity
    b: NodeIdentity
    stranger: NodeIdentity  # from another cluster's CA
    expired: NodeIdentity
    seen: list[tuple[str, Role, bytes]] = field(default_factory=list)

    async def echo(self, peer: str, role: Role, body: bytes) -> bytes | None:
        self.seen.append((peer, role, body))
        if body == b"reject me":
            raise HandlerRejected("bad record")
        if body == b"nothing":
            return None
        return b"echo:" + body


@pytest.fixture
def lab(tmp_path: Path) -> Lab:
    cluster = init_cluster(tmp_path / "c", "lab", "op", NOW)
    ca = cluster.ca
    other = init_cluster(tmp_path / "other", "other", "op", NOW)
    expired_dir = tmp_path / "old"
    expired = enroll_node(ca, expired_dir, "agent", ["127.0.0.1"], DAY, NOW - 3 * DAY)
    return Lab(
        cluster=cluster,
        a=enroll_node(ca, tmp_path / "a", "agent", ["127.0.0.1", "localhost"], DAY, NOW),
        b=enroll_node(ca, tmp_path / "b", "agent", ["127.0.0.1"], DAY, NOW),
        stranger=other.operator,
        expired=expired,
    )


async def eventually(predicate: Callable[[], bool], tries: int = 300) -> None:
    """Wait for the server side of a refused handshake to be counted (bounded)."""
    for _ in range(tries):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


def client_for(lab: Lab, who: NodeIdentity) -> GossipClient:
    return GossipClient(who, lab.cluster.ca.certificate)


@pytest.fixture
async def server(lab: Lab) -> AsyncIterator[GossipServer]:
    trust = CertTrust(lab.cluster.ca.certificate)
    async with GossipServer(
        lab.a, lab.cluster.ca.certificate, lab.echo, "127.0.0.1", 0, 4096, trust=trust
    ) as srv:
        yield srv


async def test_round_trip_over_mutual_tls(lab: Lab, server: GossipServer) -> None:
    async with client_for(lab, lab.b) as client:
        answer = await client.send(server.address, b"\x92\x01\x02", TIMEOUT_S, lab.a.node_id)
        assert answer == b"echo:\x92\x01\x02"
        assert await client.send(server.address, b"nothing", TIMEOUT_S) is None
    assert lab.seen == [
        (lab.b.node_id, "agent", b"\x92\x01\x02"),
        (lab.b.node_id, "agent", b"nothing"),
    ]
    assert server.stats.accepted == 2


async def test_operator_role_reaches_the_handler(lab: Lab, server: GossipServer) -> None:
    async with client_for(lab, lab.cluster.operator) as client:
        await client.send(server.address, b"hi", TIMEOUT_S)
    assert lab.seen == [(lab.cluster.operator.node_id, "operator", b"hi")]


async def test_client_checks_the_server_node_id(lab: Lab, server: GossipServer) -> None:
    async with client_for(lab, lab.b) as client:
        with pytest.raises(PeerMismatch, match=lab.a.node_id):
            await client.send(server.address, b"x", TIMEOUT_S, expect_node_id=lab.b.node_id)
    assert lab.seen == []  # checked before the request was written


def _bare_client_context(lab: Lab) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ca_pem = lab.cluster.ca.certificate.public_bytes(Encoding.PEM).decode()
    ctx.load_verify_locations(cadata=ca_pem)
    return ctx


async def test_client_without_certificate_is_rejected(lab: Lab, server: GossipServer) -> None:
    connector = aiohttp.TCPConnector(ssl=_bare_client_context(lab))
    async with aiohttp.ClientSession(connector=connector) as session:
        with pytest.raises((aiohttp.ClientError, ssl.SSLError, OSError)):
            async with session.post(
                f"https://{server.address}{PATH}",
                data=b"x",
                headers={PROTOCOL_HEADER: "1", "Content-Type": CONTENT_TYPE},
            ) as response:
                await response.read()
    await eventually(lambda: server.stats.no_client_cert == 1)
    assert lab.seen == []


@pytest.mark.parametrize("who", ["stranger", "expired"])
async def test_foreign_or_expired_certificate_is_rejected(
    lab: Lab, server: GossipServer, who: str
) -> None:
    identity = lab.stranger if who == "stranger" else lab.expired
    async with client_for(lab, identity) as client:
        with pytest.raises(Unreachable):
            await client.send(server.address, b"x", TIMEOUT_S)
    await eventually(lambda: server.stats.bad_cert == 1)
    assert lab.seen == []


async def test_client_refuses_a_server_from_another_ca(lab: Lab) -> None:
    other_ca = lab.stranger.ca_certificate
    async with (
        GossipServer(lab.stranger, other_ca, lab.echo, "127.0.0.1", 0) as srv,
        client_for(lab, lab.b) as client,
    ):
        with pytest.raises(Unreachable, match="CERTIFICATE_VERIFY_FAILED"):
            await client.send(srv.address, b"x", TIMEOUT_S)
    assert lab.seen == []


async def test_revoked_peer_is_refused(lab: Lab) -> None:
    trust = CertTrust(lab.cluster.ca.certificate)
    rl = issue_revocations(
        CertSigner(lab.cluster.operator), [lab.b.node_id], [], 1, NOW.timestamp()
    )
    assert trust.apply_revocations(rl, NOW.timestamp())
    async with (
        GossipServer(lab.a, lab.cluster.ca.certificate, lab.echo, trust=trust) as srv,
        client_for(lab, lab.b) as client,
    ):
        with pytest.raises(RevokedByPeer) as refused:
            await client.send(srv.address, b"x", TIMEOUT_S)
        # The refusal shows the list that revokes it, for the revoked node to see for itself.
        assert decode(refused.value.revocations) == rl
    assert srv.stats.revoked == 1
    assert lab.seen == []


async def test_oversized_body_is_refused_before_reading(lab: Lab, server: GossipServer) -> None:
    async with client_for(lab, lab.b) as client:
        with pytest.raises(RemoteRejected) as refused:
            await client.send(server.address, b"x" * 5000, TIMEOUT_S)
        assert refused.value.status == 413
        # The peer may go on after its refusal (a new connection replaces the closed one).
        assert await client.send(server.address, b"small", TIMEOUT_S) == b"echo:small"
    assert server.stats.oversized == 1
    assert lab.seen == [(lab.b.node_id, "agent", b"small")]


async def _raw_post(lab: Lab, server: GossipServer, data: object, headers: dict[str, str]) -> int:
    ctx = _bare_client_context(lab)
    ctx.load_cert_chain(lab.b.cert_path, lab.b.key_path)
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session,
        session.post(f"https://{server.address}{PATH}", data=data, headers=headers) as response,
    ):
        return response.status


async def test_chunked_oversized_body_is_cut_off_while_reading(
    lab: Lab, server: GossipServer
) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(8):  # 8 KiB without a Content-Length, limit 4 KiB
            yield b"y" * 1024

    status = await _raw_post(
        lab, server, chunks(), {PROTOCOL_HEADER: "1", "Content-Type": CONTENT_TYPE}
    )
    assert status == 413
    assert server.stats.oversized == 1
    assert lab.seen == []


async def test_header_checks(lab: Lab, server: GossipServer) -> None:
    assert await _raw_post(lab, server, b"x", {PROTOCOL_HEADER: "1"}) == 415
    assert (
        await _raw_post(lab, server, b"x", {PROTOCOL_HEADER: "9", "Content-Type": CONTENT_TYPE})
        == 400
    )
    assert await _raw_post(lab, server, b"x", {"Content-Type": CONTENT_TYPE}) == 400
    stats = server.stats
    assert (stats.wrong_content_type, stats.unknown_protocol_version) == (1, 2)
    assert lab.seen == []


async def test_handler_rejection_is_counted(lab: Lab, server: GossipServer) -> None:
    async with client_for(lab, lab.b) as client:
        with pytest.raises(RemoteRejected) as refused:
            await client.send(server.address, b"reject me", TIMEOUT_S)
    assert refused.value.status == 400
    assert server.stats.handler_rejected == 1
    assert server.stats.accepted == 0


async def test_flood_from_one_peer_is_rate_limited_per_peer(lab: Lab) -> None:
    frozen = lambda: 100.0  # noqa: E731 - no refill during the test
    limit = RateLimit(rate_per_s=1.0, burst=3.0)
    async with (
        GossipServer(
            lab.a, lab.cluster.ca.certificate, lab.echo, rate_limit=limit, clock=frozen
        ) as srv,
        client_for(lab, lab.b) as flooder,
        client_for(lab, lab.cluster.operator) as other,
    ):
        statuses: list[int] = []
        for i in range(10):
            try:
                await flooder.send(srv.address, b"f%d" % i, TIMEOUT_S)
                statuses.append(200)
            except RemoteRejected as e:
                statuses.append(e.status)
        assert statuses == [200, 200, 200] + [429] * 7
        assert await other.send(srv.address, b"still here", TIMEOUT_S) == b"echo:still here"
    assert srv.stats.rate_limited == 7
    assert len(lab.seen) == 4


async def test_unreachable_peer(lab: Lab) -> None:
    async with GossipServer(lab.a, lab.cluster.ca.certificate, lab.echo) as srv:
        address = srv.address
    async with client_for(lab, lab.b) as client:
        with pytest.raises(TransportError):
            await client.send(address, b"x", TIMEOUT_S)


def test_stats_snapshot_names() -> None:
    assert set(TransportStats().snapshot()) >= {
        "no_client_cert",
        "bad_cert",
        "oversized",
        "wrong_content_type",
        "unknown_protocol_version",
        "handler_rejected",
        "rate_limited",
    }


def test_expired_fixture_is_really_expired(lab: Lab) -> None:
    assert lab.expired.certificate.not_valid_after_utc < NOW
    cert = issue_certificate(lab.cluster.ca, lab.expired.key.public_key(), "agent", [], DAY, NOW)
    assert cert.not_valid_after_utc > NOW


async def test_application_routes_share_the_listener_and_its_identity_check(lab: Lab) -> None:
    from aiohttp import web

    from gossip.tls import client_context
    from gossip.transport import request_peer

    async def whoami(request: web.Request) -> web.Response:
        peer = request_peer(request)
        return web.json_response({"node": peer.node_id, "role": peer.role})

    def setup(app: web.Application) -> None:
        app.router.add_get("/v1/whoami", whoami)

    trust = CertTrust(lab.cluster.ca.certificate)
    async with GossipServer(
        lab.a, lab.cluster.ca.certificate, lab.echo, trust=trust, app_setup=setup
    ) as srv:
        url = f"https://{srv.address}/v1/whoami"
        operator = lab.cluster.operator
        ctx = client_context(operator, lab.cluster.ca.certificate)
        async with aiohttp.ClientSession() as session, session.get(url, ssl=ctx) as response:
            assert response.status == 200
            assert await response.json() == {"node": operator.node_id, "role": "operator"}
        bare = ssl.create_default_context(cafile=str(lab.a.ca_path))
        bare.check_hostname = False
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ClientError):
                async with session.get(url, ssl=bare) as response:
                    await response.read()
        await eventually(lambda: srv.stats.no_client_cert >= 1)


def test_aiohttp_imported_by_an_agent_holds_no_system_ca_and_ssl_is_left_as_it_was() -> None:
    # A fresh interpreter: the test process imported aiohttp long ago.
    script = """
import ssl, sys
from gossip.tls import import_aiohttp_without_system_cas
before = (ssl.create_default_context, ssl.SSLContext.set_default_verify_paths)
import_aiohttp_without_system_cas()
import aiohttp.connector as c
assert (ssl.create_default_context, ssl.SSLContext.set_default_verify_paths) == before
for ctx in (c._SSL_CONTEXT_VERIFIED, c._SSL_CONTEXT_UNVERIFIED):
    assert ctx.cert_store_stats()["x509_ca"] == 0, ctx.cert_store_stats()
assert c._SSL_CONTEXT_VERIFIED.verify_mode == ssl.CERT_REQUIRED  # trusts nobody, fails closed
import_aiohttp_without_system_cas()  # once aiohttp is in, a no-op
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.strip() == "ok", done.stderr


# -- connections that never finish their handshake ---------------------------------------------

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def closed_by_server(conn: Conn) -> bool:
    """Whether the server closed (or reset) this connection; a short wait for a live one."""
    try:
        return await asyncio.wait_for(conn[0].read(1), 0.05) == b""
    except ConnectionError:
        return True
    except TimeoutError:
        return False


async def open_idle(srv: GossipServer, count: int, first: bytes = b"") -> list[Conn]:
    """``count`` plain TCP connections that send ``first`` (or nothing) and then wait."""
    conns = []
    for _ in range(count):
        conn = await asyncio.open_connection("127.0.0.1", srv.port)
        if first:
            conn[1].write(first)
        conns.append(conn)
        await asyncio.sleep(0.005)  # accepted in this order
    return conns


def client_hello(lab: Lab) -> bytes:
    """A real ClientHello (its first flight), for connections that then stall in the handshake."""
    from gossip.tls import client_context

    tls = client_context(lab.b, lab.cluster.ca.certificate).wrap_bio(
        ssl.MemoryBIO(), outgoing := ssl.MemoryBIO(), server_hostname="127.0.0.1"
    )
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def close_all(conns: list[Conn]) -> None:
    for _, writer in conns:
        writer.close()


def lab_server(lab: Lab, limits: ConnectionLimits) -> GossipServer:
    return GossipServer(lab.a, lab.cluster.ca.certificate, lab.echo, limits=limits)


async def test_idle_connections_are_bounded_per_source_and_the_oldest_gives_way(lab: Lab) -> None:
    limits = ConnectionLimits(max_unfinished=8, max_unfinished_per_source=4)
    async with lab_server(lab, limits) as srv, client_for(lab, lab.b) as client:
        idle = await open_idle(srv, 10)
        await eventually(lambda: srv.stats.handshakes_evicted == 6)
        assert [await closed_by_server(c) for c in idle] == [True] * 6 + [False] * 4
        # A peer still gets in at once: its connection is the newest, one more idle one goes.
        assert await client.send(srv.address, b"hi", TIMEOUT_S) == b"echo:hi"
        assert srv.stats.handshakes_evicted == 7
        assert [await closed_by_server(c) for c in idle[6:]] == [True, False, False, False]
        assert srv.stats.handshake_slowest_ms < 1000
        close_all(idle)


@pytest.mark.parametrize("how", ["evicted", "stopped"])
async def test_a_connection_let_go_before_its_handshake_began_is_closed(lab: Lab, how: str) -> None:
    """Accepted, then evicted or the server stopped in the same iteration of the loop: its
    handshake never began, and its socket is closed all the same (it was left to the GC, a
    ResourceWarning in CI)."""
    srv = lab_server(lab, ConnectionLimits())
    await srv.start()
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    try:
        srv._admit(ours, "127.0.0.1")
        (entry,) = srv._unfinished
        if how == "evicted":
            srv._evict(entry)
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        else:
            await srv.stop()
        assert ours.fileno() == -1
    finally:
        theirs.close()
        await srv.stop()


async def test_idle_connections_give_way_before_handshakes_in_progress(lab: Lab) -> None:
    limits = ConnectionLimits(max_unfinished=3, max_unfinished_per_source=3)
    async with lab_server(lab, limits) as srv:
        started = await open_idle(srv, 2, first=client_hello(lab))  # then nothing
        idle = await open_idle(srv, 1) + await open_idle(srv, 1, first=b"\x16\x03")
        await eventually(lambda: srv.stats.handshakes_evicted == 1)
        assert [await closed_by_server(c) for c in started + idle] == [False, False, True, False]
        close_all(started + idle)


async def test_a_client_hello_that_comes_in_pieces_still_gets_through(lab: Lab) -> None:
    from gossip.tls import client_context

    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    ctx = client_context(lab.b, lab.cluster.ca.certificate)
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    async with lab_server(lab, ConnectionLimits()) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        with pytest.raises(ssl.SSLWantReadError):
            tls.do_handshake()
        hello = outgoing.read()
        writer.write(hello[:7])
        await asyncio.sleep(0.05)
        writer.write(hello[7:])
        while True:
            data = await asyncio.wait_for(reader.read(65536), TIMEOUT_S)
            assert data, "closed by the server"
            incoming.write(data)
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                writer.write(outgoing.read())
        writer.write(outgoing.read())  # our Finished
        await eventually(lambda: srv.stats.handshake_slowest_ms >= 50)
        assert srv.stats.handshake_failed == srv.stats.handshakes_evicted == 0
        writer.close()


async def test_handshakes_in_progress_are_bounded(lab: Lab) -> None:
    limits = ConnectionLimits(max_handshaking=2)
    async with lab_server(lab, limits) as srv, client_for(lab, lab.b) as client:
        # A byte and nothing more: still a bare socket, not a handshake.
        bytes_only = await open_idle(srv, 5, first=b"\x16")
        stalled = await open_idle(srv, 5, first=client_hello(lab))
        await eventually(lambda: srv.stats.handshakes_evicted == 3)
        assert not any([await closed_by_server(c) for c in bytes_only])
        assert [await closed_by_server(c) for c in stalled] == [True] * 3 + [False] * 2
        assert await client.send(srv.address, b"hi", TIMEOUT_S) == b"echo:hi"
        assert srv.stats.handshakes_evicted == 4
        close_all(bytes_only + stalled)


async def test_unfinished_connections_are_closed_at_the_deadline(lab: Lab) -> None:
    async with lab_server(lab, ConnectionLimits(handshake_timeout_s=0.2)) as srv:
        conns = await open_idle(srv, 1) + await open_idle(srv, 1, first=b"\x16\x03")
        await eventually(lambda: srv.stats.handshake_timeouts == 2)
        assert [await closed_by_server(c) for c in conns] == [True, True]
        assert srv.stats.handshakes_evicted == 0 and srv.stats.handshake_failed == 0
        close_all(conns)


async def test_a_peer_holding_too_many_connections_loses_its_oldest(lab: Lab) -> None:
    from gossip.tls import client_context

    ctx = client_context(lab.b, lab.cluster.ca.certificate)
    async with lab_server(lab, ConnectionLimits(max_connections_per_peer=2)) as srv:
        conns = []
        for _ in range(3):
            conns.append(await asyncio.open_connection("127.0.0.1", srv.port, ssl=ctx))
        await eventually(lambda: srv.stats.peer_connections_closed == 1)
        assert [await closed_by_server(c) for c in conns] == [True, False, False]
        close_all(conns)


async def test_a_newcomer_past_max_connections_is_refused(lab: Lab) -> None:
    async with (
        lab_server(lab, ConnectionLimits(max_connections=1)) as srv,
        client_for(lab, lab.b) as client,
    ):
        assert await client.send(srv.address, b"kept", TIMEOUT_S) == b"echo:kept"  # held alive
        late = await open_idle(srv, 1)
        await eventually(lambda: srv.stats.connections_refused == 1)
        assert await closed_by_server(late[0])
        close_all(late)
