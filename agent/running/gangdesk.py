"""The runner's side of a gang's two-phase start: ``gang_prepare``, ``gang_commit``, ``gang_abort``.

- ``gang_prepare`` is admitted as a ``start`` is (the caller may own the job and carries the
  operator's submission; the node takes work; the attempt is not fenced; the job's other owner
  confirms that the caller placed it on this node, ``agent.running.confirming``; this node's
  member's devices are here and free, or, when the prepare lets it and they are taken, others of the
  same models its placement chooses, named in the answer), then holds those devices for ``ttl_s``
  (:class:`agent.running.reservations.Reservations`; at most :data:`agent.wire.calls.MAX_HOLD_S`, 30
  s: a longer hold is refused, 400, as a body that does not decode). Rank 0's runner also picks
  where the members meet: its own advertised host and a TCP port free on it now.
- ``gang_commit`` starts the held member (``Runner.launch``) with the gang's variables
  (:meth:`agent.execution.pinning.GangRank.one_per_node`); a hold that ran out or was aborted is
  declined.
- ``gang_abort`` frees the hold and fences the attempt (a late prepare or commit of it is
  declined), as a ``stop`` does for a running attempt.

Only the agent that prepared the hold, or one that may own the job, may commit or abort it.
What one agent may hold here uncommitted is bounded by what its holds cost
(:class:`agent.running.reservations.HoldBudget`): past it, its prepares are declined (409) and
counted (``shoal_gang_holds_total{outcome="refused"}``).
A member that started is an ordinary run of this node from then on: stopped, fenced, reported
and reconciled as any other.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

from agent.execution.pinning import GangRank
from agent.job.jobspec import check_job_id
from agent.running.reservations import Hold, HoldRefused
from agent.running.runner import Runner
from agent.running.runs import Declined, NotAllowed
from agent.wire.calls import (
    GangAbort,
    GangAborted,
    GangCommit,
    GangPrepare,
    GangPrepared,
    StartAnswer,
    hold_problem,
)


def free_port(host: str) -> int:
    """A TCP port nothing listens on at ``host`` now (the system's pick)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def host_of(addr: str) -> str:
    """The host of a ``host:port`` address (brackets of an IPv6 literal taken off)."""
    host = addr.rpartition(":")[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def node_devices(r: Runner, now: float) -> int:
    """How many devices this node has: free, held for gangs, or running jobs."""
    return len(set(r.free_devices()) | r.holds.devices(now) | set(r.held()))


class GangDesk:
    """Holds and starts this node's members of gangs (see the module doc)."""

    def __init__(self, runner: Runner, clock: Callable[[], float] = time.monotonic) -> None:
        self.runner = runner
        self.node_id = runner.node_id
        self._clock = clock
        self._timer: asyncio.TimerHandle | None = None

    @property
    def holds(self) -> int:
        return len(self.runner.holds)

    async def prepare(self, req: GangPrepare, caller: str) -> GangPrepared:
        r = self.runner
        job_id = check_job_id(req.job_id)
        if (problem := hold_problem(req.ttl_s)) is not None:
            raise ValueError(problem)  # as the wire refuses it (400)
        spec = r.authorised_spec(job_id, req.owner, caller, req.submission, "prepare")
        if spec.resources.nodes != len(req.members):
            raise Declined(
                f"the job spans {spec.resources.nodes} nodes, the attempt names"
                f" {len(req.members)} members"
            )
        member = next((m for m in req.members if m.node == self.node_id), None)
        if member is None:
            raise Declined(f"{self.node_id[:8]} is not a member of attempt {req.attempt}")
        if len(member.devices) != spec.resources.gpus_per_node:
            raise Declined(
                f"the member has {len(member.devices)} devices, the job needs"
                f" {spec.resources.gpus_per_node} per node"
            )
        if member.rank == 0:  # the whole gang's GPUs, cleared with its team's desk once,
            sub = r.authority.submission(req.submission, job_id)  # before admit's device checks
            await r.teams.claim(sub, req.attempt, member.devices)
        admitted = await r.admit(
            job_id, req.attempt, req.owner, spec, member.devices, may_rebind=req.rebind
        )
        if admitted.keys:  # late binding: others of the same models, as the runner chose
            member = member._replace(devices=admitted.keys)
        master_addr = master_port = None
        if member.rank == 0:
            addr = r.ctx.mesh.addr_of(self.node_id)
            if addr is None:
                raise Declined("this agent does not know its own address yet")
            master_addr = host_of(addr)
            try:
                master_port = await asyncio.to_thread(free_port, master_addr)
            except OSError as exc:
                raise Declined(f"no free port for the gang to meet at: {exc}") from None
        now = self._clock()
        hold = Hold(
            job_id=job_id,
            attempt=req.attempt,
            owner=caller,
            member=member,
            world_size=len(req.members),
            submission=req.submission,
            expires_at=now + req.ttl_s,
            master_addr=master_addr,
            master_port=master_port,
        )
        try:
            r.holds.hold(hold, now, node_devices(r, now))
        except HoldRefused as exc:
            raise Declined(str(exc)) from None
        r.events.add(
            "held",
            f"attempt {req.attempt} rank {member.rank} for {req.ttl_s:g} s",
            job_id=job_id,
        )
        self._arm()
        r.ctx.changed()
        return GangPrepared(True, master_addr, master_port, admitted.keys)

    async def commit(self, req: GangCommit, caller: str) -> StartAnswer:
        r = self.runner
        job_id = check_job_id(req.job_id)
        held = r.holds.get(job_id, req.attempt, self._clock())
        if held is None:
            raise Declined(f"attempt {req.attempt} holds nothing here (ran out or aborted)")
        spec = r.authorised_spec(job_id, held.owner, caller, held.submission, "commit")
        if req.attempt <= r.fence.get(job_id):
            raise Declined(f"attempt {req.attempt} is fenced here")
        now = self._clock()
        r.holds.take(job_id, req.attempt, now, node_devices(r, now))
        gang = GangRank.one_per_node(
            held.member.rank, held.world_size, req.master_addr, req.master_port
        )
        try:
            return await r.launch(job_id, req.attempt, held.owner, spec, held.devices, gang=gang)
        finally:
            r.ctx.changed()

    def abort(self, req: GangAbort, caller: str) -> GangAborted:
        r = self.runner
        job_id = check_job_id(req.job_id)
        held = r.holds.holder(job_id)
        prepared_it = held is not None and held.owner == caller
        if not prepared_it and not r.authority.may_own(job_id, caller):
            raise NotAllowed(f"{caller[:8]} may not abort job {job_id}")
        r.fence.raise_to(job_id, req.attempt)
        now = self._clock()
        freed = r.holds.release(job_id, req.attempt, now, node_devices(r, now))
        if freed is not None:
            r.events.add("released", f"attempt {freed.attempt} aborted", job_id=job_id)
            r.ctx.changed()
        return GangAborted(freed is not None)

    def owner_gone(self, node: str) -> None:
        """``node`` died or left: the holds it prepared here are freed now, not when they run
        out (a dead owner commits nothing; its successor places the gang afresh)."""
        r = self.runner
        gone = r.holds.release_owner(node)
        for h in gone:
            r.events.add(
                "released", f"attempt {h.attempt}: its owner {node[:8]} is gone", job_id=h.job_id
            )
        if gone:
            r.ctx.changed()
            self._arm()

    # -- running out -----------------------------------------------------------------------------

    def _arm(self) -> None:
        """Wake when the next hold runs out, so the node's free devices say so at once."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        at = self.runner.holds.next_expiry()
        if at is None:
            return
        delay = max(0.0, at - self._clock())
        self._timer = asyncio.get_running_loop().call_later(delay + 0.01, self._expire)

    def _expire(self) -> None:
        self._timer = None
        r = self.runner
        gone = r.holds.expire(self._clock())
        for h in gone:
            r.events.add("released", f"attempt {h.attempt} held too long", job_id=h.job_id)
        if gone:
            r.ctx.changed()
        self._arm()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
