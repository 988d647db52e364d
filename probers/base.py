"""The seam every prober implements, after nvtop's per-vendor vtable."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from probers.records import DeviceSample, DeviceStatic


class ProberUnavailable(Exception):
    """The source does not apply on this host (no driver, no library, no tool). Not an error."""


class Prober(Protocol):
    """One hardware source.

    ``discover`` runs once and raises :class:`ProberUnavailable` when the source does not apply.
    ``sample`` runs on every refresh and must never raise for a device-level failure: it returns a
    sample with ``healthy=False`` and ``error`` set instead. ``close`` releases the source.
    """

    source: str

    def discover(self) -> Sequence[DeviceStatic]: ...

    def sample(self) -> Sequence[DeviceSample]: ...

    def close(self) -> None: ...
