"""The operator's side of the agent API: signed commands and reads over mutual TLS.

The CLI, the TUI and ``shoal demo`` all talk to the mesh through this one client, so every
mutating action is an operator-signed command checked by the agent that executes it.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp

from agent.jobspec import JobSpec, new_job_id
from gossip.certtrust import CertSigner
from gossip.envelope import seal
from gossip.identity import NodeIdentity
from gossip.tls import client_context
from gossip.transport import PooledSession, split_address

COMMANDS_PATH = "/v1/commands"
ENVELOPE_CONTENT_TYPE = "application/octet-stream"


class ApiError(Exception):
    """The agent refused or failed a request; ``str()`` is its one-line reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class AgentUnreachable(ApiError):
    def __init__(self, address: str, why: str) -> None:
        super().__init__(0, f"cannot reach the agent at {address}: {why}")


class ApiClient(PooledSession):
    """One keep-alive HTTPS session to one agent, as ``identity`` (an operator's)."""

    def __init__(self, identity: NodeIdentity, address: str, *, timeout_s: float = 15.0) -> None:
        host, port = split_address(address)
        self.address = address
        self._base = f"https://{f'[{host}]' if ':' in host else host}:{port}"
        self._identity = identity
        self._signer = CertSigner(identity)
        self._ssl = client_context(identity, identity.ca_certificate)
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    @property
    def node_id(self) -> str:
        return self._identity.node_id

    def _make_session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._ssl), timeout=self._timeout
        )

    # -- transport ---------------------------------------------------------------------------------

    async def _answer(self, response: aiohttp.ClientResponse) -> dict[str, Any]:
        text = await response.text()
        try:
            doc = json.loads(text) if text else {}
        except json.JSONDecodeError:
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
            raise AgentUnreachable(self.address, _why(exc)) from None

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
            raise AgentUnreachable(self.address, _why(exc)) from None

    async def stream(
        self, path: str, params: Mapping[str, str] | None = None
    ) -> AsyncIterator[str]:
        """Text lines as the agent sends them (no overall timeout: ``follow`` can be long)."""
        session = self._pooled()
        try:
            async with session.get(
                self._base + path, params=params, timeout=aiohttp.ClientTimeout(total=None)
            ) as response:
                if response.status >= 400:
                    await self._answer(response)
                async for raw in response.content:
                    yield raw.decode("utf-8", errors="replace").rstrip("\n")
        except (aiohttp.ClientError, OSError) as exc:
            raise AgentUnreachable(self.address, _why(exc)) from None

    # -- the API -----------------------------------------------------------------------------------

    async def submit(self, spec: JobSpec, job_id: str | None = None) -> dict[str, Any]:
        """Submit a job; answered once it is durable on its owner and a replica."""
        return await self.command(
            "submit", {"job_id": job_id or new_job_id(), "spec": spec.to_dict()}
        )

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

    async def jobs(self) -> list[dict[str, Any]]:
        return list((await self.get("/v1/jobs")).get("jobs", []))

    async def job(self, job_id: str) -> dict[str, Any]:
        return await self.get(f"/v1/jobs/{job_id}")

    async def nodes(self) -> list[dict[str, Any]]:
        return list((await self.get("/v1/nodes")).get("nodes", []))

    async def events(self, since: int = 0) -> dict[str, Any]:
        return await self.get("/v1/events", {"since": str(since)})

    async def health(self, members: int | None = None, wait_s: int = 0) -> dict[str, Any]:
        """``/healthz``; with ``members``, answered once the agent counts that many live
        members or after ``wait_s`` seconds, whichever comes first."""
        if members is None:
            return await self.get("/healthz")
        params = {"members": str(members), "wait_s": str(wait_s)}
        return await self.get("/healthz", params, extra_s=wait_s)

    def logs(
        self, job_id: str, lines: int = 100, follow: bool = False, attempt: int | None = None
    ) -> AsyncIterator[str]:
        params = {"lines": str(lines), "follow": "1" if follow else "0"}
        if attempt is not None:
            params["attempt"] = str(attempt)
        return self.stream(f"/v1/jobs/{job_id}/logs", params)


def _why(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
