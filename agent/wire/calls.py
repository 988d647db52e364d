"""The bodies of the calls between agents (JSON, ``POST /v1/internal/<call>``), one definition each.

:class:`JobTransfer` (``replicate``, ``adopt``), :class:`StartOffer` and :class:`StartAnswer`
(``start``), :class:`StopRequest` and :class:`StopAnswer` (``stop``), :class:`StatusRequest` and
:class:`StatusAnswer` (``status``), :class:`AttemptResult` (``report``, and inside the stop and
status answers), and a gang's two-phase start (``agent.owning.gang``, ``agent.running.gangdesk``):
:class:`GangPrepare` and :class:`GangPrepared` (``gang_prepare``), :class:`GangCommit` and
:class:`StartAnswer` (``gang_commit``), :class:`GangAbort` and :class:`GangAborted`
(``gang_abort``), and :class:`StartConfirm` and :class:`StartConfirmed` (``confirm_start``: a
runner asks the job's other owner before it starts an attempt). A body that does not decode
raises :class:`~agent.wire.codec.WireError` (the API answers 400).
"""

from __future__ import annotations

import base64
from typing import Any, Final, NamedTuple

from agent.wire import codec as c
from agent.wire.codec import WireError
from agent.wire.records import (
    AttemptEntry,
    GangMember,
    JobStatus,
    members_from_wire,
    members_to_wire,
)

MAX_HOLD_S: Final = 30.0
"""The longest a gang's prepare may hold a member's devices (``GangPrepare.ttl_s``): what the
docs promise an owner that never commits can take of a runner, at a time."""


def _b64_out(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _b64_in(value: Any, name: str) -> bytes:
    text = c.or_default(c.text, "")(value, name)
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error, and the one for a string that is not ASCII
        raise WireError(f"{name}: not base64") from None


class OwnerDetail(NamedTuple):
    """What an owner keeps of a job beyond its record (persisted, and handed on with it)."""

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
    launch_failures: int = 0
    attempts: tuple[AttemptEntry, ...] = ()
    members: tuple[GangMember, ...] = ()
    """A gang's current (or last) attempt, every member (empty for a one-node job)."""
    deadline_missed_s: float | None = None
    """How late the job was when its owner said it missed its deadline (``agent.job.deadlines``);
    ``None`` until then."""

    def to_wire(self) -> dict[str, Any]:
        return members_to_wire(self._fields_to_wire(), self.members)

    def _fields_to_wire(self) -> dict[str, Any]:
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
            "attempts": [a.to_wire() for a in self.attempts],
            "deadline_missed_s": self.deadline_missed_s,
        }

    @classmethod
    def from_wire(cls, value: Any, name: str = "detail") -> OwnerDetail:
        d = c.obj({} if value is None else value, name)
        p = name + "."
        return cls(
            devices=c.field(d, "devices", c.texts, p),
            started_at=c.field(d, "started_at", c.opt_number, p),
            finished_at=c.field(d, "finished_at", c.opt_number, p),
            exit_code=c.field(d, "exit_code", c.opt_integer, p),
            signal=c.field(d, "signal", c.opt_text, p),
            reason=c.field(d, "reason", c.opt_text, p),
            gen=c.field(d, "gen", c.or_default(c.integer, 0), p),
            failures=c.field(d, "failures", c.or_default(c.integer, 0), p),
            prefer=c.field(d, "prefer", c.opt_text, p),
            avoid=c.field(d, "avoid", c.opt_text, p),
            launch_failures=c.field(d, "launch_failures", c.or_default(c.integer, 0), p),
            attempts=c.items(d.get("attempts"), p + "attempts", AttemptEntry.from_wire),
            members=members_from_wire(d.get("members"), p + "members"),
            deadline_missed_s=c.field(d, "deadline_missed_s", c.opt_number, p),
        )


class JobTransfer(NamedTuple):
    """``replicate`` and ``adopt``: a job's record and details, with the operator's sealed
    submission (the receiver runs the spec inside the submission it verified, never one here)."""

    record: JobStatus
    detail: OwnerDetail
    submission: bytes

    def to_wire(self) -> dict[str, Any]:
        return {
            "record": self.record.to_wire(),
            "detail": self.detail.to_wire(),
            "submission": _b64_out(self.submission),
        }

    @classmethod
    def from_wire(cls, value: Any) -> JobTransfer:
        d = c.obj(value, "body")
        return cls(
            record=JobStatus.from_wire(d.get("record"), "record"),
            detail=OwnerDetail.from_wire(d.get("detail"), "detail"),
            submission=_b64_in(d.get("submission"), "submission"),
        )


class ResumeFrom(NamedTuple):
    """The checkpoint an attempt starts from: the one attempt ``attempt`` wrote, whose content
    is ``digest`` (a manifest of kind ``checkpoint`` in the content store); the runner fetches
    what it lacks of it from ``holders`` (the owner first, then others the owner let serve it)
    through the content routes before it starts."""

    attempt: int
    digest: str
    holders: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"attempt": self.attempt, "digest": self.digest}
        if self.holders:
            doc["holders"] = list(self.holders)
        return doc

    @classmethod
    def from_wire(cls, value: Any, name: str = "resume") -> ResumeFrom:
        d = c.obj(value, name)
        p = name + "."
        return cls(
            attempt=c.field(d, "attempt", c.integer, p),
            digest=c.field(d, "digest", c.text, p),
            holders=c.field(d, "holders", c.texts, p),
        )


class StartOffer(NamedTuple):
    """``start``: run attempt ``attempt`` of the job on ``devices``, for its owner ``owner``;
    ``resume``: from that checkpoint (``None``: from an empty checkpoint folder); ``victims``:
    the jobs running there that the runner is asked to preempt first (``agent.running.preemption``
    decides whether it does; empty: the devices must be free); ``shrink``: elastic jobs running
    there that the runner is asked to shrink (stop with cause ``shrink``, to restart with fewer
    GPUs) to free the devices offered; ``moves``: jobs running there that the runner is asked to
    move off (stop with cause ``migrate``, to restart elsewhere) for a start its team's
    guarantee is owed (``agent.running.preemption``); ``rebind``: when the devices offered are
    taken by the time the offer arrives, the runner may start the job on others of the same
    models that its placement chooses (and says which in its answer) rather than decline."""

    job_id: str
    attempt: int
    owner: str
    devices: tuple[str, ...]
    submission: bytes
    resume: ResumeFrom | None = None
    victims: tuple[str, ...] = ()
    shrink: tuple[str, ...] = ()
    rebind: bool = False
    moves: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        doc = {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "devices": list(self.devices),
            "owner": self.owner,
            "submission": _b64_out(self.submission),
        }
        if self.resume is not None:
            doc["resume"] = self.resume.to_wire()
        if self.victims:
            doc["victims"] = list(self.victims)
        if self.shrink:
            doc["shrink"] = list(self.shrink)
        if self.rebind:
            doc["rebind"] = True
        if self.moves:
            doc["moves"] = list(self.moves)
        return doc

    @classmethod
    def from_wire(cls, value: Any) -> StartOffer:
        d = c.obj(value, "body")
        resume = d.get("resume")
        return cls(
            job_id=c.field(d, "job_id", c.text),
            attempt=c.field(d, "attempt", c.integer),
            owner=c.field(d, "owner", c.text),
            devices=c.field(d, "devices", c.texts),
            submission=_b64_in(d.get("submission"), "submission"),
            resume=None if resume is None else ResumeFrom.from_wire(resume),
            victims=c.field(d, "victims", c.texts),
            shrink=c.field(d, "shrink", c.texts),
            rebind=c.field(d, "rebind", c.or_default(c.flag, False)),
            moves=c.field(d, "moves", c.texts),
        )


class StartAnswer(NamedTuple):
    ok: bool
    started_at: float | None
    pid: int | None
    devices: tuple[str, ...] = ()
    """The devices the attempt started on when the runner chose others than those offered (the
    offer let it: ``StartOffer.rebind``); empty: those offered."""

    def to_wire(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"ok": self.ok, "started_at": self.started_at, "pid": self.pid}
        if self.devices:
            doc["devices"] = list(self.devices)
        return doc

    @classmethod
    def from_wire(cls, value: Any) -> StartAnswer:
        d = c.obj(value, "answer")
        return cls(
            ok=c.field(d, "ok", c.or_default(c.flag, False)),
            started_at=c.field(d, "started_at", c.opt_number),
            pid=c.field(d, "pid", c.opt_integer),
            devices=c.field(d, "devices", c.texts),
        )


class AttemptResult(NamedTuple):
    """How an attempt ended on its runner (``report``; inside stop and status answers)."""

    job_id: str
    attempt: int
    exit_code: int | None
    signal: str | None
    cause: str
    """``exit``, ``timeout``, ``lost`` or a stop cause (``cancel``, ``drain``, ``fenced``...)."""
    started_at: float | None
    finished_at: float | None
    preempted_by: str | None = None
    """With cause ``preempt``: the job the runner stopped it for."""

    def to_wire(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "cause": self.cause,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }
        if self.preempted_by is not None:
            doc["preempted_by"] = self.preempted_by
        return doc

    @classmethod
    def from_wire(cls, value: Any, name: str = "result") -> AttemptResult:
        d = c.obj(value, name)
        p = name + "."
        return cls(
            job_id=c.field(d, "job_id", c.text, p),
            attempt=c.field(d, "attempt", c.integer, p),
            exit_code=c.field(d, "exit_code", c.opt_integer, p),
            signal=c.field(d, "signal", c.opt_text, p),
            cause=c.field(d, "cause", c.or_default(c.text, "exit"), p),
            started_at=c.field(d, "started_at", c.opt_number, p),
            finished_at=c.field(d, "finished_at", c.opt_number, p),
            preempted_by=c.field(d, "preempted_by", c.opt_text, p),
        )


class StopRequest(NamedTuple):
    """``stop``: stop (and fence) attempt ``attempt``; ``grace_s`` ``None``: the runner's own."""

    job_id: str
    attempt: int
    cause: str = "cancel"
    grace_s: float | None = None

    def to_wire(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "cause": self.cause,
            "grace_s": self.grace_s,
        }

    @classmethod
    def from_wire(cls, value: Any) -> StopRequest:
        d = c.obj(value, "body")
        return cls(
            job_id=c.field(d, "job_id", c.text),
            attempt=c.field(d, "attempt", c.integer),
            cause=c.field(d, "cause", c.or_default(c.text, "cancel")),
            grace_s=c.field(d, "grace_s", c.opt_number),
        )


class StopAnswer(NamedTuple):
    """Whether the attempt was stopped here, and how it ended when it was."""

    stopped: bool
    exit: AttemptResult | None = None

    def to_wire(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"stopped": self.stopped}
        if self.exit is not None:
            doc["exit"] = self.exit.to_wire()
        return doc

    @classmethod
    def from_wire(cls, value: Any) -> StopAnswer:
        d = c.obj(value, "answer")
        result = d.get("exit")
        return cls(
            stopped=c.field(d, "stopped", c.or_default(c.flag, False)),
            exit=None if result is None else AttemptResult.from_wire(result, "exit"),
        )


class StatusRequest(NamedTuple):
    job_id: str

    def to_wire(self) -> dict[str, Any]:
        return {"job_id": self.job_id}

    @classmethod
    def from_wire(cls, value: Any) -> StatusRequest:
        return cls(job_id=c.field(c.obj(value, "body"), "job_id", c.text))


class StatusAnswer(NamedTuple):
    """What runs, or last ran, of a job on the answering runner."""

    running: bool
    attempt: int | None
    result: AttemptResult | None

    def to_wire(self) -> dict[str, Any]:
        return {
            "running": self.running,
            "attempt": self.attempt,
            "result": None if self.result is None else self.result.to_wire(),
        }

    @classmethod
    def from_wire(cls, value: Any) -> StatusAnswer:
        d = c.obj(value, "answer")
        result = d.get("result")
        return cls(
            running=c.field(d, "running", c.or_default(c.flag, False)),
            attempt=c.field(d, "attempt", c.opt_integer),
            result=None if result is None else AttemptResult.from_wire(result, "result"),
        )


def hold_problem(ttl_s: float) -> str | None:
    """Why a prepare may not hold devices for ``ttl_s`` (one line), or ``None`` when it may."""
    if not 0 < ttl_s <= MAX_HOLD_S:
        return f"ttl_s: a hold lasts more than 0 and at most {MAX_HOLD_S:g} s, not {ttl_s:g} s"
    return None


class GangPrepare(NamedTuple):
    """``gang_prepare``: hold the devices the node's member of ``members`` names, for attempt
    ``attempt`` of a gang, for ``ttl_s`` (counted busy for every other offer meanwhile), until a
    ``gang_commit`` starts the member or a ``gang_abort`` (or the time running out) frees them;
    ``ttl_s`` is at most :data:`MAX_HOLD_S`.
    Carries the operator's submission, as a ``start`` does; ``owner`` is the caller."""

    job_id: str
    attempt: int
    owner: str
    members: tuple[GangMember, ...]
    submission: bytes
    ttl_s: float
    rebind: bool = False
    """When the member's devices are taken by the time the prepare arrives, the runner may hold
    others of the same models that its placement chooses (and says which), as
    ``StartOffer.rebind``."""

    def to_wire(self) -> dict[str, Any]:
        doc = {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "owner": self.owner,
            "members": [m.to_wire() for m in self.members],
            "submission": _b64_out(self.submission),
            "ttl_s": self.ttl_s,
        }
        if self.rebind:
            doc["rebind"] = True
        return doc

    @classmethod
    def from_wire(cls, value: Any) -> GangPrepare:
        d = c.obj(value, "body")
        members = members_from_wire(d.get("members"), "members")
        if len(members) < 2:
            raise WireError("members: a gang has at least two")
        ttl_s = c.field(d, "ttl_s", c.number)
        if (problem := hold_problem(ttl_s)) is not None:
            raise WireError(problem)
        return cls(
            job_id=c.field(d, "job_id", c.text),
            attempt=c.field(d, "attempt", c.integer),
            owner=c.field(d, "owner", c.text),
            members=members,
            submission=_b64_in(d.get("submission"), "submission"),
            ttl_s=ttl_s,
            rebind=c.field(d, "rebind", c.or_default(c.flag, False)),
        )


class GangPrepared(NamedTuple):
    """The devices are held. Rank 0's runner also names where the members meet: its advertised
    host and a port it found free (``MASTER_ADDR``/``MASTER_PORT``); other ranks answer none."""

    held: bool
    master_addr: str | None = None
    master_port: int | None = None
    devices: tuple[str, ...] = ()
    """The devices held when the runner chose others than the member's (the prepare let it:
    ``GangPrepare.rebind``); empty: the member's."""

    def to_wire(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "held": self.held,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
        }
        if self.devices:
            doc["devices"] = list(self.devices)
        return doc

    @classmethod
    def from_wire(cls, value: Any) -> GangPrepared:
        d = c.obj(value, "answer")
        return cls(
            held=c.field(d, "held", c.or_default(c.flag, False)),
            master_addr=c.field(d, "master_addr", c.opt_text),
            master_port=c.field(d, "master_port", c.opt_integer),
            devices=c.field(d, "devices", c.texts),
        )


class GangCommit(NamedTuple):
    """``gang_commit``: start the member held for attempt ``attempt``, meeting the others at
    ``master_addr:master_port`` (answered with a :class:`StartAnswer`)."""

    job_id: str
    attempt: int
    master_addr: str
    master_port: int

    def to_wire(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
        }

    @classmethod
    def from_wire(cls, value: Any) -> GangCommit:
        d = c.obj(value, "body")
        port = c.field(d, "master_port", c.integer)
        if not 0 < port < 65536:
            raise WireError("master_port: not a TCP port")
        return cls(
            job_id=c.field(d, "job_id", c.text),
            attempt=c.field(d, "attempt", c.integer),
            master_addr=c.field(d, "master_addr", c.text),
            master_port=port,
        )


class GangAbort(NamedTuple):
    """``gang_abort``: free what attempt ``attempt`` holds here and fence it (no later prepare
    or commit of it, or of an older attempt, is taken)."""

    job_id: str
    attempt: int

    def to_wire(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "attempt": self.attempt}

    @classmethod
    def from_wire(cls, value: Any) -> GangAbort:
        d = c.obj(value, "body")
        return cls(job_id=c.field(d, "job_id", c.text), attempt=c.field(d, "attempt", c.integer))


class GangAborted(NamedTuple):
    """Whether a hold was freed (``False``: there was none, it had run out, or had started)."""

    released: bool

    def to_wire(self) -> dict[str, Any]:
        return {"released": self.released}

    @classmethod
    def from_wire(cls, value: Any) -> GangAborted:
        d = c.obj(value, "answer")
        return cls(released=c.field(d, "released", c.or_default(c.flag, False)))


class StartConfirm(NamedTuple):
    """``confirm_start``: the runner that calls asks the job's other owner whether ``owner``
    placed attempt ``attempt`` of the job on it (``agent.running.confirming``); answered with a
    :class:`StartConfirmed`."""

    job_id: str
    attempt: int
    owner: str

    def to_wire(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "attempt": self.attempt, "owner": self.owner}

    @classmethod
    def from_wire(cls, value: Any) -> StartConfirm:
        d = c.obj(value, "body")
        return cls(
            job_id=c.field(d, "job_id", c.text),
            attempt=c.field(d, "attempt", c.integer),
            owner=c.field(d, "owner", c.text),
        )


class StartConfirmed(NamedTuple):
    """Whether the other owner's copy of the job places that attempt on the caller; when it
    does not, ``reason`` says why in one line."""

    confirmed: bool
    reason: str = ""

    def to_wire(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"confirmed": self.confirmed}
        if self.reason:
            doc["reason"] = self.reason
        return doc

    @classmethod
    def from_wire(cls, value: Any) -> StartConfirmed:
        d = c.obj(value, "answer")
        return cls(
            confirmed=c.field(d, "confirmed", c.or_default(c.flag, False)),
            reason=c.field(d, "reason", c.or_default(c.text, "")),
        )


class PrefetchAsk(NamedTuple):
    """``prefetch``: stage job ``job_id``'s datasets on the callee now, for the job's owner
    ``owner`` (the operator's ``submission`` authorises it, as an offer's does); ``cancel``:
    stop (the forecast moved). ``agent.running.prefetch``."""

    job_id: str
    owner: str
    submission: bytes
    cancel: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "owner": self.owner,
            "submission": _b64_out(self.submission),
            "cancel": self.cancel,
        }

    @classmethod
    def from_wire(cls, value: Any) -> PrefetchAsk:
        d = c.obj(value, "body")
        return cls(
            job_id=c.field(d, "job_id", c.text),
            owner=c.field(d, "owner", c.text),
            submission=_b64_in(d.get("submission"), "submission"),
            cancel=c.field(d, "cancel", c.or_default(c.flag, False)),
        )
