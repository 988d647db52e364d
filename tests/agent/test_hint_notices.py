"""Bottleneck hints told to the jobs they concern: once each, again only after a quiet spell, a
host's hint to every job of the node, and what ``shoal jobs JOB`` shows of them."""

from __future__ import annotations

from pathlib import Path

from agent.cli.tables import job_hints
from agent.history.hint_notices import REARM_S, HintNotices, Notice
from agent.history.history import UNSUPPORTED, SeriesKey
from agent.history.history_hints import GpuFacts, Hint
from agent.history.history_store import History

T0 = 1_800_000_000 - 1_800_000_000 % 86_400
IDLE = Hint("idle_allocated", "GPU under 5% busy for 300 s while a job holds it")
HOST = Hint("host_memory_pressure", "swap grew by 1.2 GiB")


def test_a_hint_is_told_once_to_the_job_on_that_gpu_and_again_after_a_quiet_spell() -> None:
    notices = HintNotices()
    holders = {"g0": "job-a", "g1": None}
    first = notices.update([("g0", IDLE), ("g1", IDLE)], holders, 100.0)
    assert first == [Notice("job-a", "g0", "idle_allocated", IDLE.evidence)]
    assert notices.update([("g0", IDLE)], holders, 160.0) == []  # still firing: told already
    assert notices.update([], holders, 220.0) == []
    again = 160.0 + REARM_S + 1
    assert [n.job_id for n in notices.update([("g0", IDLE)], holders, again)] == ["job-a"]
    unjudged = Hint("pcie_bound", "the GPU does not expose PCIe traffic", unjudged=True)
    assert notices.update([("g0", unjudged)], holders, again + 60) == []


def test_a_host_hint_goes_to_every_job_and_ended_jobs_are_forgotten() -> None:
    notices = HintNotices()
    told = notices.update([("host", HOST)], {"g0": "job-a", "g1": "job-b"}, 100.0)
    assert sorted(n.job_id for n in told) == ["job-a", "job-b"]
    assert told[0].line().startswith("host_memory_pressure on host: swap grew")
    notices.update([], {"g0": "job-a", "g1": None}, 160.0)  # job-b ended here
    told = notices.update([("host", HOST)], {"g0": "job-a", "g1": "job-b"}, 220.0)
    assert [n.job_id for n in told] == ["job-b"]  # told afresh: its last attempt was forgotten


def test_the_node_history_judges_the_hints_the_agent_tells(tmp_path: Path) -> None:
    history = History(tmp_path)
    util, cpu = SeriesKey("gpu.util_pct", "GPU-0"), SeriesKey("host.cpu_pct")
    for t in range(400):
        history.sample(T0 + t, {util: 0.5, SeriesKey("gpu.mem_bw_pct", "GPU-0"): UNSUPPORTED})
        history.sample(T0 + t, {cpu: 10.0})
    history.flush(T0 + 400)
    gpus = {"GPU-0": GpuFacts(allocated=True, job_id="job-a")}
    fired = history.hints(T0 + 400, gpus)
    told = HintNotices().update(fired, {"GPU-0": "job-a"}, T0 + 400)
    assert [(n.job_id, n.device, n.rule) for n in told] == [("job-a", "GPU-0", "idle_allocated")]


def test_shoal_jobs_shows_the_newest_hint_of_each_rule_and_device() -> None:
    def event(at: float, job: str, message: str) -> dict[str, object]:
        return {"at": at, "kind": "hint", "node": "n1", "job_id": job, "message": message}

    events = [
        event(1.0, "a", "idle_allocated on sim:ab:0: GPU 1% busy"),
        event(2.0, "a", "idle_allocated on sim:ab:1: GPU 2% busy"),
        event(3.0, "b", "power_capped on sim:ab:2: at the limit"),
        event(4.0, "a", "idle_allocated on sim:ab:0: GPU 0% busy"),
        {"at": 5.0, "kind": "started", "node": "n1", "job_id": "a", "message": "attempt 1"},
    ]
    assert [h["message"] for h in job_hints(events, "a")] == [
        "idle_allocated on sim:ab:1: GPU 2% busy",
        "idle_allocated on sim:ab:0: GPU 0% busy",
    ]
