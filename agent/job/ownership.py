"""Who owns a job: rendezvous (highest-random-weight) hashing of the job id over live agents.

Every agent ranks the same candidates the same way from the same membership view, with no
coordination: the owner is the first of :func:`rank`, the replica the second. When the owner
leaves, the next in order (the replica, which already holds the record) becomes the owner, and only
the jobs of the node that left move.

Ownership follows the order, with some patience: an owner that sees another agent rank first for
one of its jobs, live for a few seconds, hands the job to it (``Owner._hand_over_outranked``), so
that who may act as a job's owner is something every agent can check from its own view
(``agent.job.authority``). Until the handover, the job's gossiped record names its current owner.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable


def weight(job_id: str, node_id: str) -> int:
    digest = hashlib.blake2b(f"{job_id}\x00{node_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rank(job_id: str, nodes: Iterable[str]) -> list[str]:
    """``nodes`` ordered by descending weight for ``job_id`` (ties broken by node id).

    A pure function of the job and the set of nodes, asked again and again with the same live
    set (every gossiped record of a job, every owner's sweep over its jobs each second), so the
    newest :data:`RANKS_KEPT` orders are kept: ~1 µs for one kept, ~20 µs to hash and sort 32
    agents. Every distinct set is held once (:data:`_SETS`), so a kept order costs its tuple."""
    members = frozenset(nodes)
    shared = _SETS.get(members)
    if shared is None:
        if len(_SETS) >= SETS_KEPT:
            _SETS.clear()
        shared = _SETS[members] = members
    return list(_ranked(job_id, shared))


RANKS_KEPT = 512
"""Job orders kept by :func:`rank` (~0.2 MB at 32 agents)."""
SETS_KEPT = 8
"""Distinct node sets :func:`rank`'s kept orders share; more, and the oldest are let go."""
_SETS: dict[frozenset[str], frozenset[str]] = {}


@functools.lru_cache(maxsize=RANKS_KEPT)
def _ranked(job_id: str, members: frozenset[str]) -> tuple[str, ...]:
    return tuple(sorted(members, key=lambda n: (-weight(job_id, n), n)))


def owner_of(job_id: str, nodes: Iterable[str]) -> str | None:
    ranked = rank(job_id, nodes)
    return ranked[0] if ranked else None


def replica_of(job_id: str, nodes: Iterable[str], owner: str) -> str | None:
    """The first node after ``owner`` in the job's order (``None`` with a single agent)."""
    for node in rank(job_id, nodes):
        if node != owner:
            return node
    return None
