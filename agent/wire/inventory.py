"""The ``inventory`` record kind (``agent.wire.records`` has the others): the host and its devices.

- ``inventory`` (+ ``inventory/1`` .. ``inventory/<n-1>``): :class:`InventoryRecord`, the host, its
  API address, labels, boot count, the job-spec features the agent supports and every device's
  static facts with its links and MIG instances. What does not fit in one record goes on in
  parts; every part names the set it belongs to (``set``, a digest of all its devices) and the
  count (``parts``), so a reader knows when it holds the whole inventory (:func:`assemble`).

Like every record, each is a msgpack map of at most :data:`~agent.wire.codec.MAX_RECORD_BYTES`,
signed by the node it describes, with ``v`` its :data:`~agent.wire.codec.WIRE_VERSION`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple, cast

from agent.wire import codec as c
from agent.wire.codec import WIRE_VERSION, WireError
from probers.records import DeviceStatic, HostInfo, Link, MigDevice

INVENTORY: Final = "inventory"
INVENTORY_PART_PREFIX: Final = "inventory/"
MAX_INVENTORY_PARTS: Final = 64
"""More parts than this is not an inventory but a flood: refused."""


# -- host and devices ----------------------------------------------------------------------------


def host_to_wire(h: HostInfo) -> dict[str, Any]:
    return {
        "hostname": h.hostname,
        "os": h.os,
        "arch": h.arch,
        "cpu_count": h.cpu_count,
        "mem_total_bytes": h.mem_total_bytes,
    }


def host_from_wire(data: Any, name: str = "host") -> HostInfo:
    d = c.obj(data, name)
    p = name + "."
    return HostInfo(
        hostname=c.field(d, "hostname", c.text, p),
        os=c.field(d, "os", c.or_default(c.text, "unknown"), p),
        arch=c.field(d, "arch", c.or_default(c.text, "unknown"), p),
        cpu_count=c.field(d, "cpu_count", c.opt_integer, p),
        mem_total_bytes=c.field(d, "mem_total_bytes", c.opt_integer, p),
    )


_STATIC_OPTIONAL: Final = (
    "uuid",
    "pci_bus_id",
    "arch",
    "compute_capability",
    "mem_total_bytes",
    "mem_note",
    "compute_units",
    "temp_slowdown_c",
    "driver_version",
)


def static_to_wire(s: DeviceStatic, index_of: Mapping[str, int]) -> dict[str, Any]:
    """One device's static facts; ``index_of`` numbers the host's devices, so a link names its
    peer by number (a few bytes) where the peer is one of them. Unknown values are left out."""
    doc: dict[str, Any] = {
        "key": s.key,
        "vendor": s.vendor,
        "backend": s.backend,
        "name": s.name,
        "source": s.source,
        "vendor_index": s.vendor_index,
        "unified_memory": s.unified_memory,
    }
    for name in _STATIC_OPTIONAL:
        value = getattr(s, name)
        if value is not None:
            doc[name] = value
    if s.links:
        doc["links"] = [
            [index_of.get(link.peer, link.peer), link.kind, link.bandwidth_mbps, link.detail]
            for link in s.links
        ]
    if s.mig_devices:
        doc["mig"] = [[m.uuid, m.name, m.mem_total_bytes] for m in s.mig_devices]
    return doc


def _link_from_wire(value: Any, name: str, keys: Sequence[str]) -> Link:
    row = c.row(value, name, 2)
    peer = row[0]
    if isinstance(peer, int) and not isinstance(peer, bool):
        if not 0 <= peer < len(keys):
            raise WireError(f"{name}: no device {peer} on this host")
        peer = keys[peer]
    return Link(
        peer=c.text(peer, name + ".peer"),
        kind=cast(Any, c.text(row[1], name + ".kind")),  # a newer kind is still a link
        bandwidth_mbps=c.opt_integer(row[2] if len(row) > 2 else None, name + ".bandwidth_mbps"),
        detail=c.opt_text(row[3] if len(row) > 3 else None, name + ".detail"),
    )


def _mig_from_wire(value: Any, name: str) -> MigDevice:
    row = c.row(value, name, 1)
    return MigDevice(
        uuid=c.text(row[0], name + ".uuid"),
        name=c.opt_text(row[1] if len(row) > 1 else None, name + ".name"),
        mem_total_bytes=c.opt_integer(row[2] if len(row) > 2 else None, name + ".mem_total_bytes"),
    )


def static_from_wire(data: Any, name: str, keys: Sequence[str]) -> DeviceStatic:
    """One device's facts; ``keys``: the host's device keys in order (links name peers by
    number). A vendor, backend or link kind this version does not know is kept as it is."""
    d = c.obj(data, name)
    p = name + "."
    links = d.get("links")
    if links is not None and not isinstance(links, list | tuple):
        raise WireError(f"{p}links: expected a list")
    return DeviceStatic(
        key=c.field(d, "key", c.text, p),
        vendor=cast(Any, c.field(d, "vendor", c.text, p)),
        backend=cast(Any, c.field(d, "backend", c.text, p)),
        name=c.field(d, "name", c.text, p),
        source=c.field(d, "source", c.or_default(c.text, "unknown"), p),
        vendor_index=c.field(d, "vendor_index", c.or_default(c.integer, 0), p),
        uuid=c.field(d, "uuid", c.opt_text, p),
        pci_bus_id=c.field(d, "pci_bus_id", c.opt_text, p),
        arch=c.field(d, "arch", c.opt_text, p),
        compute_capability=c.field(d, "compute_capability", c.opt_text, p),
        unified_memory=c.field(d, "unified_memory", c.or_default(c.flag, False), p),
        mem_total_bytes=c.field(d, "mem_total_bytes", c.opt_integer, p),
        mem_note=c.field(d, "mem_note", c.opt_text, p),
        compute_units=c.field(d, "compute_units", c.opt_integer, p),
        temp_slowdown_c=c.field(d, "temp_slowdown_c", c.opt_number, p),
        links=tuple(
            _link_from_wire(row, f"{p}links[{i}]", keys) for i, row in enumerate(links or ())
        ),
        mig_devices=c.items(d.get("mig"), p + "mig", _mig_from_wire),
        driver_version=c.field(d, "driver_version", c.opt_text, p),
    )


# -- inventory -----------------------------------------------------------------------------------


class InventoryRecord(NamedTuple):
    """What a node is: published once per start, over as many records as its devices need."""

    host: HostInfo
    api: str | None
    labels: Mapping[str, str]
    boot: int
    devices: tuple[DeviceStatic, ...]
    features: tuple[str, ...] = ()
    """The job-spec features this agent can run (``agent.job.jobspec.SUPPORTED_FEATURES``)."""
    version: int = WIRE_VERSION
    """The wire version of the agent that wrote it (1: before ``v`` was written)."""
    container_runtime: str | None = None
    """What runs its jobs that name an image (``podman``, ``docker``); ``None``: nothing (and
    ``image`` is not among its features). Written as ``runtime`` only when set."""

    def encode(self, limit: int = c.MAX_RECORD_BYTES) -> list[tuple[str, bytes]]:
        """``(kind, payload)`` of every record: ``inventory`` first, then its parts, each at most
        ``limit`` bytes. Raises :class:`WireError` when one device alone cannot fit."""
        index_of = {d.key: i for i, d in enumerate(self.devices)}
        rows = [static_to_wire(d, index_of) for d in self.devices]
        set_id = hashlib.sha256(c.pack({"d": rows})).hexdigest()[:12]
        head: dict[str, Any] = {
            "v": WIRE_VERSION,
            "host": host_to_wire(self.host),
            "api": self.api,
            "labels": dict(self.labels),
            "boot": self.boot,
            "features": list(self.features),
            **({"runtime": self.container_runtime} if self.container_runtime else {}),
            "set": set_id,
            "parts": 1,
            "devices": [],
        }

        def fits(chunk: list[dict[str, Any]], first: bool) -> bool:
            # part numbers and counts are packed here at their widest (two digits)
            frame = head if first else _part_frame(set_id, 99, 99)
            return len(c.pack({**frame, "parts": 99, "devices": chunk})) <= limit

        chunks: list[list[dict[str, Any]]] = [[]]
        for i, row in enumerate(rows):
            chunks[-1].append(row)
            if fits(chunks[-1], len(chunks) == 1):
                continue
            chunks[-1].pop()
            chunks.append([row])
            if not fits(chunks[-1], False):
                raise WireError(f"device {i} does not fit in a {limit}-byte record")
        if len(chunks) > MAX_INVENTORY_PARTS:
            raise WireError(f"an inventory of {len(chunks)} records is more than allowed")
        out = [(INVENTORY, c.pack({**head, "parts": len(chunks), "devices": chunks[0]}))]
        for n, chunk in enumerate(chunks[1:], start=1):
            frame = _part_frame(set_id, n, len(chunks))
            out.append((f"{INVENTORY_PART_PREFIX}{n}", c.pack({**frame, "devices": chunk})))
        return out


def _part_frame(set_id: str, part: int, parts: int) -> dict[str, Any]:
    return {"v": WIRE_VERSION, "set": set_id, "part": part, "parts": parts}


class InventoryHead(NamedTuple):
    """The ``inventory`` record as read, before its parts are joined to it."""

    host: HostInfo
    api: str | None
    labels: Mapping[str, str]
    boot: int
    features: tuple[str, ...]
    set_id: str | None
    parts: int
    rows: tuple[Any, ...]
    version: int
    container_runtime: str | None = None

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> InventoryHead:
        return cls(
            host=host_from_wire(doc.get("host")),
            api=c.field(doc, "api", c.opt_text),
            labels=c.field(doc, "labels", c.text_map),
            boot=c.field(doc, "boot", c.or_default(c.integer, 0)),
            features=c.field(doc, "features", c.texts),
            set_id=c.field(doc, "set", c.opt_text),
            parts=_part_count(doc),
            rows=c.items(doc.get("devices"), "devices", lambda v, n: c.obj(v, n)),
            version=c.field(doc, "v", c.or_default(c.integer, 1)),
            container_runtime=c.field(doc, "runtime", c.opt_text),
        )


class InventoryPart(NamedTuple):
    """One ``inventory/<n>`` record as read."""

    set_id: str
    part: int
    parts: int
    rows: tuple[Any, ...]

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> InventoryPart:
        parts = _part_count(doc)
        part = c.field(doc, "part", c.integer)
        if not 1 <= part < parts:
            raise WireError(f"part: {part} is not within 1..{parts - 1}")
        return cls(
            set_id=c.field(doc, "set", c.text),
            part=part,
            parts=parts,
            rows=c.items(doc.get("devices"), "devices", lambda v, n: c.obj(v, n)),
        )


def _part_count(doc: Mapping[str, Any]) -> int:
    parts = c.field(doc, "parts", c.or_default(c.integer, 1))
    if not 1 <= parts <= MAX_INVENTORY_PARTS:
        raise WireError(f"parts: {parts} is not within 1..{MAX_INVENTORY_PARTS}")
    return parts


def assemble(head: InventoryHead, parts: Mapping[int, InventoryPart]) -> InventoryRecord | None:
    """The whole inventory once every part of the head's set is held; ``None`` until then.
    Raises :class:`WireError` when the joined devices do not decode."""
    rows: list[Any] = list(head.rows)
    for n in range(1, head.parts):
        part = parts.get(n)
        if part is None or part.set_id != head.set_id or part.parts != head.parts:
            return None
        rows.extend(part.rows)
    keys = [c.field(c.obj(r, f"devices[{i}]"), "key", c.text) for i, r in enumerate(rows)]
    devices = tuple(static_from_wire(r, f"devices[{i}]", keys) for i, r in enumerate(rows))
    return InventoryRecord(
        host=head.host,
        api=head.api,
        labels=head.labels,
        boot=head.boot,
        devices=devices,
        features=head.features,
        version=head.version,
        container_runtime=head.container_runtime,
    )
