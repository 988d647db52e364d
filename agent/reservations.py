"""What a runner holds for gangs: time-limited reservations of its devices (sans-I/O).

A gang starts in two phases (``agent.gang`` on the owner, ``agent.gangdesk`` on each runner):
``gang_prepare`` holds one member's devices here for a while (``ttl_s``), ``gang_commit`` starts
the member on them, ``gang_abort`` frees them. While a hold lasts, its devices count as busy for
every other offer and in the free devices this node gossips; when it runs out uncommitted, they
are free again, so an owner that vanished between the phases strands nothing (and when gossip
declares it dead or gone, its holds are freed at once: ``GangDesk.owner_gone``).

One hold per job: a prepare of a newer attempt of the job replaces the older hold; one of an
older (or the same) attempt is refused. Time is passed in (``now``, a monotonic clock).
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.wire.records import GangMember


@dataclass(frozen=True, slots=True)
class Hold:
    """The devices attempt ``attempt`` of gang job ``job_id`` holds here, until ``expires_at``."""

    job_id: str
    attempt: int
    owner: str
    """The agent that prepared it (the only one, with the job's owners, that may commit)."""
    member: GangMember
    """This node's member: its rank and devices."""
    world_size: int
    submission: bytes
    """The operator's sealed submission the prepare carried (the commit runs its spec)."""
    expires_at: float
    master_addr: str | None = None
    master_port: int | None = None
    """Rank 0's: where the members meet (``MASTER_ADDR``/``MASTER_PORT``)."""

    @property
    def devices(self) -> tuple[str, ...]:
        return self.member.devices


class HoldRefused(Exception):
    """A hold that cannot be made (an attempt already held, devices held by another job)."""


class Reservations:
    """Holds by job (see the module doc)."""

    def __init__(self) -> None:
        self._holds: dict[str, Hold] = {}

    def __len__(self) -> int:
        return len(self._holds)

    def hold(self, new: Hold, now: float) -> Hold | None:
        """Hold ``new``'s devices; the older hold of the same job it replaces, if any.
        ``HoldRefused`` when that job holds the same or a newer attempt, or another job
        holds one of the devices."""
        self.expire(now)
        held = self._holds.get(new.job_id)
        if held is not None and held.attempt >= new.attempt:
            raise HoldRefused(f"attempt {held.attempt} of the job is held here already")
        taken = self.devices(now, but=new.job_id)
        clash = [k for k in new.devices if k in taken]
        if clash:
            raise HoldRefused(f"device {clash[0]} is held for another gang")
        self._holds[new.job_id] = new
        return held

    def get(self, job_id: str, attempt: int, now: float) -> Hold | None:
        """The live hold of exactly that attempt."""
        held = self._holds.get(job_id)
        if held is None or held.attempt != attempt or held.expires_at <= now:
            return None
        return held

    def holder(self, job_id: str) -> Hold | None:
        """The job's hold, live or run out (who prepared it: for the abort's authority)."""
        return self._holds.get(job_id)

    def take(self, job_id: str, attempt: int, now: float) -> Hold | None:
        """Remove and return the live hold of that attempt (it is being committed)."""
        held = self.get(job_id, attempt, now)
        if held is not None:
            del self._holds[job_id]
        return held

    def release(self, job_id: str, up_to_attempt: int) -> Hold | None:
        """Free the job's hold if its attempt is ``up_to_attempt`` or older; the freed hold."""
        held = self._holds.get(job_id)
        if held is None or held.attempt > up_to_attempt:
            return None
        del self._holds[job_id]
        return held

    def release_owner(self, owner: str) -> list[Hold]:
        """Free every hold ``owner`` prepared (it died or left: it will commit none of them)."""
        gone = [h for h in self._holds.values() if h.owner == owner]
        for h in gone:
            del self._holds[h.job_id]
        return gone

    def expire(self, now: float) -> list[Hold]:
        """Drop the holds that ran out; those dropped."""
        gone = [h for h in self._holds.values() if h.expires_at <= now]
        for h in gone:
            del self._holds[h.job_id]
        return gone

    def devices(self, now: float, *, but: str | None = None) -> set[str]:
        """Device keys held now (by every job but ``but``)."""
        return {
            k
            for h in self._holds.values()
            if h.expires_at > now and h.job_id != but
            for k in h.devices
        }

    def next_expiry(self) -> float | None:
        return min((h.expires_at for h in self._holds.values()), default=None)
