"""A runner's word on a preempting offer: it believes nothing of it that it cannot check.

An owner whose job finds no free room may offer it to a node together with running jobs to stop
first (``StartOffer.victims``, chosen by the policy: :mod:`agent.policy.preempt`). The runner
re-checks every victim against what it runs itself and against the victim's own
operator-signed submission (kept with the run when it started it), and the offered job against
the offer's own signed submission. Each victim must:

- run here (an attempt this runner started and still runs), and not be claimed already by
  another preempting offer (two offers racing for one victim: the second is refused);
- be preemptible, and of a lower priority than the offered job (equal never: time slicing runs
  in the simulator only), unless the runner finds the offer a team's reclaim by its own count
  (``agent.running.teamdesk``: the job's team within its guarantee, each victim's team above its
  own);
- have run at least ``min_run_s`` (``AgentConfig.preempt_min_run_s``) since its attempt started;
- hold at least one of the offered devices;

and every offered device that is not free must be held by a named victim. Anything else refuses
the whole offer with one line, and nothing is stopped. An accepted offer claims its victims and
its devices before the first await, stops the victims with cause ``preempt`` (their checkpoint
signal and the grace period, so each saves its checkpoint), then starts the job. Each victim's
report names the job it was stopped for, so its owner requeues it saying so; its checkpoint
travels with it (``agent.checkpoints.ckptstore``) and its next attempt resumes from it.

An offer may also name elastic jobs to shrink (``StartOffer.shrink``: :mod:`agent.policy.shrink`),
checked on the same path: each must run here, unclaimed, be elastic (its own signed submission
gives a range of GPUs), hold more than its fewest, have run ``min_run_s``, and hold one of the
offered devices, of which the offer may take no more than it holds beyond its fewest. No priority
is needed: a shrunk job is stopped with cause ``shrink`` (its checkpoint signal and grace) and
its owner restarts it from its checkpoint with fewer GPUs.

An offer may also name jobs to move off the node (``StartOffer.moves``: a team's guarantee plan,
:mod:`agent.policy.guarantee`), checked on the same path: each must run here, unclaimed, have run
``min_run_s`` and hold one of the offered devices, and be movable (one node, whole GPUs, not an
inference service, not elastic: ``LocalRun.movable``, from its own signed submission), and the
offered job must be owed its team's guarantee by the runner's own count
(``agent.running.teamdesk``: the team has one and stays within it with this start). No priority
is needed and a moved job need not be preemptible, but then it must have saved a checkpoint
here (its folder changed: a move loses only the work since). It is stopped with cause
``migrate`` (its checkpoint signal and grace) and its owner places it again, elsewhere, from its
checkpoint.

What a lying owner can make a runner do through an offer: stop preemptible jobs of a lower
priority than the job it offers, that have run their minimum time, and that hold the devices it
offers; restart elastic jobs that have run their minimum time above their fewest GPUs; for a job
its team is owed, restart elsewhere movable jobs that have run their minimum time (if not
preemptible, that have saved a checkpoint); each stopped job is requeued by its own owner with
its checkpoint. Nothing else.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import NamedTuple, Protocol


class RunFacts(Protocol):
    """What the runner knows of a job it runs (``agent.running.runs.LocalRun``)."""

    @property
    def attempt(self) -> int: ...
    @property
    def devices(self) -> tuple[str, ...]: ...
    @property
    def priority(self) -> int: ...
    @property
    def preemptible(self) -> bool: ...
    @property
    def started_at(self) -> float | None: ...
    @property
    def gpus_min(self) -> int | None: ...
    @property
    def movable(self) -> bool: ...


class Refused(Exception):
    """A preempting offer the runner will not carry out; the message is one line."""


class Ask(NamedTuple):
    """What a preempting offer asks: start ``job_id`` (its submission's ``priority``) on
    ``devices`` once ``victims`` are stopped, ``shrink`` (elastic jobs) are shrunk and
    ``moves`` are moved off."""

    job_id: str
    priority: int
    devices: tuple[str, ...]
    victims: tuple[str, ...]
    shrink: tuple[str, ...] = ()
    reclaim: bool = False
    """The runner found the offer a reclaim by its own count (``agent.running.teamdesk``): the
    job's team is within its guarantee and every victim's team holds more than its own, so the
    victims may be of any priority."""
    moves: tuple[str, ...] = ()
    owed: bool = False
    """The runner found the job owed its team's guarantee by its own count
    (``agent.running.teamdesk``): only then may ``moves`` be moved off."""

    def cause_of(self, victim: str) -> str:
        """The stop cause of one of its victims: ``shrink``, ``migrate`` or ``preempt``."""
        if victim in self.shrink:
            return "shrink"
        return "migrate" if victim in self.moves else "preempt"


def _common(
    v: str, run: RunFacts | None, claimed: Collection[str], now: float, min_run_s: float
) -> RunFacts:
    """What every victim must be: run here, unclaimed, started ``min_run_s`` ago."""
    if run is None:
        raise Refused(f"victim {v} does not run here")
    if v in claimed:
        raise Refused(f"victim {v} is being preempted already")
    if run.started_at is None:
        raise Refused(f"victim {v} has not started yet")
    ran_s = now - run.started_at
    if ran_s < min_run_s:
        raise Refused(f"victim {v} has run {ran_s:.0f} s, less than the minimum {min_run_s:g} s")
    return run


def _check_shrink(v: str, run: RunFacts, wanted: set[str]) -> None:
    """An elastic job above its fewest GPUs, asked for no more than it holds beyond them."""
    if run.gpus_min is None:
        raise Refused(f"victim {v} is not elastic: it cannot be shrunk")
    spare = len(run.devices) - run.gpus_min
    if spare <= 0:
        raise Refused(f"victim {v} runs on its fewest GPUs ({run.gpus_min}) already")
    taken = len(wanted & set(run.devices))
    if taken > spare:
        raise Refused(f"the offer takes {taken} of {v}'s GPUs; a shrink frees {spare}")


def _check_move(v: str, run: RunFacts, owed: bool, saved: Collection[str]) -> None:
    """A movable job, moved for a job owed its team's guarantee; one that is not preemptible
    only once it has saved a checkpoint (it would otherwise start over)."""
    if not owed:
        raise Refused(f"victim {v} may be moved only for a job its team's guarantee is owed")
    if not run.movable:
        raise Refused(f"victim {v} cannot move (a gang, a share, inference or elastic)")
    if not run.preemptible and v not in saved:
        raise Refused(f"victim {v} is not preemptible and has saved no checkpoint to move with")


def arbitrate(
    ask: Ask,
    runs: Mapping[str, RunFacts],
    free: Collection[str],
    claimed: Collection[str],
    now: float,
    min_run_s: float,
    saved: Collection[str] = (),
) -> tuple[str, ...]:
    """The victims to stop for ``ask``, checked against the runs held here (``runs``, the
    devices ``free``, the victims ``claimed`` by other offers, the jobs that ``saved`` a
    checkpoint here); raises :class:`Refused` with the first reason it may not."""
    job_id, priority, devices = ask.job_id, ask.priority, ask.devices
    named = tuple(dict.fromkeys((*ask.victims, *ask.shrink, *ask.moves)))
    if job_id in named:
        raise Refused(f"job {job_id} cannot preempt itself")
    wanted = set(devices)
    for v in named:
        run = _common(v, runs.get(v), claimed, now, min_run_s)
        if v in ask.shrink:
            _check_shrink(v, run, wanted)
        elif v in ask.moves:
            _check_move(v, run, ask.owed, saved)
        elif not run.preemptible:
            raise Refused(f"victim {v} is not preemptible")
        elif run.priority >= priority and not ask.reclaim:
            raise Refused(f"victim {v} has priority {run.priority}, not lower than {priority}")
        if not wanted & set(run.devices):
            raise Refused(f"victim {v} holds none of the offered devices")
    held = {k for v in named for k in runs[v].devices}
    for key in devices:
        if key not in free and key not in held:
            raise Refused(f"device {key} is in use")
    return named


Stop = Callable[[str, int, str], Awaitable[object]]
"""Stops a job's attempt here with a cause (``preempt``, ``shrink``, ``migrate``) and waits until
it is gone."""

Note = Callable[[str, str, str], None]
"""Writes one event about a job (job id, kind, message)."""


class Preemptions:
    """The runner's preemptions: claims, the stops, who stopped whom, and counts."""

    def __init__(self, min_run_s: float, clock: Callable[[], float] = time.time) -> None:
        self.min_run_s = min_run_s
        self._clock = clock
        self.claimed: dict[str, tuple[int, str]] = {}
        """Victim -> (its attempt, the job it is stopped for), until its end is reported."""
        self.counts: Counter[str] = Counter()
        """``preempted`` (victims stopped), ``shrunk`` (elastic victims), ``moved`` (moved off
        for a team's guarantee) and ``refused`` (offers refused), for
        ``shoal_preemptions_total``."""

    def claim(
        self,
        ask: Ask,
        runs: Mapping[str, RunFacts],
        free: Collection[str],
        saved: Collection[str] = (),
    ) -> tuple[str, ...]:
        """Check the offer (:func:`arbitrate`) and claim its victims, synchronously."""
        try:
            named = arbitrate(ask, runs, free, self.claimed, self._clock(), self.min_run_s, saved)
        except Refused:
            self.counts["refused"] += 1
            raise
        for v in named:
            self.claimed[v] = (runs[v].attempt, ask.job_id)
        return named

    def release(self, victims: Sequence[str]) -> None:
        """Give up the claims of an offer that was declined after all (nothing was stopped)."""
        for v in victims:
            self.claimed.pop(v, None)

    async def stop(
        self, ask: Ask, victims: Sequence[str], runs: Mapping[str, RunFacts], stop: Stop, note: Note
    ) -> None:
        """Stop the claimed ``victims`` (at once, each with its checkpoint signal and grace)."""
        for v in victims:
            run = runs[v]
            if v in ask.shrink:
                note(v, "shrunk", f"for {ask.job_id}, attempt {run.attempt}")
                self.counts["shrunk"] += 1
                continue
            if v in ask.moves:
                why = f"for {ask.job_id} (its team's guarantee), attempt {run.attempt}"
                note(v, "moved", f"off this node {why}")
                self.counts["moved"] += 1
                continue
            note(
                v,
                "preempted",
                f"preempted by {ask.job_id} (priority {ask.priority} over {run.priority}), "
                f"attempt {run.attempt}",
            )
            self.counts["preempted"] += 1
        await asyncio.gather(*(stop(v, runs[v].attempt, ask.cause_of(v)) for v in victims))

    def stopped_for(self, job_id: str, attempt: int) -> str | None:
        """The job an attempt that just ended was preempted for (the claim is then released)."""
        held = self.claimed.get(job_id)
        if held is None or held[0] != attempt:
            return None
        del self.claimed[job_id]
        return held[1]
