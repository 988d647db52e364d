"""``shoal history``'s figures in the unit each series' name ends with, as a person reads them."""

from __future__ import annotations

import pytest

from agent.cli.history_cmd import in_units


@pytest.mark.parametrize(
    ("name", "value", "shown"),
    [
        ("gpu.power_mw", 312_400.0, "312 W"),
        ("gpu.power_mw", 4_250.0, "4.2 W"),
        ("gpu.mem_used_bytes", 43.5 * 2**30, "43.5 GiB"),
        ("host.swap_used_bytes", 0.0, "0 MiB"),
        ("host.net_rx_bytes_per_s", 9_558.5, "9.6 kB/s"),
        ("host.disk_write_bytes_per_s", 5_900_000.0, "5.9 MB/s"),
        ("gpu.pcie_rx_bytes_per_s", 512.0, "512 B/s"),
        ("gpu.util_pct", 71.4, "71%"),
        ("gpu.temp_c", 64.2, "64°C"),
        ("link.rtt_ms", 0.42, "0.4 ms"),
        ("some.count", 12_345.0, "12.3k"),
        ("gpu.util_pct", None, "N/A"),
    ],
)
def test_a_series_figure_is_shown_in_its_unit(name: str, value: float | None, shown: str) -> None:
    assert in_units(name, value) == shown
