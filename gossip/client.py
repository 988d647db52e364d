"""The gossip client: one ``aiohttp.ClientSession`` with a keep-alive pool.

``send`` posts a body and returns the response body (None for 204), raising a
:class:`gossip.transport.TransportError` subclass otherwise. When the caller names the node it
expects, the server certificate's node id is checked after the handshake and the response
discarded (and its connection closed) on mismatch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextvars import ContextVar
from types import TracebackType
from typing import Any, Self

import aiohttp
from aiohttp.connector import Connection
from cryptography import x509

from gossip import droplist
from gossip.addresses import split_address
from gossip.certtrust import Admission, CertTrust
from gossip.identity import IdentityError, NodeIdentity
from gossip.tls import client_context, peer_identity
from gossip.transport import (
    CONTENT_TYPE,
    DEFAULT_MAX_BODY_BYTES,
    PATH,
    PROTOCOL_HEADER,
    PROTOCOL_VERSION,
    REVOCATIONS_CONTENT_TYPE,
    PeerMismatch,
    RemoteRejected,
    RevokedByPeer,
    Unreachable,
)

_PeerCheck = Callable[[asyncio.Transport | None], None]
_PEER_CHECK: ContextVar[_PeerCheck | None] = ContextVar("shoal_peer_check", default=None)


class PeerCheckingRequest(aiohttp.ClientRequest):
    """Checks the server's certificate (node id, revocation) before the request is written;
    refuses to write to a peer on the test drop list (:mod:`gossip.droplist`)."""

    async def send(self, conn: Connection) -> aiohttp.ClientResponse:
        if droplist.active() and _dropped_server(conn.transport):
            conn.close()
            raise aiohttp.ClientConnectionError("dropped (test partition)")
        check = _PEER_CHECK.get()
        if check is not None:
            check(conn.transport)
        return await super().send(conn)


def _dropped_server(transport: asyncio.Transport | None) -> bool:
    ssl_object: Any = transport.get_extra_info("ssl_object") if transport else None
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    try:
        return bool(der) and droplist.dropped(peer_identity(der).node_id)
    except IdentityError:
        return False


class PooledSession:
    """Owns one lazily made, kept-alive ``aiohttp.ClientSession`` (remade if it was closed);
    ``close()`` or leaving ``async with`` closes it. Subclasses say how to make it."""

    _session: aiohttp.ClientSession | None = None

    def _make_session(self) -> aiohttp.ClientSession:
        raise NotImplementedError

    def _pooled(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = self._make_session()
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class GossipClient(PooledSession):
    """Posts gossip bodies to peers over one pooled, keep-alive ``aiohttp.ClientSession``.

    One connection per peer by default: a send to a peer whose connection is busy waits for it
    (a loopback round trip is about half a millisecond) instead of opening another. A fresh
    connection costs a TLS handshake, about ten times a request in CPU, and a mesh starting
    at once used to open two or three per pair of members.
    """

    def __init__(
        self,
        identity: NodeIdentity,
        ca: x509.Certificate,
        *,
        trust: CertTrust | None = None,
        max_connections: int = 256,
        max_connections_per_peer: int = 1,
        keepalive_timeout_s: float = 30.0,
        max_response_bytes: int = DEFAULT_MAX_BODY_BYTES,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._ssl = client_context(identity, ca)
        self._identity = identity
        self._trust = trust
        self._max_connections = max_connections
        self._max_per_peer = max_connections_per_peer
        self._keepalive_timeout_s = keepalive_timeout_s
        self._max_response_bytes = max_response_bytes
        self._wall_clock = wall_clock
        self._headers = {PROTOCOL_HEADER: PROTOCOL_VERSION, "Content-Type": CONTENT_TYPE}
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        """The pooled session (this node's certificate, kept-alive connections to its peers).
        The agent's short calls to other agents ride on it: their connections are warm from
        gossip, so a call rarely waits for a TLS handshake."""
        return self._pooled()

    def _make_session(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            ssl=self._ssl,
            limit=self._max_connections,
            limit_per_host=self._max_per_peer,
            keepalive_timeout=self._keepalive_timeout_s,
        )
        return aiohttp.ClientSession(
            connector=connector,
            headers=self._headers,
            auto_decompress=False,
            request_class=PeerCheckingRequest,
        )

    def _check_server(self, transport: asyncio.Transport | None, expect: str | None) -> None:
        """Runs on the fresh or pooled connection before any request byte is written."""
        ssl_object: Any = transport.get_extra_info("ssl_object") if transport else None
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if not der:
            raise PeerMismatch("server presented no certificate")
        try:
            peer = peer_identity(der)
        except IdentityError as e:
            raise PeerMismatch(f"server certificate: {e}") from e
        if expect is not None and peer.node_id != expect:
            raise PeerMismatch(f"expected node {expect}, server is {peer.node_id}")
        if self._trust is not None:
            admission = self._trust.check(peer.node_id, der, self._wall_clock())
            if admission is not Admission.ADMITTED:
                raise PeerMismatch(f"server {peer.node_id}: certificate {admission.value}")

    async def _read_capped(self, response: aiohttp.ClientResponse) -> bytes:
        length = response.content_length
        if length is not None and length > self._max_response_bytes:
            raise RemoteRejected(response.status, "response over the size limit")
        chunks: list[bytes] = []
        total = 0
        async for chunk in response.content.iter_chunked(64 * 1024):
            total += len(chunk)
            if total > self._max_response_bytes:
                raise RemoteRejected(response.status, "response over the size limit")
            chunks.append(chunk)
        return b"".join(chunks)

    async def send(
        self,
        address: str,
        body: bytes,
        timeout_s: float,
        expect_node_id: str | None = None,
    ) -> bytes | None:
        """POST ``body`` to the peer at ``"host:port"``; its answer, or None when it had none."""
        host, port = split_address(address)
        url_host = f"[{host}]" if ":" in host else host
        url = f"https://{url_host}:{port}{PATH}"
        session = self._pooled()
        token = _PEER_CHECK.set(lambda transport: self._check_server(transport, expect_node_id))
        try:
            async with session.post(
                url, data=body, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as response:
                if response.status == 204:
                    return None
                if response.status == 403 and response.content_type == REVOCATIONS_CONTENT_TYPE:
                    raise RevokedByPeer(address, await self._read_capped(response))
                if response.status != 200:
                    raise RemoteRejected(response.status, response.reason or "")
                return await self._read_capped(response)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise Unreachable(f"{address}: {e!r}") from e
        finally:
            _PEER_CHECK.reset(token)
