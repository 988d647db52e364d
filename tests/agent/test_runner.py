"""The runner's admission with real processes: fencing during a launch, declining on shutdown."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent.events import EventLog
from agent.executor import ExecutorConfig, ProcessExecutor
from agent.jobspec import JobSpec, Resources, new_job_id
from agent.peers import PeerClient
from agent.runner import Declined, Runner
from agent.store import Store
from agent.view import ClusterView
from gossip.identity import enroll_node, init_cluster
from probers.records import DeviceStatic

GPU = DeviceStatic(key="h0", vendor="nvidia", backend="cuda", name="H100", source="sim")


@pytest.fixture
async def runner(tmp_path: Path) -> AsyncIterator[Runner]:
    now = datetime.now(UTC)
    cluster = init_cluster(tmp_path / "cluster", "test", "operator", now)
    me = enroll_node(cluster.ca, tmp_path / "me", "agent", ["127.0.0.1"], timedelta(days=1), now)
    store = Store(tmp_path / "agent.sqlite")
    store.set_node_id(me.node_id)
    peers = PeerClient(me, insecure_dev=True)
    r: Runner | None = None
    executor = ProcessExecutor(
        ExecutorConfig(data_dir=tmp_path, grace_s=1.0),
        on_event=lambda e: r.on_exec_event(e) if r is not None else None,
    )
    r = Runner(
        me.node_id,
        store,
        ClusterView(),
        peers,
        EventLog(me.node_id),
        executor,
        statics=lambda: [GPU],
        set_load=lambda key, on: None,
        live_agents=lambda: [me.node_id],
        addr_of=lambda node: None,  # reports wait: there is no owner to take them here
        on_change=lambda: None,
        stop_grace_s=1.0,
    )
    try:
        yield r
    finally:
        await executor.close()
        await r.close()
        await peers.close()
        store.close()


def _offer(tmp_path: Path, attempt: int = 1) -> dict[str, Any]:
    pidfile = tmp_path / f"pid-{attempt}"
    script = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    spec = JobSpec(command=(sys.executable, "-c", script), resources=Resources(gpus_per_node=1))
    return {
        "job_id": new_job_id(),
        "attempt": attempt,
        "spec": spec.to_dict(),
        "devices": ["h0"],
        "owner": "the-owner",
    }


async def test_a_stop_that_lands_while_the_job_launches_ends_it(
    runner: Runner, tmp_path: Path
) -> None:
    # The owner's offer timed out, so it fences the attempt while the runner is still launching.
    offer = _offer(tmp_path)
    start = asyncio.create_task(runner.start(offer))
    await asyncio.sleep(0)  # the launch is under way: the process is being spawned
    assert offer["job_id"] in runner.runs and not runner.executor.running()
    answer = await runner.stop({"job_id": offer["job_id"], "attempt": 1, "cause": "fenced"})
    assert answer == {"stopped": False}
    with pytest.raises(Declined, match="stopped as it started"):
        await start
    # The owner took "not running" for an answer: nothing of that attempt may run on.
    assert offer["job_id"] not in runner.runs
    assert runner.executor.running() == ()
    pid = int((tmp_path / "pid-1").read_text()) if (tmp_path / "pid-1").exists() else None
    if pid is not None:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def test_offers_are_declined_once_the_agent_shuts_down(
    runner: Runner, tmp_path: Path
) -> None:
    running = _offer(tmp_path)
    await runner.start(running)
    assert running["job_id"] in runner.runs
    await runner.shutdown(wait_reports_s=0)
    assert runner.runs == {}
    with pytest.raises(Declined, match="shutting down"):
        await runner.start(_offer(tmp_path, attempt=2))
