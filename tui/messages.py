"""Messages that travel up the DOM: the mesh changed, an operation finished."""

from __future__ import annotations

from textual.message import Message

from tui.model import MeshSnapshot


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


class OperationDone(Message):
    """An operator action finished: ``ok`` with the agent's answer, or the reason it failed."""

    def __init__(self, kind: str, label: str, ok: bool, detail: str) -> None:
        super().__init__()
        self.kind = kind
        self.label = label
        self.ok = ok
        self.detail = detail
