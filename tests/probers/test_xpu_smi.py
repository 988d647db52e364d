"""The xpu-smi parsers and prober against output captured on a Data Center GPU Max 1100."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

import pytest

from probers.base import ProberUnavailable
from probers.xpu_smi import (
    XpuDevice,
    XpuDeviceDetail,
    XpuDumpRow,
    XpuSmiProber,
    parse_discovery,
    parse_discovery_device,
    parse_dump,
)
from tests.support import FIXTURES

XPU = FIXTURES / "intel-xpu-smi"
DISCOVERY = (XPU / "discovery.json").read_text()
DISCOVERY_D0 = (XPU / "discovery-d0-partial.json").read_text()
DUMP = (XPU / "dump.csv").read_text()
UUID = "00000000-0000-0029-0000-002f0bda8086"


def test_parse_discovery() -> None:
    assert parse_discovery(DISCOVERY) == [
        XpuDevice(
            device_id=0,
            name="Intel(R) Data Center GPU Max 1100",
            pci_bus_id="0000:29:00.0",
            uuid=UUID,
            pci_device_id=0x0BDA,
            drm_device="/dev/dri/card1",
        )
    ]


def test_parse_discovery_device_byte_strings() -> None:
    assert parse_discovery_device(DISCOVERY_D0) == XpuDeviceDetail(
        mem_total_bytes=51522830336,
        mem_free_bytes=51493543936,
        driver_version="I915_23.10.72_PSB_231129.76",
        tiles=1,
    )


def test_parse_dump_units_and_na() -> None:
    (row,) = parse_dump(DUMP)
    assert row == XpuDumpRow(
        device_id=0,
        util_pct=0.0,
        power_mw=118870,  # 118.87 W
        freq_mhz=1550,
        temp_c=None,  # N/A
        mem_temp_c=None,  # N/A
        mem_util_pct=0.05,
        mem_used_bytes=29349642,  # 27.99 MiB = 27.99 * 1048576 = 29349642.24
    )


def test_parse_dump_columns_by_name_not_position() -> None:
    text = (
        "Timestamp, DeviceId, GPU Memory Used (MiB), GPU Power (W)\n"
        "10:00:00.000,    1, 1024.00, N/A\n"
    )
    (row,) = parse_dump(text)
    assert (row.device_id, row.mem_used_bytes, row.power_mw, row.util_pct) == (
        1,
        1073741824,
        None,
        None,
    )


def test_parse_dump_rejects_text_without_header() -> None:
    with pytest.raises(ValueError):
        parse_dump("no device found\n")
    assert parse_dump("") == []


class FakeXpuSmi:
    """Answers xpu-smi command lines from the captured outputs, recording each call."""

    def __init__(self, dump: str | BaseException = DUMP) -> None:
        self.dump = dump
        self.calls: list[tuple[list[str], float]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> str:
        self.calls.append((list(argv), timeout_s))
        args = list(argv[1:])
        if args == ["discovery", "-j"]:
            return DISCOVERY
        if args == ["discovery", "-d", "0", "-j"]:
            return DISCOVERY_D0
        if args[:3] == ["dump", "-d", "0"]:
            if isinstance(self.dump, BaseException):
                raise self.dump
            return self.dump
        raise AssertionError(f"unexpected command {argv}")


def which_found(name: str) -> str | None:
    return f"/opt/xpu/bin/{name}"


def test_prober_discover_and_sample() -> None:
    fake = FakeXpuSmi()
    prober = XpuSmiProber(runner=fake, which=which_found, timeout_s=7.0)
    (dev,) = prober.discover()
    assert dev.key == UUID
    assert dev.uuid == UUID
    assert dev.name == "Intel(R) Data Center GPU Max 1100"
    assert dev.pci_bus_id == "0000:29:00.0"
    assert dev.arch == "pvc/xe-hpc"
    assert dev.source == "xpu-smi"
    assert (dev.vendor, dev.backend, dev.vendor_index) == ("intel", "xpu", 0)
    assert dev.unified_memory is False
    assert dev.mem_total_bytes == 51522830336
    assert dev.driver_version == "I915_23.10.72_PSB_231129.76"
    (sample,) = prober.sample()
    assert sample.key == UUID
    assert sample.healthy is True
    assert sample.power_mw == 118870
    assert sample.util_pct == 0.0
    assert sample.temp_c is None
    assert sample.mem_used_bytes == 29349642
    assert sample.power_limit_mw is None
    assert fake.calls[-1] == (
        ["/opt/xpu/bin/xpu-smi", "dump", "-d", "0", "-m", "0,1,2,3,4,5,18", "-n", "1"],
        7.0,
    )


def test_tool_absent_is_unavailable() -> None:
    prober = XpuSmiProber(runner=FakeXpuSmi(), which=lambda name: None)
    with pytest.raises(ProberUnavailable, match="not on PATH"):
        prober.discover()


def test_discovery_failing_is_unavailable() -> None:
    def broken(argv: Sequence[str], timeout_s: float) -> str:
        raise subprocess.CalledProcessError(1, list(argv), "", "Error: Level Zero init failed\n")

    prober = XpuSmiProber(runner=broken, which=which_found)
    with pytest.raises(ProberUnavailable, match="Level Zero init failed"):
        prober.discover()


def test_dump_timeout_gives_unhealthy_sample() -> None:
    fake = FakeXpuSmi(dump=subprocess.TimeoutExpired(["xpu-smi"], 10.0))
    prober = XpuSmiProber(runner=fake, which=which_found)
    prober.discover()
    (sample,) = prober.sample()
    assert sample.healthy is False
    assert sample.error == "xpu-smi timed out after 10 s"
    assert sample.power_mw is None


def test_dump_failing_gives_unhealthy_sample() -> None:
    error = subprocess.CalledProcessError(2, ["xpu-smi"], "", "device lost\nretry later\n")
    prober = XpuSmiProber(runner=FakeXpuSmi(dump=error), which=which_found)
    prober.discover()
    (sample,) = prober.sample()
    assert sample.healthy is False
    assert sample.error == "xpu-smi exited with status 2: retry later"
    assert "\n" not in sample.error


def test_dump_garbage_gives_unhealthy_sample() -> None:
    prober = XpuSmiProber(runner=FakeXpuSmi(dump="Segmentation fault\n"), which=which_found)
    prober.discover()
    (sample,) = prober.sample()
    assert sample.healthy is False
    assert sample.error is not None and sample.error.startswith("xpu-smi failed:")
