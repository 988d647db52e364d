"""Real-process gossip benchmark: N standalone members on loopback over mutual TLS.

``python -m bench.members --members 32 [--idle-s 30] [--kills 3] [--starve-s 60] --json``

Every member is a ``python -m gossip`` process; all of them start at once, every one joining
member 0. Measured (see BENCHMARKS.md, "real processes"):

- converged_s: from the moment the last member said it listens until every member sees every
  other alive; start_false_deaths / start_suspicions: Deads and Suspects of live members until
  then (and until the idle window ends);
- ``formation`` (per member from the first member listening until a full view everywhere) and
  ``steady`` (over the idle window): TLS handshakes, streams opened and evicted per second,
  streams held, and per kind of message received (ping, ack, indirect, nack, push_pull, gossip)
  messages per second and CPU microseconds per message; ``handshakes_per_s`` and
  ``streams_opened_per_s`` / ``streams_evicted_per_s`` at the top level are the steady ones;
- the idle footprint over ``--idle-s`` seconds, ``--settle-s`` after the last member was ready
  (the start-up's catch-up exchanges over): CPU % of one core and RSS per member, established
  TCP connections per member, and each counter a member keeps per member per second
  (``idle_rates``: messages, bytes, handshakes...);
- ``--kills`` trials: kill -9 of one member, until every other declares it dead (detect_s), then
  its restart on the same address until every member sees it alive again (rejoin_s);
- ``--starve-s`` seconds of SIGSTOP 400 ms / SIGCONT 600 ms on one member, then 10 s to settle:
  starve_false_deaths (any live member declared dead), starve_suspicions of the starved one.

false_deaths counts every Dead of a live member over the whole run (a restarted member's earlier
life excepted). ``--source DIR`` runs the members from another checkout, to compare two versions
side by side on one machine. The machine's load average is reported at the start and the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from agent.sandbox.localmesh import free_ports
from bench.memberprocs import STATE_OF_EVENT, MemberProc, MemberSet
from gossip.identity import enroll_node, init_cluster

DEADLINE_S = 120.0
START_S_PER_MEMBER = 2.0
"""Starting N interpreters at once on two cores takes about a second of CPU each (imports, keys,
TLS contexts): the wait for every member to listen grows with N (128 members at load 8 did not
all listen within 120 s). Convergence is measured from the last one listening, so this only
bounds the wait."""
STARVE_STOP_S, STARVE_CONT_S = 0.4, 0.6
STARVE_SETTLE_S = 10.0


@dataclass
class _Run:
    """What the members reported, as the scenario goes."""

    procs: MemberSet
    ids: dict[int, str]
    phase: str = "start"
    restarted_wall: dict[str, float] = field(default_factory=dict)
    """A restarted member's start (wall clock): a Dead of an incarnation below is of its
    earlier life."""
    down: set[str] = field(default_factory=set)
    false_deaths: dict[str, int] = field(default_factory=dict)
    suspicions: dict[str, int] = field(default_factory=dict)
    suspected: dict[str, set[str]] = field(default_factory=dict)
    dead_at: dict[str, dict[int, float]] = field(default_factory=dict)
    changed_at: dict[int, float] = field(default_factory=dict)

    def pump(self, wait_s: float = 0.05) -> None:
        """Apply every line read so far (waiting up to ``wait_s`` for the first)."""
        lines = self.procs.lines
        try:
            item = lines.get(timeout=wait_s)
        except Exception:
            return
        while True:
            self._apply(*item)
            try:
                item = lines.get_nowait()
            except Exception:
                return

    def _apply(self, read_at: float, index: int, line: dict[str, object]) -> None:
        member = self.procs.members[index]
        event = line.get("event")
        if event == "listening":
            member.node_id, member.ready_at = str(line["node"]), read_at
            return
        if event == "view":
            stats = line.get("stats")
            if isinstance(stats, dict):
                member.stats = {str(k): int(v) for k, v in stats.items()}
                member.stats_at = read_at
            return
        state = STATE_OF_EVENT.get(str(event))
        node = str(line.get("node", ""))
        if state is None or not node or node == member.node_id:
            return
        at = line.get("at")
        at_s = float(at) if isinstance(at, int | float) else read_at
        member.view[node] = state
        self.changed_at[index] = at_s
        if state == "suspect":
            self.suspicions[self.phase] = self.suspicions.get(self.phase, 0) + 1
            self.suspected.setdefault(self.phase, set()).add(node)
        elif state == "dead":
            self.dead_at.setdefault(node, {})[index] = at_s
            incarnation = line.get("incarnation")
            earlier_life = isinstance(incarnation, int) and incarnation < int(
                self.restarted_wall.get(node, 0.0)
            )
            if node not in self.down and not earlier_life:
                self.false_deaths[self.phase] = self.false_deaths.get(self.phase, 0) + 1

    def running(self) -> list[MemberProc]:
        return [m for m in self.procs.members if m.running]

    def wait(self, what: str, check: object, deadline_s: float = DEADLINE_S) -> float:
        """Pump until ``check()`` holds; the monotonic time it first did."""
        assert callable(check)
        until = time.monotonic() + deadline_s
        while time.monotonic() < until:
            self.pump()
            if check():
                return time.monotonic()
        views = {m.index: [*sorted(set(m.view.values())), len(m.view)] for m in self.procs.members}
        raise TimeoutError(f"timed out after {deadline_s:.0f} s waiting for {what}: {views}")

    def all_see_all(self) -> bool:
        live = self.running()
        if any(m.ready_at is None for m in live):
            return False
        ids = {m.node_id for m in live}
        return all(m.sees_all_alive(ids - {m.node_id}) for m in live)

    def sleep(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            self.pump(min(0.05, max(0.0, until - time.monotonic())))


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _rates(
    before: dict[int, dict[str, int]], after: list[MemberProc], seconds: float
) -> dict[str, float]:
    """Each counter's growth per member per second over the window."""
    totals: dict[str, float] = {}
    for m in after:
        old = before.get(m.index, {})
        for key, value in m.stats.items():
            if key in old and not key.endswith("_ms") and key != "streams_open":
                totals[key] = totals.get(key, 0.0) + value - old[key]
    n = max(1, len(after))
    return {k: round(v / n / seconds, 3) for k, v in sorted(totals.items()) if v}


KINDS = ("ping", "ack", "indirect", "nack", "push_pull", "gossip", "other")


def _costs(
    before: dict[int, dict[str, int]], after: dict[int, dict[str, int]], seconds: float
) -> dict[str, object]:
    """Per member over a window (``before`` empty: since each member started): handshakes and
    streams opened and evicted per second, streams held at the end, and per message kind
    received, messages per second and CPU microseconds per message (handling it and sending
    what it caused)."""
    n = max(1, len(after))

    def grown(key: str) -> float:
        return sum(a.get(key, 0) - before.get(i, {}).get(key, 0) for i, a in after.items())

    by_kind: dict[str, float] = {}
    cpu_per: dict[str, float] = {}
    for kind in KINDS:
        count = grown(f"messages_in_{kind}")
        if count > 0:
            by_kind[kind] = round(count / n / seconds, 3)
            cpu_per[kind] = round(grown(f"cpu_us_{kind}") / count, 1)
    return {
        "seconds": round(seconds, 1),
        "handshakes_per_s": round(grown("handshakes") / n / seconds, 3),
        "streams_opened_per_s": round(grown("streams_opened") / n / seconds, 3),
        "streams_evicted_per_s": round(grown("streams_evicted") / n / seconds, 3),
        "streams_open_mean": round(sum(a.get("streams_open", 0) for a in after.values()) / n, 1),
        "messages_in_per_s": by_kind,
        "cpu_us_per_message": cpu_per,
    }


def _collect_stats(run: _Run) -> dict[int, dict[str, int]]:
    asked = time.monotonic()
    run.procs.ask_stats()
    live = run.running()
    run.wait("every member's counters", lambda: all(m.stats_at >= asked for m in live), 30.0)
    return {m.index: dict(m.stats) for m in live}


def _idle(run: _Run, idle_s: float, before: dict[int, dict[str, int]]) -> dict[str, object]:
    live = run.running()
    cpu0 = {m.index: m.cpu_s() for m in live}
    t0 = time.monotonic()
    run.sleep(idle_s / 2)
    conns = [m.tcp_connections() for m in live]
    run.sleep(max(0.0, t0 + idle_s - time.monotonic()))
    took = time.monotonic() - t0
    cpu = [100.0 * (m.cpu_s() - cpu0[m.index]) / took for m in live]
    rss = [m.rss_bytes() / 2**20 for m in live]
    after = _collect_stats(run)
    steady = _costs(before, after, took)
    return {
        "handshakes_per_s": steady["handshakes_per_s"],
        "streams_opened_per_s": steady["streams_opened_per_s"],
        "streams_evicted_per_s": steady["streams_evicted_per_s"],
        "steady": steady,
        "idle_s": round(took, 1),
        "idle_cpu_pct_mean": _r(statistics.fmean(cpu), 3),
        "idle_cpu_pct_max": _r(max(cpu), 3),
        "idle_rss_mb_mean": _r(statistics.fmean(rss), 1),
        "idle_rss_mb_max": _r(max(rss), 1),
        "tcp_connections_mean": _r(statistics.fmean(conns), 1),
        "tcp_connections_max": max(conns),
        "idle_rates": _rates(before, live, took),
    }


def _kill_trial(run: _Run, victim: MemberProc, join: list[str]) -> tuple[float, float]:
    node = victim.node_id
    run.dead_at.pop(node, None)
    run.down.add(node)
    killed_at = time.monotonic()
    run.procs.kill(victim)
    others = [m for m in run.running()]
    run.wait(
        "the kill to be seen by all", lambda: all(m.view.get(node) == "dead" for m in others), 60.0
    )
    seen = run.dead_at.get(node, {})
    detect_s = max(seen[m.index] for m in others) - killed_at
    run.restarted_wall[node] = time.time()
    run.procs.start(victim, join)
    run.wait("the restarted member to listen", lambda: victim.ready_at is not None, 60.0)
    ready = victim.ready_at or 0.0
    run.down.discard(node)
    back = run.wait("the restarted member alive everywhere", run.all_see_all, 60.0)
    return detect_s, max(0.0, back - ready)


def _starve(run: _Run, victim: MemberProc, seconds: float) -> dict[str, object]:
    run.phase = "starve"
    stop = threading.Event()

    def toggle() -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until and not stop.is_set():
            run.procs.signal(victim, signal.SIGSTOP)
            time.sleep(STARVE_STOP_S)
            run.procs.signal(victim, signal.SIGCONT)
            time.sleep(STARVE_CONT_S)
        run.procs.signal(victim, signal.SIGCONT)

    thread = threading.Thread(target=toggle, daemon=True)
    thread.start()
    try:
        run.sleep(seconds)
    finally:
        stop.set()
        thread.join()
    run.sleep(STARVE_SETTLE_S)
    suspected = run.suspected.get("starve", set())
    return {
        "starve_s": seconds,
        "starve_false_deaths": run.false_deaths.get("starve", 0),
        "starve_suspicions": run.suspicions.get("starve", 0),
        "starve_suspected_others": len(suspected - {victim.node_id}),
    }


def run(
    members: int,
    idle_s: float = 30.0,
    settle_s: float = 30.0,
    kills: int = 3,
    starve_s: float = 60.0,
    source: Path | None = None,
    seed: int = 1,
) -> dict[str, object]:
    t_wall = time.monotonic()
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="shoal-members-") as tmp:
        root = Path(tmp)
        now = datetime.now(UTC)
        ca = init_cluster(root / "cluster", "bench-members", "op", now).ca
        procs = MemberSet(source)
        ports = free_ports(members)
        ids: dict[int, str] = {}
        for i in range(members):
            identity = enroll_node(
                ca, root / f"m{i:03d}", "agent", ["127.0.0.1"], timedelta(hours=4), now
            )
            ids[i] = identity.node_id
            procs.add(root / f"m{i:03d}", f"127.0.0.1:{ports[i]}")
        join = [procs.members[0].listen]
        result: dict[str, object] = {"members": members, "source": str(source or "")}
        state = _Run(procs, ids)
        try:
            for m in procs.members:  # all at once; member 0 is everyone's seed
                procs.start(m, join if m.index else [])
            state.wait(
                "every member to listen",
                lambda: all(m.ready_at for m in procs.members),
                max(DEADLINE_S, START_S_PER_MEMBER * members),
            )
            last_ready = max(m.ready_at or 0.0 for m in procs.members)
            result["start_spread_s"] = _r(
                last_ready - min(m.ready_at or 0.0 for m in procs.members), 2
            )
            state.wait("a full view everywhere", state.all_see_all)
            converged_at = max(state.changed_at.values(), default=last_ready)
            result["converged_s"] = _r(max(0.0, converged_at - last_ready))
            formed = _collect_stats(state)
            first_ready = min(m.ready_at or last_ready for m in procs.members)
            result["formation"] = _costs({}, formed, time.monotonic() - first_ready)
            state.sleep(max(0.0, last_ready + settle_s - time.monotonic()))
            state.phase = "idle"
            result.update(_idle(state, idle_s, _collect_stats(state)))
            result["start_false_deaths"] = state.false_deaths.get("start", 0) + (
                state.false_deaths.get("idle", 0)
            )
            result["start_suspicions"] = state.suspicions.get("start", 0)
            result["idle_suspicions"] = state.suspicions.get("idle", 0)
            state.phase = "kill"
            detect: list[float] = []
            rejoin: list[float] = []
            others = procs.members[1:] or procs.members
            for trial in range(kills):
                victim = others[(seed + 7 * trial) % len(others)]
                detect_s, rejoin_s = _kill_trial(state, victim, join)
                detect.append(detect_s)
                rejoin.append(rejoin_s)
                state.sleep(3.0)
            result["detect_s"] = [round(d, 2) for d in detect]
            result["detect_s_median"] = _r(statistics.median(detect) if detect else None, 2)
            result["detect_s_max"] = _r(max(detect) if detect else None, 2)
            result["rejoin_s"] = [round(r, 2) for r in rejoin]
            result["kill_false_deaths"] = state.false_deaths.get("kill", 0)
            if starve_s > 0:
                victim = others[(seed + 3) % len(others)]
                result.update(_starve(state, victim, starve_s))
            result["false_deaths"] = sum(state.false_deaths.values())
        finally:
            procs.stop_all()
    result["load_avg_start"] = [round(x, 2) for x in load_start]
    result["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    result["wall_s"] = round(time.monotonic() - t_wall, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    doc = (__doc__ or "").split("\n")[0]
    ap = argparse.ArgumentParser(prog="python -m bench.members", description=doc)
    ap.add_argument("--members", type=int, default=32)
    ap.add_argument("--idle-s", type=float, default=30.0)
    ap.add_argument("--settle-s", type=float, default=30.0, help="from the last ready to idle")
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--starve-s", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--source", type=Path, default=None, help="run the members from this tree")
    ap.add_argument("--json", action="store_true", help="print one JSON object (the default)")
    a = ap.parse_args(argv)
    result = run(a.members, a.idle_s, a.settle_s, a.kills, a.starve_s, a.source, a.seed)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
