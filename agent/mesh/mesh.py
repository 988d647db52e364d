"""The agent's reading of gossip membership: who is live, where, since when, how many.

``GossipMesh`` answers the ``agent.mesh.context.Mesh`` seam (and a little more for the API and the
authority) from a running :class:`~gossip.node.GossipNode` and the cluster trust: a member counts
as an agent only while its certificate is admitted with the ``agent`` role and unrevoked, so the
TUI (an operator peer) and revoked nodes are never among the live agents.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable
from typing import Final

from agent.mesh.view import live_agents
from gossip.certtrust import CertTrust
from gossip.membership import MemberInfo
from gossip.messages import MemberState
from gossip.node import GossipNode
from gossip.relay import ring_successors

_LIVE = (MemberState.ALIVE, MemberState.SUSPECT)

LIVE_RECOUNT_S = 1.0
"""The live agents are counted at least this often (see :meth:`GossipMesh.live_agents`)."""


class GossipMesh:
    def __init__(self, node_id: str, node: GossipNode, trust: CertTrust) -> None:
        self.node_id = node_id
        self._node = node
        self._trust = trust
        self.changed = asyncio.Event()
        """Set at every membership event (the caller does): wakes ``wait_members``."""
        self._live: tuple[float, list[str]] | None = None
        """The live agents as last counted, and when (``time.monotonic``)."""
        self._gone = GoneReports(node_id)

    def membership_changed(self) -> None:
        """A member joined, died, left or came back: wakes the watches, recounts the live."""
        self._live = None
        self.changed.set()

    def _members(self) -> list[MemberInfo]:
        return self._node.members() if self._node.started else []

    def _member(self, node_id: str) -> MemberInfo | None:
        return self._node.peer.member(node_id) if self._node.started else None

    def live_agents(self) -> list[str]:
        """Agents alive or suspect, this one included; never a revoked or expired one.

        Counted again at each membership event and at least every :data:`LIVE_RECOUNT_S`
        (a certificate expires, a revocation arrives, without a membership event). Every job
        record applied asks this (who may own the job): counting the members and each one's
        role each time was a twelfth of an agent's work in a 64-agent mesh under load."""
        now = time.monotonic()
        if self._live is None or now - self._live[0] >= LIVE_RECOUNT_S:
            self._live = (now, self._count_live())
        return list(self._live[1])

    def _count_live(self) -> list[str]:
        members = self._members()
        roles = {m.node: self._trust.role_of(m.node) or "" for m in members}
        roles[self.node_id] = "agent"
        live = live_agents(members, roles)
        if self.node_id not in live:
            live.append(self.node_id)
        return live

    def live_for_s(self, node_id: str) -> float:
        """How long ``node_id`` has been alive here (0 when it is not)."""
        member = self._member(node_id)
        if member is None or member.state != MemberState.ALIVE:
            return 0.0
        return time.monotonic() - member.state_since

    def heard_of(self, node_id: str) -> bool:
        """Membership knows the node, in any state."""
        return self._member(node_id) is not None

    def is_gone(self, node_id: str) -> bool:
        member = self._member(node_id)
        return member is not None and member.state in (MemberState.DEAD, MemberState.LEFT)

    def addr_of(self, node_id: str) -> str | None:
        if not self._node.started:
            return None  # None until the server binds
        if node_id == self.node_id:
            return self._node.address
        member = self._member(node_id)
        return member.addr if member is not None and member.addr else None

    def link_rtts(self) -> dict[str, tuple[float | None, float | None]]:
        """Each live peer this agent has measured round trips to (those it probes: on the probe
        rings, eight at most whatever the mesh's size): the Vivaldi estimate of the round trip
        and the median of the measured probes (seconds; the estimate ``None`` until known).

        A series for every live peer, sampled every second, would grow an idle agent's work with
        the mesh (254 readings a second at 128 agents); the probed ones are found among the few
        measured, not by a pass over every member. The estimate to any other peer follows from
        the coordinates gossip keeps."""
        if not self._node.started:
            return {}
        peer = self._node.peer
        out: dict[str, tuple[float | None, float | None]] = {}
        for node in peer.measured_nodes():  # those it probes now: a few, whatever N
            m = peer.member(node)
            rtt_s = peer.measured_rtt(node)
            if node != self.node_id and m is not None and m.state in _LIVE and rtt_s is not None:
                out[node] = (peer.rtt_estimate(self.node_id, node), rtt_s)
        return out

    def gone(self, node_id: str, how: str) -> list[tuple[str, str]]:
        """``node_id`` died or left (``how``): the ends this agent tells the mesh about now, as
        (node, how): its own to report, the first live agent after it in node-id order (see
        :func:`reporter_of`), and those an agent gone with it was to report
        (:class:`GoneReports`)."""
        return self._gone.gone(node_id, how, self.live_agents(), time.monotonic())

    def member_count(self) -> int:
        """Members alive or suspect, this one included."""
        return sum(1 for m in self._members() if m.state in _LIVE)

    async def wait_members(self, count: int, timeout_s: float) -> int:
        """Until ``count`` live members are seen, or ``timeout_s`` passed; the count then.
        Woken by membership events, so a watcher costs nothing while it waits (polling 32
        agents every 50 ms was a fifth of a 2-core machine while a mesh forms)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.changed.clear()  # before counting: a change from here on wakes us
            count_now = self.member_count()
            left_s = deadline - time.monotonic()
            if count_now >= count or left_s <= 0:
                return count_now
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left_s):
                    await self.changed.wait()


def reporter_of(node_id: str, live: Iterable[str]) -> str | None:
    """Who tells the mesh that ``node_id`` died or left: the first of the ``live`` agents after it
    in node-id order, wrapping round (its ring successor, as :mod:`gossip.relay` orders them).

    Every member sees a death itself; when each also published it as an event, a death cost the
    mesh N events, each gossiped to N members, and a mesh of 128 agents on two cores turned a
    handful of false deaths into tens of thousands of event records. Members whose views differ
    may name two reporters for a moment, or none (the death is still in every agent's log).
    """
    successor = ring_successors(sorted(live), node_id, 1, lambda _n: True)
    return successor[0] if successor else None


GONE_KEPT_S: Final = 60.0
"""How long an agent remembers a death another agent was to report (see :class:`GoneReports`)."""


class GoneReports:
    """Which deaths and leaves this agent publishes as events (sans-I/O).

    Its own to report (:func:`reporter_of`), and one more case: two neighbours in node-id order
    gone together (a rack losing power). Agents that see the first dead while the second still
    looks alive name the second as its reporter and only log it; when the second is declared
    dead too, the first's death would never reach the feed. So each agent remembers, for
    :data:`GONE_KEPT_S`, the deaths another agent was to report; when that agent is gone in
    turn, the successor among the live reports those too, unless the feed has them already."""

    def __init__(self, me: str) -> None:
        self._me = me
        self._theirs: dict[str, tuple[str, str | None, float]] = {}
        """Gone node -> (how: dead or left, the agent named to report it, when seen)."""

    def gone(
        self, node_id: str, how: str, live: Iterable[str], now_s: float
    ) -> list[tuple[str, str]]:
        """``node_id`` is ``how`` (``dead``, ``left``); ``live``: the live agents now. The
        (node, how) this agent publishes now, its own first."""
        live = frozenset(live)
        self._theirs = {n: v for n, v in self._theirs.items() if now_s - v[2] <= GONE_KEPT_S}
        out: list[tuple[str, str]] = []
        reporter = reporter_of(node_id, live)
        if reporter == self._me:
            out.append((node_id, how))
        elif node_id != self._me:
            self._theirs[node_id] = (how, reporter, now_s)
        for other, (other_how, named, at_s) in list(self._theirs.items()):
            if named != node_id or other == node_id:
                continue
            now_named = reporter_of(other, live)
            if now_named == self._me:
                out.append((other, other_how))
                del self._theirs[other]
            else:
                self._theirs[other] = (other_how, now_named, at_s)
        return out
