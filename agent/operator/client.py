"""The operator's side of the agent API: signed commands and reads over mutual TLS.

The CLI, the TUI and ``shoal demo`` all talk to the mesh through this one client, so every
mutating action is an operator-signed command checked by the agent that executes it. Every read is
decoded with the wire contract (``agent.wire.documents``): ``node_docs``, ``job_docs``,
``job_doc``, ``event_docs`` and ``health_doc`` return the typed documents; ``nodes``, ``jobs``,
``job``, ``events`` and ``health`` the same documents as JSON objects, in their one shape (an
answer that does not decode is an :class:`ApiError`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp

from agent.common.parsing import json_loads
from agent.job.jobspec import JobSpec, new_job_id
from agent.operator import netwhy
from agent.wire.codec import ENVELOPE_CONTENT_TYPE, WireError
from agent.wire.health import HealthDoc

if TYPE_CHECKING:  # loaded by the reads that need them (an agent imports this client too)
    from agent.wire.documents import EventsDoc, JobDoc, NodeDoc
from gossip.addresses import split_address
from gossip.certtrust import CertSigner
from gossip.client import PooledSession
from gossip.envelope import seal
from gossip.identity import NodeIdentity
from gossip.tls import client_context

COMMANDS_PATH = "/v1/commands"
SUBMIT_RETRY_WAITS_S = (0.5, 1.0, 2.0)
"""Pauses before a submission answered 503 (held, not yet replicated) is sent again."""


def agent_address(address: str) -> tuple[str, int]:
    """An agent's API address as an operator gives it (``HOST:PORT``, ``[v6]:PORT``) -> (host,
    port); ValueError with one line when it is not one (port 0 included: an agent listens on a
    port of its own)."""
    return split_address(address)


class ApiError(Exception):
    """The agent refused or failed a request; ``str()`` is its one-line reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class AgentUnreachable(ApiError):
    """No answer from the agent at ``address``: ``why`` says so in a word or two (``refused``,
    ``timeout``), the message in a phrase (:mod:`agent.operator.netwhy`)."""

    def __init__(self, address: str, exc: BaseException | str) -> None:
        long = exc if isinstance(exc, str) else netwhy.why(exc)
        super().__init__(0, f"cannot reach the agent at {address}: {long}")
        self.address = address
        self.why = exc if isinstance(exc, str) else netwhy.short_why(exc)


class ApiClient(PooledSession):
    """One keep-alive HTTPS session to one agent, as ``identity`` (an operator's)."""

    def __init__(
        self,
        identity: NodeIdentity,
        address: str,
        *,
        timeout_s: float = 15.0,
        keepalive_s: float = 15.0,
    ) -> None:
        """``keepalive_s``: how long an idle connection is kept for the next request."""
        host, port = agent_address(address)
        self.address = address
        self._base = f"https://{f'[{host}]' if ':' in host else host}:{port}"
        self._identity = identity
        self._signer = CertSigner(identity)
        self._ssl = client_context(identity, identity.ca_certificate)
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._keepalive_s = keepalive_s
        self._session: aiohttp.ClientSession | None = None

    @property
    def node_id(self) -> str:
        return self._identity.node_id

    @property
    def identity(self) -> NodeIdentity:
        """Who this client speaks as (to ask other agents as the same operator)."""
        return self._identity

    def _make_session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._ssl, keepalive_timeout=self._keepalive_s),
            timeout=self._timeout,
        )

    # -- transport ---------------------------------------------------------------------------------

    async def _answer(self, response: aiohttp.ClientResponse) -> dict[str, Any]:
        text = await response.text()
        try:
            doc = json_loads(text) if text else {}
        except ValueError:
            doc = {"error": text.strip().splitlines()[0] if text.strip() else response.reason}
        if response.status >= 400:
            message = doc.get("error") if isinstance(doc, dict) else None
            raise ApiError(response.status, str(message or response.reason or response.status))
        if not isinstance(doc, dict):
            raise ApiError(response.status, "the agent answered something other than an object")
        return doc

    async def command(self, kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Sign ``body`` as a ``kind`` command and send it; the agent's answer."""
        envelope = seal(self._signer, kind, json.dumps(body).encode(), time.time())
        try:
            async with self._pooled().post(
                self._base + COMMANDS_PATH,
                data=envelope,
                headers={"Content-Type": ENVELOPE_CONTENT_TYPE},
            ) as response:
                return await self._answer(response)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise AgentUnreachable(self.address, exc) from None

    async def get(
        self, path: str, params: Mapping[str, str] | None = None, *, extra_s: float = 0.0
    ) -> dict[str, Any]:
        """GET ``path``; ``extra_s`` lengthens the timeout for a call the agent holds open."""
        timeout = self._timeout
        if extra_s:
            timeout = aiohttp.ClientTimeout(total=(timeout.total or 0.0) + extra_s)
        try:
            async with self._pooled().get(
                self._base + path, params=params, timeout=timeout
            ) as response:
                return await self._answer(response)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise AgentUnreachable(self.address, exc) from None

    async def stream(
        self, path: str, params: Mapping[str, str] | None = None
    ) -> AsyncIterator[str]:
        """Text lines as the agent sends them (no overall timeout: ``follow`` can be long; but
        an agent that accepts and never answers is given up on after this client's timeout)."""
        session = self._pooled()
        head_s = self._timeout.total
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=head_s)
        try:
            async with asyncio.timeout(head_s):
                response = await session.get(self._base + path, params=params, timeout=timeout)
            async with response:
                if response.status >= 400:
                    await self._answer(response)
                async for raw in response.content:
                    yield raw.decode("utf-8", errors="replace").rstrip("\n")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise AgentUnreachable(self.address, exc) from None

    # -- the API -----------------------------------------------------------------------------------

    async def submit(self, spec: JobSpec, job_id: str | None = None) -> dict[str, Any]:
        """Submit a job; answered once it is durable on its owner and a replica.

        The owner answers 503 when it holds the job but no replica could store it yet: the
        job is sent again under the same id (a new command each time), which the owner takes
        as the same job, so a retry never makes a second one (:data:`SUBMIT_RETRY_WAITS_S`)."""
        body = {"job_id": job_id or new_job_id(), "spec": spec.to_dict()}
        for wait_s in SUBMIT_RETRY_WAITS_S:
            try:
                return await self.command("submit", body)
            except ApiError as exc:
                if exc.status != 503:
                    raise
            await asyncio.sleep(wait_s)
        return await self.command("submit", body)

    async def cancel(self, job_id: str) -> dict[str, Any]:
        return await self.command("cancel", {"job_id": job_id})

    async def migrate(self, job_id: str, target: str | None = None) -> dict[str, Any]:
        return await self.command("migrate", {"job_id": job_id, "target": target})

    async def cordon(self, node: str) -> dict[str, Any]:
        return await self.command("cordon", {"node": node})

    async def drain(self, node: str, grace_s: float = 300.0) -> dict[str, Any]:
        return await self.command("drain", {"node": node, "grace_s": grace_s})

    async def undrain(self, node: str) -> dict[str, Any]:
        return await self.command("undrain", {"node": node})

    async def job_docs(self) -> list[JobDoc]:
        from agent.wire.documents import jobs_from_wire

        return _decoded(jobs_from_wire, await self.get("/v1/jobs"))

    async def job_doc(self, job_id: str) -> JobDoc:
        from agent.wire.documents import JobDoc

        return _decoded(JobDoc.from_wire, await self.get(f"/v1/jobs/{job_id}"))

    async def node_docs(self) -> list[NodeDoc]:
        from agent.wire.documents import nodes_from_wire

        return _decoded(nodes_from_wire, await self.get("/v1/nodes"))

    async def event_docs(self, since: int = 0) -> EventsDoc:
        from agent.wire.documents import EventsDoc

        path, params = "/v1/events", {"since": str(since)}
        return _decoded(EventsDoc.from_wire, await self.get(path, params))

    async def health_doc(self, members: int | None = None, wait_s: int = 0) -> HealthDoc:
        """``/healthz``; with ``members``, answered once the agent counts that many live
        members or after ``wait_s`` seconds, whichever comes first."""
        if members is None:
            return _decoded(HealthDoc.from_wire, await self.get("/healthz"))
        params = {"members": str(members), "wait_s": str(wait_s)}
        return _decoded(HealthDoc.from_wire, await self.get("/healthz", params, extra_s=wait_s))

    async def jobs(self) -> list[dict[str, Any]]:
        return [j.to_wire() for j in await self.job_docs()]

    async def job(self, job_id: str) -> dict[str, Any]:
        return (await self.job_doc(job_id)).to_wire()

    async def nodes(self) -> list[dict[str, Any]]:
        return [n.to_wire() for n in await self.node_docs()]

    async def events(self, since: int = 0) -> dict[str, Any]:
        return (await self.event_docs(since)).to_wire()

    async def health(self, members: int | None = None, wait_s: int = 0) -> dict[str, Any]:
        return (await self.health_doc(members, wait_s)).to_wire()

    def logs(
        self,
        job_id: str,
        lines: int = 100,
        follow: bool = False,
        attempt: int | None = None,
        node: str | None = None,
    ) -> AsyncIterator[str]:
        """The job's log; ``attempt``: that attempt's lines (``node``: on that member node)."""
        params = {"lines": str(lines), "follow": "1" if follow else "0"}
        if attempt is not None:
            params["attempt"] = str(attempt)
        if node is not None:
            params["node"] = node
        return self.stream(f"/v1/jobs/{job_id}/logs", params)


D = TypeVar("D")


def _decoded(decode: Callable[[Any], D], doc: dict[str, Any]) -> D:
    try:
        return decode(doc)
    except WireError as exc:
        raise ApiError(0, f"the agent answered a malformed document: {exc}") from None
