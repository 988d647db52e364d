"""Where a node is, for data gravity and latency: the ``place`` record.

Each agent publishes one ``place`` record: the datasets it holds with their sizes in bytes, and
its network coordinate (the gossip layer's Vivaldi estimate, learned from probe round trips), so
any owner knows both where a job's data already is and the RTT between any two nodes
(:meth:`PlaceRecord.rtt_s`) without probing them itself.

A dataset's name is one path component of letters, digits, ``.``, ``_`` and ``-`` (no leading
``.`` or ``-``, at most :data:`MAX_DATASET_NAME_CHARS` characters): a job names datasets, and a
name must never walk out of a folder, nor mean anything to a shell or a command line it lands
in. A size of 0 means the size is not known (a dataset named in the agent's config with no folder
to measure).

A dataset has versions, each named by its manifest's digest (``agent.content.manifest``): a job
names ``NAME`` (the newest version seen in the mesh) or ``NAME@DIGEST`` (that one version,
:func:`parse_dataset_ref`). The record's ``versions`` say, for each version this node holds whole
or in part, its name, digest, total bytes, bytes held here and when it was made, so placement
counts what is missing where. An agent that predates them reads ``datasets`` alone (the versions
held whole, by name), and a record without them decodes as before.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

from agent.wire import codec as c
from agent.wire.codec import EMPTY_MAP, WIRE_VERSION, WireError
from gossip.vivaldi import Coordinate

PLACE: Final = "place"
MAX_DATASET_NAME_CHARS: Final = 128
MAX_COORD_DIMENSIONS: Final = 16
MAX_RATES: Final = 32
_DATASET_NAME: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
"""A dataset name's one character set: safe in a path, an argv, a shell line and a log."""


def dataset_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a dataset, or ``None`` when it can."""
    if not name:
        return "a dataset name is empty"
    if len(name) > MAX_DATASET_NAME_CHARS:
        return f"a dataset name is at most {MAX_DATASET_NAME_CHARS} characters"
    if "/" in name or "\\" in name or "\x00" in name:
        return f"dataset {name!r}: a name is one path component (no / or \\)"
    if name.startswith("."):
        return f"dataset {name!r}: a name may not start with '.'"
    if not _DATASET_NAME.fullmatch(name):
        return (
            f"dataset {name!r}: a name has only letters, digits, '.', '_' and '-', and does not"
            " start with '-'"
        )
    return None


_DIGEST: Final = re.compile(r"[0-9a-f]{64}")


class DatasetRef(NamedTuple):
    """What a job (or a command) names: a dataset, and maybe one version of it."""

    name: str
    digest: str | None = None
    """A version's manifest digest; ``None``: the newest version seen in the mesh."""

    def __str__(self) -> str:
        return self.name if self.digest is None else f"{self.name}@{self.digest}"


def parse_dataset_ref(text: str) -> DatasetRef:
    """``NAME`` or ``NAME@DIGEST`` (a SHA-256, 64 lowercase hex digits); raises
    :class:`ValueError` with one line saying what is wrong."""
    name, at, digest = text.partition("@")
    problem = dataset_name_problem(name)
    if problem is not None:
        raise ValueError(problem)
    if not at:
        return DatasetRef(name)
    if not _DIGEST.fullmatch(digest):
        raise ValueError(
            f"dataset {name!r}: a version is @ and 64 lowercase hex digits, not {digest[:70]!r}"
        )
    return DatasetRef(name, digest)


def dataset_ref_problem(text: str) -> str | None:
    """Why ``text`` is not ``NAME`` or ``NAME@DIGEST``, or ``None``."""
    try:
        parse_dataset_ref(text)
    except ValueError as exc:
        return str(exc)
    return None


class HeldVersion(NamedTuple):
    """One version of a dataset on one node, whole or in part."""

    name: str
    digest: str
    total_bytes: int
    held_bytes: int
    """Bytes of it on this node (``total_bytes`` when whole; partial copies count)."""
    created_s: float
    """When the version was made (its first scan or build): the newest is what ``NAME`` means."""

    @property
    def complete(self) -> bool:
        return self.held_bytes >= self.total_bytes


class HeldContent(NamedTuple):
    """An image or a built Python environment a node holds whole (``shoal cache`` lists it; a
    runner that lacks an image asks the nodes that list it first)."""

    kind: str
    """``image`` (an exported archive, named by its reference) or ``env``."""
    name: str
    digest: str
    total_bytes: int


CONTENT_KINDS: Final = ("image", "env")
MAX_CONTENT: Final = 256


class PlaceRecord(NamedTuple):
    datasets: Mapping[str, int] = EMPTY_MAP
    """Dataset name -> bytes on this node (0: not known)."""
    coord: Coordinate | None = None
    """The node's Vivaldi coordinate; ``None`` before its first measured round trip."""
    versions: tuple[HeldVersion, ...] = ()
    """The dataset versions held here, whole or in part (largest held first)."""
    rates: Mapping[str, float] = EMPTY_MAP
    """Member -> the bytes/s this node measured fetching content from it (at most
    :data:`MAX_RATES`, the fastest kept): what the policy's data term divides by."""
    content: tuple[HeldContent, ...] = ()
    """Images and environments held here whole (at most :data:`MAX_CONTENT`, largest first);
    absent from the payload when none, as older agents write it."""

    def rtt_s(self, other: PlaceRecord) -> float | None:
        """Estimated round trip between this node and ``other``; ``None`` if either is unknown."""
        if self.coord is None or other.coord is None:
            return None
        return self.coord.distance_s(other.coord)

    def encode(self, limit_bytes: int = c.MAX_RECORD_BYTES) -> tuple[bytes, int]:
        """The payload, and how many datasets and versions did not fit in ``limit_bytes`` (the
        smallest go first: the largest are the ones worth moving a job for)."""
        names = sorted(self.datasets, key=lambda n: (-self.datasets[n], n))
        versions = sorted(self.versions, key=lambda v: (-v.held_bytes, v.name, v.digest))
        kept, kept_v = len(names), len(versions)
        while True:
            doc: dict[str, Any] = {
                "v": WIRE_VERSION,
                "datasets": [[n, self.datasets[n]] for n in names[:kept]],
                "coord": None if self.coord is None else _coord_to_wire(self.coord),
            }
            if versions:
                doc["versions"] = [list(v) for v in versions[:kept_v]]
            if self.rates:
                fastest = sorted(self.rates.items(), key=lambda kv: (-kv[1], kv[0]))
                doc["rates"] = [[n, round(r, 1)] for n, r in fastest[:MAX_RATES]]
            if self.content:
                largest = sorted(self.content, key=lambda h: (-h.total_bytes, h.kind, h.name))
                doc["content"] = [list(h) for h in largest[:MAX_CONTENT]]
            payload = c.pack(doc)
            if len(payload) <= limit_bytes or kept + kept_v == 0:
                return payload, len(names) - kept + len(versions) - kept_v
            over = len(payload) - limit_bytes
            kept -= min(kept, max(1, (kept * over) // len(payload)))
            kept_v -= min(kept_v, max(1, (kept_v * over) // len(payload)))

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> PlaceRecord:
        datasets: dict[str, int] = {}
        for i, row in enumerate(c.items(doc.get("datasets"), "datasets", _row)):
            name, size_bytes = row
            problem = dataset_name_problem(c.text(name, f"datasets[{i}][0]"))
            if problem is not None:
                raise WireError(problem)
            size = c.integer(size_bytes, f"datasets[{i}][1]")
            if size < 0:
                raise WireError(f"datasets[{i}][1]: a size is not negative")
            datasets[name] = size
        coord = doc.get("coord")
        versions = c.items(doc.get("versions"), "versions", _version)
        rates: dict[str, float] = {}
        for i, row in enumerate(c.items(doc.get("rates"), "rates", _row)):
            if i >= MAX_RATES:
                raise WireError(f"rates: at most {MAX_RATES}")
            rate = c.number(row[1], f"rates[{i}][1]")
            if not (math.isfinite(rate) and rate >= 0):
                raise WireError(f"rates[{i}][1]: a rate is a finite number, not negative")
            rates[c.text(row[0], f"rates[{i}][0]")] = rate
        content = c.items(doc.get("content"), "content", _content)
        if len(content) > MAX_CONTENT:
            raise WireError(f"content: at most {MAX_CONTENT}")
        return cls(
            datasets=datasets,
            coord=None if coord is None else _coord_from_wire(coord),
            versions=versions,
            rates=rates,
            content=content,
        )


def _content(value: Any, name: str) -> HeldContent:
    row = c.row(value, name, 4)
    kind = c.text(row[0], f"{name}[0]")
    if kind not in CONTENT_KINDS:
        raise WireError(f"{name}[0]: {kind[:20]!r} is not one of {', '.join(CONTENT_KINDS)}")
    digest = c.text(row[2], f"{name}[2]")
    if not _DIGEST.fullmatch(digest):
        raise WireError(f"{name}[2]: a digest is a SHA-256 in hex")
    total = c.integer(row[3], f"{name}[3]")
    if total < 0:
        raise WireError(f"{name}[3]: a size is not negative")
    return HeldContent(kind, c.text(row[1], f"{name}[1]"), digest, total)


def _version(value: Any, name: str) -> HeldVersion:
    row = c.row(value, name, 5)
    ds = c.text(row[0], f"{name}[0]")
    problem = dataset_name_problem(ds)
    if problem is not None:
        raise WireError(problem)
    digest = c.text(row[1], f"{name}[1]")
    if not _DIGEST.fullmatch(digest):
        raise WireError(f"{name}[1]: a version is a SHA-256 in hex")
    total, held = c.integer(row[2], f"{name}[2]"), c.integer(row[3], f"{name}[3]")
    if not 0 <= held <= total:
        raise WireError(f"{name}: held bytes are between 0 and the total")
    return HeldVersion(ds, digest, total, held, c.number(row[4], f"{name}[4]"))


def _row(value: Any, name: str) -> tuple[Any, Any]:
    if not isinstance(value, list | tuple) or len(value) < 2:
        raise WireError(f"{name}: expected [name, bytes]")
    return value[0], value[1]


def _coord_to_wire(coord: Coordinate) -> list[Any]:
    return [list(coord.vec), coord.error, coord.adjustment_s, coord.height_s]


def _coord_from_wire(value: Any) -> Coordinate:
    if not isinstance(value, list | tuple) or len(value) < 4:
        raise WireError("coord: expected [vec, error, adjustment_s, height_s]")
    vec = c.items(value[0], "coord.vec", c.number)
    if not 1 <= len(vec) <= MAX_COORD_DIMENSIONS:
        raise WireError(f"coord.vec: 1 to {MAX_COORD_DIMENSIONS} dimensions")
    coord = Coordinate(
        vec=vec,
        error=c.number(value[1], "coord.error"),
        adjustment_s=c.number(value[2], "coord.adjustment_s"),
        height_s=c.number(value[3], "coord.height_s"),
    )
    if not coord.is_valid() or coord.error < 0 or coord.height_s < 0:
        raise WireError("coord: not a finite coordinate")
    if any(abs(x) > 3600.0 for x in (*vec, coord.adjustment_s, coord.height_s)):
        raise WireError("coord: more than an hour away")
    return coord


def coord_moved_s(before: Coordinate | None, now: Coordinate | None) -> float:
    """How far a coordinate moved (seconds of RTT); infinite from or to unknown."""
    if before is None or now is None:
        return 0.0 if before is now else math.inf
    if len(before.vec) != len(now.vec):
        return math.inf
    return math.dist(before.vec, now.vec) + abs(before.height_s - now.height_s)
