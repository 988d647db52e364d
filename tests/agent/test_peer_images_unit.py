"""The image source's waiting line: while a job's image is pulled the runner says so (its
owner copies the line into the job's reason), and a pull that fails everywhere fails in one line.
A stand-in runtime client (a script) answers slowly; no podman needed."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from agent.execution.containers import ContainerError, ContainerRuntime
from agent.running.peerimages import PeerImages

CLIENT = """#!/bin/sh
# image exists: no; pull: slowly, then fails (no registry)
case "$1" in
  image) exit 1 ;;
  pull) sleep 1; echo "Error: initializing source: connection refused" ; exit 125 ;;
esac
exit 2
"""


async def test_a_job_waiting_for_its_image_says_so_and_a_failed_pull_says_why(
    tmp_path: Path,
) -> None:
    client = tmp_path / "podman"
    client.write_text(CLIENT)
    os.chmod(client, 0o755)
    runtime = ContainerRuntime("podman", str(client))
    images = PeerImages(tmp_path / "data")
    told: list[str] = []
    images.waiting_changed = lambda: told.append("changed")
    pulling = asyncio.create_task(images.ensure(runtime, "reg.example:5000/team/x:1", "job-1"))
    for _ in range(100):
        if images.lines():
            break
        await asyncio.sleep(0.01)
    assert images.lines() == {"job-1": "pulling image reg.example:5000/team/x:1"}
    with pytest.raises(ContainerError) as err:
        await pulling
    assert "connection refused" in str(err.value) and "no member holds it" in str(err.value)
    assert images.lines() == {} and told == ["changed", "changed"]
    assert images.counts["failed"] == 1
