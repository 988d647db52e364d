"""What a runner (:class:`agent.running.runner.Runner`) answers and holds: the errors of an offer
or a call (``Declined``, ``LaunchFailed``, ``NotAllowed``), what admission lets in (``Admitted``), a
run here (``LocalRun``), and the devices it grants (the ``LocalDevices`` seam).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from probers.records import DeviceStatic


class Declined(Exception):
    """An offer this node refuses; the message says why."""


class LaunchFailed(Declined):
    """The offer was taken but the job's process could not be started (its launch error)."""


class NotAllowed(Exception):
    """A call whose caller has no authority over the job (``agent.job.authority``)."""


class Admitted(NamedTuple):
    """What :meth:`Runner.admit` let in: a share's memory on its device (0: devices given
    whole) and the victims it claimed, to stop before the job starts."""

    share_bytes: int = 0
    victims: tuple[str, ...] = ()
    shrink: tuple[str, ...] = ()
    """Those of ``victims`` that are shrunk (elastic), not preempted."""
    keys: tuple[str, ...] = ()
    """The devices the runner chose instead of those offered (``agent.running.admission`` late
    binding); empty: those offered."""
    moves: tuple[str, ...] = ()
    """Those of ``victims`` that are moved off (to restart elsewhere), not preempted."""


@dataclass(slots=True)
class LocalRun:
    job_id: str
    attempt: int
    owner: str
    devices: tuple[str, ...]
    share_bytes: int = 0
    """The memory it holds of its one device when it is a share of a GPU; 0: devices whole."""
    priority: int = 0
    preemptible: bool = False
    gpus_min: int | None = None
    """An elastic job's fewest GPUs (``None``: not elastic). All three from the job's
    operator-signed submission."""
    started_at: float | None = None
    """When its process started (``None`` while it launches)."""
    movable: bool = False
    """It may be moved off for a start its team's guarantee is owed (``agent.running.
    preemption``): one node, whole GPUs, not an inference service, not elastic (from its
    submission)."""


class UsageSink(Protocol):
    """Where the runner keeps what ran here, for accounting
    (``agent.history.usage_book.UsageBook``)."""

    def opened(
        self,
        job_id: str,
        attempt: int,
        person: str | None,
        model: str,
        gpus: float,
        devices: tuple[str, ...],
        started_at: float,
    ) -> None: ...

    def closed(self, job_id: str, attempt: int, started_at: float, finished_at: float) -> None: ...


class LocalDevices(Protocol):
    """The devices of this node, as the runner grants them
    (``agent.daemon.devices.HostDevices``)."""

    def statics(self) -> list[DeviceStatic]:
        """The accelerators a job may be given (not the CPU)."""
        ...

    def set_load(self, key: str, jobs: Sequence[int]) -> None:
        """What runs on the device now: the memory each job holds of it (0: a job given the
        whole device); empty when idle. A simulated device shows the combined load."""
        ...
