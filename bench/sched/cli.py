"""Scheduling benchmark: Shoal's policy against first fit, EASY backfill and Gavel, side by side.

``python -m bench.sched --trace T --policy P [--cluster SPEC] [--gpus-per-node G] [--load X]
[--seed K] --json``

- ``--trace gavel-synthetic``: Gavel's job distribution (Philly durations and GPU counts, 26
  models) with Poisson arrivals at ``--load`` jobs per hour (a comma-separated list sweeps);
- ``--trace PATH`` to an openb pod list, with ``--nodes`` the node list: FGD's experiment (pods in
  a seeded order until they ask for ``--fill`` times the GPUs, none ever ending); the policy is
  told the workload's shapes from the whole list (``--workload list``, FGD's target workload) or
  only from the pods arrived so far (``--workload arrived``);
- ``--trace PATH`` to a CSV ``submit_time,duration_s,num_gpus[,gpu_type][,model]``.

``--costs same`` (the default): every policy pays the same costs for a preemption or a move
(the work since the job's last checkpoint, the stopping job's grace period, the restart) and
knows throughputs only as it learns them; ``--costs paper`` gives ``gavel`` its paper's free
preemption and true throughputs.

``--policy all`` runs every policy that applies, on the same jobs. Mesh policies (``shoal``,
``fifo``) run with ``--owners`` owners deciding from a view ``--gossip-delay`` seconds old;
central ones (``backfill``, ``gavel``, ``bestfit``) see the present. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.policy.config import OBJECTIVES, Objective, PolicyConfig
from bench.sched.cluster import NodeSpec, nodes_from_openb, nodes_from_spec
from bench.sched.engine import Simulation
from bench.sched.metrics import JobRecord, pct, ratios, summarize
from bench.sched.policies import BackfillCentral, BestFitCentral, FifoMesh, ShoalMesh
from bench.sched.simtypes import SimConfig
from bench.sched.teamstats import equal_quotas
from bench.sched.traces import TraceJob, gavel_synthetic, generic_csv, openb, openb_shapes
from bench.sched.truth import Truth

DEFAULT_CLUSTER = "v100:36,p100:36,k80:36"
TIME_POLICIES = ("fifo", "backfill", "gavel", "shoal")
FILL_POLICIES = ("fifo", "bestfit", "shoal")


def _is_openb(path: Path) -> bool:
    with path.open(newline="") as f:
        header = next(csv.reader(f), [])
    return "gpu_milli" in header


def _mesh_policy(name: str, objective: Objective = "performance") -> Any:
    table = {
        "shoal": lambda: ShoalMesh(PolicyConfig(objective=objective)),
        "fifo": FifoMesh,
        "backfill": BackfillCentral,
        "bestfit": BestFitCentral,
    }
    return table[name]()


def run_policy(
    name: str,
    nodes: Sequence[NodeSpec],
    jobs: Sequence[TraceJob],
    truth: Truth,
    sim_config: SimConfig,
    measure: tuple[int, int],
    wall_limit_s: float | None,
    costs: str = "same",
    objective: Objective = "performance",
) -> dict[str, Any]:
    started = time.perf_counter()
    total = sum(n.gpus for n in nodes)
    measured = set(range(*measure))
    if name == "gavel":
        try:
            import scipy  # noqa: F401
        except ImportError:
            return {"policy": name, "error": "needs SciPy (pip install scipy)"}
        from bench.sched.gavel_sim import Costs, GavelSim

        terms = Costs(
            costs,
            checkpoint_s=sim_config.checkpoint_s,
            grace_s=sim_config.grace_s,
            restart_s=sim_config.move_cost_s,
        )
        g = GavelSim(nodes, jobs, truth, measure=measure, costs=terms)
        g.run(wall_limit_s=wall_limit_s)
        records = [
            JobRecord(j.trace.index, j.trace.arrival_s, j.first_start, j.finish, j.trace.deadline_s)
            for j in g.jobs
        ]
        out = summarize(
            name,
            records,
            measured,
            total_gpus=total,
            busy_area=g.busy_area,
            idle_waiting_area=g.idle_waiting_area,
            waiting_time=g.waiting_time,
            decision_ms=g.decision_ms,
            extra={
                "rounds": len(g.decision_ms),
                "preemptions": g.preemptions,
                "moves": g.moves,
                "kept_to_checkpoint": g.kept,
                "lost_gpu_s": g.lost_gpu_s,
                "stopped_unfinished_at_s": g.gave_up_at,
            },
        )
        out["wall_s"] = time.perf_counter() - started
        return out
    policy = _mesh_policy(name, objective)
    config = sim_config
    if policy.central:
        from dataclasses import replace

        config = replace(sim_config, gossip_delay_s=0.0, owners=1)
    sim = Simulation(nodes, jobs, policy, truth, config, measure=measure)
    sim.run(wall_limit_s=wall_limit_s)
    records = [
        JobRecord(
            sj.trace.index,
            sj.trace.arrival_s,
            sj.first_start,
            sj.finish_at if sj.state == "done" else None,
            sj.trace.deadline_s,
        )
        for sj in sim.jobs.values()
    ]
    extra: dict[str, Any] = {
        "declines": sim.declines,
        "preemptions": sim.preemptions,
        "moves": sim.moves,
        "owners": config.owners,
        "gossip_delay_s": config.gossip_delay_s,
        "view_lag_s": config.view_lag_s if name == "shoal" else None,
        "quota_desk": config.quota_desk,
        "decision_cpu_ms_p50": pct(sim.decision_cpu_ms, 50),
        "decision_cpu_ms_p99": pct(sim.decision_cpu_ms, 99),
    }
    out = summarize(
        name,
        records,
        measured,
        total_gpus=total,
        busy_area=sim.busy_area,
        idle_waiting_area=sim.idle_waiting_area,
        waiting_time=sim.waiting_time,
        decision_ms=sim.decision_ms,
        tick_ms=sim.tick_ms,
        extra=extra,
    )
    if sim_config.fill:
        out.update(_fill_figures(sim, total))
    if sim.book is not None:
        sim.book.advance(sim.now, sim.running.values(), sim.pending.values())
        out.update(sim.book.figures())
    out["wall_s"] = time.perf_counter() - started
    return out


def _fill_figures(sim: Simulation, total: int) -> dict[str, Any]:
    """FGD's figures: GPUs left unallocated once the pods that arrived ask for 100% of the
    cluster's GPUs, and at the end (``--fill``)."""
    at_100 = None
    for arrived, alloc in sim.fill_points:
        if arrived >= total and at_100 is None:
            at_100 = 1.0 - alloc / total
    end = 1.0 - sim.alloc_gpus / total
    return {
        "unallocated_gpu_fraction": end,
        "unallocated_gpu_fraction_at_100": at_100,
        "allocated_gpus": sim.alloc_gpus,
        "pods_arrived": len(sim.jobs),
        "pods_failed": sim.dropped,
        "avg_jct_s": None,
        "p50_jct_s": None,
        "p99_jct_s": None,
        "makespan_s": None,
        "utilization": sim.alloc_gpus / total,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sched", description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default="gavel-synthetic")
    ap.add_argument("--policy", default="all")
    ap.add_argument("--cluster", default=DEFAULT_CLUSTER, help="TYPE:GPUS,... (not for openb)")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--nodes", type=Path, default=None, help="openb node list")
    ap.add_argument("--load", default="4", help="jobs/hour (gavel-synthetic); a list sweeps: 2,4,6")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=1000, help="jobs in the synthetic trace")
    ap.add_argument("--window", default="0.5:0.75", help="fraction of jobs measured for JCT, LO:HI")
    ap.add_argument("--single-gpu", action="store_true", help="Gavel's continuous-single trace")
    ap.add_argument("--priorities", action="store_true", help="20%% of jobs at priority 1")
    ap.add_argument("--owners", type=int, default=16)
    ap.add_argument("--gossip-delay", type=float, default=2.0)
    ap.add_argument(
        "--view-lag",
        type=float,
        default=0.0,
        help="seconds more that half of the owners' views lag (owners whose views differ)",
    )
    ap.add_argument("--fill", type=float, default=1.3, help="openb: GPUs asked / cluster's")
    ap.add_argument(
        "--workload",
        choices=("list", "arrived"),
        default=None,
        help="openb (default list): the task shapes fragmentation is measured against: the "
        "whole pod list's (FGD's target workload) or the pods' arrived so far",
    )
    ap.add_argument("--truth-noise", type=float, default=0.0)
    ap.add_argument(
        "--costs",
        choices=("same", "paper"),
        default="same",
        help="same: Gavel pays the mesh's preemption costs and learns throughputs; "
        "paper: its paper's free preemption and true throughputs",
    )
    ap.add_argument(
        "--teams",
        type=int,
        default=0,
        help="gavel-synthetic: jobs drawn among N equal teams, each guaranteed 1/N of the GPUs "
        "and at most 2/N; reports the teams' figures",
    )
    ap.add_argument(
        "--desk",
        action="store_true",
        help="with --teams: a quota desk refuses a start past its team's maximum",
    )
    ap.add_argument(
        "--team-max",
        type=float,
        default=None,
        help="with --teams: each team's maximum, as a multiple of its guarantee (default 2)",
    )
    ap.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="performance",
        help="what the shoal policy optimizes (an agent's objective setting)",
    )
    ap.add_argument("--wall-limit", type=float, default=None, help="seconds per policy run")
    ap.add_argument("--json", action="store_true", help="print one JSON object (the default)")
    a = ap.parse_args(argv)

    path = None if a.trace == "gavel-synthetic" else Path(a.trace)
    fill = path is not None and _is_openb(path)
    names = (
        (FILL_POLICIES if fill else TIME_POLICIES)
        if a.policy == "all"
        else tuple(p.strip() for p in a.policy.split(","))
    )
    truth = Truth(a.truth_noise, a.seed)
    if fill:
        if a.nodes is None:
            ap.error("an openb pod list needs --nodes (the node list)")
        nodes = nodes_from_openb(a.nodes)
    else:
        nodes = nodes_from_spec(a.cluster, a.gpus_per_node)
    total = sum(n.gpus for n in nodes)
    loads = [float(x) for x in a.load.split(",")]
    if a.teams and path is not None:
        ap.error("--teams draws teams in the synthetic trace only")
    if not a.teams and (a.desk or a.team_max is not None):
        ap.error("--desk and --team-max go with --teams")
    if a.team_max is not None and a.team_max < 1:
        ap.error("--team-max must be at least 1 (a maximum below the guarantee)")
    if a.workload is not None and not fill:
        ap.error("--workload goes with an openb pod list")
    if a.view_lag < 0:
        ap.error("--view-lag must not be negative")
    if a.view_lag > 0 and ("shoal" not in names or a.owners < 2):
        ap.error("--view-lag lags half of the shoal policy's owners: needs shoal, --owners 2+")
    team_max = 2.0 if a.team_max is None else a.team_max
    workload = a.workload or "list"
    quotas = equal_quotas(a.teams, total, team_max) if a.teams > 0 else ()
    shapes = openb_shapes(path) if fill and path is not None and workload == "list" else ()
    sim_config = SimConfig(
        owners=a.owners,
        gossip_delay_s=a.gossip_delay,
        view_lag_s=a.view_lag,
        quota_desk=a.desk,
        fill=fill,
        quotas=quotas,
        shapes=shapes,
    )
    runs: list[dict[str, Any]] = []
    for load in loads if not fill and path is None else [loads[0]]:
        if path is None:
            jobs = gavel_synthetic(
                a.jobs,
                load,
                a.seed,
                multi_gpu=not a.single_gpu,
                gpus_per_node=a.gpus_per_node,
                priorities=a.priorities,
                teams=a.teams,
            )
        elif fill:
            jobs = openb(path, a.seed, fill=a.fill, capacity_gpus=total, interval_s=1.0 / load)
        else:
            types = [n.model for n in nodes]
            jobs = generic_csv(path, a.seed, truth, sorted(set(types)), a.gpus_per_node)
            if load != 1.0:
                from dataclasses import replace

                jobs = [replace(j, arrival_s=j.arrival_s / load) for j in jobs]
        lo, hi = (float(x) for x in a.window.split(":"))
        measure = (int(lo * len(jobs)), max(int(hi * len(jobs)), int(lo * len(jobs)) + 1))
        if fill:
            measure = (0, len(jobs))
        results = [
            run_policy(
                name, nodes, jobs, truth, sim_config, measure, a.wall_limit, a.costs, a.objective
            )
            for name in names
        ]
        runs.append(
            {
                "load": load,
                "jobs_in_trace": len(jobs),
                "results": results,
                "ratios": ratios(results),
            }
        )
    doc = {
        "trace": a.trace,
        "cluster": a.cluster if not fill else str(a.nodes),
        "nodes": len(nodes),
        "gpus": total,
        "gpus_per_node": a.gpus_per_node,
        "seed": a.seed,
        "owners": a.owners,
        "gossip_delay_s": a.gossip_delay,
        "costs": a.costs,
        "teams": a.teams,
        "objective": a.objective,
        "workload": workload if fill else None,
        "runs": runs,
    }
    json.dump(doc, sys.stdout)
    sys.stdout.write("\n")
    return 0
