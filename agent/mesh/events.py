"""The event log: one line per lifecycle event, bounded, merged from the whole mesh.

Each agent logs its own events (job placed, started, exited, requeued; node drained; member
died...) and gossips its latest ones in its ``events`` record. Every agent merges what it hears
into its own log, once per ``(node, node_seq)``, so ``GET /v1/events?since=N`` on any agent shows
the mesh's recent history. ``seq`` numbers are this agent's own (poll the same agent).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from agent.wire.records import EventsRecord, GossipedEvent

if TYPE_CHECKING:
    from agent.wire.documents import EventsDoc

log = logging.getLogger("shoal.events")

MAX_EVENTS = 2000
GOSSIPED = 12
"""How many of its latest events an agent keeps in its ``events`` record (fits 4 KiB)."""
GOSSIPED_FOR_S = 5.0
"""How long an event stays in the ``events`` record (longer where a large mesh spaces the
record's versions further apart: ``agent.daemon.publisher.spacing_s``). Peers merge each version
as it reaches them, within a second or two; a busy agent republishes every second, and resending
its last twelve events each time was half of what a mesh under load gossiped."""
MAX_MESSAGE_CHARS = 200
LIFE_EVENTS = 1 << 32
"""Event numbers one start of an agent may use (its ``n`` stay within the wire's integers for
2 million starts)."""


class EventLog:
    def __init__(
        self,
        node_id: str,
        *,
        clock: Callable[[], float] = time.time,
        size: int = MAX_EVENTS,
        boot: int = 0,
    ) -> None:
        """``boot``: this start's number (the store's boot count). Our events are numbered
        from ``boot * LIFE_EVENTS``, so each life's numbers lie above every earlier life's and
        peers, which merge each ``n`` once per node, take a restarted agent's events at once."""
        self.node_id = node_id
        self._clock = clock
        self._events: deque[dict[str, Any]] = deque(maxlen=size)
        self._own: deque[dict[str, Any]] = deque(maxlen=GOSSIPED)
        self._seq = 0
        self._own_seq = boot * LIFE_EVENTS
        self._seen: dict[str, int] = {}
        self.on_own: Callable[[], None] | None = None

    @property
    def seq(self) -> int:
        return self._seq

    def _append(self, event: dict[str, Any]) -> dict[str, Any]:
        self._seq += 1
        stored = dict(event, seq=self._seq)
        self._events.append(stored)
        return stored

    def add(self, kind: str, message: str, *, job_id: str | None = None) -> None:
        """Log one of our own events (and one line in the agent's log)."""
        self._own_seq += 1
        row = {  # as gossiped: the record's origin names the node
            "at": self._clock(),
            "kind": kind,
            "job_id": job_id,
            "message": message[:MAX_MESSAGE_CHARS],
            "n": self._own_seq,
        }
        self._seen[self.node_id] = self._own_seq
        self._append(dict(row, node=self.node_id))
        self._own.append(row)
        log.info("%s%s: %s", kind, f" {job_id[:8]}" if job_id else "", message)
        if self.on_own is not None:
            self.on_own()

    def merge(self, origin: str, rows: Iterable[GossipedEvent]) -> None:
        """Take in another node's gossiped events, each once."""
        if origin == self.node_id:
            return
        last = self._seen.get(origin, 0)
        for row in sorted((r for r in rows if r.n > last), key=lambda r: r.n):
            self._append(
                {
                    "at": row.at,
                    "kind": row.kind,
                    "node": origin,
                    "job_id": row.job_id,
                    "message": row.message[:MAX_MESSAGE_CHARS],
                    "n": row.n,
                }
            )
            self._seen[origin] = row.n

    def told(self, kind: str, prefix: str) -> bool:
        """The log holds an event of ``kind`` (any node's) whose message starts with ``prefix``."""
        return any(e["kind"] == kind and e["message"].startswith(prefix) for e in self._events)

    def since(self, seq: int, limit: int = 500) -> EventsDoc:
        """Events after ``seq`` (oldest first, at most ``limit``) and the ``next`` to ask for."""
        from agent.wire.documents import EventDoc, EventsDoc  # loaded on the first read

        out = [
            EventDoc(e["seq"], e["at"], e["kind"], e["node"], e["job_id"], e["message"])
            for e in self._events
            if e["seq"] > seq
        ][:limit]
        return EventsDoc(events=tuple(out), next=out[-1].seq if out else max(seq, 0))

    def gossip_record(self, for_s: float = GOSSIPED_FOR_S) -> EventsRecord:
        """Our events of the last ``for_s``, for the ``events`` record (the record's origin names
        the node)."""
        oldest = self._clock() - for_s
        return EventsRecord(
            events=tuple(
                GossipedEvent(
                    n=row["n"],
                    at=row["at"],
                    kind=row["kind"],
                    job_id=row["job_id"],
                    message=row["message"],
                )
                for row in self._own
                if row["at"] >= oldest
            )
        )
