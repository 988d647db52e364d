"""Who may give which command: the rules every agent checks before it acts (sans I/O).

A person signs each command with their own key; the agent that executes it looks the signer up
in the team policy it holds (:mod:`agent.wire.policy`) and applies the table below. The
certificate says what kind of key signed (an agent's, or a person's: ``operator`` certificates
may be admins, ``user`` certificates never are); the policy says who the person is now (team,
role), so a role changes with a new policy version and no new certificate.

With no policy held (a cluster from before people and roles), an ``operator`` certificate is an
admin, as it always was, and a ``user`` certificate has no standing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from agent.wire.policy import PolicyBody

ADMIN_ONLY: Final = frozenset(
    {"cordon", "drain", "undrain", "revoke", "policy", "policy_missing", "policy_put"}
)
"""Kinds only an admin may give."""
OWN_JOB: Final = frozenset({"cancel", "migrate"})
"""Kinds a user may give for the jobs they submitted (an admin for any job)."""
SUBMITTING: Final = frozenset({"submit", "workdir_missing", "workdir_put"})
"""Kinds a user or an admin may give: a submission (at a priority within their ceiling), and
sending up the working folder it names (content the store keeps within its budget)."""


class Refused(Exception):
    """The signer may not do this; ``why`` labels ``shoal_refused_total``, the message is one
    line for the person refused."""

    def __init__(self, why: str, message: str) -> None:
        super().__init__(message)
        self.why = why


@dataclass(frozen=True, slots=True)
class Standing:
    """A person as the policy held here sees them."""

    node_id: str
    role: str
    """``admin``, ``user`` or ``viewer``."""
    name: str | None = None
    """``None``: an operator certificate with no policy held (an admin by default)."""
    team: str | None = None
    ceiling: int | None = None
    """The highest priority they may submit at (``None``: no ceiling)."""

    @property
    def who(self) -> str:
        return self.name or self.node_id[:10]


def standing(policy: PolicyBody | None, node_id: str, cert_role: str | None) -> Standing:
    """Who signed, as ``policy`` sees them; :class:`Refused` for a key with no standing."""
    if cert_role not in ("operator", "user"):
        raise Refused("not_a_person", f"{node_id[:10]} holds no person's certificate")
    if policy is None:
        if cert_role == "operator":
            return Standing(node_id, "admin")
        raise Refused("no_policy", f"{node_id[:10]}: no team policy is held here yet")
    person = policy.person_by_id(node_id)
    if person is None:
        raise Refused("not_in_policy", f"{node_id[:10]} is not a person of the team policy")
    role = person.role
    if role == "admin" and cert_role != "operator":
        role = "user"  # a user certificate never carries an admin's authority
    bounds = [policy.ceilings.get(role)]
    team = policy.team(person.team)
    if team is not None:
        bounds.append(team.ceiling)
    ceilings = [b for b in bounds if b is not None]
    return Standing(node_id, role, person.name, person.team, min(ceilings) if ceilings else None)


def check_kind(who: Standing, kind: str) -> None:
    """May ``who`` give a command of ``kind`` at all (the job's owner checks ownership)?"""
    if who.role == "admin":
        return
    if who.role == "viewer":
        raise Refused("viewer", f"{who.who} is a viewer: a viewer only reads ({kind} refused)")
    if kind in ADMIN_ONLY or kind not in OWN_JOB | SUBMITTING:
        raise Refused("admin_only", f"{kind} is for admins; {who.who} is a {who.role}")


def check_job(who: Standing, kind: str, job_id: str, submitter: str) -> None:
    """May ``who`` give ``kind`` for a job ``submitter`` submitted?"""
    check_kind(who, kind)
    if who.role != "admin" and submitter != who.node_id:
        raise Refused(
            "not_owner",
            f"{kind} of {job_id} refused: {who.who} did not submit it (a user acts "
            "on their own jobs)",
        )


def check_priority(who: Standing, priority: int) -> None:
    """May ``who`` submit at ``priority``?"""
    if who.ceiling is not None and priority > who.ceiling:
        raise Refused(
            "priority",
            f"priority {priority} is above {who.who}'s ceiling of {who.ceiling}",
        )


def check_read_logs(who: Standing, job_id: str, submitter: str | None) -> None:
    """May ``who`` read the logs of a job ``submitter`` submitted? Admins and viewers read every
    log; a user, those of their own jobs."""
    if who.role in ("admin", "viewer"):
        return
    if submitter != who.node_id:
        raise Refused("not_owner", f"logs of {job_id} refused: {who.who} did not submit it")
