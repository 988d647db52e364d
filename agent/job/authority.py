"""Who may cause what on a job: the authority model of the job protocol.

A certificate alone grants no authority. Every action an agent takes on a job traces back to an
operator's signature:

- **A job exists only through its submission**: the sealed ``submit`` command an operator signed
  (:mod:`gossip.envelope`). Its owner keeps those very bytes, copies them to the replica, hands
  them on with the job and shows them with every offer. A runner starts a job only from a
  submission it verified itself (an operator's valid signature, an operator certificate that is
  admitted and unrevoked now, this job id), and runs the spec *inside* it, never a spec an agent
  wrote. The gossiped ``sub/<id>`` record carries the same bytes, so no member can list a job
  that no operator submitted.
- **Only an owner acts for a job**: the agents first and second in the job's rendezvous order
  over the live agents of the verifier's own view (:data:`OWNER_WINDOW`: the owner, and the
  replica that takes over when the owner is gone, which a verifier may learn of a moment after
  the replica does). An agent the verifier has not heard of yet is ranked as if it were live; one
  it knows dead or gone is not. A start, a stop, a replica copy or a handover from anyone else is
  refused, and a ``job/<id>`` record published by anyone else is not believed. A runner also
  obeys the agent that started the attempt it runs (a stop from it stays valid while ownership
  moves).
- **Commands** (cancel, migrate, drain...) are operator-signed envelopes checked by the agent
  that executes them, fresh and unique (``envelope.open``).

What a member (an agent's certificate and key) can still do is bounded by this: act as owner for
the jobs whose rendezvous order puts it first or second, about 2/N of them, using only what their
operators signed; report on the jobs it runs; lie about its own state (its records are signed by
it and attributed to it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from agent.common.parsing import json_loads
from agent.job.jobspec import JobSpec, UnknownFeatures, check_job_id
from agent.job.ownership import rank
from gossip import envelope
from gossip.certtrust import CertTrust
from gossip.identity import PERSON_ROLES

OWNER_WINDOW = 2
"""How many agents at the head of a job's rendezvous order may act as its owner."""

SUBMIT_KIND = "submit"


class SubmissionRefused(Exception):
    """A submission that grants no authority; the message says why in one line."""


class FeaturesLacking(SubmissionRefused):
    """An operator's valid submission of a job that uses job-spec features this agent does not
    know: it cannot tell what the job means, so it neither runs nor owns it (the message names
    the spec version the job needs)."""


@dataclass(frozen=True, slots=True)
class Submission:
    """A verified submission: the operator's sealed bytes and what they say."""

    sealed: bytes
    job_id: str
    spec: JobSpec
    operator_id: str
    issued_at: float


def read_submission(sealed: bytes, trust: CertTrust, now: float) -> Submission:
    """Verify ``sealed`` as an operator's submit command and decode it.

    Raises :class:`SubmissionRefused` for a bad signature, a signer that is not an admitted,
    unrevoked operator at ``now``, another kind of command, or a body that is not a job.
    """
    try:
        command = envelope.authenticate(sealed, trust, now)
    except envelope.EnvelopeError as exc:
        raise SubmissionRefused(f"submission refused ({exc.reason}): {exc}") from None
    if command.kind != SUBMIT_KIND:
        raise SubmissionRefused(f"a {command.kind!r} command is not a submission")
    try:
        body = json_loads(command.body)
        if not isinstance(body, dict):
            raise ValueError("the body is not a JSON object")
        job_id = check_job_id(body["job_id"])
        spec = JobSpec.from_dict(body["spec"])
    except UnknownFeatures as exc:
        raise FeaturesLacking(str(exc)) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise SubmissionRefused(f"submission body refused: {exc}") from None
    return Submission(sealed, job_id, spec, command.operator_id, command.issued_at)


def may_own(job_id: str, node: str, live_agents: Iterable[str]) -> bool:
    """True when ``node`` is one of ``live_agents`` and among the first :data:`OWNER_WINDOW` of
    them in the job's rendezvous order."""
    ranked = rank(job_id, live_agents)
    return node in ranked[:OWNER_WINDOW]


class Authority:
    """The checks above against this agent's trust and its current view of live agents."""

    def __init__(
        self,
        node_id: str,
        trust: CertTrust,
        live_agents: Callable[[], list[str]],
        live_for_s: Callable[[str], float],
        wall_clock: Callable[[], float],
        heard_of: Callable[[str], bool] = lambda node: True,
    ) -> None:
        """``live_agents``: the agents alive or suspect in this agent's view (itself included);
        ``live_for_s``: how long a member has been alive here (0 when it is not); ``heard_of``:
        whether membership knows the node at all (in any state)."""
        self.node_id = node_id
        self._trust = trust
        self._live = live_agents
        self.live_for_s = live_for_s
        self._heard_of = heard_of
        self._wall_clock = wall_clock
        self._verified: dict[str, Submission] = {}
        """Submissions verified since the start, by job id (a runner sees one again at every
        offer; the signature is checked once, the operator's standing at every use)."""

    def forget(self, job_ids: list[str]) -> None:
        """Drop retired jobs' verified submissions (``agent.mesh.retiring``)."""
        for job_id in job_ids:
            self._verified.pop(job_id, None)

    def submission(self, sealed: bytes, job_id: str | None = None) -> Submission:
        """The verified submission in ``sealed`` (of ``job_id``, when given)."""
        held = self._verified.get(job_id) if job_id is not None else None
        if (
            held is not None
            and held.sealed == sealed
            and self._trust.role_of(held.operator_id) in PERSON_ROLES  # not revoked or expired
        ):
            return held
        sub = read_submission(sealed, self._trust, self._wall_clock())
        if job_id is not None and sub.job_id != job_id:
            raise SubmissionRefused(f"the submission is of job {sub.job_id}, not {job_id}")
        if len(self._verified) >= 10_000:
            self._verified.pop(next(iter(self._verified)))
        self._verified[sub.job_id] = sub
        return sub

    def submitter(self, job_id: str) -> str | None:
        """Who signed the submission of ``job_id`` verified here (``None``: none is held)."""
        held = self._verified.get(job_id)
        return None if held is None else held.operator_id

    def live_agents(self) -> list[str]:
        return self._live()

    def is_agent(self, node: str) -> bool:
        """Is ``node`` this agent, or an agent whose certificate is admitted, unexpired and not
        revoked (not an operator, not unknown)?"""
        return node == self.node_id or self._trust.role_of(node) == "agent"

    def may_own(self, job_id: str, node: str) -> bool:
        """May ``node`` act as the owner of ``job_id``, as this agent sees the mesh?"""
        if not self.is_agent(node):
            return False  # an operator, an unknown, expired or revoked certificate
        return may_own(job_id, node, self._judged(node))

    def other_owner(self, job_id: str, node: str) -> str | None:
        """The agent beside ``node`` in the job's owner window, as :meth:`may_own` judges it
        (``None``: ``node`` is the only live agent, so the job has no other owner here)."""
        window = rank(job_id, self._judged(node))[:OWNER_WINDOW]
        return next((n for n in window if n != node), None)

    def _judged(self, node: str) -> list[str]:
        """The live agents ``node``'s authority is judged among."""
        live = self._live()
        if node not in live and not self._heard_of(node):
            # An agent gossip has not told of yet (a mesh forming) is judged as if it were live:
            # the same window, so no more authority than any member has.
            live = [*live, node]
        return live
