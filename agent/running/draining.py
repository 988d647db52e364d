"""A runner's drain state (:class:`agent.running.runner.Runner`): cordon, drain, undrain.

Cordoned and draining nodes accept nothing new; a draining node lets its jobs finish within the
grace period, then stops the rest (cause ``drain``; their owners requeue them elsewhere) and
becomes drained. The state follows ``agent.job.jobstate.drain_transition``, is persisted in the
store and gossiped in the ``node`` record.

What it uses of the runner is named in :class:`DrainingRunner`; it never imports
``agent.running.runner``.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Protocol

from agent.job.jobstate import DrainEvent, IllegalTransition, NodeDrainState, drain_transition

if TYPE_CHECKING:
    from collections.abc import Mapping

    from agent.execution.executor import ProcessExecutor
    from agent.mesh.events import EventLog
    from agent.storage.store import Store


class Drain:
    """This node's drain state and the draining under way (module doc)."""

    def __init__(self, runner: DrainingRunner) -> None:
        self.r = runner
        self.state = NodeDrainState(runner.store.get_meta("drain") or NodeDrainState.SCHEDULABLE)
        self._task: asyncio.Task[None] | None = None

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def set(self, event: DrainEvent) -> None:
        try:
            state = drain_transition(self.state, event)
        except IllegalTransition:
            return
        if state != self.state:
            self.state = state
            self.r.store.set_meta("drain", state.value)
            self.r.events.add("drain", f"node is {state.value}")
            self.r._on_change()

    def command(self, kind: str, grace_s: float | None, default_grace_s: float) -> str:
        if kind == "cordon":
            self.set(DrainEvent.CORDON)
        elif kind == "undrain":
            if self._task is not None:
                self._task.cancel()
                self._task = None
            self.set(DrainEvent.UNDRAIN)
        elif kind == "drain":
            self.set(DrainEvent.DRAIN)
            if self.state == NodeDrainState.DRAINING:
                if not self.r.runs:
                    self.set(DrainEvent.DRAINED)
                elif self._task is None or self._task.done():
                    grace = default_grace_s if grace_s is None else grace_s
                    self._task = asyncio.create_task(self._drain(grace))
        return self.state.value

    async def _drain(self, grace_s: float) -> None:
        deadline = time.monotonic() + grace_s
        while self.r.runs and time.monotonic() < deadline:
            await asyncio.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        if self.state != NodeDrainState.DRAINING:
            return
        await asyncio.gather(
            *(self.r.executor.stop(j, cause="drain") for j in list(self.r.runs)),
            return_exceptions=True,
        )
        if self.state == NodeDrainState.DRAINING and not self.r.runs:
            self.set(DrainEvent.DRAINED)


class DrainingRunner(Protocol):
    """What draining uses of the runner: its store, events, executor and running jobs."""

    store: Store
    events: EventLog
    executor: ProcessExecutor

    @property
    def runs(self) -> Mapping[str, object]: ...
    def _on_change(self) -> None: ...
