"""The capacity index: the fleet's free capacity grouped so a decision does not visit every node.

Nodes whose devices are in the same state (same kinds, same free capacity, same sharers, same
link domains, same free CPU and memory) are interchangeable for fit and for the device-level
score terms, so they form one *group*, keyed by that state (the node's signature). A decision
evaluates each group once and only then looks at a few of its nodes for the node-level terms
(data, heat, cost, spreading). A fleet of 1,000 identical idle nodes is one group.

The index is kept up to date incrementally: :meth:`ClusterIndex.refresh` re-indexes only the nodes
whose :class:`~agent.policy.snapshot.Node` object changed since it last saw them (snapshots are
immutable, so an unchanged node is the same object), and :meth:`ClusterIndex.put` takes a node the
policy itself changed while deciding (a job placed in this pass). Pure data: no clock, no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from agent.policy.snapshot import SCHEDULABLE, Device, Node


@dataclass(frozen=True, slots=True, eq=False)
class DeviceKind:
    """What the device filters and the throughput model see of a device. Interned by
    :func:`kind_of`: one object per distinct kind, compared and hashed by identity (cheap)."""

    model: str
    vendor: str
    backend: str
    arch: str | None
    compute_capability: str | None
    mem_total_bytes: int
    healthy: bool


_KINDS: dict[tuple[object, ...], DeviceKind] = {}


def kind_of(d: Device) -> DeviceKind:
    facts = (
        d.model,
        d.vendor,
        d.backend,
        d.arch,
        d.compute_capability,
        d.mem_total_bytes,
        d.healthy,
    )
    kind = _KINDS.get(facts)
    if kind is None:
        kind = _KINDS[facts] = DeviceKind(*facts)
    return kind


@dataclass(frozen=True, slots=True)
class SlotState:
    """The state of one device position in a signature."""

    kind: DeviceKind
    free_fraction: float
    """1.0 idle, 0.0 given whole, in between: the part of its memory no share holds."""
    share_free_bytes: int
    sharers: tuple[str, ...]
    """Classes of the jobs sharing it."""
    link_domain: str | None
    link_kind: str | None


@dataclass(slots=True)
class Group:
    """Nodes in one state: ``members`` (ids, in the order they joined)."""

    serial: int
    """Unique to this group for the index's life (a cheap key for callers' caches)."""
    signature: tuple[object, ...]
    slots: tuple[SlotState, ...]
    cpu_free: int | None
    mem_free: int | None
    members: dict[str, None]
    whole_free: dict[DeviceKind, int]
    """Idle devices by kind."""
    share_free: dict[DeviceKind, int]
    """The most memory a new share could take on one device, by kind."""
    free_fractions: tuple[float, ...]
    models: tuple[str, ...]
    """Each slot's device model (what a shape that accepts only some models reads)."""


@dataclass(slots=True)
class Entry:
    node: Node
    ordered: tuple[Device, ...]
    """The node's devices in signature order: position i is ``Group.slots[i]``."""
    group: Group | None
    """The group it is in; ``None`` for a node that takes no work (drained, cordoned)."""
    static: tuple[object, ...]
    """What the hard filters read of it (changes bump ``ClusterIndex.static_version``)."""


def static_key(node: Node) -> tuple[object, ...]:
    return (
        node.drain,
        tuple(sorted(node.labels.items())),
        node.os,
        node.cost_per_hour,
        node.cpu_milli_total,
        node.host_mem_total_bytes,
        node.features,
        tuple((kind_of(d), d.link_domain, d.link_kind) for d in node.devices),
    )


def _slot(d: Device) -> SlotState:
    kind = kind_of(d)
    if d.whole_job is not None or not d.healthy:
        frac, share_free = 0.0, 0
    elif d.mem_total_bytes > 0:
        share_free = d.mem_total_bytes - d.shared_mem_bytes
        frac = share_free / d.mem_total_bytes if d.shares else 1.0
    else:
        share_free, frac = 0, (0.0 if d.shares else 1.0)
    sharers = tuple(sorted(s.job_class for s in d.shares))
    return SlotState(kind, frac, share_free, sharers, d.link_domain, d.link_kind)


def _slot_order(item: tuple[SlotState, Device]) -> tuple[object, ...]:
    s = item[0]
    return (s.kind.model, s.kind.vendor, -s.free_fraction, s.link_domain or "", s.sharers)


class ClusterIndex:
    """Free capacity by group, and counts that reject a job that fits nowhere in O(kinds)."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self.groups: dict[tuple[object, ...], Group] = {}
        self._whole_hist: dict[DeviceKind, Counter[int]] = {}
        self._share_hist: dict[DeviceKind, Counter[int]] = {}
        self._cpu_hist: Counter[int | None] = Counter()
        self._kinds: Counter[DeviceKind] = Counter()
        self.datasets: dict[str, set[str]] = {}
        """Which nodes hold each dataset."""
        self.version = 0
        """Bumped by every change (callers key their caches on it)."""
        self._source: Sequence[Node] | None = None
        self._source_nodes: dict[str, Node] = {}
        self._source_ids: dict[int, Node] = {}
        self._serial = 0
        self._touched: set[str] = set()
        self.static_version = 0
        """Bumped when what the hard filters read changes: a node comes, goes, drains, is
        relabelled (what can *never* fit is cached on it)."""

    # -- keeping it current ----------------------------------------------------------------------

    def refresh(self, nodes: Sequence[Node]) -> None:
        """Make the index hold exactly ``nodes``, re-indexing only the node objects it has not
        seen (snapshots are immutable: an unchanged node is the same object), and the nodes
        :meth:`put` changed since the last refresh."""
        if nodes is not self._source:
            by_id = dict(zip(map(id, nodes), nodes, strict=True))
            held = self._source_ids
            gone = {held[k].node_id for k in held.keys() - by_id.keys()}
            self._source = nodes
            self._source_ids = by_id
            self._source_nodes = {n.node_id: n for n in nodes}
            for k in by_id.keys() - held.keys():
                n = by_id[k]
                gone.discard(n.node_id)
                self._touched.discard(n.node_id)
                self.put(n)
            for node_id in gone:
                self._touched.discard(node_id)
                if node_id not in self._source_nodes:
                    self.remove(node_id)
        for node_id in self._touched:
            source = self._source_nodes.get(node_id)
            if source is None:
                self.remove(node_id)
            else:
                self._put(source)
        self._touched.clear()

    def remove(self, node_id: str, *, replaced: bool = False) -> None:
        entry = self.entries.pop(node_id, None)
        if entry is None:
            return
        self.version += 1
        if not replaced:
            self.static_version += 1
        for d in entry.ordered:
            kind = kind_of(d)
            self._kinds[kind] -= 1
            if not self._kinds[kind]:
                del self._kinds[kind]
        for name in entry.node.datasets:
            holders = self.datasets.get(name)
            if holders is not None:
                holders.discard(node_id)
        group = entry.group
        if group is not None:
            del group.members[node_id]
            self._count(group, -1)
            if not group.members:
                del self.groups[group.signature]

    def put(self, node: Node) -> None:
        """Index ``node`` (replacing what was held for its id); a node that is not the one of
        the last refresh is undone at the next."""
        if self._source_nodes.get(node.node_id) is not node:
            self._touched.add(node.node_id)
        self._put(node)

    def _put(self, node: Node) -> None:
        held = self.entries.get(node.node_id)
        static = static_key(node)
        if held is None or held.static != static:
            self.static_version += 1
        self.remove(node.node_id, replaced=True)
        self.version += 1
        for name in node.datasets:
            self.datasets.setdefault(name, set()).add(node.node_id)
        pairs = sorted(((_slot(d), d) for d in node.devices), key=_slot_order)
        ordered = tuple(d for _, d in pairs)
        for state, _ in pairs:
            self._kinds[state.kind] += 1
        if node.drain != SCHEDULABLE:
            self.entries[node.node_id] = Entry(node, ordered, None, static)
            return
        slots = tuple(s for s, _ in pairs)
        cpu_free, mem_free = node.cpu_milli_free, node.host_mem_free_bytes
        signature: tuple[object, ...] = (slots, cpu_free, mem_free)
        group = self.groups.get(signature)
        if group is None:
            whole: Counter[DeviceKind] = Counter()
            share: dict[DeviceKind, int] = {}
            for s in slots:
                if s.free_fraction >= 1.0:
                    whole[s.kind] += 1
                if s.share_free_bytes > share.get(s.kind, 0):
                    share[s.kind] = s.share_free_bytes
            self._serial += 1
            group = Group(
                self._serial,
                signature,
                slots,
                cpu_free,
                mem_free,
                {},
                dict(whole),
                share,
                tuple(s.free_fraction for s in slots),
                tuple(s.kind.model for s in slots),
            )
            self.groups[signature] = group
        group.members[node.node_id] = None
        self._count(group, +1)
        self.entries[node.node_id] = Entry(node, ordered, group, static)

    def _count(self, group: Group, step: int) -> None:
        for kind, n in group.whole_free.items():
            hist = self._whole_hist.setdefault(kind, Counter())
            hist[n] += step
            if not hist[n]:
                del hist[n]
        for kind, n in group.share_free.items():
            hist = self._share_hist.setdefault(kind, Counter())
            hist[n] += step
            if not hist[n]:
                del hist[n]
        self._cpu_hist[group.cpu_free] += step
        if not self._cpu_hist[group.cpu_free]:
            del self._cpu_hist[group.cpu_free]

    # -- questions -------------------------------------------------------------------------------

    def kinds(self) -> list[DeviceKind]:
        """Every device kind in the index (schedulable or not)."""
        return list(self._kinds)

    def has_idle(self) -> bool:
        """Is any GPU capacity free on a schedulable node: a GPU, or part of one?"""
        if any(hist.keys() - {0} for hist in self._whole_hist.values()):
            return True
        return any(hist.keys() - {0} for hist in self._share_hist.values())

    def max_whole_free(self, kind: DeviceKind) -> int:
        """The most idle devices of ``kind`` on one schedulable node."""
        hist = self._whole_hist.get(kind)
        return max(hist) if hist else 0

    def max_share_free(self, kind: DeviceKind) -> int:
        hist = self._share_hist.get(kind)
        return max(hist) if hist else 0

    def max_cpu_free(self) -> int | None:
        """The most free CPU on one schedulable node (``None``: some node does not count CPU)."""
        if not self._cpu_hist:
            return 0
        if None in self._cpu_hist:
            return None
        return max(k for k in self._cpu_hist if k is not None)

    def node(self, node_id: str) -> Node | None:
        entry = self.entries.get(node_id)
        return entry.node if entry is not None else None

    def nodes(self) -> Sequence[Node]:
        return [e.node for e in self.entries.values()]
