"""A job as its owner keeps it, and its wire form between owner, replica and successor.

``OwnedJob`` is the owner's mutable working copy of a job (persisted as a ``JobRecord``, gossiped
as ``job/<id>`` by :meth:`OwnedJob.to_json`). ``job_wire``/``job_from_wire`` carry it, with the
operator's submission, in ``replicate`` and ``adopt`` calls; the receiving side runs the spec of
the submission it verified, never one in the body (``agent.authority``).
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import Any

from agent.authority import Authority
from agent.jobspec import JobSpec, check_job_id
from agent.jobstate import JobState
from agent.store import JobRecord, Store
from agent.view import job_gen

ATTEMPTS_KEPT = 20


@dataclass(slots=True)
class OwnedJob:
    """A job as its owner keeps it (mutable; persisted as a ``JobRecord``)."""

    job_id: str
    spec: JobSpec
    state: JobState
    attempt: int
    owner: str
    runner: str | None
    submitted_at: float
    devices: tuple[str, ...] = ()
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    reason: str | None = None
    gen: int = 0
    failures: int = 0
    prefer: str | None = None
    avoid: str | None = None
    placing_since: float = 0.0
    refused_by: str | None = None
    """The node that refused the current attempt (so it ran nowhere): offered to that same node
    again, the attempt keeps its number. Another node gets a new one: a runner fences an attempt
    that a job record (maybe an older one, still travelling) places on another node."""
    launch_failures: int = 0
    attempts: list[dict[str, Any]] = field(default_factory=list)
    """Where each attempt ran and how it ended (the last :data:`ATTEMPTS_KEPT`): ``attempt``,
    ``node``, ``started_at``, then ``finished_at``, ``cause``, ``exit_code``."""
    """Offers that failed to launch the job (missing program, bad folder...)."""
    submission: bytes = b""
    """The operator's sealed submission (see ``agent.authority``)."""
    extra: dict[str, Any] = field(default_factory=dict)

    def record(self) -> JobRecord:
        return JobRecord(
            job_id=self.job_id,
            spec=self.spec,
            state=self.state,
            attempt=self.attempt,
            owner=self.owner,
            runner=self.runner,
            submitted_at=self.submitted_at,
            updated_at=time.time(),
            detail=self.detail(),
            submission=self.submission,
        )

    def detail(self) -> dict[str, Any]:
        return {
            "devices": list(self.devices),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "reason": self.reason,
            "gen": self.gen,
            "failures": self.failures,
            "prefer": self.prefer,
            "avoid": self.avoid,
            "launch_failures": self.launch_failures,
            "attempts": self.attempts,
        }

    @classmethod
    def from_record(cls, rec: JobRecord) -> OwnedJob:
        d = dict(rec.detail)
        return cls(
            job_id=rec.job_id,
            spec=rec.spec,
            state=rec.state,
            attempt=rec.attempt,
            owner=rec.owner,
            runner=rec.runner,
            submitted_at=rec.submitted_at,
            devices=tuple(d.get("devices") or ()),
            started_at=d.get("started_at"),
            finished_at=d.get("finished_at"),
            exit_code=d.get("exit_code"),
            signal=d.get("signal"),
            reason=d.get("reason"),
            gen=int(d.get("gen") or 0),
            failures=int(d.get("failures") or 0),
            prefer=d.get("prefer"),
            avoid=d.get("avoid"),
            launch_failures=int(d.get("launch_failures") or 0),
            attempts=[a for a in d.get("attempts") or () if isinstance(a, dict)],
            submission=rec.submission,
        )

    def merge_gossip(self, doc: dict[str, Any]) -> None:
        """Take the fresher facts of a gossiped record (a newer version by a former owner)."""
        if job_gen(doc) <= self.gen:
            return
        try:
            self.state = JobState(str(doc.get("state")))
        except ValueError:
            return
        self.attempt = int(doc.get("attempt") or 0)
        self.runner = doc.get("runner")
        self.devices = tuple(doc.get("devices") or ())
        self.started_at = doc.get("started_at")
        self.finished_at = doc.get("finished_at")
        self.exit_code = doc.get("exit_code")
        self.reason = doc.get("reason")
        self.gen = job_gen(doc)

    def to_json(self, *, with_spec: bool = True) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "state": self.state.value,
            "attempt": self.attempt,
            "owner": self.owner,
            "runner": self.runner,
            "devices": list(self.devices),
            "spec": self.spec.to_dict() if with_spec else None,
            "submitted_at": self.submitted_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "reason": self.reason,
            "gen": self.gen,
            "attempts": self.attempts,
        }

    def attempt_started(self, node: str, started_at: float) -> None:
        self.attempts.append({"attempt": self.attempt, "node": node, "started_at": started_at})
        del self.attempts[:-ATTEMPTS_KEPT]

    def attempt_ended(self, attempt: int, cause: str, exit_code: int | None, at: float) -> None:
        for entry in reversed(self.attempts):
            if entry.get("attempt") == attempt and "cause" not in entry:
                entry.update(finished_at=at, cause=cause, exit_code=exit_code)
                return


class OwnerError(Exception):
    """A command the owner refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def job_wire(job: OwnedJob) -> dict[str, Any]:
    """The body of a ``replicate`` or ``adopt`` call: the record, its details, the submission."""
    return {
        "record": job.to_json(with_spec=False),
        "detail": job.detail(),
        "submission": base64.b64encode(job.submission).decode("ascii"),
    }


def job_from_wire(body: dict[str, Any], authority: Authority) -> OwnedJob:
    """An ``OwnedJob`` from a ``replicate``/``adopt`` body: ``ValueError`` when malformed,
    ``SubmissionRefused`` unless it carries its operator's submission (whose spec it runs)."""
    rec = body.get("record")
    detail = body.get("detail") or {}
    if not isinstance(rec, dict) or not isinstance(detail, dict):
        raise ValueError("record and detail must be objects")
    sealed = base64.b64decode(str(body.get("submission", "")), validate=True)
    job_id = check_job_id(rec["job_id"])
    sub = authority.submission(sealed, job_id)
    return OwnedJob.from_record(
        JobRecord(
            job_id=job_id,
            spec=sub.spec,
            state=JobState(rec["state"]),
            attempt=int(rec["attempt"]),
            owner=str(rec["owner"]),
            runner=rec.get("runner"),
            submitted_at=float(rec["submitted_at"]),
            updated_at=time.time(),
            detail=detail,
            submission=sub.sealed,
        )
    )


def store_replica(store: Store, body: dict[str, Any], caller: str, authority: Authority) -> None:
    """Keep a copy sent by the job's owner, unless we already hold a newer version. Refused
    (``OwnerError`` 403) unless the caller may act as the job's owner and says it is."""
    job = job_from_wire(body, authority)
    if job.owner != caller or not authority.may_own(job.job_id, caller):
        raise OwnerError(403, f"{caller[:8]} may not replicate job {job.job_id}")
    held = store.get_job(job.job_id)
    if held is not None and int(dict(held.detail).get("gen") or 0) > job.gen:
        return
    store.put_job(job.record())
