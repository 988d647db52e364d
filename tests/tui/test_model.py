"""The TUI's pure parts: the snapshot from JSON, placement preview, filters, history, bars."""

from __future__ import annotations

import copy
import dataclasses
import gc
from collections.abc import Mapping
from typing import Any

import pytest
from rich.style import Style

from agent.job.jobspec import JobSpec, Resources
from tui import decode
from tui.collector import NO_AUTOMATIC_FULL, QuietCollector
from tui.decode import SnapshotBuilder, snapshot_from_json
from tui.model import History, RowFilter
from tui.preview import offers
from tui.simmesh import SimSource
from tui.widgets.render import Glyphs, line_strip, load_level, oneline, temp_level


def _snapshot(source: SimSource):  # type: ignore[no-untyped-def]
    return snapshot_from_json(source.now(), source.nodes_now(), source.jobs_now())


def test_sim_mesh_has_the_documented_shape() -> None:
    source = SimSource(12, seed=0)
    snap = _snapshot(source)
    names = [h.hostname for h in snap.hosts]
    assert names[:3] == ["amd-mi300x-001", "amd-mi300x-009", "amd-rx7900-006"]
    assert len(snap.hosts) == 12
    assert sum(len(h.devices) for h in snap.hosts) == 53
    suspect = snap.host(source.node_id_of("mac-m2u-004"))
    dead = snap.host(source.node_id_of("xe-a770-011"))
    assert suspect is not None and suspect.state == "suspect" and suspect.stale
    assert dead is not None and dead.state == "dead" and dead.telemetry_age_s == 312.0
    h100 = snap.host(source.node_id_of("nv-h100-000"))
    assert h100 is not None and h100.devices[0].mem_total_bytes == 80 * 1024**3
    assert h100.devices[0].links[0].kind == "nvlink"


def test_reads_at_one_moment_are_identical() -> None:
    source = SimSource(6, seed=0)
    assert source.nodes_now() == source.nodes_now()


def test_the_preview_applies_hard_constraints_and_says_why_not() -> None:
    source = SimSource(12, seed=0)
    snap = _snapshot(source)
    spec = JobSpec(
        command=("x",),
        resources=Resources(
            gpus_per_node=2, min_mem_per_gpu_bytes=80 * 1024**3, backends=("cuda",)
        ),
    )
    rows, _ = offers(spec, snap)
    # H100 and A100-80GB hosts have 80 GiB GPUs; nv-h100-000 and nv-a100-010 are full; the
    # H100 is the faster of the two for any job.
    assert [f.hostname for f in rows] == ["nv-h100-008", "nv-a100-002"]
    assert all(len(f.devices) == 2 and f.why.startswith("speed") for f in rows)
    rocm = JobSpec(command=("x",), resources=Resources(gpus_per_node=8, backends=("rocm",)))
    # amd-mi300x-001 runs a 4-GPU job and amd-mi300x-009 a 1-GPU job: no host has 8 free.
    rows, answer = offers(rocm, snap)
    assert rows == [] and not answer.never_fits
    assert answer.line == "waiting: no node has 8 free GPUs (backend rocm) now"
    huge = JobSpec(command=("x",), resources=Resources(gpus_per_node=16))
    rows, answer = offers(huge, snap)
    assert rows == [] and answer.never_fits
    assert answer.line == "never fits: no node has 16 matching GPUs on one node"


def test_row_filter_regex_and_inversion() -> None:
    assert RowFilter("^nv-").keeps("nv-h100-000")
    assert not RowFilter("^nv-").keeps("amd-mi300x-001")
    assert RowFilter("!^nv-").keeps("amd-mi300x-001")
    assert not RowFilter("!^nv-").keeps("nv-h100-000")
    assert RowFilter("[").keeps("a[b")  # not a regex: matched literally


def test_history_keeps_one_point_per_bucket() -> None:
    source = SimSource(1, seed=0, profiles=("h100:1",))
    history = History(points=3, step_s=5.0)
    for _ in range(3):
        history.record(_snapshot(source))
    key = f"{source.node_id_of('nv-h100-000')}/sim:{source.node_id_of('nv-h100-000')}:0"
    assert len(history.series(key)) == 1
    for _ in range(5):
        source.advance(5.0)
        history.record(_snapshot(source))
    assert len(history.series(key)) == 3


def test_bars_and_sparklines() -> None:
    g = Glyphs()
    assert g.bar(0.5, 4) == ("██", "  ")
    assert g.bar(0.3, 4) == ("█▎", "  ")
    assert g.bar(None, 3) == ("", "···")
    assert Glyphs(ascii=True).bar(0.5, 4) == ("##", "..")
    assert g.spark([0.0, 100.0], 2) == "▁█"
    assert Glyphs(ascii=True).spark([0.0, 50.0, 100.0], 3) == "_=#"
    assert g.spark([0.0, 100.0, 0.0, 0.0], 2) == "█▁"  # each cell shows its peak


def test_levels_follow_the_gpus_own_slowdown() -> None:
    assert load_level(0.5) == "ok" and load_level(0.7) == "warn" and load_level(0.95) == "bad"
    assert temp_level(80.0, 100.0) == "ok"  # an MI300X at 80 °C is fine; an H100 is not
    assert temp_level(80.0, 90.0) == "warn"
    assert temp_level(86.0, 90.0) == "bad"
    assert temp_level(70.0, 100.0) == "ok"
    assert temp_level(None, 90.0) == "muted"


def test_builder_parses_static_fields_once_and_notices_a_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parsed: list[str] = []
    parse = decode._static_from_json

    def counting(data: Mapping[str, Any]) -> tuple[Any, ...]:
        parsed.append(str(data["key"]))
        return parse(data)

    source = SimSource(2, seed=0, profiles=("h100:2",))  # its own reads are not counted
    monkeypatch.setattr(decode, "_static_from_json", counting)
    builder = SnapshotBuilder()
    first = builder.build(source.now(), source.nodes_now(), source.jobs_now())
    assert len(parsed) == 4  # two hosts, two GPUs each
    source.advance(5.0)
    nodes = source.nodes_now()
    second = builder.build(source.now(), nodes, source.jobs_now())
    assert len(parsed) == 4  # nothing static changed: nothing parsed again
    a, b = first.hosts[0].devices[0], second.hosts[0].devices[0]
    assert a.row_key == b.row_key and a.name == b.name == "NVIDIA H100 SXM (simulated)"
    assert b.links[0].kind == "nvlink" and b.mem_total_bytes == 80 * 1024**3
    # A GPU whose static fields change (a new name, a link gone) is parsed again.
    changed = copy.deepcopy(nodes)
    device = changed[0]["devices"][0]
    device["name"] = "NVIDIA H100 NVL"
    device["links"] = []
    third = builder.build(source.now(), changed, source.jobs_now())
    assert len(parsed) == 5  # only the changed GPU
    c = next(d for h in third.hosts for d in h.devices if d.row_key == b.row_key)
    assert c.name == "NVIDIA H100 NVL" and c.links == ()
    # Equal to what a fresh parse gives.
    fresh = snapshot_from_json(source.now(), changed, source.jobs_now())
    assert [h.devices for h in fresh.hosts] == [h.devices for h in third.hosts]


def test_oneline_and_line_strip_keep_a_row_on_one_line_of_exact_width() -> None:
    assert oneline("python -c 'a\nb'\tx\x07") == "python -c 'a↵b' x"
    strip = line_strip([("ab", None), ("°C", None), ("xyz", None)], 5, Style())
    assert strip.cell_length == 5 and strip.text == "ab°Cx"
    assert line_strip([("a", None)], 4, Style()).text == "a   "


def test_quiet_collector_runs_full_collections_only_when_quiet_and_due() -> None:
    now = [100.0]
    before = gc.get_threshold()
    collector = QuietCollector(every_s=20.0, quiet_s=1.0, clock=lambda: now[0])
    collector.start()
    try:
        assert gc.get_threshold()[:2] == before[:2]
        assert gc.get_threshold()[2] == NO_AUTOMATIC_FULL
        assert collector.maybe_collect() is None  # not due yet
        now[0] += 25.0
        collector.input_seen()
        assert collector.maybe_collect() is None  # a key was just pressed
        now[0] += 1.5
        assert collector.maybe_collect() is not None
        assert len(collector.pauses_ms) == 1
        assert collector.maybe_collect() is None  # the next one is 20 s away
    finally:
        collector.stop()
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_history_ring_keeps_the_newest_points_oldest_first() -> None:
    history = History(points=3, step_s=5.0)
    history.seed("a/gpu0", [1.0, 2.0, 3.0, 4.0], bucket=10)
    history.seed("b/gpu0", [7.0], bucket=10)
    assert list(history.series("a/gpu0")) == [2.0, 3.0, 4.0]
    assert list(history.series("b/gpu0")) == [7.0]
    assert list(history.series("c/gpu0")) == []


def test_a_jobs_times_are_its_own_eta_else_the_policys_forecast() -> None:
    source = SimSource(12, seed=0)
    jobs = source.jobs_now()
    running = [j for j in jobs if j["state"] == "running"]
    reported, silent = running[0], running[1]
    silent["eta_s"] = None  # a job that reports no progress: the policy's forecast stands
    snap = snapshot_from_json(source.now(), source.nodes_now(), jobs)
    mine = snap.job(reported["job_id"])
    theirs = snap.job(silent["job_id"])
    assert mine is not None and theirs is not None
    assert snap.times(mine).ends_in_s == reported["eta_s"]
    forecast = snap.outlook().forecasts[silent["job_id"]]
    assert snap.times(theirs) == (None, forecast.end_p50 - source.now(), forecast)
    assert 0 < forecast.end_p50 - source.now() < float("inf")
    [pending] = [j for j in snap.jobs if j.state == "pending"]
    assert snap.times(pending).starts_in_s is None  # it can never start: no time is made up
    assert snap.why_waiting(pending) == pending.reason == snap.outlook().waiting[pending.job_id]
    done = next(j for j in snap.jobs if j.state == "succeeded")
    assert snap.times(done) == (None, None, None) and snap.why_waiting(done) is None
    line = "staging imagenet 43% (1.2 GB/s from 3 holders, ~40 s)"
    staging = dataclasses.replace(pending, state="placing", reason=line)
    assert snap.why_waiting(staging) == line


def test_a_host_is_stale_by_the_heartbeat_its_agent_keeps() -> None:
    """An alive host of a large mesh heartbeats every 480 s: its telemetry 300 s old is current;
    a host that names no heartbeat (60 s) is stale at that age."""
    source = SimSource(6, seed=0)
    nodes = [dict(n) for n in source.nodes_now()]
    alive = [n for n in nodes if n["state"] == "alive"][:2]
    for node, every_s in zip(alive, (480.0, None), strict=True):
        node["telemetry_age_s"] = 300.0
        node["telemetry_every_s"] = every_s  # None: an older agent's, not said
    snap = snapshot_from_json(source.now(), nodes, source.jobs_now())
    far, near = (snap.host(n["node_id"]) for n in alive)
    assert far is not None and far.telemetry_every_s == 480.0 and not far.stale
    assert near is not None and near.telemetry_every_s is None and near.stale
