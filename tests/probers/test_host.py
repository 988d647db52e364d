"""The host probe: sources joined, deduplicated by PCI address, faults contained."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from probers.base import ProberUnavailable
from probers.host import HostProbe, ProbeOptions, probe_once
from probers.records import DeviceSample, DeviceStatic, HostInfo
from tests.support import SYSFS

HOST = HostInfo(hostname="h", os="linux", arch="x86_64", cpu_count=2, mem_total_bytes=1 << 30)


class FakeProber:
    """A scripted source: fixed statics, samples from a callable, counts closes."""

    def __init__(self, source: str, statics: Sequence[DeviceStatic], *, fail: str = "") -> None:
        self.source = source
        self.statics = list(statics)
        self.fail = fail
        self.closed = 0

    def discover(self) -> Sequence[DeviceStatic]:
        if self.fail == "unavailable":
            raise ProberUnavailable(self.source)
        if self.fail == "discover":
            raise RuntimeError("library exploded")
        return self.statics

    def sample(self) -> Sequence[DeviceSample]:
        if self.fail == "sample":
            raise RuntimeError("driver hung")
        return [DeviceSample(key=s.key, util_pct=50.0) for s in self.statics]

    def close(self) -> None:
        self.closed += 1


def _gpu(key: str, bus: str | None, source: str = "a") -> DeviceStatic:
    return DeviceStatic(
        key=key, vendor="intel", backend="xpu", name=key, source=source, pci_bus_id=bus
    )


def test_device_seen_by_two_sources_is_reported_once_by_the_first() -> None:
    rich = FakeProber("level-zero", [_gpu("ze:0", "0000:03:00.0", "level-zero")])
    poor = FakeProber("xe-sysfs", [_gpu("pci:0000:03:00.0", "0000:03:00.0", "xe-sysfs")])
    report = HostProbe([rich, poor], host=HOST).refresh()
    assert [d.static.key for d in report.devices] == ["ze:0"]
    assert poor.closed == 1  # a source left with no device is released


def test_devices_are_numbered_host_wide_in_source_order() -> None:
    a = FakeProber("nvml", [_gpu("n0", "0000:01:00.0"), _gpu("n1", "0000:02:00.0")])
    b = FakeProber("amdgpu-sysfs", [_gpu("a0", "0000:81:00.0")])
    report = HostProbe([a, b], host=HOST).refresh()
    assert [(d.index, d.static.key) for d in report.devices] == [(0, "n0"), (1, "n1"), (2, "a0")]
    assert all(d.sample.util_pct == 50.0 for d in report.devices)


def test_failing_sample_marks_only_that_sources_devices_unhealthy() -> None:
    good = FakeProber("nvml", [_gpu("n0", "0000:01:00.0")])
    bad = FakeProber("xpu-smi", [_gpu("x0", "0000:02:00.0")], fail="sample")
    report = HostProbe([good, bad], host=HOST).refresh()
    by_key = {d.static.key: d.sample for d in report.devices}
    assert by_key["n0"].healthy
    assert not by_key["x0"].healthy
    assert by_key["x0"].error == "xpu-smi: driver hung"


def test_broken_discovery_is_a_warning_and_unavailable_is_silent() -> None:
    broken = FakeProber("level-zero", [], fail="discover")
    absent = FakeProber("nvml", [], fail="unavailable")
    good = FakeProber("xe-sysfs", [_gpu("i0", "0000:03:00.0")])
    report = HostProbe([broken, absent, good], host=HOST).refresh()
    assert [d.static.key for d in report.devices] == ["i0"]
    assert report.warnings == ("level-zero: discovery failed: library exploded",)


def test_no_accelerator_falls_back_to_the_cpu() -> None:
    report = HostProbe([FakeProber("nvml", [], fail="unavailable")]).refresh()
    assert [d.static.vendor for d in report.devices] == ["cpu"]
    assert report.devices[0].static.mem_total_bytes == report.host.mem_total_bytes
    assert report.host.cpu_count is not None and report.host.cpu_count >= 1


def _mixed_root(tmp_path: Path) -> Path:
    """One sysfs root holding an AMD, an Intel and an NVIDIA card, as on a mixed-vendor host."""
    drm = tmp_path / "sys" / "class" / "drm"
    drm.mkdir(parents=True)
    sources = [
        ("amd-rx6900xt", "card0"),
        ("intel-a380-xe", "card0"),
        ("nvidia-rtx4080", "card1"),
    ]
    for number, (tree, card) in enumerate(sources):
        shutil.copytree(SYSFS / tree / "sys" / "class" / "drm" / card, drm / f"card{number}")
    return tmp_path


def test_mixed_vendor_host_reports_every_vendor(tmp_path: Path) -> None:
    report = probe_once(ProbeOptions(root=_mixed_root(tmp_path)))
    assert sorted(d.static.vendor for d in report.devices) == ["amd", "intel", "nvidia"]
    assert len({d.static.pci_bus_id for d in report.devices}) == 3


def test_root_reads_only_files(tmp_path: Path) -> None:
    """Under --root no library or tool source is consulted, so an empty tree has only the CPU."""
    report = probe_once(ProbeOptions(root=tmp_path))
    assert [d.static.source for d in report.devices] == ["psutil"]


def test_one_name_per_cpu_architecture() -> None:
    from probers.records import normal_arch

    assert [normal_arch(m) for m in ("x86_64", "AMD64", "aarch64", "arm64", "riscv64")] == [
        "x86_64",
        "x86_64",
        "arm64",
        "arm64",
        "riscv64",
    ]
