"""The one-line answers: why a job waits, and whether it can ever run.

A job that *never fits* (no node could host it even idle: "never fits: no node has 80 GiB per
GPU") is told so at submission. A job that *waits for busy capacity* is told what it waits for and,
where the forecast knows, which node frees it and when ("waiting: no node has 2 free GPUs of
>= 80 GiB now; best candidate a100-02 frees 2 GPUs in ~14 min").
"""

from __future__ import annotations

from collections import Counter

from agent.job.jobspec import IMAGE_HOST
from agent.policy.context import Context, req_key
from agent.policy.filters import gib, static_fit
from agent.policy.snapshot import Job
from agent.policy.state import PolicyState


def about(seconds: float) -> str:
    """``~14 min``, ``~2.5 h``, ``~3 d``."""
    if seconds < 90:
        return f"~{max(seconds, 0):.0f} s"
    if seconds < 5400:
        return f"~{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"~{seconds / 3600:.1f} h"
    return f"~{seconds / 86400:.1f} d"


def needs(job: Job) -> str:
    """What the job needs, in words: ``2 free GPUs of >= 80 GiB (backend cuda)``."""
    if job.gpus_per_node == 0:
        what = f"{job.cpu_milli / 1000:g} free CPUs" if job.cpu_milli else "room"
    elif job.is_share:
        size = (
            gib(job.share_mem_bytes)
            if job.share_mem_bytes is not None
            else f"{job.share_fraction:g} of a GPU"
        )
        what = f"a GPU with {size} free"
    else:
        n = job.gpus_per_node
        what = f"{n} free GPU" + "s" * (n != 1)
        if job.gpus_max_per_node is not None:
            what += f" (it takes up to {job.gpus_max_per_node})"
        if job.min_mem_per_gpu_bytes:
            what += f" of >= {gib(job.min_mem_per_gpu_bytes)}"
    extra = []
    if job.backends:
        extra.append("backend " + "/".join(job.backends))
    if job.models:
        extra.append("model " + "/".join(job.models))
    if job.min_compute_capability:
        extra.append(f"compute capability >= {job.min_compute_capability}")
    if job.archs:
        extra.append("arch " + "/".join(job.archs))
    if job.interconnect and job.gpus_per_node > 1:
        extra.append(f"linked by {job.interconnect}")
    if extra:
        what += " (" + ", ".join(extra) + ")"
    if job.is_gang:
        what += f" on each of {job.nodes} nodes"
    return what


def static_key(job: Job) -> tuple[object, ...]:
    return (
        *req_key(job),
        job.nodes,
        job.os,
        tuple(sorted(job.affinity.items())),
        tuple(sorted(job.anti_affinity.items())),
        job.max_cost_per_hour,
        job.features,
    )


def never_reason(job: Job, ctx: Context, state: PolicyState) -> str | None:
    """Why ``job`` can never run on this fleet (``None``: some node set could host it)."""
    version = ctx.index.static_version
    mine = state.never_by_job.get(job.job_id)
    if mine is not None and mine[0] == version and mine[1] is job:
        return mine[2]
    answer = _never_reason(job, ctx, state, version)
    if len(state.never_by_job) > 100_000:
        state.never_by_job.clear()
    state.never_by_job[job.job_id] = (version, job, answer)
    return answer


def _never_reason(job: Job, ctx: Context, state: PolicyState, version: int) -> str | None:
    key = static_key(job)
    held = state.never.get(key)
    if held is not None and held[0] == version:
        return held[1]
    reasons: Counter[str] = Counter()
    hosts = 0
    for entry in ctx.index.entries.values():
        reason = static_fit(job, entry.node, drained_too=True)
        if reason is None:
            hosts += 1
            if hosts >= job.nodes:
                break
        else:
            reasons[reason] += 1
    answer: str | None = None
    if hosts < job.nodes:
        if not ctx.index.entries:
            answer = "never fits: the mesh has no node"
        elif job.is_gang and hosts:
            answer = f"never fits: only {hosts} node(s) can host a member; it needs {job.nodes}"
        else:
            top = reasons.most_common(1)[0][0] if reasons else "room"
            answer = f"never fits: no node has {top}"
            if reasons[IMAGE_HOST]:
                n = job.gpus_per_node
                gpus = f" and {n} GPU{'s' * (n != 1)}" if n else ""
                answer = f"never fits: no {IMAGE_HOST.removeprefix('a ')}{gpus}"
    if len(state.never) > 10_000:
        state.never.clear()
    state.never[key] = (version, answer)
    return answer


def busy_line(job: Job, ahead: int, node: str | None, eta_s: float | None) -> str:
    line = f"waiting: no node has {needs(job)} now"
    if node is not None and eta_s is not None:
        freed = (
            "a share"
            if job.is_share
            else f"{max(job.gpus_per_node, 1)} GPU" + "s" * (job.gpus_per_node > 1)
        )
        line += f"; best candidate {node} frees {freed} in {about(eta_s)}"
    if ahead:
        line += f" ({ahead} job{'s' * (ahead != 1)} ahead)"
    return line


def behind_line(job: Job, head: str, start_in_s: float) -> str:
    return (
        f"waiting: it would delay job {head[:8]}, reserved to start in {about(start_in_s)}"
        f" (it needs {needs(job)})"
    )
