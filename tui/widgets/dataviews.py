"""The datasets view: each dataset version in the mesh, its size, and where its copies are.

Its rows are ``shoal data ls``'s (:func:`agent.cli.data_cmd.copies`, grouped by version), read
from the nodes' ``dataset_versions`` in the snapshot the other views show: no second read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

from agent.cli.data_cmd import by_version, copies, held_pct
from agent.operator.units import fmt_bytes
from tui.model import MeshSnapshot
from tui.widgets.base import Selection, ViewContext
from tui.widgets.render import Part, duration
from tui.widgets.tables import Column, MeshTable, Row, SortSpec


class DatasetRow(NamedTuple):
    """One version of a dataset and its copies (rows of :func:`copies`, one per node)."""

    name: str
    digest: str | None
    size_bytes: int
    created_s: float | None
    held: tuple[Mapping[str, Any], ...]

    @property
    def key(self) -> str:
        return f"{self.name}@{self.digest or '-'}"

    @property
    def whole(self) -> int:
        """How many nodes hold all of it."""
        return sum(1 for r in self.held if int(r["held_bytes"]) >= int(r["total_bytes"]))

    @property
    def best_frac(self) -> float:
        return max(
            (int(r["held_bytes"]) / int(r["total_bytes"]) if int(r["total_bytes"]) else 1.0)
            for r in self.held
        )

    def raw(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "digest": self.digest,
            "total_bytes": self.size_bytes,
            "created_s": self.created_s,
            "copies": [dict(r) for r in self.held],
        }


def dataset_rows(snapshot: MeshSnapshot) -> list[DatasetRow]:
    """The mesh's dataset versions, as ``shoal data ls`` lists them."""
    nodes = [h.raw for h in snapshot.hosts]
    out = []
    for (name, digest), held in by_version(copies(nodes)).items():
        out.append(
            DatasetRow(
                name=name,
                digest=digest,
                size_bytes=max(int(r["total_bytes"]) for r in held),
                created_s=max((r["created_s"] for r in held if r["created_s"]), default=None),
                held=tuple(held),
            )
        )
    return out


def where_held(row: DatasetRow) -> str:
    """``gpu-h100-000 100%, gpu-h100-003 40%``: whole copies first."""
    ordered = sorted(row.held, key=lambda r: (-int(r["held_bytes"]), str(r["host"])))
    return ", ".join(f"{r['host']} {held_pct(r)}" for r in ordered)


class DatasetsTable(MeshTable):
    view_name = "datasets"
    COLUMNS = (
        Column("name", "Dataset", 16, grow=8),
        Column("version", "Version", 12),
        Column("size", "Size", 10, right=True),
        Column("made", "Made", 5, right=True),
        Column("whole", "Whole", 5, right=True),
        Column("copies", "Copies: host, held", 20, stretch=True),
    )
    SORTS: ClassVar[Mapping[str, SortSpec]] = {
        "name": (lambda r: (r.name, -(r.created_s or 0.0)), False),
        "util": (lambda r: (r.whole, r.best_frac), True),
        "mem": (lambda r: r.size_bytes, True),
    }
    """For datasets: N by name, U by copies (whole, then the most complete), M by size."""

    def table_rows(self, ctx: ViewContext) -> Iterable[Row]:
        node_id = ctx.scope.node_id
        for row in dataset_rows(ctx.snapshot):
            if node_id is None or any(r["node"] == node_id for r in row.held):
                yield row.key, row

    def haystack(self, item: Any, ctx: ViewContext) -> str:
        row: DatasetRow = item
        hosts = " ".join(str(r["host"]) for r in row.held)
        return f"{row.name} {row.digest or ''} {hosts}"

    def cells(self, item: Any, ctx: ViewContext) -> Sequence[Part]:
        row: DatasetRow = item
        p = ctx.palette
        made = "-" if row.created_s is None else duration(ctx.snapshot.taken_at - row.created_s)
        whole = row.whole
        return (
            (row.name, None),
            ((row.digest or "-")[:12], p.muted),
            (fmt_bytes(row.size_bytes), None),
            (made, p.muted),
            (f"{whole}/{len(row.held)}", p.of("ok" if whole else "warn")),
            (where_held(row), None if whole else p.of("warn")),
        )

    def selection_for(self, key: str, snapshot: MeshSnapshot) -> Selection | None:
        row = next((r for r in dataset_rows(snapshot) if r.key == key), None)
        if row is None:
            return None
        title = f"{row.name}@{(row.digest or '-')[:12]}"
        return Selection("dataset", raw=row.raw(), title=title)
