"""Per-peer budgets: token buckets of messages, and CPU budgets (a peer whose messages cost too
much to handle has them dropped until its budget refills, and nobody else's are): the sans-I/O
balances, then the stream gate."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from gossip.admission import FrameGate
from gossip.budgets import Charged, CpuBuckets, CpuBudget, RateLimit, TokenBuckets
from gossip.tls import PeerIdentity
from gossip.transport import TransportStats


def test_token_buckets_refill_and_stay_bounded() -> None:
    buckets = TokenBuckets(RateLimit(rate_per_s=2.0, burst=2.0, max_peers=3))
    assert [buckets.take("p", 0.0) for _ in range(3)] == [True, True, False]
    assert buckets.take("p", 0.5)  # 0.5 s x 2/s = one token back
    assert not buckets.take("p", 0.5)
    for i in range(1000):
        buckets.take(f"peer{i}", 1.0)
    assert len(buckets) == 3


def test_balances_refill_at_the_share_allow_a_debt_and_stay_bounded() -> None:
    buckets = CpuBuckets(CpuBudget(share=0.1, burst_s=0.5, max_peers=3))
    assert buckets.allows("p", 0.0)
    buckets.charge("p", 0.4, 0.0)
    assert buckets.allows("p", 0.0)  # 0.1 s left
    buckets.charge("p", 0.4, 0.0)  # one dear message: 0.3 s in debt
    assert not buckets.allows("p", 0.0)
    assert not buckets.allows("p", 2.9)  # 0.29 s back at a tenth of a core
    assert buckets.allows("p", 3.1)
    assert buckets.allows("q", 0.0)  # another peer's balance is its own
    buckets.charge("p", 0.0, 100.0)
    assert buckets.allows("p", 100.0)
    for i in range(1000):
        buckets.charge(f"peer{i}", 1.0, 200.0)
    assert len(buckets) == 3


class _Clocks:
    def __init__(self) -> None:
        self.now = 0.0
        self.cpu = 0.0


def _gate(clocks: _Clocks, stats: TransportStats) -> FrameGate:
    """A gate with a tenth of a core per peer (half a second at once), on the test's clocks."""
    return FrameGate(
        stats,
        TokenBuckets(RateLimit(rate_per_s=1000.0, burst=1000.0)),
        None,
        clock=lambda: clocks.now,
        wall_clock=lambda: clocks.now,
        cpu=CpuBuckets(CpuBudget(share=0.1, burst_s=0.5)),
        cpu_clock=lambda: clocks.cpu,
    )


def test_the_gate_drops_a_peers_messages_once_their_handling_spent_its_budget() -> None:
    clocks = _Clocks()
    stats = TransportStats()
    gate = _gate(clocks, stats)
    dear = PeerIdentity("dear" * 8, "agent", b"")
    cheap = PeerIdentity("cheap" * 6 + "xx", "agent", b"")
    handled: list[str] = []

    def deliver(node_id: str, role: str, body: bytes) -> None:
        handled.append(node_id)
        clocks.cpu += 0.3 if node_id == dear.node_id else 0.0001  # what handling it cost

    def send(peer: PeerIdentity) -> None:
        body = gate.frame(peer, aiohttp.WSMessage(aiohttp.WSMsgType.BINARY, b"m", None))
        if body is not None:
            gate.handled(peer, deliver, body)

    for _ in range(5):
        send(dear)
        send(cheap)
    assert handled.count(dear.node_id) == 2  # 0.5 s of burst: two messages of 0.3 s
    assert handled.count(cheap.node_id) == 5
    assert stats.cpu_limited == 3
    clocks.now += 0.5  # 0.05 s back: still in debt (0.1 s owed)
    send(dear)
    assert handled.count(dear.node_id) == 2
    clocks.now += 1.0  # out of debt
    send(dear)
    assert handled.count(dear.node_id) == 3
    assert stats.accepted == 8


async def test_a_call_is_charged_for_its_steps_not_for_what_it_waits_on() -> None:
    clocks = _Clocks()
    charges: list[float] = []
    go_on: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def handler() -> str:
        clocks.cpu += 0.2  # checks and a decode
        answer = await go_on  # a disk or a peer: others use the core meanwhile
        clocks.cpu += 0.3  # the answer built
        return answer

    task = asyncio.ensure_future(Charged(handler(), charges.append, lambda: clocks.cpu))
    await asyncio.sleep(0)
    clocks.cpu += 5.0  # the rest of the process, while the call waits
    go_on.set_result("ok")
    assert await task == "ok"
    assert sum(charges) == pytest.approx(0.5)

    waiting: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def cancelled() -> None:
        clocks.cpu += 0.1
        try:
            await waiting
        finally:
            clocks.cpu += 0.05  # its clean-up runs, and is charged too

    charges.clear()
    task = asyncio.ensure_future(Charged(cancelled(), charges.append, lambda: clocks.cpu))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sum(charges) == pytest.approx(0.15)


async def test_the_gate_drops_a_peers_messages_once_its_calls_spent_its_budget() -> None:
    """The handling of calls served on a stream is charged to the caller, step by step."""
    clocks = _Clocks()
    stats = TransportStats()
    gate = _gate(clocks, stats)
    caller = PeerIdentity("call" * 8, "agent", b"")
    message = aiohttp.WSMessage(aiohttp.WSMsgType.BINARY, b"m", None)

    async def dear_call() -> int:
        clocks.cpu += 0.2
        await asyncio.sleep(0)
        clocks.cpu += 0.2
        return 200

    served = 0
    for _ in range(3):
        if gate.frame(caller, message) is not None:
            assert await gate.charged(caller, dear_call()) == 200
            served += 1
    assert served == 2  # the second call put it 0.3 s in debt
    assert stats.cpu_limited == 1
