"""Where a job would go, for the operator before it is submitted: the policy's own ranking over
the hosts the TUI shows (the submit form's preview, the migrate picker, ``shoal tui --sim``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cache

from agent.jobspec import JobSpec
from agent.policy.adapt import HostFacts, job_from_spec, node_from_host
from agent.policy.config import PolicyConfig
from agent.policy.decision import context, rank_any
from agent.policy.model import ThroughputModel
from agent.policy.place import Candidate
from agent.policy.snapshot import Snapshot


@cache
def _model() -> ThroughputModel:
    return ThroughputModel()


def preview(
    spec: JobSpec,
    hosts: Iterable[HostFacts],
    busy: Mapping[str, set[str]],
    *,
    now: float = 0.0,
    exclude: frozenset[str] = frozenset(),
    limit: int = 64,
) -> list[Candidate]:
    """The places ``spec`` could start now on ``hosts`` (``busy``: device keys held, by host),
    best first, as the agents' owners rank them."""
    nodes = tuple(node_from_host(h, busy.get(h.node_id, ())) for h in hosts)
    config = PolicyConfig(scan_per_group=limit)
    ctx, _ = context(Snapshot(now=now, nodes=nodes), _model(), config)
    return rank_any(job_from_spec("preview", spec), ctx, limit=limit, exclude=exclude)
