"""``ssl`` contexts for mutual TLS between Shoal nodes, and reading the peer's identity.

Both sides: TLS 1.3 only, the cluster CA as the only trust anchor, a certificate required from
the other side. Hostname checking is off because peers are identified by node id, which the
transport reads from the verified peer certificate after the handshake (:func:`peer_identity`).
Ed25519 certificates work for TLS 1.3 in OpenSSL >= 1.1.1 (the build here is OpenSSL 3.0).
"""

from __future__ import annotations

import asyncio.sslproto
import contextlib
import functools
import ssl
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gossip.identity import (
    IdentityError,
    NodeIdentity,
    Role,
    certificate_node_id,
    role_of_certificate,
)

TLS_READ_BUFFER_BYTES = 4 * 1024
"""Bytes an asyncio TLS connection reads from its socket at a time. OpenSSL gathers a TLS record
from as many reads as it takes, so this only sets how many reads a large message needs (ten for
40 KB) against memory held by every connection, idle or not (~60 at 32 agents)."""


def shrink_tls_read_buffers(size_bytes: int = TLS_READ_BUFFER_BYTES) -> None:
    """Give every asyncio TLS connection a small decrypt buffer (process-wide).

    asyncio's ``SSLProtocol`` zero-fills a 256 KiB ``bytearray`` per connection. An agent keeps
    a connection to and from each peer it talks to, so at 32 agents that was ~25 MB of each
    agent's memory for read buffers.
    """
    asyncio.sslproto.SSLProtocol.max_size = size_bytes


def import_aiohttp_without_system_cas() -> None:
    """Import aiohttp without the system CA bundle it would load (call before anything else
    imports it; a no-op after).

    ``aiohttp.connector`` builds two default client contexts when imported and loads the whole
    system CA bundle into each: ~1.7 MB of an agent's memory and ~50 ms of its start. Shoal
    trusts only its cluster CA and passes its own context to every session, so those two are
    left empty here: a connection that ever fell back to them would fail verification, never
    trust the world.
    """
    if "aiohttp.connector" in sys.modules:
        return
    create_default_context = ssl.create_default_context
    set_default_verify_paths = ssl.SSLContext.set_default_verify_paths

    def empty_client_context(*_: object, **__: object) -> ssl.SSLContext:
        return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies, against no CA at all

    def no_default_paths(_: ssl.SSLContext) -> None:
        return None

    ssl.create_default_context = empty_client_context
    ssl.SSLContext.set_default_verify_paths = no_default_paths  # type: ignore[method-assign,assignment]
    try:
        import aiohttp.connector  # noqa: F401
    finally:
        ssl.create_default_context = create_default_context
        ssl.SSLContext.set_default_verify_paths = set_default_verify_paths  # type: ignore[method-assign]


@dataclass(frozen=True, slots=True)
class PeerIdentity:
    """Who is on the other end of a verified TLS connection."""

    node_id: str
    role: Role
    certificate_der: bytes


_RESUME: ContextVar[ssl.SSLSession | None] = ContextVar("shoal_tls_resume", default=None)


class ResumingContext(ssl.SSLContext):
    """A client context that offers the TLS session :func:`resuming` names, if any.

    asyncio builds each connection's ``SSLObject`` through ``wrap_bio`` without a session
    argument, inside the task that opens the connection; the session travels there in a context
    variable. A resumed TLS 1.3 handshake skips both certificate signatures and their checks
    (the session was made by a full, mutually verified handshake with the same server process,
    whose ticket only it can open); the peer's certificate is still there to read afterwards,
    and both ends check its node id, validity and revocation at the application layer as after
    a full handshake."""

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        return super().wrap_bio(
            incoming,
            outgoing,
            server_side=server_side,
            server_hostname=server_hostname,
            session=session or _RESUME.get(),
        )


@contextlib.contextmanager
def resuming(session: ssl.SSLSession | None) -> Iterator[None]:
    """Connections opened by this task inside the block offer ``session`` (None: none)."""
    token = _RESUME.set(session)
    try:
        yield
    finally:
        _RESUME.reset(token)


SERVER_TICKETS = 1
"""TLS 1.3 session tickets a server sends after each full handshake: one, for the gossip
streams, which resume their session when they reconnect (see :class:`ResumingContext`)."""


def _context(purpose: int, identity: NodeIdentity, ca: x509.Certificate) -> ssl.SSLContext:
    ctx = (
        ResumingContext(purpose) if purpose == ssl.PROTOCOL_TLS_CLIENT else ssl.SSLContext(purpose)
    )
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    ctx.load_cert_chain(certfile=identity.cert_path, keyfile=identity.key_path)
    ctx.load_verify_locations(cadata=ca.public_bytes(serialization.Encoding.PEM).decode("ascii"))
    if purpose == ssl.PROTOCOL_TLS_SERVER:
        ctx.num_tickets = SERVER_TICKETS  # TLS 1.3's default is two; a stream uses one
    return ctx


def server_context(identity: NodeIdentity, ca: x509.Certificate) -> ssl.SSLContext:
    """A server context that demands a client certificate issued by ``ca``."""
    return _context(ssl.PROTOCOL_TLS_SERVER, identity, ca)


def client_context(identity: NodeIdentity, ca: x509.Certificate) -> ssl.SSLContext:
    """A client context that presents ``identity`` and accepts only servers certified by ``ca``."""
    return _context(ssl.PROTOCOL_TLS_CLIENT, identity, ca)


@functools.lru_cache(maxsize=1024)
def peer_identity(certificate_der: bytes) -> PeerIdentity:
    """The node id and role a handshake-verified peer certificate proves (else IdentityError).

    Both ends read it on every request; a peer's certificate is the same bytes every time, so
    it is parsed once (revocation and expiry are checked per request, by the trust store)."""
    try:
        cert = x509.load_der_x509_certificate(certificate_der)
    except ValueError as e:
        raise IdentityError(f"peer certificate is not DER: {e}") from e
    return PeerIdentity(
        node_id=certificate_node_id(cert),
        role=role_of_certificate(cert),
        certificate_der=certificate_der,
    )
