"""A waiting job's image pre-pull tries again when the registry or the runtime fails for a
moment, instead of leaving the job to pull it when its slot frees."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agent.execution.containers import ContainerError
from agent.running import peerimages
from agent.running.peerimages import PeerImages


class Flaky(PeerImages):
    def __init__(self, data_dir: Path, failures: int) -> None:
        super().__init__(data_dir)
        self.failures = failures
        self.calls = 0

    async def ensure(self, runtime: Any, image: str, job_id: str = "") -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise ContainerError("registry busy")


@pytest.mark.parametrize(("failures", "pulled"), [(0, 1), (2, 1), (3, 0)])
async def test_a_pre_pull_tries_again_a_few_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failures: int, pulled: int
) -> None:
    monkeypatch.setattr(peerimages, "PREFETCH_RETRY_S", 0.01)
    images = Flaky(tmp_path, failures)
    images.runtime = object()  # type: ignore[assignment]
    assert images.prefetch("registry.lab/train:1")
    assert not images.prefetch("registry.lab/train:1")  # one pull at a time
    for _ in range(200):
        if not images._tasks:
            break
        await asyncio.sleep(0.01)
    assert images.counts["prefetched"] == pulled
    assert images.counts["prefetch_failed"] == 1 - pulled
    assert images.calls == min(failures + 1, peerimages.PREFETCH_TRIES)
