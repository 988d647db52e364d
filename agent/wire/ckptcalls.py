"""The agents' checkpoint calls (``agent.checkpoints.ckptstore``): an owner asks a runner for the
checkpoint an attempt left (``checkpoint_of``), has its replica or the job's next owner fetch its
copy (``checkpoint_copy``), and lets a holder serve the next runner (``checkpoint_grant``); a
runner tells the owner its job checkpointed (``checkpointed``)."""

from __future__ import annotations

from typing import Any, NamedTuple

from agent.wire import codec as c


class CheckpointCopy(NamedTuple):
    """``checkpoint_copy``, from an agent that may act as the job's owner: fetch the job's
    checkpoint ``digest`` (written by attempt ``attempt``) from the caller and ``holders`` and
    keep it (the replica's copy, the next owner's)."""

    job_id: str
    attempt: int
    digest: str
    holders: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "digest": self.digest,
            "holders": list(self.holders),
        }

    @classmethod
    def from_wire(cls, value: Any) -> CheckpointCopy:
        d = c.obj(value, "body")
        return cls(
            job_id=c.field(d, "job_id", c.text),
            attempt=c.field(d, "attempt", c.integer),
            digest=c.field(d, "digest", c.text),
            holders=c.field(d, "holders", c.texts),
        )


class CheckpointGrant(NamedTuple):
    """``checkpoint_grant``, from an agent that may act as the job's owner: serve the job's
    checkpoint to ``node``, which runs the job's next attempt."""

    job_id: str
    node: str

    def to_wire(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "node": self.node}

    @classmethod
    def from_wire(cls, value: Any) -> CheckpointGrant:
        d = c.obj(value, "body")
        return cls(job_id=c.field(d, "job_id", c.text), node=c.field(d, "node", c.text))


class CheckpointNote(NamedTuple):
    """``checkpointed``: the runner of attempt ``attempt`` saw its checkpoint folder change;
    ``checkpoint_of``: the owner asks the runner for the checkpoint that attempt left (answered
    with its :class:`ResumeFrom`, under ``checkpoint``, or none)."""

    job_id: str
    attempt: int

    def to_wire(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "attempt": self.attempt}

    @classmethod
    def from_wire(cls, value: Any) -> CheckpointNote:
        d = c.obj(value, "body")
        return cls(job_id=c.field(d, "job_id", c.text), attempt=c.field(d, "attempt", c.integer))
