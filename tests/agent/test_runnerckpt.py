"""The runner's side of its jobs' checkpoints (``agent.running.runnerckpt``) while an attempt
launches: its folder still holds what an earlier attempt left here (or the checkpoint being put
there), so it is neither told to the owner as the new attempt's checkpoint nor served as it."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from agent.running import runnerckpt
from agent.running.runnerckpt import CheckpointingRunner, RunnerCheckpoints
from agent.running.runs import LocalRun

JOB = "d" * 32


class Results:
    """The runner's store, as far as this reads it: attempt 1 finished here."""

    def results(self, job_id: str) -> list[Any]:
        return [SimpleNamespace(attempt=1)] if job_id == JOB else []


def runner(tmp_path: Path) -> tuple[Any, list[str]]:
    told: list[str] = []
    r = SimpleNamespace(
        executor=SimpleNamespace(job_dir=lambda job_id: tmp_path / job_id),
        store=Results(),
        peers=None,
        checkpoints=object(),
        saved_at={},
        runs={},
        spawn=lambda coro: (told.append("checkpointed"), coro.close()),
        owner_for=lambda job_id, hint: hint,
        _on_change=lambda: None,
        _addr_of=lambda node: None,
    )
    return r, told


async def test_an_attempt_still_launching_has_no_checkpoint_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r, told = runner(tmp_path)
    ckpts = RunnerCheckpoints(cast(CheckpointingRunner, r))
    stale = ckpts.folder(JOB)
    stale.mkdir(parents=True)
    (stale / "step").write_text("20")  # what attempt 1 saved here
    r.runs[JOB] = LocalRun(JOB, 3, "owner", ("gpu0",))  # attempt 3 launches: not started
    monkeypatch.setattr(runnerckpt, "CHECKPOINT_SCAN_S", 0.01)

    watch = asyncio.create_task(ckpts.watch())
    await asyncio.sleep(0.1)  # several scans
    assert told == [] and r.saved_at == {}
    # Asked for attempt 3's checkpoint, the runner says attempt 1 ran here last (a 409).
    assert ckpts.last_attempt(JOB) == (1, None)

    r.runs[JOB].started_at = 1.0  # the process started: the folder is the attempt's own
    await asyncio.sleep(0.1)
    watch.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watch
    assert told == ["checkpointed"] and JOB in r.saved_at
    assert ckpts.last_attempt(JOB) == (3, "owner")
