"""Accounting: one row per attempt that ran on a node, as that node's runner kept it
(``GET /v1/usage``, :mod:`agent.history.usage_book`).

A row is an attempt's part on one node: a one-node job's attempt is one row, a gang's one row
per member node. The key ``(job_id, attempt, node)`` is unique in the mesh, so rows gathered
from many agents add up with no double count (``shoal usage`` deduplicates on it).
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

from agent.wire import codec as c

MAX_USAGE_ROWS: Final = 20_000
"""The most rows one answer carries (the oldest are left out first, and ``truncated`` says so)."""


class UsageRow(NamedTuple):
    job_id: str
    attempt: int
    node: str
    person: str | None
    """The node id of the key that signed the job's submission (its submitter)."""
    name: str | None
    """The submitter's name in the team policy when the attempt started (``None``: not named)."""
    team: str | None
    model: str
    """The model of the attempt's GPUs (``cpu`` for a job given none)."""
    gpus: float
    """GPUs held: whole devices, or a share's fraction of its device's memory."""
    started_at: float
    finished_at: float | None
    """``None``: still running (counted up to the time of the answer)."""
    energy_j: float | None
    """Energy its GPUs drew, from their measured power (``None``: no power measured)."""

    def gpu_s(self, now: float) -> float:
        end = self.finished_at if self.finished_at is not None else now
        return max(0.0, end - self.started_at) * self.gpus

    def to_wire(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def decode(cls, data: Any, name: str = "row") -> UsageRow:
        d = c.obj(data, name)
        p = name + "."
        row = cls(
            job_id=c.field(d, "job_id", c.text, p),
            attempt=c.field(d, "attempt", c.integer, p),
            node=c.field(d, "node", c.text, p),
            person=c.field(d, "person", c.opt_text, p),
            name=c.field(d, "name", c.opt_text, p),
            team=c.field(d, "team", c.opt_text, p),
            model=c.field(d, "model", c.text, p),
            gpus=c.field(d, "gpus", c.number, p),
            started_at=c.field(d, "started_at", c.number, p),
            finished_at=c.field(d, "finished_at", c.opt_number, p),
            energy_j=c.field(d, "energy_j", c.opt_number, p),
        )
        if row.gpus < 0 or (row.energy_j is not None and row.energy_j < 0):
            raise c.WireError(f"{name}: negative gpus or energy")
        return row


class UsageDoc(NamedTuple):
    """``GET /v1/usage``: the rows one node keeps of attempts that ran on it."""

    node: str
    at: float
    """The answering node's clock: the end of the rows still running."""
    rows: tuple[UsageRow, ...] = ()
    truncated: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "at": self.at,
            "rows": [r.to_wire() for r in self.rows],
            "truncated": self.truncated,
        }

    @classmethod
    def decode(cls, data: Any) -> UsageDoc:
        d = c.obj(data, "usage")
        return cls(
            node=c.field(d, "node", c.text, "usage."),
            at=c.field(d, "at", c.number, "usage."),
            rows=c.field(d, "rows", lambda v, n: c.items(v, n, UsageRow.decode), "usage."),
            truncated=c.field(d, "truncated", c.or_default(c.flag, False), "usage."),
        )
