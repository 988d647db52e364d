"""The first agent of a list that answers: how commands reach the fleet of ``fleet.toml``.

Each address is asked for ``/healthz``; the next one is asked too when the previous has not
answered within :data:`STAGGER_S` or has failed (a refused agent costs nothing, a silent one at
most the stagger), so a dead first entry delays a command by a fraction of a second, never by a
whole timeout. The first to answer is the one the command talks to; when none does, the error
names each and why: ``no agent of the fleet answered: a:7946 (refused), b:7946 (timeout)``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from agent.operator.client import AgentUnreachable, ApiClient, ApiError
from gossip.identity import NodeIdentity

STAGGER_S = 0.3
"""How long one address has to answer before the next is asked too."""
ANSWER_TIMEOUT_S = 4.0
"""How long any one address has to answer at all."""


class NoAgentAnswered(ApiError):
    """Every address failed; ``failures`` holds ``(address, why)`` in the order given."""

    def __init__(self, failures: Sequence[tuple[str, str]], what: str = "the fleet") -> None:
        listed = ", ".join(f"{address} ({why})" for address, why in failures)
        super().__init__(0, f"no agent of {what} answered: {listed}")
        self.failures = list(failures)


async def _ask(client: ApiClient) -> ApiClient:
    try:
        await asyncio.wait_for(client.health(), ANSWER_TIMEOUT_S)
    except TimeoutError:
        raise AgentUnreachable(client.address, "timeout") from None
    return client


def _reason(exc: BaseException) -> str:
    if isinstance(exc, AgentUnreachable):
        return exc.why
    if isinstance(exc, ApiError):
        return f"refused: {exc}"
    return str(exc) or type(exc).__name__


async def first_answering(
    identity: NodeIdentity,
    addresses: Sequence[str],
    *,
    what: str = "the fleet",
    stagger_s: float = STAGGER_S,
) -> ApiClient:
    """A client to the first of ``addresses`` that answers (the others are closed)."""
    if not addresses:
        raise NoAgentAnswered([], what)
    clients: list[ApiClient] = []
    failures: dict[str, str] = {}
    for address in addresses:
        try:
            clients.append(ApiClient(identity, address))
        except ValueError as exc:
            failures[address] = str(exc)
    tasks: dict[asyncio.Task[ApiClient], ApiClient] = {}
    winner: ApiClient | None = None
    try:
        pending_clients = list(clients)
        while winner is None and (pending_clients or tasks):
            if pending_clients:
                client = pending_clients.pop(0)
                tasks[asyncio.create_task(_ask(client))] = client
            timeout = stagger_s if pending_clients else None
            done, _ = await asyncio.wait(
                tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                client = tasks.pop(task)
                error = task.exception()
                if error is None and winner is None:
                    winner = client
                    continue
                if error is not None:
                    failures[client.address] = _reason(error)
                await client.close()
    finally:
        for task, client in tasks.items():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            failures.setdefault(client.address, "timeout")
            await client.close()
    if winner is None:
        raise NoAgentAnswered([(a, failures.get(a, "timeout")) for a in addresses], what)
    return winner
