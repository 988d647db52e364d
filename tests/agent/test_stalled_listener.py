"""Every network call Shoal makes ends against a listener that accepts and never answers: the
agent-to-agent calls and log streams (``agent.mesh.peers``), the operator's client
(``agent.operator.client``) and gossip (``gossip.client``). Each raises its own "unreachable"
error within its timeout.

A listening socket that is never ``accept()``-ed is such a peer: the kernel completes the TCP
handshake from its backlog and nothing ever answers. The bound is the test's own
``asyncio.timeout``: a call that outlives it fails the test (no timed assert).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.mesh.peers import PeerClient, PeerUnreachable
from agent.operator.client import AgentUnreachable, ApiClient
from gossip.client import GossipClient
from gossip.transport import Unreachable
from tests.agent.authority_kit import Kit

TIMEOUT_S = 0.5
BOUND_S = 20.0
"""Far beyond TIMEOUT_S: only a call that never ends reaches it."""


@pytest.fixture
def silent() -> Iterator[str]:
    """``HOST:PORT`` of a listener that takes connections and never says a word."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


async def _drain(chunks: AsyncIterator[Any]) -> None:
    async for _ in chunks:
        pass


async def _ends_with(error: type[Exception], call: Callable[[], Awaitable[Any]]) -> None:
    async with asyncio.timeout(BOUND_S):
        with pytest.raises(error):
            await call()


async def test_no_call_waits_forever_on_a_silent_peer(tmp_path: Path, silent: str) -> None:
    kit = Kit(tmp_path)
    me = kit.agent("a")
    async with PeerClient(me, timeout_s=TIMEOUT_S) as peers:
        await _ends_with(PeerUnreachable, lambda: peers.call(silent, "status", {"job_id": "x"}))
        await _ends_with(PeerUnreachable, lambda: _drain(peers.stream(silent, "/v1/x")))
        await _ends_with(
            PeerUnreachable, lambda: _drain(peers.stream(silent, "/v1/x", quiet_s=TIMEOUT_S))
        )
    async with ApiClient(kit.cluster.operator, silent, timeout_s=TIMEOUT_S) as client:
        await _ends_with(AgentUnreachable, lambda: client.get("/healthz"))
        await _ends_with(AgentUnreachable, lambda: client.command("drain", {"node": "x"}))
        await _ends_with(AgentUnreachable, lambda: _drain(client.stream("/v1/jobs/x/logs")))
    async with GossipClient(me, kit.cluster.ca.certificate) as gossip:
        await _ends_with(Unreachable, lambda: gossip.send(silent, b"x", TIMEOUT_S))
