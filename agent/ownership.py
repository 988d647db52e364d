"""Who owns a job: rendezvous (highest-random-weight) hashing of the job id over live agents.

Every agent ranks the same candidates the same way from the same membership view, with no
coordination: the owner is the first of :func:`rank`, the replica the second. When the owner
leaves, the next in order (the replica, which already holds the record) becomes the owner, and only
the jobs of the node that left move.

Ownership follows the order, with some patience: an owner that sees another agent rank first for
one of its jobs, live for a few seconds, hands the job to it (``Owner._hand_over_outranked``), so
that who may act as a job's owner is something every agent can check from its own view
(``agent.authority``). Until the handover, the job's gossiped record names its current owner.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def weight(job_id: str, node_id: str) -> int:
    digest = hashlib.blake2b(f"{job_id}\x00{node_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rank(job_id: str, nodes: Iterable[str]) -> list[str]:
    """``nodes`` ordered by descending weight for ``job_id`` (ties broken by node id)."""
    return sorted(set(nodes), key=lambda n: (-weight(job_id, n), n))


def owner_of(job_id: str, nodes: Iterable[str]) -> str | None:
    ranked = rank(job_id, nodes)
    return ranked[0] if ranked else None


def replica_of(job_id: str, nodes: Iterable[str], owner: str) -> str | None:
    """The first node after ``owner`` in the job's order (``None`` with a single agent)."""
    for node in rank(job_id, nodes):
        if node != owner:
            return node
    return None
