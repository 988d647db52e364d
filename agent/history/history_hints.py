"""Bottleneck hints: named rules over one GPU's recent history, each with its thresholds.

A rule reads a :class:`Window` (one GPU's 1 s samples over a few minutes, its host's CPU, and
whether a job holds the GPU) and either fires, with the evidence in one line, or not. A rule
whose series the device does not expose says so (``unjudged``) instead of guessing. Pure: no
clock, no I/O; tested on synthetic series with known labels (``bench.history`` scores them).

=========================  ==================================================================
rule                       fires when (over the window)
=========================  ==================================================================
``idle_allocated``         a job holds the GPU and its utilization's 90th percentile is under
                           :data:`IDLE_UTIL_PCT` (5 %) over the window (:data:`MIN_WINDOW_S`,
                           300 s, unless the agent's ``hints_window_s`` says otherwise) of which
                           :data:`MIN_SAMPLED` (80 %) hold a sample
``input_bound``            a job holds the GPU, utilization averages between 5 % and
                           :data:`INPUT_UTIL_MAX_PCT` (60 %) and swings (coefficient of variation
                           at least :data:`INPUT_CV_MIN`, 0.5), while the host's CPU averages at
                           least :data:`INPUT_CPU_MIN_PCT` (85 %): the GPU waits for its data
``memory_bandwidth_bound`` memory-bandwidth activity averages at least :data:`MEMBW_MIN_PCT`
                           (80 %) while utilization averages at least 50 %
``thermally_throttled``    the temperature is within :data:`THERMAL_MARGIN_C` (2 °C) of the
                           GPU's own slowdown threshold (else :data:`DEFAULT_SLOWDOWN_C`, 85 °C)
                           for at least :data:`THERMAL_SHARE` (30 %) of the samples
``power_capped``           the power draw is at least :data:`POWER_CAP_SHARE` (97 %) of the
                           limit for at least half of the samples while utilization averages at
                           least :data:`POWER_UTIL_MIN_PCT` (80 %)
``straggler``              the GPU is one of a gang's (a job's GPUs, this one and its peers),
                           the peers' median utilization averages at least
                           :data:`STRAGGLER_PEER_MIN_PCT` (50 %), and this GPU's is at most
                           :data:`STRAGGLER_SHARE` (70 %) of it and at least
                           :data:`STRAGGLER_GAP_PCT` (20) points below: one rank holds the
                           others back
``pcie_bound``             PCIe traffic in either direction is at least :data:`PCIE_LINK_SHARE`
                           (70 %) of the link's bandwidth for at least :data:`PCIE_TIME_SHARE`
                           (50 %) of the samples while utilization averages under
                           :data:`PCIE_UTIL_MAX_PCT` (70 %): the GPU waits on transfers
``host_memory_pressure``   swap is in use and grew by at least :data:`SWAP_GROWTH_BYTES`
                           (64 MiB) over the window (the median of its last quarter over that of
                           its first), or the host's memory is at least
                           :data:`MEM_PRESSURE_SHARE` (95 %) used for at least half the samples
=========================  ==================================================================

``host_memory_pressure`` is the host's, not a GPU's: a node's hints give it once, for the host
(subject ``host``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from agent.history.history import SeriesKey

IDLE_UTIL_PCT: Final = 5.0
MIN_WINDOW_S: Final = 300
MIN_SAMPLED: Final = 0.8
"""The share of those seconds that must hold a sample (gaps, the last seconds not yet written)."""
INPUT_UTIL_MAX_PCT: Final = 60.0
INPUT_CV_MIN: Final = 0.5
INPUT_CPU_MIN_PCT: Final = 85.0
MEMBW_MIN_PCT: Final = 80.0
THERMAL_MARGIN_C: Final = 2.0
DEFAULT_SLOWDOWN_C: Final = 85.0
THERMAL_SHARE: Final = 0.3
POWER_CAP_SHARE: Final = 0.97
POWER_UTIL_MIN_PCT: Final = 80.0
STRAGGLER_PEER_MIN_PCT: Final = 50.0
STRAGGLER_SHARE: Final = 0.7
STRAGGLER_GAP_PCT: Final = 20.0
PCIE_LINK_SHARE: Final = 0.7
PCIE_TIME_SHARE: Final = 0.5
PCIE_UTIL_MAX_PCT: Final = 70.0
SWAP_GROWTH_BYTES: Final = 64 * 2**20
MEM_PRESSURE_SHARE: Final = 0.95

Samples = Sequence[float | None]


@dataclass(frozen=True, slots=True)
class Window:
    """One GPU's recent samples, one a second (``None``: a gap; a whole series ``None``: the
    device does not expose it)."""

    util_pct: Samples
    host_cpu_pct: Samples
    allocated: bool
    """A job running on this node holds the GPU (or a share of it)."""
    temp_c: Samples | None = None
    power_mw: Samples | None = None
    power_limit_mw: Samples | None = None
    mem_bw_pct: Samples | None = None
    slowdown_c: float | None = None
    """The GPU's own slowdown temperature, when it tells."""
    peers_util_pct: Sequence[Samples] = ()
    """The utilization of the other GPUs of the same job (its gang's other ranks); empty for a
    job on this GPU alone, or a free GPU."""
    pcie_rx_bytes_per_s: Samples | None = None
    pcie_tx_bytes_per_s: Samples | None = None
    pcie_link_bytes_per_s: float | None = None
    """The PCIe link's bandwidth each way at its current generation and width, when known."""
    host_mem_used_bytes: Samples | None = None
    host_swap_used_bytes: Samples | None = None
    host_mem_total_bytes: float | None = None
    window_s: int = MIN_WINDOW_S
    """The window's length (the agent's ``hints_window_s``): ``idle_allocated`` needs
    :data:`MIN_SAMPLED` of it sampled."""


@dataclass(frozen=True, slots=True)
class Hint:
    rule: str
    evidence: str
    """One line: the figures that made the rule fire (or why it could not judge)."""
    unjudged: bool = False


def _known(samples: Samples) -> list[float]:
    return [s for s in samples if s is not None]


def _mean(samples: Samples) -> float | None:
    known = _known(samples)
    return sum(known) / len(known) if known else None


def idle_allocated(w: Window) -> Hint | None:
    util = sorted(_known(w.util_pct))
    if not w.allocated or len(util) < MIN_SAMPLED * w.window_s:
        return None
    p90 = util[int(0.9 * (len(util) - 1))]
    if p90 < IDLE_UTIL_PCT:
        return Hint(
            "idle_allocated", f"held by a job, utilization p90 {p90:.1f}% for {len(util)} s"
        )
    return None


def input_bound(w: Window) -> Hint | None:
    util, cpu = _known(w.util_pct), _mean(w.host_cpu_pct)
    if not w.allocated or len(util) < 2 or cpu is None:
        return None
    mean = sum(util) / len(util)
    cv = statistics.pstdev(util) / mean if mean > 0 else 0.0
    bursty = IDLE_UTIL_PCT <= mean <= INPUT_UTIL_MAX_PCT and cv >= INPUT_CV_MIN
    if bursty and cpu >= INPUT_CPU_MIN_PCT:
        return Hint(
            "input_bound",
            f"utilization {mean:.0f}% in bursts (cv {cv:.2f}) while the host's CPU is at"
            f" {cpu:.0f}%",
        )
    return None


def memory_bandwidth_bound(w: Window) -> Hint | None:
    if w.mem_bw_pct is None:
        return Hint("memory_bandwidth_bound", "this GPU does not expose it", unjudged=True)
    bw, util = _mean(w.mem_bw_pct), _mean(w.util_pct)
    if bw is not None and util is not None and bw >= MEMBW_MIN_PCT and util >= 50:
        return Hint("memory_bandwidth_bound", f"memory bandwidth {bw:.0f}% busy, util {util:.0f}%")
    return None


def thermally_throttled(w: Window) -> Hint | None:
    if w.temp_c is None:
        return Hint("thermally_throttled", "this GPU does not tell its temperature", unjudged=True)
    temps = _known(w.temp_c)
    if not temps:
        return None
    slowdown = w.slowdown_c if w.slowdown_c is not None else DEFAULT_SLOWDOWN_C
    hot = sum(1 for t in temps if t >= slowdown - THERMAL_MARGIN_C) / len(temps)
    if hot >= THERMAL_SHARE:
        return Hint(
            "thermally_throttled",
            f"{hot:.0%} of samples within {THERMAL_MARGIN_C:.0f} °C of its {slowdown:.0f} °C"
            f" slowdown (peak {max(temps):.0f} °C)",
        )
    return None


def power_capped(w: Window) -> Hint | None:
    if w.power_mw is None or w.power_limit_mw is None:
        return Hint("power_capped", "this GPU does not tell its power or limit", unjudged=True)
    pairs = [
        (p, cap)
        for p, cap in zip(w.power_mw, w.power_limit_mw, strict=False)
        if p is not None and cap
    ]
    util = _mean(w.util_pct)
    if not pairs or util is None:
        return None
    capped = sum(1 for p, cap in pairs if p >= POWER_CAP_SHARE * cap) / len(pairs)
    if capped >= 0.5 and util >= POWER_UTIL_MIN_PCT:
        return Hint(
            "power_capped", f"at its power limit {capped:.0%} of the time, util {util:.0f}%"
        )
    return None


def straggler(w: Window) -> Hint | None:
    mine = _mean(w.util_pct)
    peers = sorted(m for p in w.peers_util_pct if (m := _mean(p)) is not None)
    if not w.allocated or mine is None or not peers:
        return None
    median = statistics.median(peers)
    behind = mine <= STRAGGLER_SHARE * median and median - mine >= STRAGGLER_GAP_PCT
    if median >= STRAGGLER_PEER_MIN_PCT and behind:
        return Hint(
            "straggler",
            f"utilization {mine:.0f}% while its {len(peers)} gang peers average {median:.0f}%",
        )
    return None


def pcie_bound(w: Window) -> Hint | None:
    link = w.pcie_link_bytes_per_s
    if w.pcie_rx_bytes_per_s is None or w.pcie_tx_bytes_per_s is None or not link:
        return Hint("pcie_bound", "this GPU does not tell its PCIe traffic or link", unjudged=True)
    pairs = [
        max(rx, tx)
        for rx, tx in zip(w.pcie_rx_bytes_per_s, w.pcie_tx_bytes_per_s, strict=False)
        if rx is not None and tx is not None
    ]
    util = _mean(w.util_pct)
    if not pairs or util is None:
        return None
    busy = sum(1 for b in pairs if b >= PCIE_LINK_SHARE * link) / len(pairs)
    if busy >= PCIE_TIME_SHARE and util < PCIE_UTIL_MAX_PCT:
        peak = max(pairs)
        return Hint(
            "pcie_bound",
            f"PCIe at >= {PCIE_LINK_SHARE:.0%} of its {link / 1e9:.1f} GB/s link {busy:.0%} of"
            f" the time (peak {peak / 1e9:.1f} GB/s), util {util:.0f}%",
        )
    return None


def host_memory_pressure(w: Window) -> Hint | None:
    total = w.host_mem_total_bytes
    used = _known(w.host_mem_used_bytes or [])
    swap = _known(w.host_swap_used_bytes or [])
    if not swap and (not used or not total):
        return Hint(
            "host_memory_pressure", "this host does not tell its memory or swap", unjudged=True
        )
    if len(swap) >= 4:
        quarter = len(swap) // 4
        first = statistics.median(swap[:quarter])
        last = statistics.median(swap[-quarter:])
        if last > 0 and last - first >= SWAP_GROWTH_BYTES:
            return Hint(
                "host_memory_pressure",
                f"swap in use grew {(last - first) / 2**20:.0f} MiB to {last / 2**20:.0f} MiB",
            )
    if used and total:
        full = sum(1 for u in used if u >= MEM_PRESSURE_SHARE * total) / len(used)
        if full >= 0.5:
            return Hint(
                "host_memory_pressure",
                f"memory >= {MEM_PRESSURE_SHARE:.0%} used {full:.0%} of the time"
                f" (peak {max(used) / total:.1%})",
            )
    return None


RULES: Final[dict[str, Callable[[Window], Hint | None]]] = {
    "idle_allocated": idle_allocated,
    "input_bound": input_bound,
    "memory_bandwidth_bound": memory_bandwidth_bound,
    "thermally_throttled": thermally_throttled,
    "power_capped": power_capped,
    "straggler": straggler,
    "pcie_bound": pcie_bound,
    "host_memory_pressure": host_memory_pressure,
}
HOST_RULES: Final = frozenset({"host_memory_pressure"})
"""The rules about the host, not the GPU (a node's hints give them once)."""


def judge(window: Window) -> list[Hint]:
    """Every rule's verdict that is not silence: the hints that fire, and the rules that could
    not judge (unexposed series)."""
    return [h for rule in RULES.values() if (h := rule(window)) is not None]


def fired(window: Window) -> set[str]:
    return {h.rule for h in judge(window) if not h.unjudged}


WINDOW_S: Final = 300
"""The span the node's hints read: the five minutes before the query's end."""


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """What the agent knows of a GPU beyond its samples."""

    allocated: bool
    slowdown_c: float | None = None
    job_id: str | None = None
    """The job holding it (whole or a share), when one does: its other GPUs are its peers."""
    pcie_link_bytes_per_s: float | None = None


def node_hints(
    gpus: Mapping[str, GpuFacts],
    fetch: Callable[[SeriesKey], Samples | None],
    mem_total_bytes: float | None = None,
    window_s: int = WINDOW_S,
) -> list[tuple[str, Hint]]:
    """Every GPU's hints, then the host's (subject ``host``); ``fetch`` gives a series' samples
    over the window (``None``: the GPU does not expose it)."""
    cpu = fetch(SeriesKey("host.cpu_pct")) or []
    mem = fetch(SeriesKey("host.mem_used_bytes"))
    swap = fetch(SeriesKey("host.swap_used_bytes"))
    utils = {key: fetch(SeriesKey("gpu.util_pct", key)) for key in gpus}
    out: list[tuple[str, Hint]] = []
    for key, facts in sorted(gpus.items()):
        util = utils[key]
        if util is None:
            continue
        peers = [
            u
            for other, f in sorted(gpus.items())
            if other != key and facts.job_id is not None and f.job_id == facts.job_id
            if (u := utils[other]) is not None
        ]
        window = Window(
            util,
            cpu,
            facts.allocated,
            temp_c=fetch(SeriesKey("gpu.temp_c", key)),
            power_mw=fetch(SeriesKey("gpu.power_mw", key)),
            power_limit_mw=fetch(SeriesKey("gpu.power_limit_mw", key)),
            mem_bw_pct=fetch(SeriesKey("gpu.mem_bw_pct", key)),
            slowdown_c=facts.slowdown_c,
            peers_util_pct=peers,
            pcie_rx_bytes_per_s=fetch(SeriesKey("gpu.pcie_rx_bytes_per_s", key)),
            pcie_tx_bytes_per_s=fetch(SeriesKey("gpu.pcie_tx_bytes_per_s", key)),
            pcie_link_bytes_per_s=facts.pcie_link_bytes_per_s,
            window_s=window_s,
        )
        out += [
            (key, h)
            for name, rule in RULES.items()
            if name not in HOST_RULES
            if (h := rule(window))
        ]
    host = Window(
        [],
        cpu,
        False,
        host_mem_used_bytes=mem,
        host_swap_used_bytes=swap,
        host_mem_total_bytes=mem_total_bytes,
    )
    out += [("host", h) for name in sorted(HOST_RULES) if (h := RULES[name](host))]
    return out
