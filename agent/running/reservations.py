"""What a runner holds for gangs: time-limited reservations of its devices (sans-I/O).

A gang starts in two phases (``agent.owning.gang`` on the owner, ``agent.running.gangdesk`` on each
runner): ``gang_prepare`` holds one member's devices here for a while (``ttl_s``), ``gang_commit``
starts the member on them, ``gang_abort`` frees them. While a hold lasts, its devices count as busy
for every other offer and in the free devices this node gossips; when it runs out uncommitted, they
are free again, so an owner that vanished between the phases strands nothing (and when gossip
declares it dead or gone, its holds are freed at once: ``GangDesk.owner_gone``).

One hold per job: a prepare of a newer attempt of the job replaces the older hold; one of an
older (or the same) attempt is refused. Time is passed in (``now``, a monotonic clock).

What one agent may hold is bounded by what its holds cost (:class:`HoldBudget`): a hold is
paid for up front, its devices (at least one) times its ``ttl_s``, from a bucket per agent
that prepared it, and paid back for the time it did not use when it is committed (the gang
starts) or aborted. An agent that never commits holds every device of the node for a minute
at most, then a tenth of them on average; its prepares past that are refused and counted.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

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


@dataclass(slots=True)
class _Bucket:
    level_s: float
    """Device-seconds this agent may still hold uncommitted."""
    at: float
    """When ``level_s`` was last brought up to date."""


@dataclass(slots=True)
class HoldBudget:
    """Device-seconds each agent may hold here without committing (see the module doc). The
    node's device count is passed in with each call (at least one counts: a hold of no device
    still costs one)."""

    burst_s: float = 60.0
    """Seconds of all the node's devices an agent may hold at once: two holds' worth at 30 s."""
    share: float = 0.1
    """Of the node's devices, the part an agent may go on holding uncommitted on average."""
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    def _level(self, agent: str, devices: int, now: float) -> tuple[_Bucket, float]:
        capacity_s = self.burst_s * max(1, devices)
        b = self._buckets.get(agent)
        if b is None:
            b = self._buckets[agent] = _Bucket(capacity_s, now)
        refill_s = max(0.0, now - b.at) * self.share * max(1, devices)
        b.level_s, b.at = min(capacity_s, b.level_s + refill_s), now
        return b, capacity_s

    def charge(self, hold: Hold, devices: int, now: float) -> None:
        """Pay for ``hold`` up front; ``HoldRefused`` when its agent cannot."""
        cost_s = cost_of(hold, now)
        b, _ = self._level(hold.owner, devices, now)
        if cost_s > b.level_s:
            raise HoldRefused(
                f"{hold.owner[:8]} has held devices here uncommitted for as long as it may for"
                f" now ({b.level_s:.0f} of the {cost_s:.0f} device-seconds asked left)"
            )
        b.level_s -= cost_s

    def refund(self, hold: Hold, devices: int, now: float) -> None:
        """Pay back the time ``hold`` will not use (committed or aborted now)."""
        b, capacity_s = self._level(hold.owner, devices, now)
        b.level_s = min(capacity_s, b.level_s + cost_of(hold, now))
        if b.level_s >= capacity_s:
            del self._buckets[hold.owner]  # full: nothing to remember

    def forget(self, agent: str) -> None:
        """``agent`` died or left."""
        self._buckets.pop(agent, None)

    def __len__(self) -> int:
        return len(self._buckets)


def cost_of(hold: Hold, now: float) -> float:
    """Device-seconds of ``hold`` from ``now`` to its end."""
    return max(1, len(hold.devices)) * max(0.0, hold.expires_at - now)


class Reservations:
    """Holds by job (see the module doc)."""

    def __init__(self) -> None:
        self._holds: dict[str, Hold] = {}
        self.budget = HoldBudget()
        """What each agent may still hold here uncommitted."""
        self.counts: Counter[str] = Counter()
        """Holds by outcome: ``held``, ``committed``, ``aborted``, ``expired``, ``refused``
        (over its agent's budget)."""

    def __len__(self) -> int:
        return len(self._holds)

    def hold(self, new: Hold, now: float, devices: int = 1) -> Hold | None:
        """Hold ``new``'s devices; the older hold of the same job it replaces, if any (paid
        for in full all the same). ``HoldRefused`` when that job holds the same or a newer
        attempt, another job holds one of the devices, or the agent that prepared it cannot
        pay for it (``devices``: the node's, for :class:`HoldBudget`; counted ``refused``)."""
        self.expire(now)
        held = self._holds.get(new.job_id)
        if held is not None and held.attempt >= new.attempt:
            raise HoldRefused(f"attempt {held.attempt} of the job is held here already")
        taken = self.devices(now, but=new.job_id)
        clash = [k for k in new.devices if k in taken]
        if clash:
            raise HoldRefused(f"device {clash[0]} is held for another gang")
        try:
            self.budget.charge(new, devices, now)
        except HoldRefused:
            self.counts["refused"] += 1
            raise
        self._holds[new.job_id] = new
        self.counts["held"] += 1
        return held

    def get(self, job_id: str, attempt: int, now: float) -> Hold | None:
        """The live hold of exactly that attempt."""
        held = self._holds.get(job_id)
        if held is None or held.attempt != attempt or held.expires_at <= now:
            return None
        return held

    def job_ids(self) -> list[str]:
        """The jobs holding devices here (about to start on them)."""
        return list(self._holds)

    def holder(self, job_id: str) -> Hold | None:
        """The job's hold, live or run out (who prepared it: for the abort's authority)."""
        return self._holds.get(job_id)

    def take(self, job_id: str, attempt: int, now: float, devices: int = 1) -> Hold | None:
        """Remove and return the live hold of that attempt (it is being committed: the time
        it did not use is paid back)."""
        held = self.get(job_id, attempt, now)
        if held is not None:
            del self._holds[job_id]
            self.budget.refund(held, devices, now)
            self.counts["committed"] += 1
        return held

    def release(
        self, job_id: str, up_to_attempt: int, now: float | None = None, devices: int = 1
    ) -> Hold | None:
        """Free the job's hold if its attempt is ``up_to_attempt`` or older; the freed hold.
        Given ``now`` (an abort), the time it did not use is paid back."""
        held = self._holds.get(job_id)
        if held is None or held.attempt > up_to_attempt:
            return None
        del self._holds[job_id]
        self.counts["aborted"] += 1
        if now is not None:
            self.budget.refund(held, devices, now)
        return held

    def release_owner(self, owner: str) -> list[Hold]:
        """Free every hold ``owner`` prepared (it died or left: it will commit none of them)."""
        gone = [h for h in self._holds.values() if h.owner == owner]
        for h in gone:
            del self._holds[h.job_id]
        self.budget.forget(owner)
        if gone:
            self.counts["aborted"] += len(gone)
        return gone

    def expire(self, now: float) -> list[Hold]:
        """Drop the holds that ran out; those dropped."""
        gone = [h for h in self._holds.values() if h.expires_at <= now]
        for h in gone:
            del self._holds[h.job_id]
        if gone:
            self.counts["expired"] += len(gone)
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
