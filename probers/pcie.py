"""PCIe link bandwidth from what a device says of its link (generation or transfer rate, width).

Each way, after line encoding: 8b/10b up to 5 GT/s (PCIe 1 and 2), 128b/130b from 8 GT/s (PCIe 3
to 5; PCIe 6's FLIT encoding is near enough the same). A lane of PCIe 4.0 carries about
1.97 GB/s, so an x16 link about 31.5 GB/s.
"""

from __future__ import annotations

from typing import Final

GT_PER_S_BY_GEN: Final = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}


def link_bytes_per_s(gt_per_s: float | None, width: int | None) -> float | None:
    """Bytes a second each way of a link at ``gt_per_s`` per lane and ``width`` lanes; ``None``
    if either is unknown or not positive."""
    if gt_per_s is None or width is None or gt_per_s <= 0 or width <= 0:
        return None
    encoding = 8 / 10 if gt_per_s <= 5.0 else 128 / 130
    return gt_per_s * 1e9 * encoding / 8 * width


def gen_bytes_per_s(gen: int | None, width: int | None) -> float | None:
    """The same from a PCIe generation (as NVML gives it)."""
    return link_bytes_per_s(None if gen is None else GT_PER_S_BY_GEN.get(gen), width)


def parse_link_speed(text: str) -> float | None:
    """GT/s from sysfs's ``current_link_speed`` (``16.0 GT/s PCIe``, ``8 GT/s``); ``None`` if it
    is not one (``Unknown``)."""
    parts = text.replace("\x00", "").strip().split()
    if len(parts) < 2 or parts[1] != "GT/s":
        return None
    try:
        value = float(parts[0])
    except ValueError:
        return None
    return value if value > 0 else None
