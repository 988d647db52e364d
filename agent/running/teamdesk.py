"""A runner's word on a start against its team's quota: the no-master bound.

Owners decide from their own views; two that decide at once may each start a job of one team
that fits under the team's maximum alone and overshoot it together. The runner an offer lands
on checks again, as it sees the mesh (:mod:`agent.people.quotas`): the GPUs the team holds are
the running jobs of the gossiped job records on other nodes plus this node's own runs, which it
counts exactly (an offer admitted here is counted before the next is checked: the check and the
run's entry happen with no await between them). A start that would take the team past a maximum
is declined with the policy's line, and the owner places the job again later.

The same count decides a reclaim: an offer may stop preemptible jobs of equal or higher priority
only when the offered job's team stays within its guarantee and every victim's team holds more
than its own (:func:`agent.people.quotas.reclaim_allows`). The runner never takes an owner's word
for either.

What this bounds: two offers that land on one runner never overshoot together. Offers that land on
different runners at once can, until each sees the other's start in gossip (one record
round-trip): the overshoot is at most the jobs started on other runners within that window, and
the next decision pass of every owner sees it and starts nothing more for that team until it
falls back under.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from agent.people import quotas
from agent.wire.policy import PolicyBody
from probers.catalog import device_model
from probers.records import DeviceStatic

if TYPE_CHECKING:
    from agent.job.authority import Submission
    from agent.mesh.view import ClusterView
    from agent.running.runs import LocalRun


def _model(statics: Sequence[DeviceStatic], keys: Collection[str]) -> str:
    for s in statics:
        if s.key in keys:
            return device_model(s.name, s.backend)
    return "cpu"


def _gpus(sub: Submission, keys: Collection[str]) -> float:
    r = sub.spec.resources
    if r.share_mem_bytes is not None or r.share_fraction is not None:
        return 1.0
    return float(len(keys))


class TeamDesk:
    """The runner's team checks (see the module doc); ``policy``: the team policy held now."""

    def __init__(
        self,
        node_id: str,
        view: ClusterView,
        policy: Callable[[], PolicyBody | None],
        statics: Callable[[], Sequence[DeviceStatic]],
    ) -> None:
        self.node_id = node_id
        self.view = view
        self._policy = policy
        self._statics = statics
        self.refused = 0
        """Offers declined for a team's maximum (``shoal_quota_refused_total``)."""

    def _who(self, body: PolicyBody) -> dict[str, quotas.Who]:
        return {j: quotas.who_signed(body, s.operator_id) for j, s in self.view.submissions.items()}

    def _held(
        self, body: PolicyBody, runs: Mapping[str, LocalRun], but: Collection[str]
    ) -> tuple[dict[tuple[str, str | None], float], dict[str, quotas.Who]]:
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
        return quotas.held_by_team(rows, who), who

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
            self.refused += 1
        return why
