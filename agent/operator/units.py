"""Human-readable units for tables; ``None`` is shown as ``N/A``."""

from __future__ import annotations

NA = "N/A"
UNKNOWN_PART = "?"
"""An unknown side of a pair such as ``used/total``; the whole pair unknown is ``N/A``."""
_GIB = 1024**3
_MIB = 1024**2


def fmt_bytes(value: int | None) -> str:
    if value is None:
        return NA
    if value >= _GIB:
        return f"{value / _GIB:.1f} GiB"
    return f"{value / _MIB:.0f} MiB"


def fmt_mem(used_bytes: int | None, total_bytes: int | None) -> str:
    """``12.3/80.0 GiB``; either side may be unknown."""
    if total_bytes is None and used_bytes is None:
        return NA
    used = UNKNOWN_PART if used_bytes is None else f"{used_bytes / _GIB:.1f}"
    total = UNKNOWN_PART if total_bytes is None else f"{total_bytes / _GIB:.1f}"
    return f"{used}/{total} GiB"


def fmt_pct(value: float | None) -> str:
    return NA if value is None else f"{value:.0f}%"


def fmt_temp(value_c: float | None) -> str:
    return NA if value_c is None else f"{value_c:.0f}°C"


def fmt_power(power_mw: int | None, limit_mw: int | None) -> str:
    """``312/700 W``; either side may be unknown."""
    if power_mw is None and limit_mw is None:
        return NA
    now = UNKNOWN_PART if power_mw is None else f"{power_mw / 1000:.0f}"
    cap = UNKNOWN_PART if limit_mw is None else f"{limit_mw / 1000:.0f}"
    return f"{now}/{cap} W"
