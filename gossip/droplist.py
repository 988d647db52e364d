"""A test-and-benchmark-only partition: drop all traffic to and from some peers, by node id.

Off unless the process was *started* with ``SHOAL_TEST_DROP_FILE`` in its environment, naming a
file (``python -m bench.chaos`` points each agent at ``drop`` in that agent's own folder). Once
on, the file is read again whenever it changes (checked at most every :data:`RECHECK_S`): one
node id per line, ``#`` comments; an absent or empty file drops nothing. Nothing reaches it from
the network: no API, record or call names it, and only whoever starts the agent process sets its
environment; an agent started by ``shoal bootstrap`` or a service unit never has it. An agent
that has it says so at WARNING each time the list changes.

Where traffic is dropped (:func:`dropped`): the server refuses, and closes, every request and
stream upgrade from a listed peer (``gossip.server``); every client request to a listed peer
fails as unreachable once the TLS handshake shows who answered (``gossip.client``'s
``PeerCheckingRequest``); and an
open gossip stream to or from a listed peer is cut at its next message either way
(``gossip.streams``). So a partition looks like connections refused, not like a black hole.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

ENV: Final = "SHOAL_TEST_DROP_FILE"
RECHECK_S: Final = 0.1


class DropList:
    """The node ids listed in ``path``, read again when the file changes."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._clock = clock
        self._next_check = float("-inf")
        self._seen: tuple[int, int] | None = None
        self.node_ids: frozenset[str] = frozenset()

    def drops(self, node_id: str) -> bool:
        now = self._clock()
        if now >= self._next_check:
            self._next_check = now + RECHECK_S
            self._reload()
        return node_id in self.node_ids

    def _reload(self) -> None:
        try:
            st = self.path.stat()
            seen: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except OSError:
            seen = None
        if seen == self._seen:
            return
        self._seen = seen
        try:
            text = self.path.read_text() if seen is not None else ""
        except OSError:
            text = ""
        ids = frozenset(
            line.split("#", 1)[0].strip()
            for line in text.splitlines()
            if line.split("#", 1)[0].strip()
        )
        if ids != self.node_ids:
            self.node_ids = ids
            log.warning(
                "test drop list %s (%s): dropping traffic to and from %d peer(s)",
                self.path,
                ENV,
                len(ids),
            )


def _from_environment() -> DropList | None:
    path = os.environ.get(ENV)
    return DropList(Path(path)) if path else None


_active: DropList | None = _from_environment()
"""Read once, when the process starts (this module is imported by the transport)."""


def dropped(node_id: str) -> bool:
    """Whether traffic to and from ``node_id`` is dropped (always False unless switched on)."""
    return _active is not None and _active.drops(node_id)


def active() -> bool:
    return _active is not None
