"""The one converged view the simulator's background members share (:mod:`gossip.simbackground`):
every update any of them accepted, newest by key, with the digests and the push-pull repairs
computed from it instead of from per-member rows.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Iterable

from gossip import messages as wire
from gossip.membership import digest_line
from gossip.messages import Alive, Dead, Record, Suspect, Update
from gossip.rings import Rings

_ALIVE, _SUSPECT, _DEAD = 0, 1, 2  # broadcast classes and version ranks, as the core's
_STATES = (wire.MemberState.ALIVE, wire.MemberState.SUSPECT, wire.MemberState.DEAD)
Version = tuple[int, int]


def key_version(u: Update) -> tuple[object, Version, int]:
    """The update's key (node, or record origin and kind), its version and its class."""
    t = type(u)
    if t is Record:
        r: Record = u  # type: ignore[assignment]
        return (r.origin, r.kind), (r.incarnation, r.counter), 0
    if t is Alive:
        return u.node, (u.incarnation, _ALIVE), _ALIVE  # type: ignore[union-attr]
    if t is Suspect:
        return u.node, (u.incarnation, _SUSPECT), _SUSPECT  # type: ignore[union-attr]
    return u.node, (u.incarnation, _DEAD), _DEAD  # type: ignore[union-attr]


class SharedView:
    """The converged view every background member reads: each member's newest Alive and the
    accusation behind its state, the newest record per key, and their digests (rebuilt only
    after a change, and shared by every push-pull that carries them)."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.alive: dict[str, Alive] = {}
        self.base: dict[str, int] = {}
        """The incarnation of each member's Alive in the warm-start snapshot."""
        self.state: dict[str, tuple[Version, Suspect | Dead | None]] = {}
        self.records: dict[tuple[str, str], Record] = {}
        self.dead = 0
        self.ring: list[str] = []
        """``ids`` sorted."""
        self._rings: dict[int, Rings] = {}
        self._digest: tuple[wire.MemberDigest, ...] | None = None
        self._rdigest: tuple[wire.RecordDigest, ...] | None = None

    def add(self, alive: Alive) -> None:
        if alive.node not in self.alive:
            self.ids.append(alive.node)
            insort(self.ring, alive.node)
            for rings in self._rings.values():
                rings.add(alive.node)
            self.base[alive.node] = alive.incarnation
        self.learn(alive)

    def rings(self, count: int) -> Rings:
        """The probe rings (:mod:`gossip.rings`) over every member, shared by all."""
        rings = self._rings.get(count)
        if rings is None:
            rings = self._rings[count] = Rings(count)
            for node in self.ids:
                rings.add(node)
        return rings

    @property
    def live(self) -> int:
        return len(self.ids) - self.dead

    def learn(self, u: Update) -> None:
        """Take ``u`` into the view if it is newer than what the view holds."""
        key, v, klass = key_version(u)
        if type(u) is Record:
            old = self.records.get(key)  # type: ignore[call-overload]
            if old is None or v > old.version:
                self.records[key] = u  # type: ignore[index]
                self._rdigest = None
            return
        held = self.state.get(key)  # type: ignore[call-overload]
        if held is not None and v <= held[0]:
            return
        was_dead = held is not None and held[0][1] == _DEAD
        if klass == _ALIVE:
            self.alive[u.node] = u  # type: ignore[union-attr, assignment]
            self.state[u.node] = (v, None)  # type: ignore[union-attr]
        else:
            self.state[u.node] = (v, u)  # type: ignore[union-attr, assignment]
        self.dead += (klass == _DEAD) - was_dead
        self._digest = None

    def member_digest(self) -> tuple[wire.MemberDigest, ...]:
        if self._digest is None:
            lines = []
            for node in sorted(self.state):
                (inc, rank), _ = self.state[node]
                lines.append(digest_line(node, inc, _STATES[rank]))
            self._digest = tuple(lines)
        return self._digest

    def record_digest(self) -> tuple[wire.RecordDigest, ...]:
        if self._rdigest is None:
            self._rdigest = tuple(
                wire.RecordDigest(r.origin, r.kind, r.incarnation, r.counter)
                for r in self.records.values()
            )
        return self._rdigest

    def _full(self, node: str) -> list[Update]:
        out: list[Update] = [self.alive[node]]
        acc = self.state[node][1]
        if acc is not None:
            out.append(acc)
        return out

    def missing_for(
        self, members: Iterable[wire.MemberDigest], records: Iterable[wire.RecordDigest]
    ) -> tuple[Update, ...]:
        """Full updates the holder of these digests lacks or holds older than the view."""
        out: list[Update] = []
        ours = self.member_digest()
        if members is not ours and tuple(members) != ours:
            theirs = {d.node: (d.incarnation, min(int(d.state), _DEAD)) for d in members}
            for node, (v, _) in self.state.items():
                d = theirs.get(node)
                if (d is None and v[1] != _DEAD) or (d is not None and v > d):
                    out.extend(self._full(node))
        rtheirs = {(d.origin, d.kind): (d.incarnation, d.counter) for d in records}
        for key, r in self.records.items():
            held = rtheirs.get(key)
            if held is None or r.version > held:
                out.append(r)
        return tuple(out)
