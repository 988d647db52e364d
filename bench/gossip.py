"""Gossip benchmark: the real core in the deterministic simulator.

``python -m bench.gossip --nodes N --loss P --seconds S --seed K [--starved F] --json``

With ``--seeds 1-8`` (or ``1,3,5``) instead of ``--seed``, the same run once per seed, and one
object: every numeric field the median over the seeds, ``<field>_worst`` beside each figure where
more is worse (the largest over the seeds), ``seeds`` and ``worst_seed`` (the seed whose slowest
update was slowest), and ``runs`` (each seed's own object). A tail one seed shows cannot hide.

Workload, after a warm-up: every ``--publish-every`` seconds a random live node publishes a new
version of a 128-byte record; every ``--crash-every`` seconds a random live, unstarved node
crashes (kill -9, never restarted). Measured (see BENCHMARKS.md):

- dissemination: from a record's publication until every node alive at the end holds it, in
  seconds and in gossip rounds (seconds / gossip interval); ``dissemination_rounds_max`` is the
  slowest update of the run (``dissemination_undelivered`` counts those that never got there);
- detect: from a crash until every node alive at the end has declared the crashed node dead;
- false_deaths: distinct live nodes that any node ever declared dead;
- bytes_per_node_per_s: encoded bytes received per node per simulated second (all traffic), and
  membership_bytes_per_node_per_s (the same without application record parts).

With ``--partition-s S`` the nodes split into two halves for S seconds a third of the way into the
run (no publications or crashes from the split until the heal is measured); ``heal_s`` is the
time from the heal until every live node sees every other live node alive. Live nodes declared
dead across the split count as ``partition_deaths``, not as false deaths.

Per-node counts for the cost model, over the measured window, averaged over the live observers
(every node, unless ``--observers``): ``observer_messages_out_per_s``,
``observer_messages_in_per_s``, ``observer_bytes_in_per_s``, ``observer_bytes_out_per_s`` and,
with ``--streams``,
``observer_handshakes_per_s`` (handshakes it took part in), ``observer_open_streams_mean``,
``observer_signatures_checked_per_s`` and ``observer_cpu_model_pct``: the CPU those counts cost
a real member (:data:`MESSAGE_CPU_S`, :data:`HANDSHAKE_END_CPU_S`, :data:`VERIFY_CPU_S`).

``--observers S`` runs only S real cores (spread evenly over the ids) among N-S background
members (``gossip/simbackground.py``: the protocol's traffic over one shared converged view, no
per-member rows), so that 10,000 nodes fit in a few GB. Dissemination, detection, false deaths
and the observer counts then come from the S real cores; ``bytes_per_node_per_s`` and
``messages_out_per_node_per_s`` stay whole-network averages (background members included).
``--starved`` is refused with it (background members have no Lifeguard local health).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field, replace

from gossip.config import GossipConfig
from gossip.events import Event, MemberDead, RecordChanged
from gossip.messages import MemberState
from gossip.sim import Simulation, StreamModel, few_collections

_KIND = "bench"


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100.0 * len(s)) - 1))]


@dataclass
class _Tracker:
    crashed_at: dict[str, float] = field(default_factory=dict)
    dead_seen: dict[str, dict[str, float]] = field(default_factory=dict)
    published: dict[tuple[str, int], float] = field(default_factory=dict)
    received: dict[tuple[str, int], dict[str, float]] = field(default_factory=dict)
    false_dead: set[str] = field(default_factory=set)
    partitioned: bool = False
    partition_dead: set[str] = field(default_factory=set)

    def on_event(self, nid: str, ev: Event) -> None:
        if isinstance(ev, MemberDead):
            if ev.node in self.crashed_at:
                self.dead_seen[ev.node].setdefault(nid, ev.at)
            elif self.partitioned:
                self.partition_dead.add(ev.node)
            else:
                self.false_dead.add(ev.node)
        elif isinstance(ev, RecordChanged) and ev.kind == _KIND:
            got = self.received.get((ev.origin, ev.counter))
            if got is not None:
                got.setdefault(nid, ev.at)


class _FullView:
    """Does every live node see every other live node alive? Cheap to ask often: it rechecks only
    the gaps of the first observer that still had some, and confirms with one full pass."""

    def __init__(self, sim: Simulation) -> None:
        self._sim = sim
        self._missing: dict[str, set[str]] | None = None

    def _gaps(self, obs: str, targets: list[str] | set[str]) -> set[str]:
        peer = self._sim.peer(obs)
        out = set()
        for t in targets:
            info = peer.member(t)
            if t != obs and (info is None or info.state != MemberState.ALIVE):
                out.add(t)
        return out

    def _scan(self, live: list[str]) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for obs in self._sim.live_observers():
            gaps = self._gaps(obs, live)
            if gaps:
                out[obs] = gaps
        return out

    def full(self) -> bool:
        live = self._sim.live_ids()
        if self._missing is None:
            self._missing = self._scan(live)
        for obs in list(self._missing):
            gaps = self._gaps(obs, self._missing[obs])
            if gaps:
                self._missing[obs] = gaps
                return False
            del self._missing[obs]
        self._missing = self._scan(live)
        return not self._missing


def _stream_counts(
    model: StreamModel | None, live: list[str], handshakes0: int, seconds: float
) -> dict[str, object]:
    """With ``--streams B``: the streams each live node holds at the end, and the handshakes
    per node per second over the measured window (each handshake has two ends)."""
    if model is None:
        return {}
    held = model.open_counts(live)
    return {
        "stream_bound": model.bound,
        "open_streams_mean": sum(held) / max(1, len(held)),
        "open_streams_max": max(held, default=0),
        "handshakes_per_node_per_s": 2 * (model.handshakes - handshakes0) / len(live) / seconds,
    }


MESSAGE_CPU_S = 60e-6
"""CPU to handle one gossip message and send its answer, measured on real members
(``bench.members``: ``cpu_us_per_message`` of pings and acks in steady state, 55-65 us)."""
HANDSHAKE_END_CPU_S = 1.5e-3
"""One end of a resumed stream handshake (``bench.costs``: 3.0 ms for both ends together)."""
VERIFY_CPU_S = 97e-6
"""One Ed25519 signature checked (``bench.costs``)."""


class _Counts:
    """The live observers' own counters, from the start of the measured window."""

    def __init__(self, sim: Simulation, model: StreamModel | None) -> None:
        self._sim, self._model = sim, model
        self._start = {nid: self._read(nid) for nid in sim.live_observers()}

    def _read(self, nid: str) -> tuple[int, int, int, int, int, int]:
        st = self._sim.nodes[nid].peer.stats
        ends = self._model.ends.get(nid, 0) if self._model is not None else 0
        checked = st.updates_applied + st.rejected_signature
        return (st.messages_out, st.messages_in, st.bytes_in, st.bytes_out, ends, checked)

    def result(self, seconds: float) -> dict[str, object]:
        # observers that crashed or restarted since are left out
        ids = [i for i in self._sim.live_observers() if i in self._start]
        sums = [0] * 6
        for nid in ids:
            now, then = self._read(nid), self._start[nid]
            for k in range(6):
                sums[k] += now[k] - then[k]
        per = [x / max(1, len(ids)) / seconds for x in sums]
        out: dict[str, object] = {
            "observers": len(self._sim.observer_ids),
            "observer_messages_out_per_s": per[0],
            "observer_messages_in_per_s": per[1],
            "observer_bytes_in_per_s": per[2],
            "observer_bytes_out_per_s": per[3],
        }
        if self._model is not None:
            held = self._model.open_counts(ids)
            out["observer_handshakes_per_s"] = per[4]
            out["observer_open_streams_mean"] = sum(held) / max(1, len(held))
            cpu_s = per[1] * MESSAGE_CPU_S + per[4] * HANDSHAKE_END_CPU_S + per[5] * VERIFY_CPU_S
            out["observer_signatures_checked_per_s"] = per[5]
            out["observer_cpu_model_pct"] = 100.0 * cpu_s
        return out


def run(
    nodes: int,
    loss: float,
    seconds: float,
    seed: int,
    starved: float = 0.0,
    publish_every_s: float = 2.0,
    crash_every_s: float | None = None,
    warmup_s: float = 5.0,
    progress_every_s: float | None = None,
    partition_s: float | None = None,
    streams: int = 0,
    observers: int | None = None,
    probe_rings: int | None = None,
) -> dict[str, object]:
    if observers is not None and starved:
        raise ValueError("--starved needs real cores: background members have no local health")
    t_wall = time.perf_counter()
    tr = _Tracker()
    model = StreamModel(streams) if streams else None
    rings = (lambda c: replace(c, probe_rings=probe_rings)) if probe_rings is not None else None
    sim = Simulation(
        n=nodes,
        seed=seed,
        loss=loss,
        on_event=tr.on_event,
        streams=model,
        observers=observers,
        config=rings,
    )
    setup_s = time.perf_counter() - t_wall
    rng = sim.rng
    ids = sorted(sim.nodes)
    n_starved = round(starved * nodes)
    starved_ids = set(rng.sample(ids, n_starved)) if n_starved else set()
    for nid in sorted(starved_ids):
        sim.starve(nid, period_s=1.0, stall_s=0.4)
    if crash_every_s is None:
        crash_every_s = max(10.0, seconds / max(1.0, nodes / 20.0))
    sim.run_until(warmup_s)
    bytes0 = sim.net.bytes
    rbytes0 = sim.net.record_bytes
    sent0 = sim.net.sent
    handshakes0 = model.handshakes if model is not None else 0
    counts = _Counts(sim, model)
    next_pub, next_crash = warmup_s, warmup_s + 1.0
    end = warmup_s + seconds
    quiet_after = end - 15.0  # leave time for the last changes to finish spreading
    next_progress = warmup_s + progress_every_s if progress_every_s else math.inf
    split_at = heal_at = math.inf
    if partition_s:
        split_at = warmup_s + max(1.0, (seconds - partition_s) / 3.0)
        heal_at = split_at + partition_s
    heal_s: float | None = None
    healed_at = 0.0
    view = _FullView(sim)
    while sim.now < end:
        step_to = min(next_pub, next_crash, end, split_at, heal_at)
        if tr.partitioned and sim.now >= heal_at:
            step_to = min(step_to, sim.now + 0.5)
        sim.run_until(step_to)
        now = sim.now
        if now >= split_at:
            split_at = math.inf
            half = [i for i in ids if sim.nodes[i].up]
            sim.partition(half[: len(half) // 2], half[len(half) // 2 :])
            tr.partitioned = True
        if now >= heal_at:
            heal_at = math.inf
            sim.heal()
            healed_at = now
        if tr.partitioned and split_at == heal_at == math.inf and view.full():
            tr.partitioned = False
            heal_s = now - healed_at
        if now >= next_progress:  # a line on stderr, so a long run that is cut short still tells
            next_progress += progress_every_s or math.inf
            line = {"sim_s": round(now - warmup_s, 1), "false_deaths": len(tr.false_dead)}
            line["wall_s"] = round(time.perf_counter() - t_wall, 1)
            print(json.dumps(line), file=sys.stderr, flush=True)
        if now >= next_pub:
            next_pub += publish_every_s
            if now < quiet_after and not tr.partitioned:
                origin = rng.choice([i for i in ids if sim.nodes[i].up])
                rec = sim.nodes[origin].peer.publish(_KIND, bytes(128), now)
                tr.published[(origin, rec.counter)] = now
                tr.received[(origin, rec.counter)] = {origin: now}
        if now >= next_crash:
            next_crash += crash_every_s
            if now < quiet_after and not tr.partitioned:
                cands = [i for i in ids if sim.nodes[i].up and i not in starved_ids]
                victim = rng.choice(cands)
                sim.crash(victim)
                tr.crashed_at[victim] = now
                tr.dead_seen[victim] = {}
    live = sim.live_observers()  # every live node, unless --observers
    gossip_s = GossipConfig(node_id="x", addr="x", boot_incarnation=0).gossip_interval_s
    diss_s: list[float] = []
    undelivered = 0
    for key, t0 in tr.published.items():
        got = tr.received[key]
        if all(i in got for i in live):
            diss_s.append(max(got[i] for i in live) - t0)
        else:
            undelivered += 1
    detect: list[float] = []
    undetected = 0
    for victim, t0 in tr.crashed_at.items():
        seen = tr.dead_seen[victim]
        if all(i in seen for i in live):
            detect.append(max(seen[i] for i in live) - t0)
        else:
            undetected += 1
    rounds = [d / gossip_s for d in diss_s]
    total = sim.net.bytes - bytes0
    records = sim.net.record_bytes - rbytes0
    rings_used = GossipConfig(node_id="x", addr="x", boot_incarnation=0).probe_rings
    return {
        "nodes": nodes,
        "probe_rings": rings_used if probe_rings is None else probe_rings,
        "loss": loss,
        "seconds": seconds,
        "seed": seed,
        "starved": starved,
        "dissemination_samples": len(diss_s),
        "dissemination_undelivered": undelivered,
        "dissemination_rounds_p50": _pct(rounds, 50),
        "dissemination_rounds_p99": _pct(rounds, 99),
        "dissemination_rounds_max": max(rounds, default=None),
        "dissemination_s_p50": _pct(diss_s, 50),
        "dissemination_s_p99": _pct(diss_s, 99),
        "dissemination_s_max": max(diss_s, default=None),
        "crashes": len(tr.crashed_at),
        "undetected": undetected,
        "detect_s_p50": _pct(detect, 50),
        "detect_s_p99": _pct(detect, 99),
        "false_deaths": len(tr.false_dead),
        "partition_s": partition_s,
        "partition_deaths": len(tr.partition_dead),
        "heal_s": heal_s,
        "bytes_per_node_per_s": total / nodes / seconds,
        "membership_bytes_per_node_per_s": (total - records) / nodes / seconds,
        "messages": sim.net.sent,
        "messages_out_per_node_per_s": (sim.net.sent - sent0) / nodes / seconds,
        **_stream_counts(model, [i for i in ids if sim.nodes[i].up], handshakes0, seconds),
        **counts.result(seconds),
        "setup_s": setup_s,
        "wall_s": time.perf_counter() - t_wall,
    }


_WORSE_IS_MORE = (
    "dissemination_undelivered",
    "dissemination_rounds_p50",
    "dissemination_rounds_p99",
    "dissemination_rounds_max",
    "dissemination_s_p50",
    "dissemination_s_p99",
    "dissemination_s_max",
    "undetected",
    "detect_s_p50",
    "detect_s_p99",
    "false_deaths",
    "partition_deaths",
    "heal_s",
    "bytes_per_node_per_s",
    "membership_bytes_per_node_per_s",
)
"""The figures a sweep also reports at their worst (the largest over its seeds)."""


def parse_seeds(text: str) -> list[int]:
    """``"1-8"``, ``"1,3,5"`` or a mix (``"1-4,9"``) as the list of seeds, in order."""
    seeds: list[int] = []
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            raise ValueError(f"seeds: {part.strip()!r} is not a number or a range a-b") from None
        if last < first:
            raise ValueError(f"seeds: the range {part.strip()!r} runs backwards")
        seeds.extend(range(first, last + 1))
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds: {text!r} names a seed twice")
    return seeds


def sweep(runs: list[dict[str, object]]) -> dict[str, object]:
    """One object for a run per seed: the median of every numeric field, the worst beside each
    figure where more is worse, and each seed's own object under ``runs``."""
    out: dict[str, object] = {}
    for key, first in runs[0].items():
        values = [r[key] for r in runs]
        nums = [float(v) for v in values if isinstance(v, int | float) and v is not True]
        if key == "seed" or not isinstance(first, int | float | None) or isinstance(first, bool):
            out[key] = first if all(v == first for v in values) else None
        elif not nums:
            out[key] = None
        else:
            out[key] = statistics.median(nums)
            if key in _WORSE_IS_MORE:
                out[f"{key}_worst"] = max(nums)
    out["nodes"], out["loss"], out["seconds"] = (
        runs[0]["nodes"],
        runs[0]["loss"],
        runs[0]["seconds"],
    )
    out["seeds"] = [r["seed"] for r in runs]
    slowest = max(runs, key=lambda r: _num(r["dissemination_rounds_max"]))
    out["worst_seed"] = slowest["seed"]
    out["wall_s"] = sum(_num(r["wall_s"]) for r in runs)
    out["runs"] = runs
    return out


def _num(v: object) -> float:
    return float(v) if isinstance(v, int | float) else -math.inf


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gossip", description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--loss", type=float, default=0.0)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--seeds",
        default=None,
        metavar="A-B",
        help="one run per seed (1-8, or 1,3,5); the median of each figure with the worst beside",
    )
    ap.add_argument("--starved", type=float, default=0.0, help="fraction of CPU-starved nodes")
    ap.add_argument("--publish-every", type=float, default=2.0)
    ap.add_argument("--crash-every", type=float, default=None)
    ap.add_argument(
        "--partition-s", type=float, default=None, help="split the nodes in two this long"
    )
    ap.add_argument(
        "--progress-every", type=float, default=None, help="simulated s between stderr lines"
    )
    ap.add_argument(
        "--streams",
        type=int,
        default=0,
        metavar="B",
        help="count streams (at most B per node) and their handshakes, as the real transport",
    )
    ap.add_argument(
        "--observers",
        type=int,
        default=None,
        metavar="S",
        help="only S real cores, the other nodes background members (counts from the S)",
    )
    ap.add_argument(
        "--probe-rings",
        type=int,
        default=None,
        metavar="K",
        help="probe and gossip over K rings (0: every member in turn; default: the config's)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object (the default)")
    a = ap.parse_args(argv)
    if a.observers is not None and a.starved:
        ap.error("--starved needs real cores: background members have no Lifeguard local health")
    try:
        seeds = parse_seeds(a.seeds) if a.seeds is not None else [a.seed]
    except ValueError as e:
        ap.error(str(e))
    runs = []
    for seed in seeds:
        with few_collections():
            runs.append(
                run(
                    a.nodes,
                    a.loss,
                    a.seconds,
                    seed,
                    a.starved,
                    a.publish_every,
                    a.crash_every,
                    progress_every_s=a.progress_every,
                    partition_s=a.partition_s,
                    streams=a.streams,
                    observers=a.observers,
                    probe_rings=a.probe_rings,
                )
            )
    result = runs[0] if a.seeds is None else sweep(runs)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
