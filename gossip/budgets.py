"""Per-peer budgets: balances that refill at a rate up to a cap, one per peer, in bounded memory
(:class:`Balances`); the token bucket of messages (:class:`TokenBuckets`) and the CPU budget below
are both made of them.

**CPU budgets**: what one member's messages may cost this node to handle.

A peer's token bucket (:class:`RateLimit`) bounds how many messages it may send;
it does not bound what they cost. A message that is cheap to send can be dear to handle (a
compound of records to verify and apply, a push-pull digest to merge), so a member with a valid
certificate could spend a large part of this node's core within its message rate. Each gossip
message's handling is timed on the thread's CPU clock and charged to the peer that sent it; a
peer whose balance is spent has its messages dropped (a POST answered 429; counted as
``cpu_limited``, like ``rate_limited``) until the budget has refilled, while every other peer's
go on.

The balance refills at ``share`` of a core (CPU seconds per second) up to ``burst_s``; a message
is let in while the balance is above zero and its cost is charged after, so one dear message can
leave a debt that the peer waits out. Sans-I/O: the caller passes the time and the cost.

What is timed: the gossip handler of each stream message and of each ``POST /v1/gossip`` (both
answer without waiting on anything, so the thread's CPU clock reads their cost alone), and each
call served on a stream (agents' commands and the job protocol's calls), whose handlers wait on
disks and peers: :class:`Charged` times each step of such a handler, the code it runs between
two waits, and charges only those, never the waits.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CpuBudget:
    """The CPU one peer's messages may cost: ``share`` of a core on average, ``burst_s`` at
    once. Defaults: a tenth of a core, half a second of it at once. A member of a busy 32-agent
    mesh costs each other member a few hundredths of a percent; a 1,000-member push-pull
    exchange, the dearest message there is, some tens of milliseconds."""

    share: float = 0.1
    burst_s: float = 0.5
    max_peers: int = 10_000
    """Balances kept (least recently used dropped first: memory bounded whatever the number of
    peers; a dropped balance starts full again)."""


DEFAULT_CPU_BUDGET: Final = CpuBudget()


class Balances:
    """One balance per peer, refilled at ``rate_per_s`` up to ``cap`` (a new peer starts full);
    at most ``max_peers`` kept, the least recently used dropped first. Time is passed in
    (monotonic seconds)."""

    def __init__(self, rate_per_s: float, cap: float, max_peers: int) -> None:
        self._rate_per_s = rate_per_s
        self._cap = cap
        self._max_peers = max_peers
        self._balances: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._balances)

    def take(self, peer: str, now: float) -> float:
        """``peer``'s balance now, refilled since it was last kept; :meth:`keep` it after."""
        balance, last = self._balances.pop(peer, (self._cap, now))
        return min(self._cap, balance + max(0.0, now - last) * self._rate_per_s)

    def keep(self, peer: str, balance: float, now: float) -> None:
        self._balances[peer] = (balance, now)
        while len(self._balances) > self._max_peers:
            self._balances.popitem(last=False)


class CpuBuckets:
    """The balances of :class:`CpuBudget`, one per peer. Time is monotonic seconds."""

    def __init__(self, budget: CpuBudget) -> None:
        self._balances = Balances(budget.share, budget.burst_s, budget.max_peers)

    def __len__(self) -> int:
        return len(self._balances)

    def allows(self, peer: str, now: float) -> bool:
        """May a message of ``peer`` be handled now (its balance is above zero)?"""
        balance = self._balances.take(peer, now)
        self._balances.keep(peer, balance, now)
        return balance > 0.0

    def charge(self, peer: str, cpu_s: float, now: float) -> None:
        """Handling a message of ``peer`` cost ``cpu_s`` of CPU."""
        self._balances.keep(peer, self._balances.take(peer, now) - cpu_s, now)


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A token bucket per peer: ``burst`` requests at once, refilled at ``rate_per_s``.

    At most ``max_peers`` buckets are kept (least recently used dropped first), so memory is bounded
    whatever the number of peers; the ids are authenticated, so only members can create buckets.
    """

    rate_per_s: float = 200.0
    burst: float = 400.0
    max_peers: int = 10_000


DEFAULT_RATE_LIMIT: Final = RateLimit()


class TokenBuckets:
    """Per-peer token buckets with bounded memory. Time is passed in (monotonic seconds)."""

    def __init__(self, limit: RateLimit) -> None:
        self._buckets = Balances(limit.rate_per_s, limit.burst, limit.max_peers)

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, peer: str, now: float) -> bool:
        tokens = self._buckets.take(peer, now)
        allowed = tokens >= 1.0
        self._buckets.keep(peer, tokens - 1.0 if allowed else tokens, now)
        return allowed


class Charged(Generic[T]):
    """Await ``coro``, calling ``charge`` with the CPU time (``clock``: this thread's) of each of
    its steps: what it runs between two waits. The waits themselves (a disk, a peer, a lock) are
    not charged: the event loop runs other work meanwhile."""

    def __init__(
        self,
        coro: Coroutine[Any, Any, T],
        charge: Callable[[float], None],
        clock: Callable[[], float],
    ) -> None:
        self._coro = coro
        self._charge = charge
        self._clock = clock

    def __await__(self) -> Generator[Any, Any, T]:
        coro = self._coro
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            started = self._clock()
            try:
                yielded = coro.send(sent) if thrown is None else coro.throw(thrown)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            finally:
                self._charge(self._clock() - started)
            try:
                sent, thrown = (yield yielded), None
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # a cancellation: passed to the coroutine
                sent, thrown = None, exc
