"""Garbage collection at quiet moments, so a full collection never lands in a refresh or a key.

A snapshot of 1,000 hosts is tens of thousands of objects; CPython's automatic full collection
walks every tracked object (hundreds of milliseconds at that size) whenever enough of them have
piled up, which is in the middle of whatever the app happens to be doing. The app's data is
acyclic and freed by reference counting the moment a newer snapshot replaces it; only cycles
need the collector. So while the app runs:

- what exists once it has started (Textual, the modules, the source) is moved out of the
  collector's sight with ``gc.freeze()``: it lives as long as the app;
- young generations are collected automatically as usual (cheap: only new objects);
- the full collection is not automatic: :meth:`QuietCollector.maybe_collect` runs it, at most
  every ``every_s`` seconds and only when the operator has not pressed a key for ``quiet_s``;
  the mesh worker calls it just before it reads the mesh, when nothing waits to be drawn.

Everything is put back as it was by :meth:`QuietCollector.stop`.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Final

NO_AUTOMATIC_FULL: Final = 1 << 30
"""A gen-2 threshold never reached: full collections happen only when asked for."""


class QuietCollector:
    def __init__(
        self,
        every_s: float = 20.0,
        quiet_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every_s = every_s
        self.quiet_s = quiet_s
        self.clock = clock
        self.pauses_ms: list[float] = []
        """How long each full collection took (the app was busy for that long)."""
        self._saved: tuple[int, int, int] | None = None
        self._last_collect = clock()
        self._last_input = float("-inf")

    @property
    def running(self) -> bool:
        return self._saved is not None

    def start(self) -> None:
        if self._saved is not None:
            return
        gc.collect()
        gc.freeze()
        self._saved = gc.get_threshold()
        young, middle, _ = self._saved
        gc.set_threshold(young, middle, NO_AUTOMATIC_FULL)
        self._last_collect = self.clock()

    def stop(self) -> None:
        if self._saved is None:
            return
        gc.set_threshold(*self._saved)
        self._saved = None
        gc.unfreeze()

    def input_seen(self) -> None:
        """The operator did something: no collection for the next ``quiet_s``."""
        self._last_input = self.clock()

    def due(self) -> bool:
        now = self.clock()
        return (
            self._saved is not None
            and now - self._last_collect >= self.every_s
            and now - self._last_input >= self.quiet_s
        )

    def collect(self) -> float:
        """A full collection now; its duration in milliseconds."""
        start = time.perf_counter()
        gc.collect()
        pause_ms = (time.perf_counter() - start) * 1000.0
        self._last_collect = self.clock()
        self.pauses_ms.append(pause_ms)
        del self.pauses_ms[:-100]
        return pause_ms

    def maybe_collect(self) -> float | None:
        """Collect if due (see the module's docstring); the pause in ms, or None."""
        return self.collect() if self.due() else None
