"""A node's history at full size: ``python -m bench.history --json``.

Measures, for an 8-GPU node (the simulated ``dgx-h100``: its probe's devices, this host's psutil):

- **sampling**: the real :class:`agent.history.history_sample.NodeSampler` and
  :class:`agent.history.history_store.History` (in a temporary folder) driven ``--samples`` times
  with a clock that steps one second each time, so writes (every 10 s) and trims happen as often as
  in an agent. ``sampling_cpu_pct_of_one_core`` is the CPU time of one sampled second (sampling,
  roll-ups, SQLite) as a percentage of that second; ``sampling_rss_mb`` the growth of this
  process's resident memory from just before the history is opened to the end of the run (the
  modules it needs imported before). The probe's own refresh is not counted: the agent's
  telemetry does it anyway.
- **a year**: a store filled as an agent would have left it after ``--days`` days (365 by
  default), fast-forwarded with a simulated clock: one sample an hour per series until 30 days
  before the end, one a minute until a day before, then one a second. Blocks are fixed-size
  (an empty slot is NaN), so every block of each tier exists exactly as after a year of seconds;
  the tiers are trimmed as they go. ``year_bytes_8gpu`` is the file's size (database, WAL
  checkpointed) at the end; ``year_series_stored`` the series with samples in it (the
  unsupported ones are named, with no block).
- **a 24 h query**: one series over the last 24 h from that store, ``--queries`` times:
  ``query_24h_ms_p50`` with the default step (about 600 points), ``query_24h_raw_ms_p50`` at a
  step of 1 s (86,400 points from the seconds' tier); wall clock, and ``..._cpu_ms_p50`` the
  CPU time (on a busy machine the wall clock waits for a core). ``trim_ms``: one trim of that
  store, ten minutes later (what an agent does every ten minutes, on its event loop).

- **bottleneck rules** (:mod:`agent.history.history_hints`) on a labelled synthetic set
  (:mod:`bench.history_synth`, drawn by ``--seed``, ``--windows`` per label):
  ``rules_precision`` and ``rules_recall``, micro-averaged over the rules.

- **completion forecasts** (:mod:`agent.job.progressfit`, through the agent's own
  progress tracker) on a seeded set of noisy-progress jobs (:mod:`bench.history_forecast`,
  ``--jobs`` of them): ``forecast_error_at_half_p50``, the median of ``|predicted end - true
  end| / duration`` at half-way, its p90, the share of jobs ended by the p90 forecast, and the
  old five-minute-rate estimator's error on the same set.

Bars (BENCHMARKS.md "History and hints"): sampling <= 0.3% of a core and <= 5 MB RSS, the 24 h
query <= 200 ms, a year <= 250 MB, rules' precision and recall >= 0.9, forecasts within 15 % at
half-way.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agent.history.history import DAY_S, SeriesKey
from agent.history.history_sample import (
    GPU_FIELDS,
    GPU_NOT_PROBED,
    NOT_PROBED,
    NodeSampler,
    Readings,
)
from agent.history.history_store import History
from probers.host import HostProbe, ProbeOptions

NOT_MEASURED: tuple[str, ...] = ()


def _rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def sampling(samples: int, folder: Path, start_s: int) -> dict[str, float]:
    probe = HostProbe.from_options(ProbeOptions(sim="dgx-h100", sim_seed=1))
    probe.open()
    devices = probe.refresh().devices
    sampler = NodeSampler()
    sampler.sample(devices, {}, {})  # psutil's first CPU reading, outside the figures
    rss_before = _rss_bytes()
    history = History(folder)
    cpu = time.process_time()
    for i in range(samples):
        readings = sampler.sample(devices, {"j" * 32: i / samples}, {"j" * 32: None})
        history.sample(start_s + i, readings)
    cpu_s = time.process_time() - cpu
    history.close(start_s + samples)
    probe.close()
    return {
        "sampling_cpu_pct_of_one_core": round(cpu_s / samples * 100, 4),
        "sampling_rss_mb": round((_rss_bytes() - rss_before) / 2**20, 2),
        "sampling_cpu_ms_per_sample": round(cpu_s / samples * 1000, 3),
        "series_sampled": float(len(readings)),
    }


def _node_keys(gpus: int) -> list[SeriesKey]:
    keys = [SeriesKey("gpu." + f, f"GPU-{g}") for g in range(gpus) for f in GPU_FIELDS]
    host = (
        "cpu_pct",
        "mem_used_bytes",
        "swap_used_bytes",
        "net_rx_bytes_per_s",
        "net_tx_bytes_per_s",
        "disk_read_bytes_per_s",
        "disk_write_bytes_per_s",
    )
    return keys + [SeriesKey("host." + h) for h in host]


def year(
    days: int, gpus: int, folder: Path, end_s: int, seed: int, seconds: int = DAY_S
) -> tuple[History, int]:
    """A store as ``days`` days of an agent leave it; the history (open) and the series count
    that hold samples (the unsupported ones are named in the store, with no block)."""
    rng = random.Random(seed)
    keys = _node_keys(gpus)
    unsupported: Readings = {
        SeriesKey("gpu." + f, f"GPU-{g}"): NOT_PROBED for g in range(gpus) for f in GPU_NOT_PROBED
    }
    history = History(folder)
    start = end_s - days * DAY_S
    times = [
        *range(start, end_s - 30 * DAY_S, 3600),
        *range(max(start, end_s - 30 * DAY_S), end_s - DAY_S, 60),
        *range(max(start, end_s - DAY_S), end_s - seconds, 60),
        *range(max(start, end_s - seconds), end_s),
    ]
    levels = [rng.uniform(0, 100) for _ in keys]
    for n, t in enumerate(times):
        readings: Readings = dict(unsupported) if n == 0 else {}
        for i, key in enumerate(keys):
            levels[i] = min(100.0, max(0.0, levels[i] + rng.gauss(0, 2)))
            readings[key] = levels[i]
        history.sample(t, readings)
    history.flush(end_s)
    history.store.trim(end_s)
    return history, len(keys)


def _file_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("history.sqlite*"))


def queries(history: History, end_s: int, count: int) -> dict[str, float]:
    key = SeriesKey("gpu.util_pct", "GPU-0")
    out: dict[str, float] = {}
    for name, step in (("query_24h_ms_p50", None), ("query_24h_raw_ms_p50", 1)):
        times, cpu = [], []
        for _ in range(count):
            t, c = time.perf_counter(), time.process_time()
            [answer] = history.query(end_s, [key], end_s - DAY_S, end_s, step)
            times.append((time.perf_counter() - t) * 1000)
            cpu.append((time.process_time() - c) * 1000)
        out[name] = round(statistics.median(times), 2)
        out[name.replace("_ms_p50", "_cpu_ms_p50")] = round(statistics.median(cpu), 2)
        out[name.replace("_ms_p50", "_points")] = float(len(answer.points))
        out[name.replace("_ms_p50", "_tier")] = float({"s": 1, "m": 60, "h": 3600}[answer.tier])
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    began = time.perf_counter()
    end_s = int(time.time()) // DAY_S * DAY_S
    with tempfile.TemporaryDirectory(prefix="shoal-history-") as tmp:
        root = Path(tmp)
        (root / "sampling").mkdir()
        (root / "year").mkdir()
        out: dict[str, Any] = sampling(args.samples, root / "sampling", end_s)
        history, series = year(args.days, args.gpus, root / "year", end_s, args.seed, args.seconds)
        out.update(queries(history, end_s, args.queries))
        trim_s = time.perf_counter()
        history.store.trim(end_s + 600, history.core.supported.keys())  # ten minutes' worth
        out["trim_ms"] = round((time.perf_counter() - trim_s) * 1000, 1)
        history.store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = _file_bytes(root / "year")
        history.store.close()
        full = args.gpus == 8 and args.days >= 365 and args.seconds >= DAY_S
        out.update(
            year_bytes_8gpu=size if full else None,
            store_bytes=size,
            store_days=args.days,
            store_gpus=args.gpus,
            year_series_stored=series,
            bytes_per_series_year_mb=round(size / series / 2**20, 3) if series else None,
        )
    from bench.history_forecast import score as forecasts
    from bench.history_synth import score

    out.update(score(args.seed, args.windows))
    out.update(forecasts(args.seed, args.jobs))
    missing = [*NOT_MEASURED, *([] if out["year_bytes_8gpu"] else ["year_bytes_8gpu"])]
    out.update(
        {name: None for name in NOT_MEASURED},
        not_measured=missing,
        cpu_count=os.cpu_count(),
        load_avg_1m=round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        wall_s=round(time.perf_counter() - began, 1),
    )
    return out


def main(argv: list[str] | None = None) -> int:
    doc = (__doc__ or "").split("\n\n")[0]
    ap = argparse.ArgumentParser(prog="python -m bench.history", description=doc)
    ap.add_argument("--samples", type=int, default=600, help="sampled seconds (default 600)")
    ap.add_argument("--days", type=int, default=365, help="days of history to fill (365)")
    ap.add_argument("--gpus", type=int, default=8, help="GPUs of the filled node (8)")
    ap.add_argument(
        "--seconds",
        type=int,
        default=DAY_S,
        help="of those, the last seconds sampled every second (default a day; less: a smaller "
        "run, and year_bytes_8gpu is not measured)",
    )
    ap.add_argument("--queries", type=int, default=9, help="24 h queries timed (9)")
    ap.add_argument(
        "--seed", type=int, default=1, help="draws the filled values and the labelled set"
    )
    ap.add_argument("--windows", type=int, default=50, help="labelled windows per label (50)")
    ap.add_argument("--jobs", type=int, default=200, help="noisy-progress jobs forecast (200)")
    ap.add_argument("--json", action="store_true", help="one JSON object (the default form)")
    args = ap.parse_args(argv)
    if (
        min(args.samples, args.days, args.gpus, args.queries, args.seconds, args.windows, args.jobs)
        < 1
    ):
        ap.error("--samples, --days, --gpus, --seconds, --queries, --windows, --jobs: at least 1")
    out = run(args)
    if args.json:
        print(json.dumps(out, sort_keys=True))
    else:
        for key, value in sorted(out.items()):
            print(f"{key:34} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
