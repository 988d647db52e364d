"""Where a job would go, for the operator before it is submitted or moved: the policy's own
ranking over the hosts the TUI shows (the submit form's preview, the migrate picker, ``shoal tui
--sim``), and, where nothing takes it now, the policy's own line saying why."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache

from agent.job.jobspec import JobSpec
from agent.policy.adapt import HostFacts, job_from_spec, node_from_host
from agent.policy.config import PolicyConfig
from agent.policy.decision import context, rank_any
from agent.policy.explain import busy_line, never_reason
from agent.policy.model import ThroughputModel
from agent.policy.place import Candidate
from agent.policy.snapshot import Snapshot
from agent.policy.state import PolicyState


@cache
def _model() -> ThroughputModel:
    return ThroughputModel()


@dataclass(frozen=True, slots=True)
class Preview:
    """The places a job could start now, best first, or why it would wait."""

    candidates: tuple[Candidate, ...]
    line: str
    """Empty when it starts now; else ``never fits: ...`` or ``waiting: ...``."""
    never_fits: bool = False


def preview(
    spec: JobSpec,
    hosts: Iterable[HostFacts],
    busy: Mapping[str, set[str]],
    *,
    now: float = 0.0,
    exclude: frozenset[str] = frozenset(),
    limit: int = 64,
) -> Preview:
    """Where ``spec`` could start now on ``hosts`` (``busy``: device keys held, by host), best
    first, as the agents' owners rank them; when nowhere, the line an owner would give."""
    nodes = tuple(node_from_host(h, busy.get(h.node_id, ())) for h in hosts)
    config = PolicyConfig(scan_per_group=limit)
    ctx, state = context(Snapshot(now=now, nodes=nodes), _model(), config, state=PolicyState())
    job = job_from_spec("preview", spec)
    ranked = rank_any(job, ctx, limit=limit, exclude=exclude)
    if ranked:
        return Preview(tuple(ranked), "")
    never = never_reason(job, ctx, state)
    if never is not None:
        return Preview((), never, never_fits=True)
    return Preview((), busy_line(job, 0, None, None))
