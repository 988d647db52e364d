"""The CPU prober and host facts, run for real here and with psutil's sensors faked."""

from __future__ import annotations

import platform
import socket
import sys
from pathlib import Path
from typing import Any, NamedTuple

import psutil
import pytest

from probers.cpu import CpuProber, cpu_name, host_info
from probers.records import HostInfo


class Reading(NamedTuple):
    """The shape of psutil's temperature reading."""

    label: str
    current: float | None
    high: float | None
    critical: float | None


def test_real_cpu_device_is_plausible() -> None:
    prober = CpuProber()
    (device,) = prober.discover()
    ram = psutil.virtual_memory().total
    assert device.key == "cpu:0"
    assert device.vendor == "cpu"
    assert device.backend == "cpu"
    assert device.source == "psutil"
    assert device.unified_memory is True
    assert device.mem_total_bytes == ram
    assert ram > 256 * 1024**2
    assert isinstance(device.name, str) and device.name.strip()
    assert device.arch == (platform.machine() or None)
    assert device.compute_units is None or device.compute_units >= 1


def test_real_cpu_sample_is_plausible() -> None:
    prober = CpuProber()
    (device,) = prober.discover()
    sum(i * i for i in range(200_000))  # some work between the two cpu_percent readings
    (sample,) = prober.sample()
    assert sample.key == device.key
    assert isinstance(sample.util_pct, float)
    assert 0.0 <= sample.util_pct <= 100.0
    assert isinstance(sample.mem_used_bytes, int)
    assert device.mem_total_bytes is not None
    assert 0 < sample.mem_used_bytes <= device.mem_total_bytes
    assert sample.power_mw is None
    assert sample.temp_c is None or -20.0 < sample.temp_c < 125.0
    assert sample.healthy is True
    prober.close()


def test_host_info_describes_this_host() -> None:
    info = host_info()
    assert isinstance(info, HostInfo)
    assert info.hostname == socket.gethostname()
    assert info.os == platform.system().lower()
    assert info.os in {"linux", "darwin", "windows", "freebsd"}
    assert info.arch == platform.machine()
    assert info.cpu_count == psutil.cpu_count(logical=True)
    assert info.cpu_count is not None and info.cpu_count >= 1
    assert info.mem_total_bytes == psutil.virtual_memory().total
    assert info.to_json()["os"] == info.os


def fake_sensors(monkeypatch: pytest.MonkeyPatch, sensors: dict[str, list[Reading]]) -> None:
    monkeypatch.setattr(psutil, "sensors_temperatures", lambda: sensors, raising=False)


INTEL = {
    "coretemp": [
        Reading("Core 0", 48.0, 100.0, 100.0),
        Reading("Package id 0", 52.0, 95.0, 105.0),
    ],
    "acpitz": [Reading("", 27.8, None, None)],
}


def test_coretemp_package_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_sensors(monkeypatch, INTEL)
    prober = CpuProber()
    (device,) = prober.discover()
    (sample,) = prober.sample()
    assert sample.temp_c == 52.0
    assert device.temp_slowdown_c == 95.0


def test_k10temp_prefers_tdie(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_sensors(
        monkeypatch,
        {"k10temp": [Reading("Tctl", 71.0, None, None), Reading("Tdie", 61.0, None, None)]},
    )
    prober = CpuProber()
    (device,) = prober.discover()
    (sample,) = prober.sample()
    assert sample.temp_c == 61.0
    assert device.temp_slowdown_c is None  # k10temp gives no threshold


def test_unlabelled_chip_falls_back_to_its_first_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_sensors(monkeypatch, {"k10temp": [Reading("Tccd1", 44.5, None, None)]})
    (sample,) = CpuProber().sample()
    assert sample.temp_c == 44.5


@pytest.mark.parametrize(
    "sensors",
    [
        {},
        {"acpitz": [Reading("", 27.8, None, None)]},
        {"nvme": [Reading("Composite", 40.0, 80.0, 85.0)]},
    ],
)
def test_no_cpu_sensor_means_unknown_temperature(
    monkeypatch: pytest.MonkeyPatch, sensors: dict[str, list[Reading]]
) -> None:
    fake_sensors(monkeypatch, sensors)
    prober = CpuProber()
    (device,) = prober.discover()
    (sample,) = prober.sample()
    assert sample.temp_c is None
    assert device.temp_slowdown_c is None
    assert sample.util_pct is not None


def test_platform_without_sensor_support(monkeypatch: pytest.MonkeyPatch) -> None:
    # macOS and Windows psutil have no sensors_temperatures at all.
    monkeypatch.delattr(psutil, "sensors_temperatures", raising=False)
    prober = CpuProber()
    (device,) = prober.discover()
    (sample,) = prober.sample()
    assert sample.temp_c is None
    assert device.temp_slowdown_c is None


def test_sensor_read_failure_means_unknown_temperature(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> Any:
        raise OSError("hwmon vanished")

    monkeypatch.setattr(psutil, "sensors_temperatures", broken, raising=False)
    (sample,) = CpuProber().sample()
    assert sample.temp_c is None
    assert sample.healthy is True


def test_psutil_failure_marks_the_sample_unhealthy(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> Any:
        raise OSError("no /proc")

    monkeypatch.setattr(psutil, "virtual_memory", broken)
    (sample,) = CpuProber().sample()
    assert sample.healthy is False
    assert sample.error == "psutil failed: no /proc"
    assert sample.util_pct is None


def test_mem_used_is_total_minus_available(monkeypatch: pytest.MonkeyPatch) -> None:
    class Memory(NamedTuple):
        total: int
        available: int

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Memory(16 * 1024**3, 10 * 1024**3))
    monkeypatch.setattr(psutil, "cpu_percent", lambda interval=None: 37.5)
    (sample,) = CpuProber().sample()
    assert sample.mem_used_bytes == 6 * 1024**3
    assert sample.util_pct == 37.5


def test_cpu_name_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nvendor_id\t: GenuineIntel\n"
        "model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu vme\n"
    )
    assert cpu_name(cpuinfo) == "Intel(R) Xeon(R) Platinum 8480+"
    (device,) = CpuProber(cpuinfo=cpuinfo).discover()
    assert device.name == "Intel(R) Xeon(R) Platinum 8480+"


def test_cpu_name_without_cpuinfo_falls_back_to_platform(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(platform, "processor", lambda: "")
    monkeypatch.setattr(platform, "machine", lambda: "riscv64")
    assert cpu_name(tmp_path / "missing") == "riscv64 CPU"


def test_a_sample_right_after_the_last_reading_waits_out_the_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [50.0]
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds

    monkeypatch.setattr(psutil, "cpu_percent", lambda interval=None: 12.0)
    prober = CpuProber(clock=lambda: now[0], sleep=sleep)
    prober.discover()
    now[0] += 0.03
    assert prober.sample()[0].util_pct == 12.0
    assert sleeps == [pytest.approx(0.07)]
    now[0] += 1.0  # a watch loop's second: no wait
    prober.sample()
    assert len(sleeps) == 1
