"""A runner's word on a start against its team's quota: the no-master bound.

Owners decide from their own views; two that decide at once may each start a job of one team
that fits under the team's maximum alone and overshoot it together. The runner an offer lands
on checks again, as it sees the mesh (:mod:`agent.job.teamquota`): the GPUs the team holds are
the running jobs of the gossiped job records on other nodes plus this node's own runs, which it
counts exactly (an offer admitted here is counted before the next is checked: the last check
and the run's entry happen with no await between them; the desk is asked before the runner's
device checks, never between them and the run's entry). A start that would take the team past
a maximum is declined with the policy's line, and the owner places the job again later.

The same count decides a reclaim: an offer may stop preemptible jobs of equal or higher priority
only when the offered job's team stays within its guarantee and every victim's team holds more
than its own (:func:`agent.job.teamquota.reclaim_allows`). The runner never takes an owner's word
for either.

Runners that count alone still overshoot together: two offers landing on different runners at
once each fit by their runner's view, one gossip delay old. So each team with a maximum has a
**quota desk**: the live agent that ranks first for the team's name (the rendezvous hash that
picks a job's owner, :func:`agent.job.ownership.rank`, here over ``team:<name>``). Before it
starts a job of such a team, the runner asks the desk (``quota_claim``, the signed submission
inside: the desk reads the team and GPUs itself). The desk answers one claim at a time, counting
the team's running jobs as its view says plus every grant it made that its view does not yet
count (running, with its submission: the desk's own run may come before its submission does),
for :data:`GRANT_KEPT_S` at most or until the job's record says it ended, and grants only what
stays under the maximum. A desk that does not answer declines the start (the
owner tries again; membership moves the desk to the next agent when it is gone). A grant whose
start does not happen after all holds the team's room until the job claims again, its record
says it ended, or :data:`GRANT_KEPT_S` pass: a delay for the team, never an overshoot.

What this bounds: while the live agents agree on who the desk is, starts never pass a maximum,
whatever the owners' and runners' views. When the desk changes (an agent joins or dies), the new
desk has made no grants: starts granted by the old one within the last gossip delay may be
counted by neither, and the team may overshoot by those, until their records arrive (about a
second on a healthy mesh). A gang is cleared once, for all its members' GPUs, by its rank 0's
runner at ``gang_prepare`` (``agent.running.gangdesk``); the other members' runners do not count
it themselves.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from agent.job import teamquota as quotas
from agent.job.ownership import rank
from agent.mesh.peers import PeerError, decoded_answer
from agent.running.runs import Declined
from agent.wire.policy import PolicyBody
from agent.wire.quotacalls import QuotaClaim, QuotaGrant
from probers.catalog import device_model
from probers.records import DeviceStatic

if TYPE_CHECKING:
    from agent.job.authority import Submission
    from agent.mesh.context import AgentContext
    from agent.running.runs import LocalRun

GRANT_KEPT_S = 30.0
"""How long a desk counts a grant whose job its view does not show running (then it counts the
record, or, for an attempt that never started, nothing)."""
CLAIM_TIMEOUT_S = 3.0
"""How long a runner waits for the desk's answer before it declines the start."""
_ENDED = frozenset({"succeeded", "failed", "cancelled", "lost"})


def _model(statics: Sequence[DeviceStatic], keys: Collection[str]) -> str:
    for s in statics:
        if s.key in keys:
            return device_model(s.name, s.backend)
    return "cpu"


def _gpus(sub: Submission, keys: Collection[str]) -> float:
    """The GPUs a start takes: the offered devices, a share as one, a gang all its members'."""
    r = sub.spec.resources
    if r.share_mem_bytes is not None or r.share_fraction is not None:
        return 1.0
    if r.nodes > 1:
        return quotas.submission_gpus(sub)
    return float(len(keys))


class TeamDesk:
    """The runner's team checks (see the module doc); ``policy``: the team policy held now."""

    def __init__(
        self,
        ctx: AgentContext,
        statics: Callable[[], Sequence[DeviceStatic]],
        runs: Mapping[str, LocalRun],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``runs``: what this node runs (the runner's own, live); ``statics``: its devices."""
        self.ctx = ctx
        self.node_id = ctx.node_id
        self.view = ctx.view
        self._policy = ctx.policy
        self._statics = statics
        self._runs = runs
        self._clock = clock
        self.grants: dict[str, tuple[str, float, str, float]] = {}
        """As a desk: job id -> (team, GPUs, model, when granted), see the module doc."""
        self.counts: Counter[str] = Counter()
        """``refused`` (starts declined here for a maximum), ``granted`` and ``denied`` (as a
        desk), ``unanswered`` (a desk that did not answer)."""

    def _who(self, body: PolicyBody) -> dict[str, quotas.Who]:
        return {j: quotas.who_signed(body, s.operator_id) for j, s in self.view.submissions.items()}

    def _held(
        self, body: PolicyBody, runs: Mapping[str, LocalRun], but: Collection[str]
    ) -> tuple[dict[tuple[str, str | None], float], dict[str, quotas.Who]]:
        held, who, _counted = self._held_counted(body, runs, but)
        return held, who

    def _held_counted(
        self, body: PolicyBody, runs: Mapping[str, LocalRun], but: Collection[str]
    ) -> tuple[dict[tuple[str, str | None], float], dict[str, quotas.Who], set[str]]:
        """GPUs held by team, who signed each job, and the jobs counted: those whose team is
        known (a run here whose submission has not come by gossip yet is not counted)."""
        who = self._who(body)
        rows: list[tuple[str, float, str]] = []
        for job_id, doc in self.view.jobs.items():
            runner = doc.get("runner")
            if job_id in but or doc.get("state") != "running" or runner == self.node_id:
                continue  # this node's own runs are counted from what it runs
            sub = self.view.submissions.get(job_id)
            devices = doc.get("devices")
            keys = tuple(str(k) for k in devices) if isinstance(devices, list | tuple) else ()
            node = self.view.nodes.get(str(runner))
            if sub is None:
                continue
            statics = node.statics if node is not None else ()
            rows.append((job_id, quotas.submission_gpus(sub), _model(statics, keys)))
        mine = self._statics()
        for job_id, run in runs.items():
            if job_id in but:
                continue
            gpus = 1.0 if run.share_bytes else float(len(run.devices))
            rows.append((job_id, gpus, _model(mine, run.devices)))
        counted = {job_id for job_id, _g, _m in rows if who.get(job_id, ("", ""))[0]}
        return quotas.held_by_team(rows, who), who, counted

    def reclaim(
        self,
        sub: Submission,
        keys: Sequence[str],
        victims: Sequence[str],
        runs: Mapping[str, LocalRun],
    ) -> bool:
        """Whether the offer of ``sub`` on ``keys`` may stop ``victims`` (run here) as a
        reclaim, whatever their priority."""
        body = self._policy()
        if body is None or not victims:
            return False
        held, who = self._held(body, runs, (sub.job_id,))
        team = who.get(sub.job_id) or quotas.who_signed(body, sub.operator_id)
        named = {
            v: (who.get(v, ("", ""))[0], float(len(runs[v].devices)) or 1.0)
            for v in victims
            if v in runs
        }
        return quotas.reclaim_allows(body, team[0], _gpus(sub, keys), named, held) is None

    def owed(self, sub: Submission, keys: Sequence[str], runs: Mapping[str, LocalRun]) -> bool:
        """Whether the start of ``sub`` on ``keys`` is owed its team's guarantee, as this node
        counts: the team has one and stays within it. Only such a start may move other jobs off
        the node (``agent.running.preemption``)."""
        body = self._policy()
        if body is None:
            return False
        held, who = self._held(body, runs, (sub.job_id,))
        team = who.get(sub.job_id) or quotas.who_signed(body, sub.operator_id)
        return quotas.owed_allows(body, team[0], _gpus(sub, keys), held) is None

    def over_max(
        self,
        sub: Submission,
        keys: Sequence[str],
        runs: Mapping[str, LocalRun],
        stopping: Collection[str] = (),
    ) -> str | None:
        """Why the start of ``sub`` on ``keys`` would take its team past a maximum, as this
        runner sees the mesh (``stopping``: victims stopped for it, no longer counted);
        ``None``: it would not."""
        body = self._policy()
        if body is None:
            return None
        team = quotas.who_signed(body, sub.operator_id)[0]
        if not team:
            return None
        held, _ = self._held(body, runs, (sub.job_id, *stopping))
        why = quotas.over_max(body, team, _gpus(sub, keys), _model(self._statics(), keys), held)
        if why is not None:
            self.counts["refused"] += 1
        return why

    # -- the desk --------------------------------------------------------------------------------

    def desk_of(self, team: str) -> str | None:
        """The agent that keeps ``team``'s count now: the live agent ranking first for it."""
        live = self.ctx.mesh.live_agents()
        return rank(f"team:{team}", live)[0] if live else None

    async def claim(self, sub: Submission, attempt: int, keys: Sequence[str]) -> None:
        """Ask the team's desk for room for this start (``Declined`` when it gives none or does
        not answer); nothing to ask for a job whose team has no maximum."""
        body = self._policy()
        team = quotas.who_signed(body, sub.operator_id)[0]
        if body is None or not team or not _has_max(body, team):
            return
        ask = QuotaClaim(
            sub.job_id, attempt, _gpus(sub, keys), _model(self._statics(), keys), sub.sealed
        )
        desk = self.desk_of(team)
        if desk is None or desk == self.node_id:
            answer = self.grant(ask, self.node_id)
        else:
            addr = self.ctx.mesh.addr_of(desk)
            try:
                if addr is None:
                    raise PeerError(f"{desk[:8]} has no address here yet")
                raw = await self.ctx.peers.call(
                    addr, "quota_claim", ask.to_wire(), timeout_s=CLAIM_TIMEOUT_S
                )
                answer = decoded_answer(QuotaGrant.from_wire, raw)
            except PeerError as exc:
                self.counts["unanswered"] += 1
                why = f"team {team}'s quota desk {desk[:8]} did not answer: {exc}"
                raise Declined(why) from None
        if not answer.granted:
            self.counts["refused"] += 1
            raise Declined(answer.reason)

    def grant(self, ask: QuotaClaim, caller: str) -> QuotaGrant:
        """As the desk: room for ``ask`` under its team's maximum, counted with every grant
        made here that the view does not show running yet (synchronous: one at a time)."""
        sub = self.ctx.authority.submission(ask.submission, ask.job_id)
        body = self._policy()
        team = quotas.who_signed(body, sub.operator_id)[0]
        if body is None or not team:
            return QuotaGrant(True)
        now = self._clock()
        held, _, counted = self._held_counted(body, self._runs, (ask.job_id,))
        for job_id, (gteam, gpus, model, at) in list(self.grants.items()):
            doc = self.view.jobs.get(job_id)
            state = doc.get("state") if doc is not None else None
            if now - at > GRANT_KEPT_S or state in _ENDED:
                del self.grants[job_id]
                continue
            if job_id == ask.job_id or job_id in counted:
                continue  # counted from its record, or as this node's own run
            for key in ((gteam, None), (gteam, model)):
                held[key] = held.get(key, 0.0) + gpus
        why = quotas.over_max(body, team, ask.gpus, ask.model, held)
        if why is not None:
            self.counts["denied"] += 1
            return QuotaGrant(
                False, why.replace("this agent", f"the quota desk {self.node_id[:8]}")
            )
        self.grants[ask.job_id] = (team, ask.gpus, ask.model, now)
        self.counts["granted"] += 1
        return QuotaGrant(True)


def _has_max(body: PolicyBody, team: str) -> bool:
    return any(t == team for t, _g, _m, _model in quotas.quota_rows(body))
