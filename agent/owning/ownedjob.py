"""A job as its owner keeps it, and its wire form between owner, replica and successor.

``OwnedJob`` is the owner's mutable working copy of a job (persisted as a ``JobRecord``, gossiped
as ``job/<id>``: :meth:`OwnedJob.status`, an ``agent.wire.records.JobStatus``). ``job_wire`` and
``job_from_wire`` carry it, with the operator's submission, in ``replicate`` and ``adopt`` calls
(``agent.wire.documents.JobTransfer``); the receiving side runs the spec of the submission it
verified, never one in the body (``agent.job.authority``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from agent.job.authority import Authority
from agent.job.jobspec import JobSpec, check_job_id
from agent.job.jobstate import JobState
from agent.storage.store import JobRecord, Store, StoreFull
from agent.wire.calls import JobTransfer, OwnerDetail
from agent.wire.codec import MAX_RECORD_BYTES, WireError
from agent.wire.records import AttemptEntry, GangMember, JobStatus

log = logging.getLogger("shoal.owner")

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
    """Offers that failed to launch the job (missing program, bad folder...)."""
    attempts: list[AttemptEntry] = field(default_factory=list)
    """Where each attempt ran and how it ended (the last :data:`ATTEMPTS_KEPT`)."""
    submission: bytes = b""
    """The operator's sealed submission (see ``agent.job.authority``)."""
    members: tuple[GangMember, ...] = ()
    """A gang's current attempt, every member, rank 0 first (``runner`` and ``devices`` are
    rank 0's); empty for a one-node job, and for a gang between attempts."""
    extra: dict[str, Any] = field(default_factory=dict)
    deadline_missed_s: float | None = None
    """How late it was when this or an earlier owner said it missed its deadline."""
    repaired: str | None = None
    """Why its stored details were left out when it was loaded (:meth:`from_record`)."""

    def note_repaired(self, errors: Counter[str]) -> None:
        """Log and count (``stored_copy_repaired``) that its stored details were left out."""
        if self.repaired is not None:
            errors["stored_copy_repaired"] += 1
            log.warning("job %s: stored details left out: %s", self.job_id[:8], self.repaired)

    @property
    def deadline(self) -> float | None:
        return self.spec.deadline

    @property
    def state_name(self) -> str:
        return self.state.value

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

    def owner_detail(self) -> OwnerDetail:
        return OwnerDetail(
            devices=self.devices,
            started_at=self.started_at,
            finished_at=self.finished_at,
            exit_code=self.exit_code,
            signal=self.signal,
            reason=self.reason,
            gen=self.gen,
            failures=self.failures,
            prefer=self.prefer,
            avoid=self.avoid,
            launch_failures=self.launch_failures,
            attempts=tuple(self.attempts),
            members=self.members,
            deadline_missed_s=self.deadline_missed_s,
        )

    def detail(self) -> dict[str, Any]:
        return self.owner_detail().to_wire()

    @classmethod
    def from_record(cls, rec: JobRecord) -> OwnedJob:
        """The job as stored. Details that do not decode (a copy written before integers on
        the wire were bounded, say, with a ``gen`` no counter can go past) are left out, said
        in :attr:`repaired`: the job goes on from its record's columns at ``gen`` 0, and its
        owner brings it up to the newest record the mesh believes (:meth:`merge_gossip`)."""
        repaired = None
        try:
            d = OwnerDetail.from_wire(rec.detail)
        except WireError as exc:  # said by the caller that acts on it, once
            d, repaired = OwnerDetail(), str(exc)
        return cls(
            job_id=rec.job_id,
            spec=rec.spec,
            state=rec.state,
            attempt=rec.attempt,
            owner=rec.owner,
            runner=rec.runner,
            submitted_at=rec.submitted_at,
            devices=d.devices,
            started_at=d.started_at,
            finished_at=d.finished_at,
            exit_code=d.exit_code,
            signal=d.signal,
            reason=d.reason,
            gen=d.gen,
            failures=d.failures,
            prefer=d.prefer,
            avoid=d.avoid,
            launch_failures=d.launch_failures,
            attempts=list(d.attempts),
            submission=rec.submission,
            members=d.members,
            deadline_missed_s=d.deadline_missed_s,
            repaired=repaired,
        )

    def merge_gossip(self, doc: dict[str, Any]) -> None:
        """Take the fresher facts of a gossiped record (a newer version by a former owner)."""
        status = JobStatus.from_wire(doc)
        if status.gen <= self.gen:
            return
        try:
            self.state = JobState(status.state)
        except ValueError:
            return
        self.attempt = status.attempt
        self.runner = status.runner
        self.devices = status.devices
        self.started_at = status.started_at
        self.finished_at = status.finished_at
        self.exit_code = status.exit_code
        self.reason = status.reason
        self.gen = status.gen
        self.members = status.members
        if status.deadline_missed_s is not None:
            self.deadline_missed_s = status.deadline_missed_s

    def status(self) -> JobStatus:
        """The job's record as gossiped (``job/<id>``) and handed on."""
        return JobStatus(
            job_id=self.job_id,
            state=self.state.value,
            attempt=self.attempt,
            owner=self.owner,
            runner=self.runner,
            devices=self.devices,
            submitted_at=self.submitted_at,
            started_at=self.started_at,
            finished_at=self.finished_at,
            exit_code=self.exit_code,
            signal=self.signal,
            reason=self.reason,
            gen=self.gen,
            attempts=tuple(self.attempts),
            members=self.members,
            deadline_missed_s=self.deadline_missed_s,
        )

    def to_json(self) -> dict[str, Any]:
        """The record with the spec: what the API shows of a job this agent owns."""
        doc = self.status().to_wire()
        doc["spec"] = self.spec.to_dict()
        return doc

    def attempt_started(self, node: str, started_at: float) -> None:
        self.attempts.append(AttemptEntry(self.attempt, node, started_at))
        del self.attempts[:-ATTEMPTS_KEPT]

    def attempt_ended(self, attempt: int, cause: str, exit_code: int | None, at: float) -> None:
        for i in range(len(self.attempts) - 1, -1, -1):
            entry = self.attempts[i]
            if entry.attempt == attempt and entry.cause is None:
                self.attempts[i] = entry._replace(finished_at=at, cause=cause, exit_code=exit_code)
                return


def gossip_payload(status: JobStatus) -> bytes:
    """The ``job/<id>`` record as gossiped: the oldest attempts left out until it fits one
    record (a gang's members take room; the owner's own copy keeps them all). ``ValueError``
    when even the record with no attempts is too large."""
    payload = status.encode()
    attempts = status.attempts
    while len(payload) > MAX_RECORD_BYTES and attempts:
        attempts = attempts[1:]
        payload = status._replace(attempts=attempts).encode()
    if len(payload) > MAX_RECORD_BYTES:
        raise ValueError(f"the job's record takes {len(payload)} bytes, over one record's limit")
    return payload


class OwnerError(Exception):
    """A command the owner refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def job_wire(job: OwnedJob) -> dict[str, Any]:
    """The body of a ``replicate`` or ``adopt`` call: the record, its details, the submission."""
    return JobTransfer(job.status(), job.owner_detail(), job.submission).to_wire()


def job_from_wire(body: dict[str, Any], authority: Authority) -> OwnedJob:
    """An ``OwnedJob`` from a ``replicate``/``adopt`` body: ``ValueError`` when malformed,
    ``SubmissionRefused`` unless it carries its operator's submission (whose spec it runs)."""
    transfer = JobTransfer.from_wire(body)
    rec = transfer.record
    job_id = check_job_id(rec.job_id)
    if rec.owner is None or rec.submitted_at is None:
        raise WireError("record: owner and submitted_at are required")
    sub = authority.submission(transfer.submission, job_id)
    return OwnedJob.from_record(
        JobRecord(
            job_id=job_id,
            spec=sub.spec,
            state=JobState(rec.state),
            attempt=rec.attempt,
            owner=rec.owner,
            runner=rec.runner,
            submitted_at=rec.submitted_at,
            updated_at=time.time(),
            detail=transfer.detail.to_wire(),
            submission=sub.sealed,
        )
    )


def store_replica(
    store: Store, body: dict[str, Any], caller: str, authority: Authority
) -> OwnedJob:
    """Keep a copy sent by the job's owner, unless we already hold a newer version. Refused
    (``OwnerError`` 403) unless the caller names itself as the owner and is one here: among the
    first :data:`~agent.job.authority.OWNER_WINDOW` of the job's order, as this agent sees the mesh.
    That this agent is an owner itself gives the caller nothing: a member outside the window
    could otherwise leave any copy it likes (an owner of its choosing, a ``gen`` above every
    record) with both of the job's owners."""
    job = job_from_wire(body, authority)
    if job.owner != caller or not authority.may_own(job.job_id, caller):
        raise OwnerError(403, f"{caller[:8]} may not replicate job {job.job_id}")
    held = store.get_job(job.job_id)
    if held is not None and held_gen(held) > job.gen:
        return job
    store.put_job(job.record())
    return job


def held_gen(rec: JobRecord) -> int:
    """The ``gen`` of a stored copy; -1 for a copy whose details do not decode (any other
    copy is newer)."""
    try:
        return OwnerDetail.from_wire(rec.detail).gen
    except WireError:
        return -1


def stored_job(store: Store, job_id: str) -> dict[str, Any] | None:
    """The job's record (with its spec) as this agent's store holds it: as its owner, or as a
    replica's holder; ``None`` if it holds none."""
    stored = store.get_job(job_id)
    return OwnedJob.from_record(stored).to_json() if stored is not None else None


@contextlib.contextmanager
def kept_or_undone(job: OwnedJob) -> Iterator[None]:
    """What a step changes in ``job`` stays only if its save is kept: a full disk
    (:class:`StoreFull`) undoes it in memory too. The caller (a runner reporting how an attempt
    ended) is answered 507 and asks again, and the step runs again, instead of finding the job
    moved on in this owner's memory alone, never saved nor said to the mesh."""
    before = copy.deepcopy(job)
    try:
        yield
    except StoreFull:
        for f in dataclasses.fields(job):
            setattr(job, f.name, getattr(before, f.name))
        raise
