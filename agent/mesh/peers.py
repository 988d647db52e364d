"""Agent-to-agent calls under ``/v1/internal/...``, over the same mutual-TLS channel as gossip.

Every call is a JSON POST answered with JSON (a forwarded command is the sealed bytes as they
came). Where the agent's gossip node has streams, a call rides the stream between the two agents
(:meth:`gossip.node.GossipNode.call`: no connection to open, no TLS handshake, no HTTP parsing)
and reaches the same handler with the same checks; a peer that predates streams is called over
HTTP. The server side requires the caller's certificate to carry the ``agent`` role. A call that
cannot reach the peer, times out or gets a 5xx raises :class:`PeerUnreachable` (the outcome is
unknown); a 4xx raises :class:`PeerRefused` (the peer answered no).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, TypeVar

import aiohttp

from agent.common.parsing import json_loads
from agent.wire.codec import WireError
from gossip.addresses import split_address
from gossip.client import PeerCheckingRequest, PooledSession
from gossip.identity import NodeIdentity
from gossip.streamparts import CallFailed
from gossip.tls import client_context

INTERNAL = "/v1/internal"


def stream_call_op(path: str) -> str | None:
    """The call a path names when it may ride a gossip stream: ``/v1/internal/<op>``, one
    segment (a forwarded command, the job protocol's calls); None for anything else (the
    content store's routes, log streams), which stays on HTTP."""
    op = path.removeprefix(f"{INTERNAL}/")
    if op == path or not op or "/" in op or "?" in op:
        return None
    return op


JSON_CONTENT_TYPE = "application/json"
"""What every ``/v1/internal/<op>`` call sends (the server refuses anything else, 415)."""


class PeerError(Exception):
    pass


class PeerUnreachable(PeerError):
    """No answer: the peer may or may not have acted."""


class PeerRefused(PeerError):
    """The peer answered with a refusal."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status}: {reason}")
        self.status = status
        self.reason = reason


A = TypeVar("A")


def decoded_answer(decode: Callable[[Any], A], answer: dict[str, Any]) -> A:
    """A peer's answer decoded; one that does not decode is as good as none (unreachable)."""
    try:
        return decode(answer)
    except WireError as exc:
        raise PeerUnreachable(f"malformed answer: {exc}") from None


class StreamCalls(Protocol):
    """Calls over the gossip streams (``gossip.node.GossipNode`` provides it)."""

    async def call(
        self, addr: str, path: str, content_type: str, body: bytes, timeout_s: float
    ) -> tuple[int, bytes]: ...


def _json_answer(text: str) -> dict[str, Any]:
    try:
        answer = json_loads(text)
    except ValueError:
        return {"error": text.strip()[:200]}
    if not isinstance(answer, dict):
        return {"error": "answer is not a JSON object"}
    return answer


class PeerClient(PooledSession):
    """A pooled HTTPS client presenting this agent's certificate."""

    def __init__(
        self,
        identity: NodeIdentity,
        *,
        timeout_s: float = 5.0,
        shared: Callable[[], aiohttp.ClientSession | None] | None = None,
        streams: StreamCalls | None = None,
    ) -> None:
        """``shared``: a pooled session presenting the same certificate (the gossip client's),
        for calls that end within ``timeout_s``; longer calls and streams get their own, so they
        never hold the connections that gossip and probes need. ``streams``: where the internal
        calls go first (see the module docstring)."""
        self._streams = streams
        self._identity = identity
        self._shared = shared
        self._ssl = client_context(identity, identity.ca_certificate)
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _make_session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._ssl, limit_per_host=8),
            request_class=PeerCheckingRequest,
        )

    def url(self, addr: str, path: str) -> str:
        host, port = split_address(addr)
        host = f"[{host}]" if ":" in host else host
        return f"https://{host}:{port}{path}"

    async def call(
        self, addr: str, op: str, body: dict[str, Any], *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """POST ``body`` to ``/v1/internal/<op>`` and return the JSON answer."""
        data = json.dumps(body, separators=(",", ":")).encode()
        status, answer = await self.post(
            addr, f"{INTERNAL}/{op}", data, JSON_CONTENT_TYPE, timeout_s=timeout_s
        )
        if status >= 500:
            raise PeerUnreachable(f"{addr} {op}: {status} {answer.get('error', '')}")
        if status >= 400:
            raise PeerRefused(status, str(answer.get("error", "")))
        return answer

    async def post(
        self,
        addr: str,
        path: str,
        data: bytes,
        content_type: str,
        *,
        timeout_s: float | None = None,
        warm: bool = False,
    ) -> tuple[int, dict[str, Any]]:
        """POST raw bytes; the status and the JSON answer (``{"error": ...}`` when not JSON).

        ``warm``: ride the shared connections even with a longer ``timeout_s``, for a call that
        is quick but for rare bad cases (a forwarded command): a fresh connection would cost
        it a TLS handshake, and it seldom goes to the same peer twice in a row."""
        if self._streams is not None and stream_call_op(path) is not None:
            try:
                status, raw = await self._streams.call(
                    addr, path, content_type, data, timeout_s or self.timeout_s
                )
            except CallFailed as exc:
                if not exc.legacy:
                    raise PeerUnreachable(f"{addr}: {exc}") from exc
            else:
                return status, _json_answer(raw.decode("utf-8", "replace"))
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)
        short = warm or timeout_s is None or timeout_s <= self.timeout_s
        session = (self._shared() if short and self._shared is not None else None) or self._pooled()
        try:
            async with session.post(
                self.url(addr, path),
                data=data,
                headers={"Content-Type": content_type},
                timeout=timeout,
            ) as response:
                return response.status, _json_answer(await response.text())
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise PeerUnreachable(f"{addr}: {exc!r}") from exc

    async def fetch(
        self, addr: str, path: str, *, max_bytes: int, timeout_s: float | None = None
    ) -> bytes:
        """GET ``path`` and return its body (at most ``max_bytes``); a 4xx raises
        :class:`PeerRefused`, anything else that is not 200 :class:`PeerUnreachable`."""
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)
        try:
            async with self._pooled().get(self.url(addr, path), timeout=timeout) as response:
                if response.status != 200:
                    text = (await response.content.read(4096)).decode("utf-8", "replace")
                    try:
                        reason = str(json.loads(text).get("error", text))
                    except (ValueError, AttributeError):
                        reason = text.strip()[:200]
                    if 400 <= response.status < 500:
                        raise PeerRefused(response.status, reason)
                    raise PeerUnreachable(f"{addr} {path}: {response.status} {reason}")
                blocks: list[bytes] = []
                size = 0
                async for block in response.content.iter_chunked(1 << 16):
                    size += len(block)
                    if size > max_bytes:
                        raise PeerUnreachable(f"{addr} {path}: answer over {max_bytes} bytes")
                    blocks.append(block)
                body = b"".join(blocks)
                if response.content_length is not None and len(body) != response.content_length:
                    raise PeerUnreachable(f"{addr} {path}: answer cut short")
                return body
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise PeerUnreachable(f"{addr}: {exc!r}") from exc

    async def stream(
        self,
        addr: str,
        path: str,
        *,
        timeout_s: float | None = None,
        quiet_s: float | None = None,
    ) -> AsyncIterator[bytes]:
        """GET ``path`` and yield the body's chunks as they come (no total timeout).

        A peer that accepts and never answers stalls no one: the connection, and the answer's
        head, must come within this client's ``timeout_s``; then, with ``quiet_s``, the peer may
        send nothing for at most that long (``None``: a followed log, quiet while its job is)."""
        timeout = aiohttp.ClientTimeout(
            total=timeout_s, sock_connect=self.timeout_s, sock_read=quiet_s
        )
        try:
            async with asyncio.timeout(self.timeout_s):
                response = await self._pooled().get(self.url(addr, path), timeout=timeout)
            async with response:
                if response.status != 200:
                    text = await response.text()
                    raise PeerRefused(response.status, text.strip()[:200])
                async for chunk in response.content.iter_any():
                    yield chunk
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise PeerUnreachable(f"{addr}: {exc!r}") from exc
