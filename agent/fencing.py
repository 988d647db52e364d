"""Fencing through gossip: when a job record a runner hears stops the attempt it runs.

A gossiped job record naming a newer attempt, or the same attempt placed on other nodes while it
is placed or running, fences the local copy (cause ``fenced``); one saying the attempt was
cancelled stops it (cause ``cancel``). A gang's attempt is placed here when the record names this
node among its ``members``. Sans-I/O: :class:`agent.runner.Runner` acts on the answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.executor import StopCause


def fence_cause(doc: dict[str, Any], attempt: int, node_id: str) -> StopCause | None:
    """Why the gossiped job record ``doc`` stops attempt ``attempt`` running on ``node_id``, or
    ``None`` when it does not."""
    recorded = doc.get("attempt")
    if not isinstance(recorded, int):
        return None
    state = doc.get("state")
    if recorded > attempt or (
        recorded == attempt and not placed_here(doc, node_id) and state in ("placing", "running")
    ):
        return "fenced"
    if recorded == attempt and state == "cancelled":
        return "cancel"
    return None


def placed_here(doc: dict[str, Any], node_id: str) -> bool:
    """Whether a gossiped job record places its attempt on ``node_id`` (its runner, or one of
    a gang's members), or names no node at all."""
    members = doc.get("members")
    if isinstance(members, list) and members:
        return any(isinstance(m, dict) and m.get("node") == node_id for m in members)
    return doc.get("runner") in (None, node_id)
