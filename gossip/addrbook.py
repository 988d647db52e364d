"""Which member listens at which address, as each member's own signed Alive says.

The gossip core addresses messages by address; a stream a peer opened is known by the peer's
node id (its certificate). This book joins the two, and refuses to when two members claim the
same address: a member can then not have messages meant for another routed to itself.

A peer the core does not know yet (its first message, a join or a probe, brings or precedes
its Alive) is answered at the address its message names: a *hint*, good only while no member's
Alive claims that address, so it routes answers back to the sender as a POST's response did,
and never takes a known member's messages.
"""

from __future__ import annotations

from collections import OrderedDict

MAX_HINTS = 1024


class AddressBook:
    """Address -> node ids claiming it, fed by the core's membership events."""

    __slots__ = ("_addr_of", "_by_addr", "_hints")

    def __init__(self) -> None:
        self._by_addr: dict[str, set[str]] = {}
        self._addr_of: dict[str, str] = {}
        self._hints: OrderedDict[str, str] = OrderedDict()

    def hint(self, node: str, addr: str) -> None:
        """``node``, not yet a member we know, says it listens at ``addr``."""
        self._hints[addr] = node
        self._hints.move_to_end(addr)
        while len(self._hints) > MAX_HINTS:
            self._hints.popitem(last=False)

    def __len__(self) -> int:
        return len(self._addr_of)

    def learn(self, node: str, addr: str) -> None:
        """``node`` now listens at ``addr`` (a join or an update of its Alive)."""
        old = self._addr_of.get(node)
        if old == addr:
            return
        if old is not None:
            self._drop(node, old)
        self._addr_of[node] = addr
        self._by_addr.setdefault(addr, set()).add(node)
        self._hints.pop(addr, None)

    def forget(self, node: str) -> None:
        old = self._addr_of.pop(node, None)
        if old is not None:
            self._drop(node, old)

    def _drop(self, node: str, addr: str) -> None:
        nodes = self._by_addr.get(addr)
        if nodes is not None:
            nodes.discard(node)
            if not nodes:
                del self._by_addr[addr]

    def node_at(self, addr: str) -> str | None:
        """The one member claiming ``addr``; None when several do. When none does, the node
        that hinted it, if any."""
        nodes = self._by_addr.get(addr)
        if nodes is None:
            return self._hints.get(addr)
        if len(nodes) != 1:
            return None
        return next(iter(nodes))

    def is_member(self, node: str) -> bool:
        """Known from a signed Alive (not only from a hint)."""
        return node in self._addr_of

    def addr_of(self, node: str) -> str | None:
        return self._addr_of.get(node)

    def nodes(self) -> list[str]:
        return list(self._addr_of)
