"""The operator's changes to the mesh, as the TUI keeps track of them.

The app's own actions (cordon, drain, submit, ...) and the add-host screen's runs of
``shoal bootstrap`` both go through one :class:`Operations`: while one runs its label shows in
the header; when it ends its outcome is kept and announced. It tells the app by message
(:class:`~tui.messages.OperationsChanged`, :class:`~tui.messages.OperationDone`), so neither the
screens nor this module need the app itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from textual.message_pump import MessagePump

from tui.messages import OperationDone, OperationsChanged
from tui.model import MeshSnapshot


class Operations:
    """What runs now, every outcome, and whether this TUI may add hosts.

    ``app``: where the messages go. ``readonly`` and ``identity_dir`` are the app's: adding a
    host signs the new node's certificate with the cluster CA, so it needs the CA's key in
    ``identity_dir``; ``--readonly`` turns it off.
    """

    def __init__(
        self, app: MessagePump, *, readonly: bool = False, identity_dir: Path | None = None
    ) -> None:
        self._app = app
        self._readonly = readonly
        self._identity_dir = identity_dir
        self._add_host_refusal: str | None = None
        self._add_host_checked = False
        self.in_flight: dict[str, str] = {}
        """Token -> the label of each operation running now, oldest first."""
        self.outcomes: list[OperationDone] = []
        """Every finished operation, oldest first."""

    @contextlib.contextmanager
    def running(self, token: str, label: str) -> Iterator[None]:
        """Show ``label`` in the header while the block runs."""
        self.in_flight[token] = label
        self._changed()
        try:
            yield
        finally:
            self.in_flight.pop(token, None)
            self._changed()

    def _changed(self) -> None:
        self._app.post_message(OperationsChanged(tuple(self.in_flight.values())))

    def finish(self, outcome: OperationDone) -> None:
        """Keep and announce an operation's outcome (the app reads the mesh again at once)."""
        self.outcomes.append(outcome)
        self._app.post_message(outcome)

    def add_host_refusal(self) -> str | None:
        """Why this TUI cannot add hosts (one line), or None when it can.

        Checked once, then remembered.
        """
        if self._readonly:
            return "read-only: adding hosts is off (start the TUI without --readonly)"
        if not self._add_host_checked:
            self._add_host_checked = True
            self._add_host_refusal = _cluster_refusal(self._identity_dir)
        return self._add_host_refusal


def _cluster_refusal(directory: Path | None) -> str | None:
    """None when ``directory`` holds a cluster whose CA can sign node certificates."""
    if directory is None:
        return (
            "adding hosts needs the cluster CA: start the TUI with --identity DIR "
            "(the folder of shoal init) on a real mesh"
        )
    from gossip.identity import IdentityError, load_cluster

    try:
        load_cluster(directory)
    except IdentityError as exc:
        return (
            f"adding hosts needs the cluster CA, and {directory} holds none that works ({exc}); "
            "run the TUI with the --identity of shoal init"
        )
    return None


def summary(answer: Mapping[str, Any], snapshot: MeshSnapshot) -> str:
    """One line from the agent's answer: the new state, and where for a job."""
    for key in ("state", "drain", "status"):
        if answer.get(key) is not None:
            runner = answer.get("runner")
            where = f" on {snapshot.hostname(str(runner))}" if runner else ""
            return f"{answer[key]}{where}"
    return "accepted"
