"""What agents gossip about themselves and their jobs: one typed definition per record kind.

Every record is a msgpack map of at most :data:`~agent.wire.codec.MAX_RECORD_BYTES`, signed by
the node it describes, with ``v`` its :data:`~agent.wire.codec.WIRE_VERSION`:

- ``inventory`` (+ ``inventory/1`` .. ``inventory/<n-1>``): ``agent.wire.inventory``'s
  ``InventoryRecord``, the host and its devices' static facts, in parts where they do not fit in
  one record.
- ``telemetry``: :class:`TelemetryRecord`, one row per device (``[key, util_pct,
  mem_used_bytes, temp_c, power_mw, power_limit_mw, healthy]``; a reader ignores further
  elements, a version 1 reader refuses rows of another length, so rows keep these seven).
- ``node``: :class:`NodeRecord`, drain state, queue, running jobs, free devices, progress, and the
  memory each share of a GPU holds on its device.
- ``events``: :class:`EventsRecord`, the publisher's recent events.
- ``job/<id>``: :class:`JobStatus`, a job as its owner sees it (the spec travels in the
  operator's sealed ``sub/<id>``, never here).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple

from agent.wire import codec as c
from agent.wire.codec import EMPTY_MAP, WIRE_VERSION, WireError
from probers.records import DeviceSample

TELEMETRY: Final = "telemetry"
NODE: Final = "node"
EVENTS: Final = "events"
JOB_PREFIX: Final = "job/"
SUB_PREFIX: Final = "sub/"


# -- telemetry -----------------------------------------------------------------------------------


def _opt_int_out(value: int | float | None) -> int | None:
    return None if value is None else int(value)


def _opt_float_out(value: float | None) -> float | None:
    """A reading as sent: one that is not a finite number (a driver's NaN) is not known."""
    return None if value is None or not math.isfinite(value) else float(value)


TELEMETRY_EVERY_S: Final = 60.0
"""The heartbeat a telemetry record that names none is taken to keep (an agent's default)."""
MAX_TELEMETRY_EVERY_S: Final = 86_400.0
"""The longest heartbeat a record may name (a day; a mesh of ~23,000 agents)."""
STALE_AFTER_HEARTBEATS: Final = 1.5
"""Telemetry older than this many of its node's heartbeats is stale: one heartbeat missed, with
room for gossip's delay."""


def telemetry_stale(age_s: float | None, every_s: float | None) -> bool:
    """Whether telemetry ``age_s`` old (``None``: none yet) from a node that sends it at least
    every ``every_s`` (``None``: :data:`TELEMETRY_EVERY_S`) is stale."""
    heartbeat_s = TELEMETRY_EVERY_S if every_s is None else every_s
    return age_s is not None and age_s > STALE_AFTER_HEARTBEATS * heartbeat_s


class TelemetryRecord(NamedTuple):
    """What every device is doing, sampled at ``at`` (epoch seconds, the publisher's clock)."""

    at: float | None
    samples: tuple[DeviceSample, ...]
    every_s: float | None = None
    """The publisher sends its telemetry again at least this often (its heartbeat, which grows
    with the mesh: ``agent.daemon.publisher.quiet_every_s``); ``None``: not said (an older agent),
    :data:`TELEMETRY_EVERY_S`."""

    def encode(self) -> bytes:
        rows = [
            [
                s.key,
                _opt_float_out(s.util_pct),
                _opt_int_out(s.mem_used_bytes),
                _opt_float_out(s.temp_c),
                _opt_int_out(s.power_mw),
                _opt_int_out(s.power_limit_mw),
                bool(s.healthy),
            ]
            for s in self.samples
        ]
        doc = {"v": WIRE_VERSION, "at": self.at, "s": rows}
        if self.every_s is not None:
            doc["every_s"] = self.every_s
        return c.pack(doc)

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> TelemetryRecord:
        every_s = c.field(doc, "every_s", c.opt_number)
        if every_s is not None and not 0 < every_s <= MAX_TELEMETRY_EVERY_S:
            raise WireError(
                f"every_s: expected 0 < every_s <= {MAX_TELEMETRY_EVERY_S:g}, got {every_s}"
            )
        return cls(
            at=c.field(doc, "at", c.opt_number),
            samples=c.items(doc.get("s"), "s", _sample_from_wire),
            every_s=every_s,
        )


def _sample_from_wire(value: Any, name: str) -> DeviceSample:
    row = c.row(value, name, 7)
    return DeviceSample(
        key=c.text(row[0], name + ".key"),
        util_pct=c.opt_number(row[1], name + ".util_pct"),
        mem_used_bytes=c.opt_integer(row[2], name + ".mem_used_bytes"),
        temp_c=c.opt_number(row[3], name + ".temp_c"),
        power_mw=c.opt_integer(row[4], name + ".power_mw"),
        power_limit_mw=c.opt_integer(row[5], name + ".power_limit_mw"),
        healthy=c.flag(row[6], name + ".healthy"),
    )


# -- node ----------------------------------------------------------------------------------------


class NodeRecord(NamedTuple):
    """A node's scheduling state: what placement reads, and its running jobs' progress."""

    drain: str = "schedulable"
    queue: int = 0
    """Pending jobs this node owns (for people to read: placement does not)."""
    running: tuple[str, ...] = ()
    free: tuple[str, ...] | None = None
    """Device keys no job holds; ``None`` (not said): every device."""
    progress: Mapping[str, tuple[float, float | None]] = EMPTY_MAP
    """Running job -> (fraction done, seconds left or ``None``)."""
    shares: Mapping[str, Mapping[str, int]] = EMPTY_MAP
    """Device key -> {job -> bytes of its memory the job holds}, for the devices that run shares
    of a GPU (never a device given whole). Such a device is not ``free``, so a reader that does
    not know this field takes it as busy."""
    saved: Mapping[str, float] = EMPTY_MAP
    """Running job -> when its checkpoint folder last changed here (epoch seconds): what a
    preemption would lose is the work since (``agent.policy.preempt``)."""
    staging: Mapping[str, str] = EMPTY_MAP
    """Job whose start waits here for its data -> the line that says how far it is
    (``staging imagenet 43% (1.2 GB/s from 3 holders, ~40 s)``, ``agent.running.datastage``);
    at most :data:`MAX_STAGING_LINES`, each at most :data:`MAX_STAGING_LINE_CHARS`."""

    def placement_view(
        self,
    ) -> tuple[str, tuple[str, ...], tuple[str, ...] | None, Mapping[str, Mapping[str, int]]]:
        """What placement reads: a change here is published at once. The rest (the queue's
        length, progress, saves, staging lines) is for people and forecasts, and waits."""
        return (self.drain, self.running, self.free, self.shares)

    def encode(self) -> bytes:
        return c.pack(
            {
                "v": WIRE_VERSION,
                "drain": self.drain,
                "queue": self.queue,
                "running": list(self.running),
                "free": None if self.free is None else list(self.free),
                "progress": {j: [f, eta] for j, (f, eta) in self.progress.items()},
                "shares": _shares_to_rows(self.shares, self.running),
                **({"saved": dict(self.saved)} if self.saved else {}),
                **({"staging": _staging_out(self.staging)} if self.staging else {}),
            }
        )

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> NodeRecord:
        free = doc.get("free")
        running = c.field(doc, "running", c.texts)
        return cls(
            drain=c.field(doc, "drain", c.or_default(c.text, "schedulable")),
            queue=c.field(doc, "queue", c.or_default(c.integer, 0)),
            running=running,
            free=None if free is None else c.texts(free, "free"),
            progress=_progress_from_wire(doc.get("progress")),
            shares=_shares_from_rows(doc.get("shares"), running),
            saved=_saved_from_wire(doc.get("saved")),
            staging=_staging_from_wire(doc.get("staging")),
        )


MAX_STAGING_LINES = 8
MAX_STAGING_LINE_CHARS = 100


def _staging_out(staging: Mapping[str, str]) -> dict[str, str]:
    kept = sorted(staging.items())[:MAX_STAGING_LINES]
    return {j: line[:MAX_STAGING_LINE_CHARS] for j, line in kept}


def _staging_from_wire(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    lines = c.obj(value, "staging")
    if len(lines) > MAX_STAGING_LINES:
        raise WireError(f"staging: at most {MAX_STAGING_LINES} jobs")
    out: dict[str, str] = {}
    for job_id, line in lines.items():
        text = c.text(line, f"staging.{job_id}")
        if len(text) > MAX_STAGING_LINE_CHARS:
            raise WireError(f"staging.{job_id}: at most {MAX_STAGING_LINE_CHARS} characters")
        out[c.text(job_id, "staging")] = text
    return out


def _shares_to_rows(
    shares: Mapping[str, Mapping[str, int]], running: Sequence[str]
) -> dict[str, list[list[Any]]]:
    """``{device: [[job, bytes], ...]}``, a job named by its place in ``running`` where it is
    there (a few bytes instead of its 32-character id: a node record is at most 4 KiB)."""
    index_of = {j: i for i, j in enumerate(running)}
    return {k: [[index_of.get(j, j), b] for j, b in jobs.items()] for k, jobs in shares.items()}


def _shares_from_rows(value: Any, running: Sequence[str]) -> dict[str, dict[str, int]]:
    if value is None:
        return {}
    out: dict[str, dict[str, int]] = {}
    for key, rows in c.obj(value, "shares").items():
        where = f"shares.{key}"
        if not isinstance(rows, list | tuple):
            raise WireError(f"{where}: expected a list")
        held: dict[str, int] = {}
        for n, row in enumerate(rows):
            pair = c.row(row, f"{where}[{n}]", 2)
            job = pair[0]
            if isinstance(job, int) and not isinstance(job, bool):
                if not 0 <= job < len(running):
                    raise WireError(f"{where}[{n}]: no running job {job}")
                job = running[job]
            held[c.text(job, f"{where}[{n}]")] = c.integer(pair[1], f"{where}[{n}]")
        out[c.text(key, where)] = held
    return out


def shares_from_wire(value: Any, name: str = "shares") -> dict[str, dict[str, int]]:
    """Device key -> {job -> bytes}; missing is none."""
    if value is None:
        return {}
    out: dict[str, dict[str, int]] = {}
    for key, jobs in c.obj(value, name).items():
        where = f"{name}.{key}"
        out[c.text(key, where)] = {
            c.text(j, where): c.integer(b, f"{where}.{j}") for j, b in c.obj(jobs, where).items()
        }
    return out


def _saved_from_wire(value: Any) -> dict[str, float]:
    if value is None:
        return {}
    return {
        c.text(job_id, f"saved.{job_id}"): c.number(at, f"saved.{job_id}")
        for job_id, at in c.obj(value, "saved").items()
    }


def _progress_from_wire(value: Any) -> dict[str, tuple[float, float | None]]:
    if value is None:
        return {}
    out: dict[str, tuple[float, float | None]] = {}
    for job_id, pair in c.obj(value, "progress").items():
        name = f"progress.{job_id}"
        row = c.row(pair, name, 2)
        out[c.text(job_id, name)] = (c.number(row[0], name), c.opt_number(row[1], name))
    return out


# -- events --------------------------------------------------------------------------------------


class GossipedEvent(NamedTuple):
    """One of the publisher's events; the record's origin names the node."""

    n: int
    """The publisher's own sequence number (each event is merged once per node and ``n``)."""
    at: float | None
    kind: str
    job_id: str | None
    message: str

    def to_wire(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "kind": self.kind,
            "job_id": self.job_id,
            "message": self.message,
            "n": self.n,
        }

    @classmethod
    def from_wire(cls, value: Any, name: str = "event") -> GossipedEvent:
        d = c.obj(value, name)
        p = name + "."
        return cls(
            n=c.field(d, "n", c.integer, p),
            at=c.field(d, "at", c.opt_number, p),
            kind=c.field(d, "kind", c.or_default(c.text, ""), p),
            job_id=c.field(d, "job_id", c.opt_text, p),
            message=c.field(d, "message", c.or_default(c.text, ""), p),
        )


class EventsRecord(NamedTuple):
    events: tuple[GossipedEvent, ...]

    def encode(self) -> bytes:
        return c.pack({"v": WIRE_VERSION, "e": [e.to_wire() for e in self.events]})

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> EventsRecord:
        return cls(events=c.items(doc.get("e"), "e", GossipedEvent.from_wire))


# -- jobs ----------------------------------------------------------------------------------------


class AttemptEntry(NamedTuple):
    """Where one attempt of a job ran and, once it ended, how."""

    attempt: int
    node: str | None
    started_at: float | None
    finished_at: float | None = None
    cause: str | None = None
    """``None`` while it runs; then ``exit``, ``timeout``, ``lost`` or a stop cause."""
    exit_code: int | None = None
    rank: int | None = None
    """A gang's member: its rank (one entry per member of the attempt); ``None`` for one node."""

    def to_wire(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "attempt": self.attempt,
            "node": self.node,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "cause": self.cause,
            "exit_code": self.exit_code,
        }
        if self.rank is not None:
            doc["rank"] = self.rank
        return doc

    @classmethod
    def from_wire(cls, value: Any, name: str = "attempt") -> AttemptEntry:
        d = c.obj(value, name)
        p = name + "."
        return cls(
            attempt=c.field(d, "attempt", c.integer, p),
            node=c.field(d, "node", c.opt_text, p),
            started_at=c.field(d, "started_at", c.opt_number, p),
            finished_at=c.field(d, "finished_at", c.opt_number, p),
            cause=c.field(d, "cause", c.opt_text, p),
            exit_code=c.field(d, "exit_code", c.opt_integer, p),
            rank=c.field(d, "rank", c.opt_integer, p),
        )


class GangMember(NamedTuple):
    """One member of a gang's attempt: rank ``rank`` runs on ``node`` with ``devices``."""

    rank: int
    node: str
    devices: tuple[str, ...]

    def to_wire(self) -> dict[str, Any]:
        return {"rank": self.rank, "node": self.node, "devices": list(self.devices)}

    @classmethod
    def from_wire(cls, value: Any, name: str = "member") -> GangMember:
        d = c.obj(value, name)
        p = name + "."
        return cls(
            rank=c.field(d, "rank", c.integer, p),
            node=c.field(d, "node", c.text, p),
            devices=c.field(d, "devices", c.texts, p),
        )


def members_from_wire(value: Any, name: str = "members") -> tuple[GangMember, ...]:
    """A gang's members, ranks ``0..n-1`` in order on distinct nodes (absent: none)."""
    members = c.items(value, name, GangMember.from_wire)
    if [m.rank for m in members] != list(range(len(members))):
        raise WireError(f"{name}: ranks must run 0..{len(members) - 1} in order")
    if len({m.node for m in members}) != len(members):
        raise WireError(f"{name}: a node appears twice")
    return members


def members_to_wire(doc: dict[str, Any], members: Sequence[GangMember]) -> dict[str, Any]:
    """``doc`` with ``members`` added when there are any (a one-node job's stays as it was)."""
    if members:
        doc["members"] = [m.to_wire() for m in members]
    return doc


class JobStatus(NamedTuple):
    """A job as its owner sees it (``job/<id>``), and the record part of a handover."""

    job_id: str
    state: str
    """A ``agent.job.jobstate.JobState`` value (a newer state is kept as it is)."""
    attempt: int = 0
    owner: str | None = None
    runner: str | None = None
    devices: tuple[str, ...] = ()
    submitted_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    reason: str | None = None
    gen: int = 0
    """Orders the versions of the record across successive owners (highest wins)."""
    attempts: tuple[AttemptEntry, ...] = ()
    """Where each attempt ran and how it ended (the last 20)."""
    members: tuple[GangMember, ...] = ()
    """A gang's current (or last) attempt: every member, rank 0 first (``runner`` and
    ``devices`` are rank 0's); empty for a one-node job, and then left out of the wire."""
    deadline_missed_s: float | None = None
    """How late the job was when its owner said it missed its deadline; ``None``: not missed
    (or not yet said)."""

    def to_wire(self) -> dict[str, Any]:
        return members_to_wire(self._fields_to_wire(), self.members)

    def _fields_to_wire(self) -> dict[str, Any]:
        return {
            "v": WIRE_VERSION,
            "job_id": self.job_id,
            "state": self.state,
            "attempt": self.attempt,
            "owner": self.owner,
            "runner": self.runner,
            "devices": list(self.devices),
            "submitted_at": self.submitted_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "reason": self.reason,
            "gen": self.gen,
            "attempts": [a.to_wire() for a in self.attempts],
            "deadline_missed_s": self.deadline_missed_s,
        }

    def encode(self) -> bytes:
        return c.pack(self.to_wire())

    @classmethod
    def from_wire(cls, value: Any, name: str = "record") -> JobStatus:
        d = c.obj(value, name)
        p = name + "."
        return cls(
            job_id=c.field(d, "job_id", c.text, p),
            state=c.field(d, "state", c.text, p),
            attempt=c.field(d, "attempt", c.or_default(c.integer, 0), p),
            owner=c.field(d, "owner", c.opt_text, p),
            runner=c.field(d, "runner", c.opt_text, p),
            devices=c.field(d, "devices", c.texts, p),
            submitted_at=c.field(d, "submitted_at", c.opt_number, p),
            started_at=c.field(d, "started_at", c.opt_number, p),
            finished_at=c.field(d, "finished_at", c.opt_number, p),
            exit_code=c.field(d, "exit_code", c.opt_integer, p),
            signal=c.field(d, "signal", c.opt_text, p),
            reason=c.field(d, "reason", c.opt_text, p),
            gen=c.field(d, "gen", c.or_default(c.integer, 0), p),
            attempts=c.items(d.get("attempts"), p + "attempts", AttemptEntry.from_wire),
            members=members_from_wire(d.get("members"), p + "members"),
            deadline_missed_s=c.field(d, "deadline_missed_s", c.opt_number, p),
        )
