"""A runner's word on a preempting offer: it believes nothing of it that it cannot check.

An owner whose job finds no free room may offer it to a node together with running jobs to stop
first (``StartOffer.victims``, chosen by the policy: :mod:`agent.policy.preempt`). The runner
re-checks every victim against what it runs itself and against the victim's own
operator-signed submission (kept with the run when it started it), and the offered job against
the offer's own signed submission. Each victim must:

- run here (an attempt this runner started and still runs), and not be claimed already by
  another preempting offer (two offers racing for one victim: the second is refused);
- be preemptible, and of a lower priority than the offered job (equal never: time slicing runs
  in the simulator only);
- have run at least ``min_run_s`` (``AgentConfig.preempt_min_run_s``) since its attempt started;
- hold at least one of the offered devices;

and every offered device that is not free must be held by a named victim. Anything else refuses
the whole offer with one line, and nothing is stopped. An accepted offer claims its victims and
its devices before the first await, stops the victims with cause ``preempt`` (their checkpoint
signal and the grace period, so each saves its checkpoint), then starts the job. Each victim's
report names the job it was stopped for, so its owner requeues it saying so; its checkpoint
travels with it (``agent.ckptmove``) and its next attempt resumes from it.

What a lying owner can make a runner do through an offer: stop preemptible jobs of a lower
priority than the job it offers, that have run their minimum time, and that hold the devices it
offers; each stopped job is requeued by its own owner with its checkpoint. Nothing else.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import NamedTuple, Protocol


class RunFacts(Protocol):
    """What the runner knows of a job it runs (``agent.runner.LocalRun``)."""

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


class Refused(Exception):
    """A preempting offer the runner will not carry out; the message is one line."""


class Ask(NamedTuple):
    """What a preempting offer asks: start ``job_id`` (its submission's ``priority``) on
    ``devices`` once ``victims`` are stopped."""

    job_id: str
    priority: int
    devices: tuple[str, ...]
    victims: tuple[str, ...]


def arbitrate(
    ask: Ask,
    runs: Mapping[str, RunFacts],
    free: Collection[str],
    claimed: Collection[str],
    now: float,
    min_run_s: float,
) -> tuple[str, ...]:
    """The victims to stop for ``ask``, checked against the runs held here (``runs``, the
    devices ``free``, the victims ``claimed`` by other offers); raises :class:`Refused` with the
    first reason it may not."""
    job_id, priority, devices = ask.job_id, ask.priority, ask.devices
    named = tuple(dict.fromkeys(ask.victims))
    if job_id in named:
        raise Refused(f"job {job_id} cannot preempt itself")
    wanted = set(devices)
    for v in named:
        run = runs.get(v)
        if run is None:
            raise Refused(f"victim {v} does not run here")
        if v in claimed:
            raise Refused(f"victim {v} is being preempted already")
        if not run.preemptible:
            raise Refused(f"victim {v} is not preemptible")
        if run.priority >= priority:
            raise Refused(f"victim {v} has priority {run.priority}, not lower than {priority}")
        if run.started_at is None:
            raise Refused(f"victim {v} has not started yet")
        ran_s = now - run.started_at
        if ran_s < min_run_s:
            raise Refused(
                f"victim {v} has run {ran_s:.0f} s, less than the minimum {min_run_s:g} s"
            )
        if not wanted & set(run.devices):
            raise Refused(f"victim {v} holds none of the offered devices")
    held = {k for v in named for k in runs[v].devices}
    for key in devices:
        if key not in free and key not in held:
            raise Refused(f"device {key} is in use")
    return named


Stop = Callable[[str, int], Awaitable[object]]
"""Stops a job's attempt here with cause ``preempt`` and waits until it is gone."""

Note = Callable[[str, str], None]
"""Writes one event about a job (job id, message)."""


class Preemptions:
    """The runner's preemptions: claims, the stops, who stopped whom, and counts."""

    def __init__(self, min_run_s: float, clock: Callable[[], float] = time.time) -> None:
        self.min_run_s = min_run_s
        self._clock = clock
        self.claimed: dict[str, tuple[int, str]] = {}
        """Victim -> (its attempt, the job it is stopped for), until its end is reported."""
        self.counts: Counter[str] = Counter()
        """``preempted`` (victims stopped) and ``refused`` (offers refused), for
        ``shoal_preemptions_total``."""

    def claim(
        self, ask: Ask, runs: Mapping[str, RunFacts], free: Collection[str]
    ) -> tuple[str, ...]:
        """Check the offer (:func:`arbitrate`) and claim its victims, synchronously."""
        try:
            named = arbitrate(ask, runs, free, self.claimed, self._clock(), self.min_run_s)
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
            note(
                v,
                f"preempted by {ask.job_id} (priority {ask.priority} over {run.priority}), "
                f"attempt {run.attempt}",
            )
            self.counts["preempted"] += 1
        await asyncio.gather(*(stop(v, runs[v].attempt) for v in victims))

    def stopped_for(self, job_id: str, attempt: int) -> str | None:
        """The job an attempt that just ended was preempted for (the claim is then released)."""
        held = self.claimed.get(job_id)
        if held is None or held[0] != attempt:
            return None
        del self.claimed[job_id]
        return held[1]
