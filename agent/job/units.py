"""Sizes and durations as people write them: ``"40GiB"``, ``"512 MiB"``, ``"2h"``, ``"1h30m"``.

Pure parsers with one-line errors; the job spec's reader (``agent.job.specreader``) and
the command line use them where a field holds bytes or seconds.
"""

from __future__ import annotations

import math
import re
from typing import Final

_SIZE_UNITS: Final[dict[str, int]] = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "k": 1024,
    "m": 1024**2,
    "g": 1024**3,
    "t": 1024**4,
    "ki": 1024,
    "mi": 1024**2,
    "gi": 1024**3,
    "ti": 1024**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE_RE: Final = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*([A-Za-z]*)\s*")

_DURATION_UNITS: Final[dict[str, float]] = {
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 604800.0,
}
_DURATION_PART_RE: Final = re.compile(r"(\d+(?:\.\d+)?|\.\d+)(ms|s|m|h|d|w)")


def parse_size(text: str) -> int:
    """Bytes from ``"40GiB"``, ``"512 MiB"``, ``"1.5G"``, ``"80GB"`` or ``"1024"``.

    Units are case-insensitive. ``KiB/MiB/GiB/TiB`` (and ``Ki``.., and bare ``K/M/G/T`` as in
    ``docker run --memory``) are powers of 1024; ``KB/MB/GB/TB`` are powers of 1000. A fractional
    result is rounded down to whole bytes.
    """
    match = _SIZE_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"not a size: {text!r} (expected e.g. 40GiB, 512MiB, 80GB)")
    number, unit = match.groups()
    factor: int | None = _SIZE_UNITS.get(unit.lower())
    if factor is None:
        raise ValueError(f"unknown size unit {unit!r} in {text!r} (use B, KiB, MiB, GiB, TiB, GB)")
    if "." in number:
        whole, _, frac = number.partition(".")
        scale: int = 10 ** len(frac)
        return (int(whole or "0") * scale + int(frac)) * factor // scale
    return int(number) * factor


def parse_duration(text: str) -> float:
    """Seconds from ``"2h"``, ``"1h30m"``, ``"90s"``, ``"1.5d"``, ``"500ms"`` or ``"3600"``."""
    if not isinstance(text, str):
        raise ValueError(f"not a duration: {text!r} (expected e.g. 2h, 90m, 1h30m)")
    compact = text.strip().replace(" ", "").lower()
    if re.fullmatch(r"\d+(?:\.\d+)?|\.\d+", compact):
        seconds = float(compact)
    elif not compact or _DURATION_PART_RE.sub("", compact) != "":
        raise ValueError(f"not a duration: {text!r} (expected e.g. 2h, 90m, 1h30m, 45s)")
    else:
        seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in _DURATION_PART_RE.findall(compact))
    if not math.isfinite(seconds):
        raise ValueError(f"not a duration: {text[:20]!r}... is too long")
    return seconds
