"""What the simulated mesh holds besides its GPUs and jobs: the datasets on its hosts.

Deterministic in the host's index, as the rest of :mod:`tui.simmesh`: the same mesh gives the
same copies at every read, so screenshots and snapshot tests are stable.
"""

from __future__ import annotations

import hashlib
from typing import Final

from agent.wire.place import HeldVersion

GB: Final[int] = 1024**3
DAY_S: Final[float] = 86400.0

_DATASETS: Final[tuple[tuple[str, int, float], ...]] = (
    ("imagenet", 150 * GB, 40 * DAY_S),
    ("imagenet", 148 * GB, 3 * DAY_S),
    ("c4-en", 806 * GB, 20 * DAY_S),
    ("wikitext-103", 515 * 1024**2, 90 * DAY_S),
    ("laion-aesth", 1900 * GB, 6 * 3600.0),
)
"""(name, size, age): two versions of imagenet, the newer one the training jobs read."""


def _digest(name: str, age_s: float) -> str:
    return hashlib.sha256(f"shoal-sim-data|{name}|{age_s}".encode()).hexdigest()


def held_versions(index: int, hosts: int, now: float) -> tuple[HeldVersion, ...]:
    """The dataset versions host ``index`` of ``hosts`` holds, whole or in part, at ``now``."""
    out: list[HeldVersion] = []
    for n, (name, size, age_s) in enumerate(_DATASETS):
        held: int | None = None
        if n == 0 and index == 0:
            held = size  # the old imagenet, on one host only
        elif n == 1 and index % 3 == 0:
            held = size  # the new one where the training jobs run
        elif n == 1 and index == 1:
            held = size * 2 // 5  # and a copy being staged
        elif n == 2 and index in (1, 2):
            held = size
        elif n == 3 and index < hosts - 1:
            held = size  # small: nearly everywhere
        elif n == 4 and index == 2:
            held = size * 7 // 10  # the newest and biggest: no whole copy yet
        if held is not None:
            created = round(now - age_s, 1)
            out.append(HeldVersion(name, _digest(name, age_s), size, held, created))
    return tuple(out)
