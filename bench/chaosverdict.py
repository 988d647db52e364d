"""The chaos run's verdict: what the agents' records and logs say happened, judged against the
invariants (no job lost, none run twice at once outside a partition's window, every requeue after
its attempt ended). :mod:`bench.chaos` injects the faults and calls :func:`verdict`.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import TYPE_CHECKING, Any

from agent.sandbox.localmesh import LocalMesh
from bench.chaosledger import checkpoint_disorders, finished, overlaps, reruns_after_success

if TYPE_CHECKING:
    from bench.chaos import Chaos

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
LIVE = frozenset({"pending", "placing", "running", "migrating"})
PARTITION_SETTLE_S = 15.0
"""After a heal, how long a job's rerun still counts as the partition's (each side may have run
it: at-least-once, as the threat model in docs/security/ says), not as a fault of its own."""
WAIT_REASONS_KEPT = 6
"""The last reasons a killed agent's job gave while it waited to run again, as reported."""


NOT_OWNED = re.compile(r" (INFO|WARNING|ERROR|CRITICAL) .*(report|checkpoint) of .*not owned")
LEVEL = re.compile(r"^\S+ \S+ (\S+) (WARNING|ERROR|CRITICAL) (.*)$")


def log_figures(mesh: LocalMesh) -> dict[str, Any]:
    not_owned = 0
    errors: Counter[str] = Counter()
    for agent in mesh.agents:
        try:
            text = agent.log_path.read_text(errors="replace")
        except OSError:
            continue
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if NOT_OWNED.search(line):
                not_owned += 1
            m = LEVEL.match(line)
            if m and m.group(2) != "WARNING":
                errors[re.sub(r"[0-9a-f]{8,}", "<id>", m.group(3))[:160]] += 1
            elif line.startswith("Traceback"):
                errors[re.sub(r"[0-9a-f]{8,}", "<id>", traceback_line(lines, i))[:300]] += 1
    return {
        "report_not_owned_lines": not_owned,
        "agent_log_errors": sum(errors.values()),
        "agent_log_error_samples": [f"{n}x {msg}" for msg, n in errors.most_common(5)],
    }


def traceback_line(lines: list[str], start: int) -> str:
    """The traceback starting at ``lines[start]`` in one line: where it was raised (its last
    frame) and the exception, so a sample says what failed without the folder kept."""
    frame, i = "", start + 1
    while i < len(lines) and (lines[i].startswith(" ") or not lines[i]):
        if lines[i].lstrip().startswith("File "):
            frame = lines[i].strip()
        i += 1
    exception = lines[i] if i < len(lines) else ""
    return f"Traceback: {frame}: {exception}"


def attempt_ended_after(record: dict[str, Any], node_id: str, killed_at: float) -> float | None:
    """From a kill to its owner ending the job's last attempt begun on the killed node (lost:
    requeued), by the job's record: 0 when it had ended before (a move off the node); None
    when the record names no such attempt, or that attempt has not ended."""
    there = [
        a
        for a in record.get("attempts") or ()
        if a.get("node") == node_id and float(a.get("started_at") or 0.0) <= killed_at
    ]
    if not there:
        return None
    last = max(there, key=lambda a: int(a.get("attempt") or 0))
    if last.get("finished_at") is None:
        return None
    return max(0.0, float(last["finished_at"]) - killed_at)


def verdict(chaos: Chaos) -> dict[str, Any]:
    by_job = chaos.ledger.by_job()
    states = Counter(chaos.records.get(j, {}).get("state", "unknown") for j in chaos.submitted)
    lost: list[str] = []
    waiting: list[str] = []
    unfinished: list[str] = []
    fake_success: list[str] = []
    for job_id in chaos.submitted:
        rec = chaos.records.get(job_id)
        if rec is None or rec.get("state") == "lost":
            lost.append(job_id)
        elif rec.get("state") == "succeeded":
            if finished(by_job.get(job_id, [])) is None:
                fake_success.append(job_id)
        elif rec.get("state") in LIVE:
            (waiting if rec.get("state") == "pending" and rec.get("reason") else unfinished).append(
                job_id
            )
    unlisted, stale = disagreements(chaos)
    failed = [j for j in chaos.submitted if chaos.records.get(j, {}).get("state") == "failed"]
    twice = [o for runs in by_job.values() for o in overlaps(runs)]
    disorders = [d for runs in by_job.values() for d in checkpoint_disorders(runs)]
    reruns = [d for runs in by_job.values() for d in reruns_after_success(runs)]
    windows = [
        (f["_started"], f["_healed"] + PARTITION_SETTLE_S)
        for f in chaos.faults
        if f["fault"] == "partition"
    ]

    def in_partition(*times: float) -> bool:
        return any(lo <= t <= hi for lo, hi in windows for t in times)

    twice_outside = [o for o in twice if not in_partition(o.second_start_t)]
    reruns_outside = [r for r in reruns if not in_partition(r.start_t, r.finished_t)]
    # A side of a partition resumes from the checkpoint it holds, older than one the other side
    # made: at least once across a partition, as for the runs themselves.
    disorders_outside = [d for d in disorders if not in_partition(d.start_t)]
    recoveries: list[float] = []
    requeues: list[float] = []
    faults = []
    for fault in chaos.faults:
        if fault["fault"] == "kill" and "_killed_at" in fault:
            killed_at, jobs = fault.pop("_killed_at"), fault.pop("_jobs")
            waited, owned = fault.pop("_waited"), fault.pop("_owned")
            back_by_job = {
                j: min(r.start_t for r in by_job.get(j, []) if r.start_t > killed_at) - killed_at
                for j in jobs
                if chaos.restarted_after(j, killed_at)
            }
            back = list(back_by_job.values())
            fault["recovery_s"] = round(max(back), 3) if back else (0.0 if not jobs else None)
            victim = chaos.mesh.agents[fault["agent"]].node_id
            ended_by_job = {
                j: e
                for j in jobs
                if (e := attempt_ended_after(chaos.records.get(j, {}), victim, killed_at))
                is not None
            }
            fault["jobs_back"] = [
                {
                    "job": j,
                    "kind": sub.kind if (sub := chaos.submitted.get(j)) is not None else None,
                    "recovery_s": round(t, 3),
                    "requeue_s": None if (e := ended_by_job.get(j)) is None else round(e, 3),
                    "owned_there": j in owned,
                    "reasons": waited.get(j, [])[-WAIT_REASONS_KEPT:],
                }
                for j, t in sorted(back_by_job.items(), key=lambda kv: -kv[1])
            ]
            ended = list(ended_by_job.values())
            fault["requeue_s"] = round(max(ended), 3) if ended else None
            if fault["requeue_s"] is not None:
                requeues.append(fault["requeue_s"])
            fault["jobs_not_run_again"] = sorted(  # nor finished before the kill
                j
                for j in jobs
                if not chaos.restarted_after(j, killed_at) and finished(by_job.get(j, [])) is None
            )
            if fault["recovery_s"] is not None:
                recoveries.append(fault["recovery_s"])
        elif fault["fault"] == "partition":
            started, healed = fault.pop("_started"), fault.pop("_healed")
            fault["runs_started_during"] = sum(
                1 for r in chaos.ledger.runs.values() if started <= r.start_t <= healed
            )
            if fault["heal_converged_s"] is not None:
                recoveries.append(fault["heal_converged_s"])
        faults.append(fault)
    unrecovered = [f for f in faults if f.get("recovery_s", 0) is None] + [
        f for f in faults if f["fault"] == "partition" and f["heal_converged_s"] is None
    ]
    return {
        "nodes": len(chaos.mesh.agents),
        "jobs_submitted": len(chaos.submitted),
        "jobs_succeeded": states["succeeded"],
        "jobs_failed": states["failed"],
        "jobs_cancelled": states["cancelled"],
        "jobs_lost": len(lost) + len(fake_success),
        "jobs_waiting_with_reason": len(waiting),
        "jobs_unfinished": len(unfinished),
        "jobs_run_twice_concurrently": len({o.job for o in twice}),
        "jobs_run_twice_concurrently_outside_partition": len({o.job for o in twice_outside}),
        "checkpoints_out_of_order": len(disorders),
        "checkpoints_out_of_order_outside_partition": len(disorders_outside),
        "jobs_run_again_after_success": len(reruns),
        "jobs_run_again_after_success_outside_partition": len(reruns_outside),
        "max_recovery_s": max(recoveries) if recoveries else None,
        "max_requeue_s": max(requeues) if requeues else None,
        "invariants": {
            "all_ended_or_waiting_with_reason": not unfinished,
            "none_lost": not lost and not fake_success,
            "none_ran_twice_at_once_outside_partition": not twice_outside,
            "checkpoints_in_order_outside_partition": not disorders_outside,
            "none_ran_again_after_success_outside_partition": not reruns_outside,
            "all_recovered": not unrecovered,
            "every_agent_lists_every_job": not unlisted and not stale,
        },
        "jobs_unlisted_somewhere": len(unlisted),
        "jobs_stale_somewhere": len(stale),
        "faults": faults,
        "submit_failures": len(chaos.submit_failures),
        "submit_failures_that_exist": sum(1 for j in chaos.unanswered if j in chaos.records),
        "runs": len(chaos.ledger.runs),
        "runs_resumed": sum(1 for r in chaos.ledger.runs.values() if r.resumed_from),
        "ledger_malformed": chaos.ledger.malformed,
        "details": {
            "lost": lost,
            "succeeded_unfinished": fake_success,
            "unfinished": {j: chaos.records[j].get("state") for j in unfinished},
            "unlisted": unlisted,
            "stale": stale,
            "run_twice": [o.__dict__ for o in twice],
            "checkpoint_disorders": [d.line for d in disorders],
            "reruns_after_success": [r.line for r in reruns],
            "reruns_after_success_outside_partition": [r.line for r in reruns_outside],
            "submit_failures": chaos.submit_failures[:10],
            "failed": {j: chaos.records[j].get("reason") for j in failed},
        },
    }


def disagreements(chaos: Chaos) -> tuple[dict[str, list[int]], dict[str, dict[int, str]]]:
    """Ended jobs some live agent does not list at all, or lists in another state (at the
    end, once every job ended or waits: every agent's listing should say the same)."""
    unlisted: dict[str, list[int]] = {}
    stale: dict[str, dict[int, str]] = {}
    for job_id in chaos.submitted:
        newest = chaos.records.get(job_id, {}).get("state")
        if newest not in TERMINAL:
            continue
        for index, listing in sorted(chaos.listed.items()):
            seen = listing.get(job_id)
            if seen is None:
                unlisted.setdefault(job_id, []).append(index)
            elif seen.get("state") != newest:
                stale.setdefault(job_id, {})[index] = str(seen.get("state"))
    return unlisted, stale
