"""A runner's reports of ended attempts reach the owner that counts on them: after a healed
partition the record's owner (the other side's, whose record fenced the run) answers "stale",
and the owner that offered the run is told too, so that it requeues instead of waiting."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from agent.running.reports import Reports
from agent.wire.calls import AttemptResult


class _Peers:
    """Owners' answers to ``report`` by address, and the calls made."""

    def __init__(self, answers: dict[str, dict[str, Any]]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    async def call(self, addr: str, op: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((addr, op, body))
        return self.answers[addr]


class _Runner:
    def __init__(self, view: Any, peers: _Peers, live: list[str]) -> None:
        self.view = view
        self.peers = peers
        self.live = live
        self.tasks: list[asyncio.Task[Any]] = []

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.tasks.append(asyncio.ensure_future(coro))

    def _live(self) -> list[str]:
        return self.live

    def _addr_of(self, node: str) -> str | None:
        return f"addr-{node}"


class _View:
    def __init__(self, jobs: dict[str, dict[str, Any]]) -> None:
        self.jobs = jobs


def _fenced(job_id: str) -> AttemptResult:
    return AttemptResult(job_id, 1, None, "SIGTERM", "fenced", 1.0, 2.0)


async def _delivered(answers: dict[str, dict[str, Any]], hint: str | None) -> list[str]:
    # The record believed here names the other side's owner, "other", running attempt 1 on
    # its own node: the record that fenced this runner's copy.
    doc = {"job_id": "j1", "state": "running", "attempt": 1, "owner": "other", "runner": "other"}
    view: Any = _View({"j1": doc})
    peers = _Peers(answers)
    runner = _Runner(view, peers, ["other", "offerer", "me"])
    reports = Reports(runner)
    reports.queue(_fenced("j1"), hint)
    await asyncio.gather(*runner.tasks)
    assert not reports.pending
    assert all(op == "report" and body["cause"] == "fenced" for _, op, body in peers.calls)
    return [addr for addr, _, _ in peers.calls]


async def test_a_report_found_stale_by_the_records_owner_goes_to_the_owner_that_offered() -> None:
    answers = {"addr-other": {"ok": True, "stale": True}, "addr-offerer": {"ok": True}}
    assert await _delivered(answers, "offerer") == ["addr-other", "addr-offerer"]


async def test_a_report_the_records_owner_takes_goes_nowhere_else() -> None:
    answers = {"addr-other": {"ok": True}, "addr-offerer": {"ok": True}}
    assert await _delivered(answers, "offerer") == ["addr-other"]
    stale = {"addr-other": {"ok": True, "stale": True}}
    assert await _delivered(stale, None) == ["addr-other"]  # no offerer known: no one else
    assert await _delivered(stale, "other") == ["addr-other"]  # the offerer is that owner
