"""What the owner and the runner share of their agent: one context object, not a bag of callbacks.

``AgentContext`` holds the agent's parts both sides of the job protocol use (its store, view of the
mesh, peer client, event log, authority) and ``Mesh``, the narrow seam through which they read
membership. The agent builds one and hands it to each; tests build one around fakes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from agent.job.authority import Authority
from agent.mesh.events import EventLog
from agent.mesh.peers import PeerClient
from agent.mesh.view import ClusterView
from agent.storage.store import Store
from agent.wire.policy import PolicyBody


class Mesh(Protocol):
    """What the job protocol reads of gossip membership (``agent.mesh.mesh.GossipMesh``)."""

    def live_agents(self) -> list[str]:
        """Agents alive or suspect, this one included; never a revoked one."""
        ...

    def addr_of(self, node_id: str) -> str | None:
        """Where the node listens, as gossip last told; None when unknown (or not yet bound)."""
        ...

    def is_gone(self, node_id: str) -> bool:
        """Membership holds the node dead or left (not merely unheard of)."""
        ...


@dataclass(frozen=True, slots=True)
class AgentContext:
    """The parts of one agent that its owner and runner act through."""

    node_id: str
    store: Store
    view: ClusterView
    peers: PeerClient
    events: EventLog
    authority: Authority
    mesh: Mesh
    publish: Callable[[str, bytes], None]
    """Gossip a record of this node (kind, payload)."""
    changed: Callable[[], None]
    """Something the ``node`` record says (queue, running jobs, free devices) may have changed."""
    stop_grace_s: float
    """Between a job's stop signal and SIGKILL, unless a stop names its own grace."""
    preempt_min_run_s: float = 600.0
    """How long a job runs before it may be preempted (``AgentConfig.preempt_min_run_s``)."""
    elastic_grow_idle_s: float = 30.0
    """How long GPUs an elastic job could use sit idle before it grows onto them
    (``AgentConfig.elastic_grow_idle_s``)."""
    policy: Callable[[], PolicyBody | None] = lambda: None
    """The team policy held now (``agent.people.keeper``): quotas and who is in which team."""
