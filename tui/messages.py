"""Messages that travel up the DOM to the app.

The mesh changed; a view that shows forecasts came or went; the operator asked for a change to
the mesh (one message per kind of action); what runs changed; an operation finished. Screens
post them and never call the app: the app handles them (attributes down, messages up).

Two go down instead, from :class:`~tui.operations.Operations` to the add-host screen whose run
it carries: a host reached a step (:class:`HostStep`), and the run ended (:class:`HostsAdded`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from textual.message import Message

from agent.bootstrap.hostrun import HostResult
from agent.job.jobspec import JobSpec
from tui.model import MeshSnapshot
from tui.source import MeshSource


class MeshChanged(Message):
    """A new snapshot of the mesh; a newer one replaces an older one still in the queue."""

    def __init__(self, snapshot: MeshSnapshot, connection: str, error: str | None = None) -> None:
        super().__init__()
        self.snapshot = snapshot
        self.connection = connection
        """``connecting``, ``connected`` or ``unreachable``."""
        self.error = error

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, MeshChanged)


class ForecastsWanted(Message):
    """Whether a view that shows the policy's forecasts (the jobs view) is on screen: a big
    mesh's snapshots are made with them only then (:meth:`tui.model.MeshSnapshot.outlook`)."""

    def __init__(self, wanted: bool) -> None:
        super().__init__()
        self.wanted = wanted

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, ForecastsWanted)


class UsageWanted(Message):
    """The usage view was shown, or switched to another grouping or window: read it again."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, UsageWanted)


class OperatorAction(Message):
    """The operator asked for a change to the mesh; the app runs it as a worker.

    ``kind`` names the worker group (a newer action of one kind cancels an older one still
    running) and the outcome. Each kind says how it reads in the header and the notification
    (:meth:`label`, against the snapshot shown when it starts) and which call of the mesh source
    makes it (:meth:`send`).
    """

    kind: ClassVar[str]

    def label(self, snapshot: MeshSnapshot) -> str:
        raise NotImplementedError

    def send(self, source: MeshSource) -> Awaitable[Mapping[str, Any]]:
        raise NotImplementedError


@dataclass(eq=False)
class CordonHost(OperatorAction):
    """No new jobs on the host ``node_id``."""

    node_id: str
    kind: ClassVar[str] = "cordon"

    def label(self, snapshot: MeshSnapshot) -> str:
        return f"cordon {snapshot.hostname(self.node_id)}"

    def send(self, source: MeshSource) -> Awaitable[Mapping[str, Any]]:
        return source.cordon(self.node_id)


@dataclass(eq=False)
class DrainHost(OperatorAction):
    """Move the host's jobs away, waiting at most ``grace_s`` for each to end."""

    node_id: str
    grace_s: float
    kind: ClassVar[str] = "drain"

    def label(self, snapshot: MeshSnapshot) -> str:
        return f"drain {snapshot.hostname(self.node_id)} (grace {self.grace_s:g} s)"

    def send(self, source: MeshSource) -> Awaitable[Mapping[str, Any]]:
        return source.drain(self.node_id, self.grace_s)


@dataclass(eq=False)
class UndrainHost(OperatorAction):
    """Make the host schedulable again."""

    node_id: str
    kind: ClassVar[str] = "undrain"

    def label(self, snapshot: MeshSnapshot) -> str:
        return f"undrain {snapshot.hostname(self.node_id)}"

    def send(self, source: MeshSource) -> Awaitable[Mapping[str, Any]]:
        return source.undrain(self.node_id)


@dataclass(eq=False)
class SubmitJob(OperatorAction):
    """Submit a new job."""

    spec: JobSpec
    workdir: Path | None = None
    """A folder to pack and send with it (``shoal submit --workdir``)."""
    kind: ClassVar[str] = "submit"

    def label(self, snapshot: MeshSnapshot) -> str:
        return f"submit {' '.join(self.spec.command)[:40]}"

    def send(self, source: MeshSource) -> Awaitable[Mapping[str, Any]]:
        return source.submit(self.spec, workdir=self.workdir)


@dataclass(eq=False)
class MigrateJob(OperatorAction):
    """Move a running job to ``target`` (a node id), or to the best host when None."""

    job_id: str
    target: str | None
    kind: ClassVar[str] = "migrate"

    def label(self, snapshot: MeshSnapshot) -> str:
        where = snapshot.hostname(self.target) if self.target else "the best host"
        return f"migrate {self.job_id[:8]} to {where}"

    def send(self, source: MeshSource) -> Awaitable[Mapping[str, Any]]:
        return source.migrate(self.job_id, self.target)


@dataclass(eq=False)
class CancelJob(OperatorAction):
    """Cancel a running or waiting job."""

    job_id: str
    kind: ClassVar[str] = "cancel"

    def label(self, snapshot: MeshSnapshot) -> str:
        return f"cancel {self.job_id[:8]}"

    def send(self, source: MeshSource) -> Awaitable[Mapping[str, Any]]:
        return source.cancel(self.job_id)


class OperationsChanged(Message):
    """An operation started or ended: the labels of all those still running, oldest first."""

    def __init__(self, labels: tuple[str, ...]) -> None:
        super().__init__()
        self.labels = labels

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, OperationsChanged)


class OperationDone(Message):
    """An operator action finished: ``ok`` with the agent's answer, or the reason it failed."""

    def __init__(self, kind: str, label: str, ok: bool, detail: str) -> None:
        super().__init__()
        self.kind = kind
        self.label = label
        self.ok = ok
        self.detail = detail


class HostStep(Message):
    """One host reached a step of its bootstrap (``done`` and ``failed`` end it)."""

    def __init__(self, host: str, text: str) -> None:
        super().__init__()
        self.host = host
        self.text = text


class HostsAdded(Message):
    """A run of ``shoal bootstrap`` ended: each host's result, or the one line of a crash."""

    def __init__(self, results: list[HostResult], crash: str | None = None) -> None:
        super().__init__()
        self.results = results
        self.crash = crash
