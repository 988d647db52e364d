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

_KEYS: dict[tuple[str, int], bytes] = {}
"""Ring keys shared by every core in the process (the simulator runs thousands)."""
_MAX_KEYS = 1 << 18


def ring_key(node: str, ring: int) -> bytes:
    """Where ``node`` sits on ``ring``: its id on ring 0, else a hash of (ring, id)."""
    if ring == 0:
        return node.encode()
    k = (node, ring)
    key = _KEYS.get(k)
    if key is None:
        if len(_KEYS) >= _MAX_KEYS:
            _KEYS.clear()
        key = _KEYS[k] = hashlib.blake2b(f"{ring}:{node}".encode(), digest_size=8).digest()
    return key


class Rings:
    """Each ring's order of the members one member holds (dead ones too: a member's state only
    changes who is skipped, not the orders); a member is added when it joins and removed when
    it is reaped, each in O(log N) comparisons."""

    __slots__ = ("_orders",)

    def __init__(self, count: int) -> None:
        self._orders: list[list[str]] = [[] for _ in range(count)]

    def add(self, node: str) -> None:
        for r, order in enumerate(self._orders):
            key = ring_key(node, r)
            i = bisect_left(order, key, key=lambda n, r=r: ring_key(n, r))  # type: ignore[misc]
            if i == len(order) or order[i] != node:
                order.insert(i, node)

    def remove(self, node: str) -> None:
        for r, order in enumerate(self._orders):
            i = self._index(r, node)
            if i is not None:
                del order[i]

    def _index(self, ring: int, node: str) -> int | None:
        order = self._orders[ring]
        key = ring_key(node, ring)
        i = bisect_left(order, key, key=lambda n: ring_key(n, ring))
        return i if i < len(order) and order[i] == node else None

    def neighbours(
        self, me: str, live: Callable[[str], bool]
    ) -> tuple[list[str], list[str], list[str]]:
        """(subjects, observers, dead after us): on each ring the first live member after ``me``,
        the first live one before it, and the non-live ones skipped on the way to the first.
        Each list names a member at most once, in ring order."""
        subjects: dict[str, None] = {}
        observers: dict[str, None] = {}
        skipped: dict[str, None] = {}
        for r, order in enumerate(self._orders):
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
        return self._orders[ring]

    def successor(self, ring: int, me: str, eligible: Callable[[str], bool]) -> str | None:
        """The first member after ``me`` on ``ring`` for which ``eligible`` holds."""
        order = self._orders[ring]
        i = self._index(ring, me)
        if i is None:
            return None
        n = len(order)
        for step in range(1, n):
            node = order[(i + step) % n]
            if eligible(node):
                return node
        return None
