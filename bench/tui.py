"""The operator TUI at fleet size: ``python -m bench.tui --hosts 1000 --json``.

Runs the real app headless under Textual's pilot on a :class:`tui.simmesh.SimSource` of ``--hosts``
hosts with eight GPUs each (NVIDIA, AMD and Intel), and measures:

- **full refresh**: a new snapshot of the whole mesh shown in the visible view (its rows rebuilt,
  filtered and sorted, the lines on screen drawn, layout and render of the screen), for the
  topology, hosts, GPUs and jobs views in turn;
- **keystroke**: one key (move, jump, sort, switch view through the command bar, filter) answered,
  handler through render.

Both are the CPU time the app spends between the input and the rendered screen
(``time.process_time``: everything the process does meanwhile is counted). The pilot's own idle
detection sleeps at least 40 ms per step, so its wall clock is reported too but is not the app's
latency.

Turning the agents' JSON into a snapshot happens on a worker thread in the app, with the app's
own :class:`tui.decode.SnapshotBuilder` (each GPU's static fields parsed once), and the GPUs'
utilization goes into the sparklines' history; the CPU time of both is ``snapshot_build_ms``, and
with the refresh that shows it, ``data_to_screen_ms``: the app's whole cost from the agents' JSON
to the screen (the bar is on the refresh; the build does not hold the event loop, but it is
reported so nothing is hidden).

Garbage collection: collections inside a measured step are in the figures, and counted in
``gc_in_steps``. The app runs full collections itself, at quiet moments (:mod:`tui.collector`:
at most every ``every_s``, never within a second of a key). The bench runs one the same way,
between measured steps, every ``every_s / refresh_s`` reads (10), as the app's mesh worker
would; their pauses are ``quiet_gc_ms``, and ``full_gc_ms`` is one more timed at the end of the
run: a key pressed during one would wait that long.

Bars (BENCHMARKS.md): full refresh <= 50 ms, keystroke <= 100 ms, at p99.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

RENDER_BAR_MS = 50.0
KEYSTROKE_BAR_MS = 100.0
VIEWS = ("topology", "hosts", "gpus", "jobs")
KEYS_PER_VIEW: tuple[tuple[str, ...], ...] = (
    ("j",),
    ("j",),
    ("k",),
    ("G",),
    ("g",),
    ("U",),
    ("N",),
    ("slash",),
    ("escape",),
)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100.0 * (len(ordered) - 1))))
    return ordered[index]


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(_pct(values, 50), 2),
        "p99": round(_pct(values, 99), 2),
        "max": round(max(values), 2) if values else float("nan"),
        "mean": round(statistics.fmean(values), 2) if values else float("nan"),
        "n": len(values),
    }


class _GcWatch:
    """Collections (and their wall time) that happen while a step is measured."""

    def __init__(self) -> None:
        self.measuring = False
        self.count = [0, 0, 0]
        self.ms = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if not self.measuring:
            return
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.count[int(info["generation"])] += 1
            self.ms += (time.perf_counter() - self._start) * 1000.0


_GC = _GcWatch()


async def _cpu_ms(step: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    _GC.measuring = True
    cpu0, wall0 = time.process_time(), time.perf_counter()
    try:
        await step()
    finally:
        _GC.measuring = False
    return (time.process_time() - cpu0) * 1000.0, (time.perf_counter() - wall0) * 1000.0


async def run(hosts: int, rounds: int, seed: int, size: tuple[int, int]) -> dict[str, Any]:
    from tui.app import ShoalApp
    from tui.simmesh import BENCH_PROFILES, SimSource

    t0 = time.perf_counter()
    source = SimSource(hosts, seed=seed, profiles=BENCH_PROFILES)
    setup_s = time.perf_counter() - t0
    app = ShoalApp(source, watch=False)
    render: dict[str, list[float]] = {v: [] for v in VIEWS}
    render_wall: list[float] = []
    keys: dict[str, list[float]] = {v: [] for v in VIEWS}
    keys_wall: list[float] = []
    build: list[float] = []
    data_to_screen: list[float] = []

    reads = [0]
    reads_per_collection = max(1, round(app.collector.every_s / app.refresh_s))

    def next_snapshot() -> Any:
        # The app's mesh worker reads every refresh_s and collects at most every every_s, when
        # quiet: here, one full collection every that many reads, between measured steps.
        reads[0] += 1
        if reads[0] % reads_per_collection == 0:
            app.collector.collect()
        source.advance(2.0)
        nodes, jobs = source.nodes_now(), source.jobs_now()  # the agents' side: not timed
        start = time.process_time()
        snapshot = app.ingest(source.now(), nodes, jobs, [])  # what the app's mesh worker does
        build.append((time.process_time() - start) * 1000.0)
        return snapshot

    gc.callbacks.append(_GC)
    _GC.count, _GC.ms = [0, 0, 0], 0.0
    try:
        async with app.run_test(size=size) as pilot:
            first = next_snapshot()
            bucket = int(first.taken_at // app.history.step_s)
            for key, values in source.backfill().items():
                app.history.seed(key, values, bucket)
            app.show_snapshot(first)
            await pilot.pause()
            main = app.main_screen()
            gpus = sum(len(h.devices) for h in first.hosts)
            for view in VIEWS:
                main.show_view(view)
                await pilot.pause()
                # One refresh to settle the view (first fill of a table is a one-off cost).
                app.show_snapshot(next_snapshot())
                await pilot.pause()
                for _ in range(rounds):
                    snapshot = next_snapshot()

                    async def refresh(snapshot: Any = snapshot) -> None:
                        app.show_snapshot(snapshot)
                        await pilot.pause()

                    cpu, wall = await _cpu_ms(refresh)
                    render[view].append(cpu)
                    data_to_screen.append(build[-1] + cpu)
                    render_wall.append(wall)
                for combo in KEYS_PER_VIEW:

                    async def press(combo: tuple[str, ...] = combo) -> None:
                        await pilot.press(*combo)

                    cpu, wall = await _cpu_ms(press)
                    keys[view].append(cpu)
                    keys_wall.append(wall)
            # Switching views through the command bar, each keystroke timed.
            for view in ("gpus", "hosts"):
                for key in ("colon", *view, "enter"):

                    async def press_one(key: str = key) -> None:
                        await pilot.press(key)

                    cpu, wall = await _cpu_ms(press_one)
                    keys["command-bar"] = [*keys.get("command-bar", []), cpu]
                    keys_wall.append(wall)
            full_gc_ms = app.collector.collect()
    finally:
        gc.callbacks.remove(_GC)
        pauses = list(app.collector.pauses_ms)

    all_render = [v for values in render.values() for v in values]
    all_keys = [v for values in keys.values() for v in values]
    result: dict[str, Any] = {
        "hosts": hosts,
        "gpus": gpus,
        "terminal": f"{size[0]}x{size[1]}",
        "rounds_per_view": rounds,
        "render_ms": _summary(all_render),
        "keystroke_ms": _summary(all_keys),
        "render_ms_by_view": {v: _summary(x) for v, x in render.items()},
        "keystroke_ms_by_view": {v: _summary(x) for v, x in keys.items()},
        "pilot_wall_ms": {"render": _summary(render_wall), "keystroke": _summary(keys_wall)},
        "snapshot_build_ms": _summary(build),
        "data_to_screen_ms": _summary(data_to_screen),
        "gc_in_steps": {"collections_by_generation": list(_GC.count), "ms": round(_GC.ms, 2)},
        "quiet_gc_ms": _summary(pauses[:-1]),
        "full_gc_ms": round(full_gc_ms, 2),
        "sim_setup_s": round(setup_s, 2),
        "bars": {"render_ms_p99": RENDER_BAR_MS, "keystroke_ms_p99": KEYSTROKE_BAR_MS},
        "render_ok": _pct(all_render, 99) <= RENDER_BAR_MS,
        "keystroke_ok": _pct(all_keys, 99) <= KEYSTROKE_BAR_MS,
        "python": sys.version.split()[0],
    }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tui", description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=1000, help="simulated hosts (8 GPUs each)")
    parser.add_argument("--rounds", type=int, default=20, help="refreshes measured per view")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--size", default="160x48", help="terminal size, COLSxROWS")
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default)")
    args = parser.parse_args(argv)
    try:
        cols, rows = (int(p) for p in args.size.lower().split("x"))
    except ValueError:
        parser.error(f"--size: expected COLSxROWS, got {args.size!r}")
    if args.hosts < 1 or args.rounds < 1:
        parser.error("--hosts and --rounds must be at least 1")
    result = asyncio.run(run(args.hosts, args.rounds, args.seed, (cols, rows)))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
