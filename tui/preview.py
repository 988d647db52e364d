"""Where a job would go, as rows for the submit form and the migrate picker.

The choice and its order are the agents' policy's (:func:`agent.policy.preview.preview`, the
ranking the owners use); this module only adds what the rows show of each host: its name, the
GPUs offered, how busy they are and its queue.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.job.jobspec import JobSpec
from agent.policy.preview import Preview, preview
from tui.model import MeshSnapshot


@dataclass(frozen=True, slots=True)
class Offer:
    """A host the policy would start the job on, with the GPUs it would get."""

    node_id: str
    hostname: str
    devices: tuple[str, ...]
    free_gpus: int
    mean_util_pct: float
    queue: int
    why: str
    """The policy's score in its largest terms (``speed +0.69, fragmentation -0.12``)."""


def offers(
    spec: JobSpec, snapshot: MeshSnapshot, *, exclude: frozenset[str] = frozenset()
) -> tuple[list[Offer], Preview]:
    """The policy's places for ``spec`` in ``snapshot``, best first, as rows; and its answer
    (whose ``line`` says why the job would wait when there is none)."""
    busy = snapshot.busy_devices()
    answer = preview(spec, snapshot.live_agents(), busy, now=snapshot.taken_at, exclude=exclude)
    rows: list[Offer] = []
    for cand in answer.candidates:
        host = snapshot.host(cand.node_id)
        if host is None:
            continue
        offered = set(cand.placement.devices[0])
        taken = busy.get(host.node_id, set())
        utils = [d.util_pct or 0.0 for d in host.devices if d.key in offered]
        rows.append(
            Offer(
                node_id=host.node_id,
                hostname=host.hostname,
                devices=cand.placement.devices[0],
                free_gpus=sum(1 for d in host.devices if d.key not in taken and d.backend != "cpu"),
                mean_util_pct=sum(utils) / len(utils) if utils else 0.0,
                queue=host.queue,
                why=cand.why(),
            )
        )
    return rows, answer
