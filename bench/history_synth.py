"""Labelled synthetic GPU windows for the bottleneck rules (:mod:`agent.history.history_hints`).

Each window is a few minutes of 1 s samples of one GPU drawn for one label: one of the rules
(what it should fire), or a healthy case built to sit near a rule's edge (busy and cool, warm
but below its slowdown, drawing 90 % of its power limit, bursty but with an idle CPU, idle and
free, a gang's rank a little behind its peers, heavy PCIe traffic on a busy GPU, swap in use but
flat with memory at 85-90 %). Every window has the series of every rule (its host's memory and
swap, its PCIe traffic; gang peers for some), so every rule judges every window. Noise, and a
few gaps, in every series; the seed draws it all.
"""

from __future__ import annotations

import math
import random
from typing import Final

from agent.history.history_hints import Window

LIMIT_MW: Final = 700_000.0
LINK_BYTES_PER_S: Final = 32e9
"""PCIe 5.0 x16, each way (about 32 GB/s usable)."""
MEM_TOTAL_BYTES: Final = 2.0 * 2**40
SLOWDOWN_C: Final = 87.0
LABELS: Final = (
    "idle_allocated",
    "input_bound",
    "memory_bandwidth_bound",
    "thermally_throttled",
    "power_capped",
    "straggler",
    "pcie_bound",
    "host_memory_pressure",
    "busy_healthy",
    "warm_healthy",
    "near_cap_healthy",
    "bursty_idle_cpu_healthy",
    "idle_free_healthy",
    "gang_even_healthy",
    "pcie_busy_healthy",
    "swap_flat_healthy",
)
RULE_LABELS: Final = frozenset(LABELS[:8])


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
    link = LINK_BYTES_PER_S
    rx = _series(rng, n, link * rng.uniform(0.02, 0.4), link * 0.03, 0, link)
    tx = _series(rng, n, link * rng.uniform(0.01, 0.1), link * 0.01, 0, link)
    mem = _series(rng, n, MEM_TOTAL_BYTES * rng.uniform(0.2, 0.8), 2**30, 0, MEM_TOTAL_BYTES)
    swap_level = rng.choice((0.0, rng.uniform(0, 8 * 2**30)))
    swap = _series(rng, n, swap_level, 2**20 if swap_level else 0, 0, 2**40)
    peers: list[list[float | None]] = []
    in_gang = rng.random() < 0.4  # one of a gang's ranks, its peers about as busy as it is
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
        peers = []
    elif label == "straggler":
        peers = [_series(rng, n, rng.uniform(80, 99), 3, 0, 100) for _ in range(rng.randint(1, 7))]
        util = _series(rng, n, rng.uniform(25, 55), 4, 0, 100)
    elif label == "gang_even_healthy":
        peers = [_series(rng, n, rng.uniform(80, 99), 3, 0, 100) for _ in range(rng.randint(1, 7))]
        util = _series(rng, n, rng.uniform(72, 90), 3, 0, 100)
    elif label == "pcie_bound":
        util = _series(rng, n, rng.uniform(25, 60), 5, 0, 100)
        rx = _series(rng, n, link * rng.uniform(0.78, 0.95), link * 0.03, 0, link)
    elif label == "pcie_busy_healthy":
        rx = _series(rng, n, link * rng.uniform(0.75, 0.95), link * 0.03, 0, link)
    elif label == "host_memory_pressure":
        if rng.random() < 0.5:
            mem = _series(rng, n, MEM_TOTAL_BYTES * rng.uniform(0.965, 0.99), 2**29, 0, 2**41)
        else:
            start, grow = rng.uniform(0, 4 * 2**30), rng.uniform(0.2, 4) * 2**30
            swap = [
                None if rng.random() < 0.01 else start + grow * i / n + rng.gauss(0, 2**20)
                for i in range(n)
            ]
    elif label == "swap_flat_healthy":
        mem = _series(rng, n, MEM_TOTAL_BYTES * rng.uniform(0.85, 0.9), 2**30, 0, 2**41)
        swap = _series(rng, n, rng.uniform(1, 8) * 2**30, 4 * 2**20, 0, 2**40)
    if in_gang and allocated and not peers:
        known = [u for u in util if u is not None]
        level = sum(known) / len(known)
        peers = [
            _series(rng, n, level * rng.uniform(0.9, 1.1), 3, 0, 100)
            for _ in range(rng.randint(1, 7))
        ]
    limit: list[float | None] = [LIMIT_MW] * n
    return Window(
        util,
        cpu,
        allocated,
        temp,
        power,
        limit,
        bw,
        SLOWDOWN_C,
        peers_util_pct=peers,
        pcie_rx_bytes_per_s=rx,
        pcie_tx_bytes_per_s=tx,
        pcie_link_bytes_per_s=link,
        host_mem_used_bytes=mem,
        host_swap_used_bytes=swap,
        host_mem_total_bytes=MEM_TOTAL_BYTES,
    )


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
