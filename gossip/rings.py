"""Probe rings: the bounded set of members one member talks to every few seconds.

SWIM probes every member in turn, and gossips to random ones: past the transport's stream bound
(64) that opens and evicts a TLS stream for most messages, a cost that grows with N. Here every
member is placed on ``config.probe_rings`` pseudo-random rings (ring 0 orders node ids, ring r > 0
orders a hash of (r, node id)), as Rapid's monitoring overlay does. A member's **subjects** are
its next live member on each ring, its **observers** the previous one; together they are its
**contacts**, at most ``2 * probe_rings`` members whatever N is.

- Probes go round-robin to the subjects (a fresh shuffle each cycle): every live member is the
  subject of one observer per ring, each probing it once every ``probe_rings`` intervals, so it is
  probed about once an interval, as in SWIM, and a crash is seen as soon.
- Gossip rounds and indirect probes go to random contacts; the ring relay goes to the ring-0
  subject (the next member in node-id order, as before).
- Reconnect pings go to the dead members just after us on a ring (those our probes would reach
  were they alive), so each dead member is pinged by at most one member per ring per interval,
  not by every member of the mesh.

So the streams a member holds are its contacts plus a few short-lived ones (push-pull with a
random member, an indirect probe's target), and in steady state no probe needs a TLS handshake.
The rings are a random regular graph of degree ``2 * probe_rings``: an expander, so gossip over it
still reaches everyone in O(log N) rounds (see the simulator's figures in docs/performance.md).

Pure functions of a member list; sans-I/O like the rest of the core.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections.abc import Callable

_KEYS: dict[tuple[str, int], str] = {}
"""Ring keys shared by every core in the process (the simulator runs thousands)."""
_MAX_KEYS = 1 << 18
_BULK = 16
"""More members than this added since the last look: sort each ring again instead of inserting."""


def ring_key(node: str, ring: int) -> str:
    """Where ``node`` sits on ``ring``: its id on ring 0, else a hash of (ring, id)."""
    if ring == 0:
        return node
    k = (node, ring)
    key = _KEYS.get(k)
    if key is None:
        if len(_KEYS) >= _MAX_KEYS:
            _KEYS.clear()
        key = _KEYS[k] = hashlib.blake2b(f"{ring}:{node}".encode(), digest_size=8).hexdigest()
    return key


class Rings:
    """Each ring's order of the members one member holds (dead ones too: a member's state only
    changes who is skipped, not the orders). Members added are placed at the next look (a warm
    start's thousand members in one sort); a member is removed when it is reaped."""

    __slots__ = ("_count", "_keys", "_nodes", "_pending", "_placed")

    def __init__(self, count: int) -> None:
        self._count = count
        self._keys: list[list[str]] = [[] for _ in range(count)]
        self._nodes: list[list[str]] = [[] for _ in range(count)]
        self._pending: dict[str, None] = {}
        self._placed: set[str] = set()

    def add(self, node: str) -> None:
        if node not in self._placed:
            self._pending[node] = None

    def remove(self, node: str) -> None:
        if node in self._pending:
            del self._pending[node]
        if node not in self._placed:
            return
        self._placed.discard(node)
        for r in range(self._count):
            i = self._index(r, node)
            if i is not None:
                del self._keys[r][i], self._nodes[r][i]

    def _place(self) -> None:
        pending = self._pending
        self._pending = {}
        self._placed.update(pending)
        for r in range(self._count):
            keys, nodes = self._keys[r], self._nodes[r]
            if len(pending) > _BULK:
                pairs = sorted(
                    [*zip(keys, nodes, strict=True), *((ring_key(n, r), n) for n in pending)]
                )
                keys[:] = [k for k, _ in pairs]
                nodes[:] = [n for _, n in pairs]
                continue
            for n in pending:
                k = ring_key(n, r)
                i = bisect_left(keys, k)
                keys.insert(i, k)
                nodes.insert(i, n)

    def _index(self, ring: int, node: str) -> int | None:
        keys, nodes = self._keys[ring], self._nodes[ring]
        k = ring_key(node, ring)
        i = bisect_left(keys, k)
        while i < len(keys) and keys[i] == k:
            if nodes[i] == node:
                return i
            i += 1
        return None

    def neighbours(
        self, me: str, live: Callable[[str], bool]
    ) -> tuple[list[str], list[str], list[str]]:
        """(subjects, observers, dead after us): on each ring the first live member after ``me``,
        the first live one before it, and the non-live ones skipped on the way to the first.
        Each list names a member at most once, in ring order."""
        if self._pending:
            self._place()
        subjects: dict[str, None] = {}
        observers: dict[str, None] = {}
        skipped: dict[str, None] = {}
        for r in range(self._count):
            order = self._nodes[r]
            i = self._index(r, me)
            n = len(order)
            if i is None or n < 2:
                continue
            for step in range(1, n):
                node = order[(i + step) % n]
                if live(node):
                    subjects[node] = None
                    break
                skipped[node] = None
            for step in range(1, n):
                node = order[(i - step) % n]
                if live(node):
                    observers[node] = None
                    break
        return list(subjects), list(observers), list(skipped)

    def order(self, ring: int) -> list[str]:
        """The members in ``ring``'s order (ring 0: sorted node ids)."""
        if self._pending:
            self._place()
        return self._nodes[ring]

    def successor(self, ring: int, me: str, eligible: Callable[[str], bool]) -> str | None:
        """The first member after ``me`` on ``ring`` for which ``eligible`` holds."""
        order = self.order(ring)
        i = self._index(ring, me)
        if i is None:
            return None
        n = len(order)
        for step in range(1, n):
            node = order[(i + step) % n]
            if eligible(node):
                return node
        return None
