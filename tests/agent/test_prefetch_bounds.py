"""A node's pre-fetches within their bounds, driven without agents: refused while a starting job
fetches, at most a few jobs and a share of the store's budget at once, paused while a starting job
fetches and resumed after, a cancelled one ending only the stages no one else needs."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from agent.content.cache import CacheRules
from agent.job.jobspec import JobSpec
from agent.running.datastage import JobData, Version
from agent.running.prefetch import MAX_PREFETCHES, Prefetches
from agent.wire.calls import PrefetchAsk

A, B, C = "a" * 64, "b" * 64, "c" * 64


@dataclass
class Held:
    total_bytes: int
    held_bytes: int = 0

    @property
    def complete(self) -> bool:
        return self.held_bytes >= self.total_bytes


@dataclass
class Store:
    held_by: dict[str, Held] = field(default_factory=dict)
    rules: CacheRules = field(default_factory=lambda: CacheRules(1000))

    def held(self, digest: str) -> Held | None:
        return self.held_by.get(digest)

    def all_held(self) -> tuple[Any, ...]:
        return ()


class Mesh:
    def live_agents(self) -> list[str]:
        return []


@dataclass
class Stager:
    mesh: Mesh = field(default_factory=Mesh)
    running: set[str] = field(default_factory=set)
    started: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)

    def start(self, name: str, digest: str | None, source: str | None, *, again: bool) -> None:
        assert digest is not None and again
        self.started.append(digest)
        self.running.add(digest)

    def state(self, key: str) -> Any:
        return State("staging" if key in self.running else "done")

    async def cancel(self, key: str) -> None:
        self.running.discard(key)
        self.cancelled.append(key)


@dataclass
class State:
    state: str


class View:
    nodes: dict[str, Any] = {}


class Runner:
    def __init__(self) -> None:
        self.specs: dict[str, JobSpec] = {}

    def authorised_spec(
        self, job_id: str, owner: str, caller: str, submission: bytes, verb: str
    ) -> JobSpec:
        return self.specs[job_id]


def setup() -> tuple[Prefetches, JobData, Store, Stager, Runner]:
    store, stager, runner = Store(), Stager(), Runner()
    data = JobData(View(), store, stager, Counter())  # type: ignore[arg-type]
    return Prefetches(runner, data), data, store, stager, runner


def ask(runner: Runner, job_id: str, *digests: str) -> PrefetchAsk:
    refs = tuple(f"d{d[0]}@{d}" for d in digests)
    runner.specs[job_id] = JobSpec(command=("true",), datasets=refs)
    return PrefetchAsk(job_id, "owner", b"sub")


def job(n: int) -> str:
    return f"{n:032x}"


def test_a_prefetch_stages_what_is_missing_within_the_budget_share() -> None:
    p, data, store, stager, runner = setup()
    store.held_by = {A: Held(300), B: Held(300, 300), C: Held(400)}
    answer = p.answer(ask(runner, job(1), A, B), "owner")
    assert answer == {"started": ["da"], "held": ["da", "db"]}
    assert stager.started == [A]
    assert Version("da", A) in data.protected() and Version("db", B) in data.protected()
    # A and C lack 700 bytes together: over half the budget of 1000.
    refused = p.answer(ask(runner, job(2), C), "owner")
    assert refused["started"] == [] and "share" in refused["refused"]
    assert data.counts["prefetch_refused"] == 1 and data.counts["prefetch_started"] == 1


def test_at_most_a_few_jobs_and_none_while_a_starting_job_fetches() -> None:
    asyncio.run(_few())


async def _few() -> None:
    p, data, store, _stager, runner = setup()
    store.rules = CacheRules(10**9)
    for n in range(MAX_PREFETCHES):
        store.held_by[f"{n:x}" * 64] = Held(10)
        assert p.answer(ask(runner, job(n), f"{n:x}" * 64), "owner")["started"]
    store.held_by[C] = Held(10)
    assert "already" in p.answer(ask(runner, job(99), C), "owner")["refused"]
    p.cancel(job(0))
    await asyncio.sleep(0)
    data.staging[job(50)] = Version("dc", C)
    assert "starting" in p.answer(ask(runner, job(99), C), "owner")["refused"]


def test_a_starting_job_that_fetches_pauses_the_prefetches_then_they_go_on() -> None:
    asyncio.run(_pauses())


async def _pauses() -> None:
    p, data, store, stager, runner = setup()
    store.held_by = {A: Held(100), B: Held(100)}
    p.answer(ask(runner, job(1), A), "owner")
    p.answer(ask(runner, job(2), B), "owner")
    data.staging[job(3)] = Version("db", B)  # a job starting here waits for B
    data.link_wanted()
    await asyncio.sleep(0)
    assert stager.cancelled == [A], "B is what the starting job waits for"
    assert data.counts["prefetch_paused"] == 1
    del data.staging[job(3)]
    store.held_by[B] = Held(100, 100)
    data.link_free()
    assert stager.started[-1] == A and A in stager.running


def test_a_cancelled_prefetch_ends_only_the_stages_no_one_else_needs() -> None:
    asyncio.run(_cancels())


async def _cancels() -> None:
    p, data, store, stager, runner = setup()
    store.held_by = {A: Held(100), B: Held(100)}
    p.answer(ask(runner, job(1), A, B), "owner")
    p.answer(ask(runner, job(2), B), "owner")
    assert p.cancel(job(1)) == ["da"]
    await asyncio.sleep(0)
    assert stager.cancelled == [A] and B in stager.running
    assert data.counts["prefetch_cancelled"] == 1
    assert p.cancel(job(1)) == []
