"""Bottleneck rules on synthetic series with known labels: each fires on its case, stays quiet
at the edge of its threshold, and says when it cannot judge."""

from __future__ import annotations

import random

import pytest

from agent.history.history import SeriesKey
from agent.history.history_hints import (
    DEFAULT_SLOWDOWN_C,
    RULES,
    GpuFacts,
    Samples,
    Window,
    fired,
    judge,
    node_hints,
)
from bench.history_synth import LABELS, RULE_LABELS, labelled_set, score, window

N = 400
BUSY: list[float | None] = [95.0] * N
CALM_CPU: list[float | None] = [30.0] * N
LINK = 32e9
MEM = 512.0 * 2**30


def _w(**kw: object) -> Window:
    base: dict[str, object] = {
        "util_pct": BUSY,
        "host_cpu_pct": CALM_CPU,
        "allocated": True,
        "temp_c": [60.0] * N,
        "power_mw": [400_000.0] * N,
        "power_limit_mw": [700_000.0] * N,
        "mem_bw_pct": [40.0] * N,
        "pcie_rx_bytes_per_s": [4e9] * N,
        "pcie_tx_bytes_per_s": [1e9] * N,
        "pcie_link_bytes_per_s": LINK,
        "host_mem_used_bytes": [0.5 * MEM] * N,
        "host_swap_used_bytes": [0.0] * N,
        "host_mem_total_bytes": MEM,
    }
    return Window(**{**base, **kw})  # type: ignore[arg-type]


def test_a_busy_healthy_gpu_fires_nothing() -> None:
    assert fired(_w()) == set()


def test_each_rule_fires_on_its_case_and_not_just_below_its_threshold() -> None:
    assert fired(_w(util_pct=[1.0] * N)) == {"idle_allocated"}
    assert fired(_w(util_pct=[1.0] * N, allocated=False)) == set()  # idle and free: fine
    assert fired(_w(util_pct=[1.0] * 200)) == set()  # too short a window to say
    assert fired(_w(util_pct=[1.0] * 250 + [None] * 50)) == {"idle_allocated"}  # a few gaps
    # an agent told a shorter window (hints_window_s) judges on that much
    assert fired(_w(util_pct=[1.0] * 20, window_s=20)) == {"idle_allocated"}
    assert fired(_w(util_pct=[1.0] * 15, window_s=20)) == set()
    bursty: list[float | None] = [90.0 if i % 4 == 0 else 1.0 for i in range(N)]
    assert fired(_w(util_pct=bursty, host_cpu_pct=[95.0] * N)) == {"input_bound"}
    assert fired(_w(util_pct=bursty, host_cpu_pct=[80.0] * N)) == set()
    assert fired(_w(mem_bw_pct=[90.0] * N)) == {"memory_bandwidth_bound"}
    assert fired(_w(mem_bw_pct=[75.0] * N)) == set()
    assert fired(_w(temp_c=[84.0] * N, slowdown_c=85.0)) == {"thermally_throttled"}
    assert fired(_w(temp_c=[82.0] * N, slowdown_c=85.0)) == set()
    assert fired(_w(temp_c=[DEFAULT_SLOWDOWN_C] * N)) == {"thermally_throttled"}
    assert fired(_w(power_mw=[690_000.0] * N)) == {"power_capped"}
    assert fired(_w(power_mw=[650_000.0] * N)) == set()
    assert fired(_w(power_mw=[690_000.0] * N, util_pct=[50.0] * N)) == set()


def test_the_straggler_pcie_and_memory_rules_fire_on_their_case_only() -> None:
    peers: list[Samples] = [[92.0] * N, [90.0] * N, [95.0] * N]
    assert fired(_w(util_pct=[40.0] * N, peers_util_pct=peers)) == {"straggler"}
    assert fired(_w(util_pct=[75.0] * N, peers_util_pct=peers)) == set()  # only a little behind
    assert fired(_w(util_pct=[30.0] * N, peers_util_pct=[[40.0] * N])) == set()  # all slow
    assert fired(_w(util_pct=[40.0] * N, peers_util_pct=peers, allocated=False)) == set()
    assert fired(_w(util_pct=[45.0] * N, pcie_rx_bytes_per_s=[26e9] * N)) == {"pcie_bound"}
    assert fired(_w(pcie_rx_bytes_per_s=[26e9] * N)) == set()  # busy: the copies overlap
    assert fired(_w(util_pct=[45.0] * N, pcie_rx_bytes_per_s=[20e9] * N)) == set()
    growing: list[float | None] = [2**30 + i * 2**20 for i in range(N)]  # 400 MiB in the window
    assert fired(_w(host_swap_used_bytes=growing)) == {"host_memory_pressure"}
    flat: list[float | None] = [8.0 * 2**30] * N
    assert fired(_w(host_swap_used_bytes=flat)) == set()  # swap in use, not growing
    assert fired(_w(host_mem_used_bytes=[0.97 * MEM] * N)) == {"host_memory_pressure"}
    assert fired(_w(host_mem_used_bytes=[0.93 * MEM] * N)) == set()


def test_a_node_names_a_gangs_straggler_and_its_host_once() -> None:
    util = {"GPU-0": 95.0, "GPU-1": 93.0, "GPU-2": 35.0, "GPU-3": 2.0}
    series: dict[SeriesKey, Samples] = {
        SeriesKey("gpu.util_pct", k): [u] * N for k, u in util.items()
    }
    series[SeriesKey("host.cpu_pct")] = CALM_CPU
    series[SeriesKey("host.mem_used_bytes")] = [0.99 * MEM] * N
    series[SeriesKey("host.swap_used_bytes")] = [0.0] * N
    gpus = {
        "GPU-0": GpuFacts(True, job_id="gang"),
        "GPU-1": GpuFacts(True, job_id="gang"),
        "GPU-2": GpuFacts(True, job_id="gang"),
        "GPU-3": GpuFacts(False),  # free: not the gang's, and idle is fine
    }
    found = node_hints(gpus, series.get, MEM)
    fired_ = [(k, h.rule) for k, h in found if not h.unjudged]
    assert fired_ == [("GPU-2", "straggler"), ("host", "host_memory_pressure")]


def test_a_series_the_gpu_does_not_expose_is_unjudged_not_a_verdict() -> None:
    hidden = {"mem_bw_pct": None, "temp_c": None, "power_mw": None, "pcie_rx_bytes_per_s": None}
    hints = judge(_w(**hidden, host_mem_used_bytes=None, host_swap_used_bytes=None))
    assert {h.rule for h in hints if h.unjudged} == {
        "memory_bandwidth_bound", "thermally_throttled", "power_capped", "pcie_bound",
        "host_memory_pressure",
    }  # fmt: skip
    assert fired(_w(**hidden)) == set()


@pytest.mark.parametrize("label", LABELS)
def test_the_synthetic_cases_carry_their_label(label: str) -> None:
    rng = random.Random(7)
    truth = {label} & RULE_LABELS
    assert all(fired(window(label, rng)) == truth for _ in range(5))


def test_precision_and_recall_on_a_labelled_set() -> None:
    assert set(RULES) == set(RULE_LABELS)
    figures = score(seed=3, per_label=10)
    assert figures["rules_precision"] >= 0.9 and figures["rules_recall"] >= 0.9
    assert len(labelled_set(3, 2)) == 2 * len(LABELS)
