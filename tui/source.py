"""Where the TUI's mesh comes from: the ``MeshSource`` seam and the real API.

:class:`ApiSource` is the operator's signed-command API client
(:class:`agent.operator.client.ApiClient`): every action is a command signed with the operator
identity and checked by the agent that runs it. The simulated mesh that answers the same reads
without agents is :class:`tui.simmesh.SimSource`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agent.cli.usage_cmd import gather_usage
from agent.job.jobspec import JobSpec
from agent.operator.client import ApiClient, ApiError
from agent.operator.fleet_read import ask_history
from agent.operator.upload import send_workdir
from agent.wire.history import HistoryDoc, HistoryQuery
from agent.wire.usage import UsageRow


@dataclass(frozen=True, slots=True)
class Identity:
    """Who the TUI is on the mesh: shown in the header at all times."""

    mesh_name: str
    node_id: str
    role: str
    address: str


class MeshSource(Protocol):
    """The reads and the actions the TUI needs; JSON shapes as ``ApiClient`` returns them."""

    identity: Identity

    def now(self) -> float:
        """The source's clock (epoch seconds): the time a snapshot is taken."""
        ...

    def backfill(self) -> Mapping[str, Sequence[float]]:
        """Utilization history already known (``node/device`` -> oldest-first values)."""
        ...

    async def nodes(self) -> list[dict[str, Any]]: ...

    async def jobs(self) -> list[dict[str, Any]]: ...

    async def events(self, since: int = 0) -> dict[str, Any]: ...

    async def usage(self, since: float) -> tuple[list[UsageRow], list[str]]:
        """Every live agent's usage rows since ``since`` (``GET /v1/usage``), and one line
        for each agent that did not answer."""
        ...

    def logs(self, job_id: str, lines: int = 100, follow: bool = False) -> AsyncIterator[str]: ...

    async def history(self, query: HistoryQuery, address: str) -> HistoryDoc:
        """``GET /v1/history`` of the node whose agent listens at ``address``."""
        ...

    async def submit(
        self, spec: JobSpec, job_id: str | None = None, workdir: Path | None = None
    ) -> dict[str, Any]:
        """Submit ``spec``; with ``workdir``, the folder packed and sent first (its digest in
        the spec); a folder that cannot be is ``ApiError`` 400, nothing submitted."""
        ...

    async def cancel(self, job_id: str) -> dict[str, Any]: ...

    async def migrate(self, job_id: str, target: str | None = None) -> dict[str, Any]: ...

    async def cordon(self, node: str) -> dict[str, Any]: ...

    async def drain(self, node: str, grace_s: float = 300.0) -> dict[str, Any]: ...

    async def undrain(self, node: str) -> dict[str, Any]: ...

    async def close(self) -> None: ...


class ApiSource:
    """The real mesh, through one agent, as the operator identity ``client`` was made with."""

    def __init__(self, client: ApiClient, mesh_name: str, role: str = "operator") -> None:
        self.client = client
        self.identity = Identity(
            mesh_name=mesh_name, node_id=client.node_id, role=role, address=client.address
        )

    def now(self) -> float:
        return time.time()

    def backfill(self) -> Mapping[str, Sequence[float]]:
        return {}

    async def nodes(self) -> list[dict[str, Any]]:
        return await self.client.nodes()

    async def jobs(self) -> list[dict[str, Any]]:
        return await self.client.jobs()

    async def events(self, since: int = 0) -> dict[str, Any]:
        return await self.client.events(since)

    async def usage(self, since: float) -> tuple[list[UsageRow], list[str]]:
        return await gather_usage(self.client, self.client.identity, since)

    def logs(self, job_id: str, lines: int = 100, follow: bool = False) -> AsyncIterator[str]:
        return self.client.logs(job_id, lines, follow)

    async def history(self, query: HistoryQuery, address: str) -> HistoryDoc:
        """Asked of the node itself (each node keeps its own history), as the operator."""
        return await ask_history(self.client, query, address)

    async def submit(
        self, spec: JobSpec, job_id: str | None = None, workdir: Path | None = None
    ) -> dict[str, Any]:
        if workdir is not None:
            try:
                spec, _ = await send_workdir(self.client, spec, workdir)
            except (ValueError, OSError) as exc:
                raise ApiError(400, f"workdir {workdir}: {exc}; nothing submitted") from None
        return await self.client.submit(spec, job_id)

    async def cancel(self, job_id: str) -> dict[str, Any]:
        return await self.client.cancel(job_id)

    async def migrate(self, job_id: str, target: str | None = None) -> dict[str, Any]:
        return await self.client.migrate(job_id, target)

    async def cordon(self, node: str) -> dict[str, Any]:
        return await self.client.cordon(node)

    async def drain(self, node: str, grace_s: float = 300.0) -> dict[str, Any]:
        return await self.client.drain(node, grace_s)

    async def undrain(self, node: str) -> dict[str, Any]:
        return await self.client.undrain(node)

    async def close(self) -> None:
        await self.client.close()
