"""Labelled synthetic GPU windows for the bottleneck rules (:mod:`agent.history.history_hints`).

Each window is a few minutes of 1 s samples of one GPU drawn for one label: one of the rules
(what it should fire), or a healthy case built to sit near a rule's edge (busy and cool, warm
but below its slowdown, drawing 90 % of its power limit, bursty but with an idle CPU, idle and
free). Noise, and a few gaps, in every series; the seed draws it all.
"""

from __future__ import annotations

import math
import random
from typing import Final

from agent.history.history_hints import Window

LIMIT_MW: Final = 700_000.0
SLOWDOWN_C: Final = 87.0
LABELS: Final = (
    "idle_allocated",
    "input_bound",
    "memory_bandwidth_bound",
    "thermally_throttled",
    "power_capped",
    "busy_healthy",
    "warm_healthy",
    "near_cap_healthy",
    "bursty_idle_cpu_healthy",
    "idle_free_healthy",
)
RULE_LABELS: Final = frozenset(LABELS[:5])


def _series(
    rng: random.Random, n: int, base: float, noise: float, low: float, high: float
) -> list[float | None]:
    out: list[float | None] = []
    for _ in range(n):
        out.append(None if rng.random() < 0.01 else min(high, max(low, rng.gauss(base, noise))))
    return out


def _bursty(rng: random.Random, n: int, peak: float, duty: float) -> list[float | None]:
    period = rng.randint(6, 20)
    on = max(2, round(period * duty))  # busy at least a fifth of the time: not idle
    phase = rng.randint(0, period)
    return [
        None
        if rng.random() < 0.01
        else (max(0.0, rng.gauss(peak, 4)) if (i + phase) % period < on else rng.uniform(0, 3))
        for i in range(n)
    ]


def window(label: str, rng: random.Random) -> Window:
    n = rng.randint(300, 600)
    util = _series(rng, n, rng.uniform(85, 99), 3, 0, 100)
    cpu = _series(rng, n, rng.uniform(20, 60), 5, 0, 100)
    temp = _series(rng, n, rng.uniform(55, 72), 1.5, 20, 110)
    power = _series(rng, n, LIMIT_MW * rng.uniform(0.55, 0.8), LIMIT_MW * 0.02, 0, LIMIT_MW)
    bw = _series(rng, n, rng.uniform(20, 60), 5, 0, 100)
    allocated = True
    if label == "idle_allocated":
        util = _series(rng, n, rng.uniform(0, 1.5), 0.8, 0, 100)
        power = _series(rng, n, LIMIT_MW * 0.12, LIMIT_MW * 0.01, 0, LIMIT_MW)
    elif label == "input_bound":
        util = _bursty(rng, n, rng.uniform(80, 98), rng.uniform(0.2, 0.45))
        cpu = _series(rng, n, rng.uniform(90, 99), 2, 0, 100)
    elif label == "memory_bandwidth_bound":
        bw = _series(rng, n, rng.uniform(85, 97), 3, 0, 100)
        util = _series(rng, n, rng.uniform(60, 90), 4, 0, 100)
    elif label == "thermally_throttled":
        temp = _series(rng, n, SLOWDOWN_C + rng.uniform(-1, 2), 1.0, 20, 110)
    elif label == "power_capped":
        power = _series(rng, n, LIMIT_MW * 0.995, LIMIT_MW * 0.008, 0, LIMIT_MW)
    elif label == "warm_healthy":
        temp = _series(rng, n, SLOWDOWN_C - rng.uniform(6, 10), 1.0, 20, 110)
    elif label == "near_cap_healthy":
        power = _series(rng, n, LIMIT_MW * rng.uniform(0.86, 0.91), LIMIT_MW * 0.01, 0, LIMIT_MW)
    elif label == "bursty_idle_cpu_healthy":
        util = _bursty(rng, n, rng.uniform(80, 98), rng.uniform(0.2, 0.45))
        cpu = _series(rng, n, rng.uniform(10, 50), 5, 0, 100)
    elif label == "idle_free_healthy":
        util = _series(rng, n, 0.3, 0.3, 0, 100)
        allocated = False
    limit: list[float | None] = [LIMIT_MW] * n
    return Window(util, cpu, allocated, temp, power, limit, bw, SLOWDOWN_C)


def labelled_set(seed: int, per_label: int) -> list[tuple[str, Window]]:
    rng = random.Random(seed)
    return [(label, window(label, rng)) for label in LABELS for _ in range(per_label)]


def score(seed: int, per_label: int) -> dict[str, float]:
    """Micro-averaged precision and recall of every rule over the labelled set (a window's
    true rules: its label if it is a rule's, else none)."""
    from agent.history.history_hints import fired

    tp = fp = fn = 0
    for label, w in labelled_set(seed, per_label):
        truth = {label} & RULE_LABELS
        got = fired(w)
        tp += len(truth & got)
        fp += len(got - truth)
        fn += len(truth - got)
    precision = tp / (tp + fp) if tp + fp else math.nan
    recall = tp / (tp + fn) if tp + fn else math.nan
    return {
        "rules_precision": round(precision, 4),
        "rules_recall": round(recall, 4),
        "rules_windows": float(len(LABELS) * per_label),
    }
