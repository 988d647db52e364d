"""An owner's offer to start a job, as a runner (:class:`agent.running.runner.Runner`) answers
it: the operator's submission it carries verified for the caller that says it owns the job, the
team's quota counted and claimed (``agent.running.teamdesk``), then admitted and launched. What
this uses of the runner is named in :class:`OfferedRunner`, so it never imports
``agent.running.runner``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from agent.job.authority import FeaturesLacking, SubmissionRefused
from agent.job.jobspec import check_job_id, lacking_reason
from agent.running.runs import Admitted, Declined, NotAllowed

if TYPE_CHECKING:
    from agent.execution.pinning import GangRank
    from agent.job.authority import Authority
    from agent.job.jobspec import JobSpec
    from agent.running.preemption import Preemptions
    from agent.running.runs import LocalRun
    from agent.running.teamdesk import TeamDesk
    from agent.wire.calls import ResumeFrom, StartAnswer, StartOffer


class OfferedRunner(Protocol):
    """What an offer uses of the runner: the authority, the team desk, the runs here and the
    preemptions, and its admit and launch."""

    authority: Authority
    teams: TeamDesk
    runs: dict[str, LocalRun]
    preemptions: Preemptions

    def authorised_spec(
        self, job_id: str, owner: str, caller: str, submission: bytes, verb: str
    ) -> JobSpec: ...

    async def admit(
        self,
        job_id: str,
        attempt: int,
        owner: str,
        spec: JobSpec,
        keys: tuple[str, ...],
        victims: tuple[str, ...] = (),
        shrink: tuple[str, ...] = (),
        may_rebind: bool = False,
        reclaim: bool = False,
        moves: tuple[str, ...] = (),
        owed: bool = False,
    ) -> Admitted: ...

    async def launch(
        self,
        job_id: str,
        attempt: int,
        owner: str,
        spec: JobSpec,
        keys: tuple[str, ...],
        resume: ResumeFrom | None = None,
        gang: GangRank | None = None,
        admitted: Admitted = ...,
    ) -> StartAnswer: ...


async def start(r: OfferedRunner, offer: StartOffer, caller: str) -> StartAnswer:
    """An offer from ``caller``: run the operator's submission it carries, if the caller may
    act as the job's owner here (``NotAllowed`` otherwise, ``Declined`` when it cannot run
    here, or the job needs a feature this agent lacks; ``LaunchFailed`` when its process
    could not start)."""
    job_id = check_job_id(offer.job_id)
    attempt = offer.attempt
    owner = offer.owner
    spec = r.authorised_spec(job_id, owner, caller, offer.submission, "start")
    if spec.is_gang:
        raise Declined("a gang starts through gang_prepare and gang_commit, not start")
    sub = r.authority.submission(offer.submission, job_id)
    # The team's quota: this node's count (no grant asked in vain), then the team's desk,
    # before admit, whose device checks and the run's entry in launch have no await between
    # them; the count again after it (agent.running.teamdesk).
    over = r.teams.over_max(sub, offer.devices, r.runs, offer.victims)
    if over is not None:
        raise Declined(over)
    await r.teams.claim(sub, attempt, offer.devices)
    reclaim = r.teams.reclaim(sub, offer.devices, offer.victims, r.runs)
    owed = bool(offer.moves) and r.teams.owed(sub, offer.devices, r.runs)
    admitted = await r.admit(
        job_id,
        attempt,
        owner,
        spec,
        offer.devices,
        offer.victims,
        offer.shrink,
        offer.rebind,
        reclaim,
        offer.moves,
        owed,
    )
    keys = admitted.keys or offer.devices
    over = r.teams.over_max(sub, keys, r.runs, admitted.victims)
    if over is not None:
        r.preemptions.release(admitted.victims)
        raise Declined(over)
    answer = await r.launch(job_id, attempt, owner, spec, keys, offer.resume, admitted=admitted)
    return answer._replace(devices=admitted.keys)


def authorised_spec(
    authority: Authority, job_id: str, owner: str, caller: str, submission: bytes, verb: str
) -> JobSpec:
    """The spec of the operator's ``submission`` for ``job_id``, when ``caller`` says it is
    the job's owner and may be (``NotAllowed`` otherwise, or for a submission that is not an
    operator's; ``Declined`` when the job needs a feature this agent does not run)."""
    if owner != caller or not authority.may_own(job_id, caller):
        raise NotAllowed(f"{caller[:8]} may not {verb} job {job_id}")
    try:
        spec = authority.submission(submission, job_id).spec
    except FeaturesLacking as exc:
        raise Declined(str(exc)) from None
    except SubmissionRefused as exc:
        raise NotAllowed(str(exc)) from None
    if spec.lacking:
        raise Declined(lacking_reason(spec.lacking))
    return spec
