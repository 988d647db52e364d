"""The team quota desk's call (``quota_claim``, ``agent.running.teamdesk``): a runner asks the
agent that keeps a team's count for room under the team's maximum before it starts a job."""

from __future__ import annotations

from typing import Any, NamedTuple

from agent.wire import codec as c
from agent.wire.calls import _b64_in, _b64_out


class QuotaClaim(NamedTuple):
    """``quota_claim``: a runner offered an attempt of a job whose team has a maximum asks the
    team's quota desk (``agent.running.teamdesk``) for room for it; answered with a
    :class:`QuotaGrant`. The desk reads the team and the GPUs from the signed submission."""

    job_id: str
    attempt: int
    gpus: float
    """GPUs the attempt takes (a share of a GPU counts as one)."""
    model: str
    """The model of its devices."""
    submission: bytes

    def to_wire(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "gpus": self.gpus,
            "model": self.model,
            "submission": _b64_out(self.submission),
        }

    @classmethod
    def from_wire(cls, value: Any) -> QuotaClaim:
        d = c.obj(value, "body")
        return cls(
            job_id=c.field(d, "job_id", c.text),
            attempt=c.field(d, "attempt", c.integer),
            gpus=c.field(d, "gpus", c.number),
            model=c.field(d, "model", c.text),
            submission=_b64_in(d.get("submission"), "submission"),
        )


class QuotaGrant(NamedTuple):
    """Whether the desk found room under the team's maximum; when not, ``reason`` says why."""

    granted: bool
    reason: str = ""

    def to_wire(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"granted": self.granted}
        if self.reason:
            doc["reason"] = self.reason
        return doc

    @classmethod
    def from_wire(cls, value: Any) -> QuotaGrant:
        d = c.obj(value, "answer")
        return cls(
            granted=c.field(d, "granted", c.or_default(c.flag, False)),
            reason=c.field(d, "reason", c.or_default(c.text, "")),
        )
