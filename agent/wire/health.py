"""``GET /healthz``: the one document every watcher of a forming mesh reads."""

from __future__ import annotations

from typing import Any, Final, NamedTuple

from agent.wire import codec as c

MAX_HEALTH_WAIT_S: Final = 60
"""The longest ``GET /healthz?members=N&wait_s=S`` waits for the members."""


class HealthDoc(NamedTuple):
    """``GET /healthz``: the agent answers, and how many live members it counts."""

    ok: bool
    node_id: str
    members: int

    def to_wire(self) -> dict[str, Any]:
        return {"ok": self.ok, "node_id": self.node_id, "members": self.members}

    @classmethod
    def from_wire(cls, value: Any) -> HealthDoc:
        d = c.obj(value)
        return cls(
            ok=c.field(d, "ok", c.or_default(c.flag, False)),
            node_id=c.field(d, "node_id", c.or_default(c.text, "")),
            members=c.field(d, "members", c.or_default(c.integer, 0)),
        )
