"""amdgpu's ``gpu_metrics`` blob, sans I/O: the fields Shoal keeps from it.

The blob starts with a header (``structure_size`` u16, ``format_revision`` u8,
``content_revision`` u8) and then a layout fixed per revision (the kernel's
``kgd_pp_interface.h``). Read here: discrete GPUs' format 1, content 3 (``gpu_metrics_v1_3``:
RDNA2 and later dGPUs), from which the memory-controller (UMC) activity, the current graphics
clock, the throttle status and the PCIe link. A field the firmware does not fill is all ones
(``0xffff``) and comes back ``None``; a revision not parsed here (the APUs' format 2, the
Instinct parts' 1.4 and later) gives :data:`NOT_PARSED`, and the prober says so.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from probers.pcie import link_bytes_per_s


@dataclass(frozen=True, slots=True)
class GpuMetrics:
    umc_activity_pct: float | None
    gfx_clock_mhz: float | None
    throttled: bool | None
    pcie_link_bytes_per_s: float | None


NOT_PARSED: Final = GpuMetrics(None, None, None, None)
_V1_3: Final = struct.Struct("<HBB 6H 3H H Q Q 7H 7H I H H H")
"""Header; six temperatures; gfx, umc, mm activity; socket power; energy; clock counter; seven
average clocks; seven current clocks; throttle status; fan; PCIe width, speed (0.1 GT/s)."""


def _u16(value: int) -> int | None:
    return None if value == 0xFFFF else value


def parse(blob: bytes) -> tuple[str, GpuMetrics]:
    """``(revision, fields)`` of a ``gpu_metrics`` blob; ``ValueError`` for one too short to
    hold its header or its own stated size."""
    if len(blob) < 4:
        raise ValueError(f"gpu_metrics: {len(blob)} bytes, not even a header")
    size, fmt, content = struct.unpack_from("<HBB", blob)
    revision = f"{fmt}.{content}"
    if len(blob) < size:
        raise ValueError(f"gpu_metrics {revision}: {len(blob)} bytes of {size}")
    if (fmt, content) != (1, 3) or size < _V1_3.size:
        return revision, NOT_PARSED
    fields = _V1_3.unpack_from(blob)
    umc = _u16(fields[10])
    gfx_clock = _u16(fields[22])
    throttle = fields[29]
    width, speed = _u16(fields[31]), _u16(fields[32])
    return revision, GpuMetrics(
        umc_activity_pct=None if umc is None else float(umc),
        gfx_clock_mhz=None if gfx_clock is None else float(gfx_clock),
        throttled=None if throttle == 0xFFFFFFFF else throttle != 0,
        pcie_link_bytes_per_s=link_bytes_per_s(None if speed is None else speed / 10, width),
    )
