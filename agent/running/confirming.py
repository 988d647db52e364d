"""A start needs two members' word: the owner's offer, and the job's other owner's confirmation.

A job's owner window is two agents (``agent.job.authority``: the owner, and the replica that takes
over when it is gone), and the owner writes each attempt to the replica *before* it offers it
(``agent.owning.placing``, ``agent.owning.gang``: the write-ahead). So a runner that is offered an
attempt can ask the other agent of the window whether its copy of the job places that attempt on
this runner, and start it only if it does (``confirm_start``; a runner that is itself the other
owner reads its own copy; an agent that owns the job answers from the job it holds, never from
a copy stored since). One member's word (a stolen key in the window, an owner whose view is
wrong) then starts nothing the other has not been told of: no second start while attempt 1 runs,
no attempt on several runners, no victims preempted for it. When the window holds one live agent
only (a mesh of one), there is nobody else to ask.

The one asked also remembers the attempt it confirmed for each job, and where: when it confirms
a newer attempt (or the same one placed on other runners), it fences the older copies at once (a
``stop`` to each of their runners with cause ``fenced``), and so it does to every other node whose
own gossiped record lists the job running (an older copy it never confirmed, or forgot: a stop
names the attempt before the one confirmed, so it ends only older ones). Even an owner that lies
to its own replica has at most one attempt running at a time, the older stopped as the newer
starts.

:class:`Confirmations` is the sans-I/O core (the copy and the memory in, a verdict out);
:class:`Confirmer` asks and answers over the agents' calls. Counted in
``shoal_start_confirmations_total``: as the runner, ``confirmed``, ``refused`` (the other owner
said no) and ``unanswered``; as the other owner, ``given``, ``denied`` and ``fenced`` (older
copies it had stopped).
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from agent.job.authority import Authority
from agent.job.jobstate import JobState
from agent.mesh.peers import PeerClient, PeerError, decoded_answer
from agent.mesh.view import ClusterView
from agent.storage.store import JobRecord, Store
from agent.wire.calls import (
    OwnerDetail,
    StartConfirm,
    StartConfirmed,
    StopAnswer,
    StopRequest,
)
from agent.wire.codec import WireError
from agent.wire.records import GangMember

log = logging.getLogger("shoal.runner")

CONFIRM_TIMEOUT_S = 3.0
"""How long a runner waits for the other owner's answer before it declines the offer."""
CONFIRMED_KEPT = 10_000
"""Jobs whose last confirmed attempt the other owner remembers (the most recent)."""
FENCE_TIMEOUT_S = 60.0
"""How long the other owner waits for an older copy's runner to say it stopped it (the stop
itself is under way once the call has arrived)."""


class NotConfirmed(Exception):
    """The job's other owner does not confirm the attempt (the message says why)."""


class Unconfirmed(Exception):
    """The job's other owner could not be asked, or did not answer (an agent that predates
    ``confirm_start`` answers 404: the offer is declined, and an older runner may take it)."""


@dataclass(frozen=True, slots=True)
class Placed:
    """What a copy of a job says of its current attempt."""

    owner: str
    attempt: int
    state: JobState
    nodes: frozenset[str]
    """Its runner, or every member of a gang's attempt."""

    @classmethod
    def at(
        cls,
        owner: str,
        attempt: int,
        state: JobState,
        runner: str | None,
        members: Iterable[GangMember] = (),
    ) -> Placed:
        nodes = frozenset(m.node for m in members)
        if not nodes and runner is not None:
            nodes = frozenset({runner})
        return cls(owner, attempt, state, nodes)

    @classmethod
    def of(cls, rec: JobRecord) -> Placed:
        """What a stored copy says (as an owner or a replica keeps it)."""
        try:
            members = OwnerDetail.from_wire(rec.detail).members
        except WireError:
            members = ()
        return cls.at(rec.owner, rec.attempt, rec.state, rec.runner, members)


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether the attempt is confirmed (``reason``: why not, one line), and the older copies
    to fence now: (runner, attempt) each."""

    confirmed: bool
    reason: str = ""
    fence: tuple[tuple[str, int], ...] = ()


class Confirmations:
    """The other owner's side (sans-I/O): each job's last confirmed attempt and its runners."""

    def __init__(self, kept: int = CONFIRMED_KEPT) -> None:
        self._kept = kept
        self._given: OrderedDict[str, tuple[int, frozenset[str]]] = OrderedDict()

    def decide(
        self,
        job_id: str,
        attempt: int,
        owner: str,
        runner: str,
        copy: Placed | None,
        listed: Iterable[str] = (),
    ) -> Verdict:
        """May ``runner`` start attempt ``attempt`` of the job that ``owner`` offered it, as
        this agent's ``copy`` of the job says? ``listed``: the nodes whose own records say the
        job runs there (their older copies are fenced too, whatever this agent remembers)."""
        if copy is None:
            return Verdict(False, "it holds no copy of the job")
        if copy.owner != owner:
            return Verdict(False, f"its copy names {copy.owner[:8]} as the owner")
        if copy.attempt != attempt:
            return Verdict(False, f"its copy is at attempt {copy.attempt}")
        if copy.state != JobState.PLACING:
            return Verdict(False, f"its copy has attempt {attempt} {copy.state.value}")
        if runner not in copy.nodes:
            where = ", ".join(sorted(n[:8] for n in copy.nodes)) or "no node"
            return Verdict(False, f"its copy places attempt {attempt} on {where}")
        given, nodes = self._given.get(job_id, (0, frozenset()))
        if given > attempt:
            return Verdict(False, f"attempt {given} was confirmed already")
        # Older attempts, or this one where the copy no longer places it, are fenced; a runner
        # fences its own older attempt itself as it admits the newer.
        stale = nodes - copy.nodes if given == attempt else nodes
        kept = nodes & copy.nodes if given == attempt else frozenset()
        self._given[job_id] = (attempt, kept | {runner})
        self._given.move_to_end(job_id)
        while len(self._given) > self._kept:
            self._given.popitem(last=False)
        fence = {n: attempt - 1 for n in listed} if attempt > 1 else {}
        for n in stale:
            fence[n] = max(fence.get(n, 0), given)
        fence.pop(runner, None)
        return Verdict(True, fence=tuple(sorted(fence.items())))

    def forget(self, job_ids: Iterable[str]) -> None:
        for job_id in job_ids:
            self._given.pop(job_id, None)

    def __len__(self) -> int:
        return len(self._given)


class ConfirmingRunner(Protocol):
    """What the confirmer uses of its runner (:class:`agent.running.runner.Runner`)."""

    node_id: str
    store: Store
    authority: Authority
    peers: PeerClient
    view: ClusterView

    def spawn(self, coro: Any) -> None: ...


class Confirmer:
    """Asks (as the runner offered an attempt) and answers (as the job's other owner)."""

    def __init__(
        self,
        runner: ConfirmingRunner,
        addr_of: Callable[[str], str | None],
        live: Callable[[], list[str]],
    ) -> None:
        self._r = runner
        self._addr_of = addr_of
        self._live = live
        self.given = Confirmations()
        self.owned: Callable[[str], Placed | None] = lambda job_id: None
        """The job as this agent's owner holds it now, when it owns it (set by the agent): what
        it answers from then, whatever a copy stored here since says."""
        self.counts: Counter[str] = Counter()
        """``shoal_start_confirmations_total`` by outcome (see the module doc)."""

    async def ask(self, job_id: str, attempt: int, owner: str) -> None:
        """Return once the job's other owner confirms that ``owner`` placed this attempt on
        this runner; ``NotConfirmed`` when it says no, ``Unconfirmed`` when it cannot say."""
        r = self._r
        other = r.authority.other_owner(job_id, owner)
        if other is None:
            return  # the owner is the only live agent: there is no other owner to ask
        if other == r.node_id:
            answer = self.answer(StartConfirm(job_id, attempt, owner), r.node_id)
        else:
            addr = self._addr_of(other)
            if addr is None:
                self.counts["unanswered"] += 1
                raise Unconfirmed(f"the job's other owner {other[:8]} has no address here yet")
            body = StartConfirm(job_id, attempt, owner).to_wire()
            try:
                answer = decoded_answer(
                    StartConfirmed.from_wire,
                    await r.peers.call(addr, "confirm_start", body, timeout_s=CONFIRM_TIMEOUT_S),
                )
            except PeerError as exc:  # no answer, or a refusal to answer (an older agent: 404)
                self.counts["unanswered"] += 1
                raise Unconfirmed(
                    f"the job's other owner {other[:8]} did not answer: {exc}"
                ) from None
        if not answer.confirmed:
            self.counts["refused"] += 1
            raise NotConfirmed(
                f"attempt {attempt} of job {job_id} from {owner[:8]} is not confirmed by the"
                f" job's other owner {other[:8]}: {answer.reason}"
            )
        self.counts["confirmed"] += 1

    def answer(self, req: StartConfirm, caller: str) -> StartConfirmed:
        """As the job's other owner: does this agent's copy place the attempt on ``caller``?"""
        copy = self.owned(req.job_id)
        if copy is None:
            rec = self._r.store.get_job(req.job_id)
            copy = Placed.of(rec) if rec is not None else None
        listed = [
            node
            for node, seen in self._r.view.nodes.items()
            if seen.status is not None and req.job_id in seen.status.running
        ]
        verdict = self.given.decide(req.job_id, req.attempt, req.owner, caller, copy, listed)
        if not verdict.confirmed:
            self.counts["denied"] += 1
            log.info(  # the runner that asked says so at WARNING, and counts the refusal
                "job %s: attempt %d on %s from %s not confirmed: %s",
                req.job_id[:8],
                req.attempt,
                caller[:8],
                req.owner[:8],
                verdict.reason,
            )
            return StartConfirmed(False, verdict.reason)
        self.counts["given"] += 1
        for node, attempt in verdict.fence:
            self._r.spawn(self._fence(req.job_id, node, attempt))
        return StartConfirmed(True)

    async def _fence(self, job_id: str, node: str, attempt: int) -> None:
        """Stop (and fence) an older attempt on ``node``: a newer one was confirmed."""
        addr = self._addr_of(node)
        if addr is None or node not in self._live():
            return  # gone: nothing of it runs on
        stop = StopRequest(job_id, attempt, "fenced").to_wire()
        try:
            answer = decoded_answer(
                StopAnswer.from_wire,
                await self._r.peers.call(addr, "stop", stop, timeout_s=FENCE_TIMEOUT_S),
            )
        except PeerError as exc:
            log.info("job %s: fencing attempt %d on %s: %s", job_id[:8], attempt, node[:8], exc)
            return
        if answer.stopped:
            self.counts["fenced"] += 1
            log.warning(
                "job %s: attempt %d on %s fenced: a newer attempt was confirmed",
                job_id[:8],
                attempt,
                node[:8],
            )
