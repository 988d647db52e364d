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


class PlaceRecord(NamedTuple):
    datasets: Mapping[str, int] = EMPTY_MAP
    """Dataset name -> bytes on this node (0: not known)."""
    coord: Coordinate | None = None
    """The node's Vivaldi coordinate; ``None`` before its first measured round trip."""

    def rtt_s(self, other: PlaceRecord) -> float | None:
        """Estimated round trip between this node and ``other``; ``None`` if either is unknown."""
        if self.coord is None or other.coord is None:
            return None
        return self.coord.distance_s(other.coord)

    def encode(self, limit_bytes: int = c.MAX_RECORD_BYTES) -> tuple[bytes, int]:
        """The payload, and how many datasets did not fit in ``limit_bytes`` (the smallest go
        first: the largest are the ones worth moving a job for)."""
        names = sorted(self.datasets, key=lambda n: (-self.datasets[n], n))
        kept = len(names)
        while True:
            payload = c.pack(
                {
                    "v": WIRE_VERSION,
                    "datasets": [[n, self.datasets[n]] for n in names[:kept]],
                    "coord": None if self.coord is None else _coord_to_wire(self.coord),
                }
            )
            if len(payload) <= limit_bytes or kept == 0:
                return payload, len(names) - kept
            kept -= max(1, (kept * (len(payload) - limit_bytes)) // len(payload))

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
        return cls(datasets=datasets, coord=None if coord is None else _coord_from_wire(coord))


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
