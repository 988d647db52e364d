"""Predicted completion from a job's own progress history: the robust slope, its p50 and p90, the
tracker that feeds it, and the policy's forecasts reading it."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from agent.execution.progress import ProgressTracker
from agent.job.progressfit import MAX_POINTS, completion, theil_sen
from agent.policy.decision import decide
from agent.policy.model import ThroughputModel
from agent.policy.snapshot import Snapshot
from bench.history_forecast import score
from tests.policy.helpers import holding, job, node, running


def test_a_straight_line_is_found_exactly() -> None:
    points = [(100.0 + 10 * i, 0.02 * i) for i in range(20)]  # 0.002 a second
    fit = theil_sen(points)
    assert fit is not None and fit[0] == pytest.approx(0.002)
    c = completion(points)
    assert c is not None and c.at_s == 290.0
    assert c.remaining_p50_s == pytest.approx((1 - 0.38) / 0.002)
    assert c.remaining_p90_s is not None and c.remaining_p90_s >= c.remaining_p50_s * 1.1


def test_wild_reports_do_not_drag_the_slope() -> None:
    rng = random.Random(3)
    points = [(10.0 * i, 0.001 * 10 * i) for i in range(60)]
    for i in rng.sample(range(60), 10):  # a sixth of them wildly off
        points[i] = (points[i][0], rng.uniform(0, 1))
    c = completion(points)
    assert c is not None and c.rate_per_s == pytest.approx(0.001, rel=0.05)
    # the mean of the pairwise slopes (what a plain fit leans towards) is far off
    assert c.end_p50_s == pytest.approx(1000.0, rel=0.05)


def test_scatter_widens_the_p90_and_a_stall_gives_none() -> None:
    rng = random.Random(1)
    steady = [(10.0 * i, 0.005 * i) for i in range(30)]
    noisy = [(t, f + rng.gauss(0, 0.03)) for t, f in steady]
    a, b = completion(steady), completion(noisy)
    assert a is not None and b is not None
    assert a.remaining_p50_s is not None and a.remaining_p90_s is not None
    assert b.remaining_p50_s is not None and b.remaining_p90_s is not None
    assert b.remaining_p90_s / b.remaining_p50_s > a.remaining_p90_s / a.remaining_p50_s
    stalled = completion([(0.0, 0.4), (60.0, 0.4), (120.0, 0.4)])
    assert stalled is not None and stalled.remaining_p50_s is None
    assert completion([(5.0, 0.1)]) is None and completion([(5.0, 0.1), (5.0, 0.2)]) is None
    done = completion([(0.0, 0.5), (9.0, 1.0)])
    assert done is not None and done.remaining_p50_s == 0.0


def test_the_tracker_keeps_the_whole_attempt_thinned() -> None:
    tracker = ProgressTracker()
    for i in range(1000):
        tracker.update(i / 2000, None, now=float(i * 5))
    points = tracker.points
    assert len(points) <= MAX_POINTS and points[-1] == (4995.0, 999 / 2000)
    assert points[0][0] < 100  # the start of the attempt is still there
    report = tracker.latest
    assert report is not None and report.eta_s == pytest.approx(5000.0, rel=0.01)
    assert report.eta_p90_s is not None and report.eta_p90_s >= report.eta_s


def test_one_wild_report_back_is_not_a_restart() -> None:
    tracker = ProgressTracker()
    for i in range(10):
        tracker.update(0.05 * i, None, now=10.0 * i)
    wild = tracker.update(0.02, None, now=100.0)  # a stray line, far back
    assert wild.fraction == 0.02 and wild.eta_s is not None
    after = tracker.update(0.5, None, now=110.0)
    assert len(tracker.points) == 11 and after.eta_s == pytest.approx(90.0)  # on its line


def test_faster_reports_than_a_second_are_not_each_fitted() -> None:
    tracker = ProgressTracker()
    for i in range(10):
        tracker.update(0.01 * i, None, now=float(i))
    fitted = len(tracker.points)
    for k in range(100):
        report = tracker.update(0.09 + 0.0001 * k, None, now=9.0 + 0.005 * k)
    assert len(tracker.points) == fitted and report.eta_s is not None


def test_the_policy_forecasts_a_running_job_from_its_fitted_eta() -> None:
    blocker = job("blocker")
    n = holding(node("n", "v100", 1), blocker, [0])
    r = running(blocker, "n", ["n/0"], progress=0.5, progress_at=1000.0)
    waiting = job("j")
    snap = Snapshot(now=1000.0, nodes=(n,), pending=(waiting,), running=(r,))
    fitted = replace(r, eta_s=1200.0, eta_p90_s=1800.0)
    d = decide(replace(snap, running=(fitted,)), ThroughputModel(), forecasts=True)
    f = d.forecasts["blocker"]
    assert (f.end_p50, f.end_p90) == (2200.0, 2800.0)
    assert d.forecasts["j"].start_p50 == pytest.approx(2200.0)
    without = decide(snap, ThroughputModel(), forecasts=True).forecasts["blocker"]
    assert without.end_p50 == pytest.approx(2000.0)  # elapsed / progress: what it did before


def test_the_seeded_noisy_set_is_within_the_bar_at_half_way() -> None:
    out = score(seed=1, jobs=60)
    assert out["forecast_error_at_half_p50"] is not None
    assert out["forecast_error_at_half_p50"] <= 0.15
    window = out["forecast_error_at_half_window_p50"]
    assert window is not None and out["forecast_error_at_half_p50"] < window
