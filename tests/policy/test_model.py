"""The throughput model: priors from the catalog and Gavel's matrix, and learning from the rates
jobs report, robust to outliers and decaying old reports."""

from __future__ import annotations

import math
import random

from agent.policy.model import ModelConfig, ThroughputModel


def test_priors_gavels_figures_and_the_catalog() -> None:
    m = ThroughputModel()
    gavel = m.speed("ResNet-50 (batch size 64)", "training", "k80")
    assert gavel.source == "measured"
    assert m.relative("ResNet-50 (batch size 64)", "training", "k80") < 0.2
    # a model Gavel did not measure is extrapolated from its measured ones through the catalog
    a100 = m.speed("ResNet-50 (batch size 64)", "training", "a100-80gb")
    assert a100.source == "extrapolated"
    assert m.relative("ResNet-50 (batch size 64)", "training", "a100-80gb") > 1.0
    # an unknown class starts from the datasheets, by kind
    assert m.speed("my-llm", "inference", "h100").source == "catalog"
    assert m.relative("my-llm", "inference", "h100") > m.relative("my-llm", "inference", "l4")
    assert m.speed("my-llm", "inference", "some-new-gpu").source == "unknown"


def test_learning_converges_on_a_devices_true_speed_despite_outliers() -> None:
    """The catalog guesses an L4 at ~0.5 of a V100 for this class; it really runs 120 steps/s
    there. Noisy reports (10%) with one in ten wild (x10 or /10) bring the estimate within 3%."""
    m = ThroughputModel()
    rng = random.Random(7)
    true = 120.0
    for k in range(400):
        rate = true * math.exp(rng.gauss(0.0, 0.1))
        if k % 10 == 3:
            rate *= 10.0 if rng.random() < 0.5 else 0.1
        m.observe("my-llm", "l4", 1, rate, now=60.0 * k)
    est = m.speed("my-llm", "inference", "l4")
    assert est.source == "learned"
    assert abs(est.value - true) / true < 0.03
    assert est.rel_sd < 0.05


def test_learning_corrects_gavels_figure_and_forgets_old_reports() -> None:
    m = ThroughputModel(ModelConfig(half_life_s=3600.0))
    measured = m.speed("ResNet-50 (batch size 64)", "training", "v100").value
    for k in range(30):  # this fleet's V100s are half as fast (old drivers)
        m.observe("ResNet-50 (batch size 64)", "v100", 1, measured / 2, now=10.0 * k)
    slow = m.speed("ResNet-50 (batch size 64)", "training", "v100").value
    assert abs(slow / measured - 0.5) < 0.08
    for k in range(30):  # upgraded a day later: the old reports have decayed away
        m.observe("ResNet-50 (batch size 64)", "v100", 1, measured, now=86400.0 + 10.0 * k)
    fixed = m.speed("ResNet-50 (batch size 64)", "training", "v100").value
    assert abs(fixed / measured - 1.0) < 0.05


def test_work_distribution_of_finished_jobs() -> None:
    m = ThroughputModel()
    assert m.work_ref_s("x") == (3600.0, 8 * 3600.0)  # the prior
    rng = random.Random(1)
    for k in range(200):
        m.observe_work("x", 7200.0 * math.exp(rng.gauss(0.0, 0.5)), now=float(k))
    p50, p90 = m.work_ref_s("x")
    assert 6000.0 < p50 < 8500.0
    assert p90 > p50 * 1.5


def test_sharing_slows_both_by_gavels_figures() -> None:
    m = ThroughputModel()
    pair = m.share_factor("ResNet-50 (batch size 64)", ["LM (batch size 20)"], "v100")
    assert 0.3 < pair < 1.0
    assert m.share_factor("a", [], "v100") == 1.0
    assert 0.25 <= m.share_factor("a", ["b", "c", "d"], "v100") < m.share_factor("a", ["b"], "v100")
