"""What an operator types for a job or a node, resolved against the mesh's own listings.

A job is named by its id or any unique prefix of it (``shoal jobs`` shows eight characters). A
node is named by its id, a unique prefix of it, or its host name (the name ``shoal nodes`` shows);
when a host name is shared (a host enrolled again keeps its old, dead member for a while) the
one alive node among them is meant. Anything else is one :class:`UserError`: nothing matches, or
several do (listed, so the operator can give more of the id).

The CLI resolves through ``GET /v1/jobs`` and ``GET /v1/nodes`` before it signs a command, so a
command always names exactly one full id.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agent.common.errors import UserError
from agent.operator.terminal import command_line, short

JOB_ID_RE = re.compile(r"[0-9a-f]{1,32}")
"""What may name a job: hex digits, a job id or a prefix of one."""
NODE_ID_RE = re.compile(r"[a-z2-7]{32}")
"""A full node id (base32 of 20 bytes, lower case, no padding)."""
SHOWN_MATCHES = 10


Row = Mapping[str, Any]


def _the_one(matches: Sequence[Row], none: str, several: str, line: Callable[[Row], str]) -> Row:
    """The single match; else ``none``, or ``several`` followed by the matches, one a line."""
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UserError(none)
    shown = [f"  {line(m)}" for m in matches[:SHOWN_MATCHES]]
    if len(matches) > SHOWN_MATCHES:
        shown.append(f"  ... and {len(matches) - SHOWN_MATCHES} more")
    raise UserError("\n".join([several.format(count=len(matches)), *shown]))


def job_line(job: Mapping[str, Any]) -> str:
    return f"{job.get('job_id')}  {job.get('state', '?'):9}  {command_line(job.get('spec') or {})}"


def node_line(node: Mapping[str, Any]) -> str:
    host = (node.get("host") or {}).get("hostname") or "-"
    return f"{node.get('node_id')}  {node.get('state', '?'):7}  {host}"


def pick_job(jobs: Sequence[Row], text: str) -> Row:
    """The one job ``text`` names (its id or a unique prefix of it)."""
    wanted = text.strip().lower()
    if not JOB_ID_RE.fullmatch(wanted):
        raise UserError(f"{text!r} is not a job id: ids are hex digits (see 'shoal jobs')")
    exact = [j for j in jobs if j.get("job_id") == wanted]
    if exact:
        return exact[0]
    return _the_one(
        [j for j in jobs if str(j.get("job_id", "")).startswith(wanted)],
        f"no job matches {text!r} (see 'shoal jobs')",
        f"{text!r} matches {{count}} jobs; give more of the id:",
        job_line,
    )


def _hostname(node: Mapping[str, Any]) -> str | None:
    name = (node.get("host") or {}).get("hostname")
    return str(name) if name else None


def pick_node(nodes: Sequence[Row], text: str) -> Row:
    """The one node ``text`` names: its id, its host name, or a unique prefix of its id."""
    wanted = text.strip()
    exact = [n for n in nodes if n.get("node_id") == wanted]
    if exact:
        return exact[0]
    named = [n for n in nodes if _hostname(n) == wanted]
    alive = [n for n in named if n.get("state") == "alive"]
    if len(named) == 1 or len(alive) == 1:
        return (alive or named)[0]
    return _the_one(
        named or [n for n in nodes if str(n.get("node_id", "")).startswith(wanted.lower())],
        f"no node is named {text!r} (a node id, a prefix of one, or a host name)",
        f"{text!r} names {{count}} nodes; give more of the node id:",
        node_line,
    )


def check_migration_target(
    node: Mapping[str, Any], job: Mapping[str, Any], names: Mapping[str, str]
) -> None:
    """Refuse a target a job cannot be moved to: not a live, schedulable agent, or its runner."""
    node_id = str(node.get("node_id"))
    label = names.get(node_id) or short(node_id)
    if node.get("role") not in ("agent", None):
        raise UserError(
            f"--to {label}: node {short(node_id)} is an {node.get('role')}, not an agent"
        )
    if node.get("state") != "alive":
        raise UserError(f"--to {label}: node {short(node_id)} is {node.get('state')}, not alive")
    if node_id == job.get("runner"):
        raise UserError(f"--to {label}: job {short(job.get('job_id'))} already runs there")
    drain = node.get("drain")
    if drain not in (None, "schedulable"):
        raise UserError(f"--to {label}: node {short(node_id)} is {drain} and takes no new work")
