"""The Apple prober: ioreg and system_profiler parsers on captured output, Metal faked."""

from __future__ import annotations

import subprocess
import sys
import types
from collections.abc import Sequence
from pathlib import Path

import pytest

from probers.apple import (
    APPLE_NO_THERMAL_NOTE,
    IOREG_ARGV,
    SYSTEM_PROFILER_ARGV,
    AppleProber,
    DisplayGpu,
    IoregAccelerator,
    MetalDevice,
    metal_devices,
    parse_ioreg,
    parse_system_profiler,
)
from probers.base import ProberUnavailable
from tests.support import FIXTURES

APPLE = FIXTURES / "apple"
ROOT = Path(__file__).resolve().parents[2]
IOREG_TEXT = (APPLE / "ioreg-m1pro-macos12.txt").read_text()
PROFILER_TEXT = (APPLE / "system_profiler-m1.json").read_text()

# From the fixture's entry header: "<class AGXAcceleratorG13X, id 0x10000087c, ...>".
M1_REGISTRY_ID = 0x10000087C
M1_WORKING_SET = 11_453_251_584  # a plausible recommendedMaxWorkingSetSize for a 16 GB Mac


def test_parse_ioreg_reads_the_performance_statistics() -> None:
    assert parse_ioreg(IOREG_TEXT) == [
        IoregAccelerator(
            class_name="AGXAcceleratorG13X",
            registry_id=4_294_969_468,
            util_pct=2.0,
            renderer_util_pct=2.0,
            tiler_util_pct=2.0,
            mem_used_bytes=340_983_808,
            mem_alloc_bytes=1_214_005_248,
            model=None,
            gpu_core_count=None,
        )
    ]
    assert M1_REGISTRY_ID == 4_294_969_468


def test_parse_ioreg_reads_model_and_core_count_and_several_entries() -> None:
    extra = '      "model" = "Apple M1 Pro"\n      "gpu-core-count" = 16\n'
    second = (
        "+-o AGXAcceleratorG14X  <class AGXAcceleratorG14X, id 0x100000abc, registered>\n"
        '      "PerformanceStatistics" = {"Device Utilization %"=97,"In use system memory"=5}\n'
    )
    first_entry, rest = IOREG_TEXT.split("\n", 1)
    accelerators = parse_ioreg(f"{first_entry}\n{extra}{rest}\n{second}")
    assert [a.class_name for a in accelerators] == ["AGXAcceleratorG13X", "AGXAcceleratorG14X"]
    assert accelerators[0].model == "Apple M1 Pro"
    assert accelerators[0].gpu_core_count == 16
    assert accelerators[0].util_pct == 2.0
    assert accelerators[1].registry_id == 0x100000ABC
    assert accelerators[1].util_pct == 97.0
    assert accelerators[1].mem_used_bytes == 5
    assert accelerators[1].mem_alloc_bytes is None


def test_parse_ioreg_without_statistics_leaves_readings_unknown() -> None:
    header = IOREG_TEXT.splitlines()[0]
    (only,) = parse_ioreg(header)
    assert only.registry_id == 4_294_969_468
    assert only.util_pct is None
    assert only.mem_used_bytes is None


def test_parse_ioreg_rejects_an_impossible_utilization() -> None:
    text = IOREG_TEXT.replace('"Device Utilization %"=2', '"Device Utilization %"=250')
    assert parse_ioreg(text)[0].util_pct is None


@pytest.mark.parametrize("text", ["", "garbage\nmore garbage", '"PerformanceStatistics" = {}'])
def test_parse_ioreg_of_nothing_is_empty(text: str) -> None:
    assert parse_ioreg(text) == []


def test_parse_system_profiler_reads_model_and_cores() -> None:
    assert parse_system_profiler(PROFILER_TEXT) == [
        DisplayGpu(model="Apple M1", core_count=7, metal_family="apple7", vendor="Apple")
    ]


def test_parse_system_profiler_without_cores_or_family() -> None:
    text = PROFILER_TEXT.replace('"sppci_cores":"7",', "").replace(
        '"spdisplays_metalfamily":"spdisplays_mtlgpufamilyapple7",', ""
    )
    assert parse_system_profiler(text) == [
        DisplayGpu(model="Apple M1", core_count=None, metal_family=None, vendor="Apple")
    ]


@pytest.mark.parametrize("text", ["", "{", "[]", '{"SPDisplaysDataType": {}}', '{"x": []}'])
def test_parse_system_profiler_of_nothing_is_empty(text: str) -> None:
    assert parse_system_profiler(text) == []


class FakeRunner:
    """Answers ioreg and system_profiler with the captured outputs, or fails on request."""

    def __init__(self, fail: set[str] | None = None) -> None:
        self.fail = fail or set()
        self.calls: list[tuple[tuple[str, ...], float]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> str:
        self.calls.append((tuple(argv), timeout_s))
        if argv[0] in self.fail:
            raise subprocess.TimeoutExpired(list(argv), timeout_s)
        return {"ioreg": IOREG_TEXT, "system_profiler": PROFILER_TEXT}[argv[0]]


def m1(registry_id: int = M1_REGISTRY_ID, name: str = "Apple M1") -> MetalDevice:
    return MetalDevice(
        name=name,
        registry_id=registry_id,
        unified_memory=True,
        recommended_working_set_bytes=M1_WORKING_SET,
    )


def make_prober(runner: FakeRunner, *devices: MetalDevice) -> AppleProber:
    return AppleProber(runner=runner, metal=lambda: list(devices), platform="darwin", timeout_s=3)


def test_discover_joins_metal_and_system_profiler() -> None:
    runner = FakeRunner()
    (device,) = make_prober(runner, m1()).discover()
    assert device.key == "metal:0x10000087c"
    assert device.vendor == "apple"
    assert device.backend == "metal"
    assert device.name == "Apple M1"
    assert device.source == "metal"
    assert device.vendor_index == 0
    assert device.arch == "apple7"
    assert device.compute_units == 7
    assert device.unified_memory is True
    assert device.mem_total_bytes == M1_WORKING_SET
    assert device.mem_note is not None and "recommendedMaxWorkingSetSize" in device.mem_note
    assert device.temp_slowdown_c is None
    assert runner.calls == [(SYSTEM_PROFILER_ARGV, 3)]


def test_sample_reads_ioreg_by_registry_id() -> None:
    runner = FakeRunner()
    prober = make_prober(runner, m1())
    prober.discover()
    (sample,) = prober.sample()
    assert sample.key == "metal:0x10000087c"
    assert sample.util_pct == 2.0
    assert sample.mem_used_bytes == 340_983_808
    assert sample.temp_c is None
    assert sample.power_mw is None
    assert sample.healthy is True
    assert sample.error == APPLE_NO_THERMAL_NOTE
    assert runner.calls[-1] == (IOREG_ARGV, 3)


def test_discover_survives_a_failing_system_profiler() -> None:
    (device,) = make_prober(FakeRunner(fail={"system_profiler"}), m1()).discover()
    assert device.name == "Apple M1"
    assert device.compute_units is None
    assert device.arch is None


def test_sample_when_ioreg_fails_keeps_the_device_with_unknown_readings() -> None:
    prober = make_prober(FakeRunner(fail={"ioreg"}), m1())
    prober.discover()
    (sample,) = prober.sample()
    assert sample.util_pct is None
    assert sample.mem_used_bytes is None
    assert sample.error is not None and sample.error.startswith("ioreg failed")


def test_two_devices_are_matched_by_registry_id_only() -> None:
    other = MetalDevice("AMD Radeon Pro 5500M", 0x1000009AA, False, 4 * 1024**3)
    prober = make_prober(FakeRunner(), m1(), other)
    built_in, radeon = prober.discover()
    assert radeon.vendor == "amd"
    assert radeon.backend == "metal"
    assert radeon.vendor_index == 0
    assert radeon.unified_memory is False
    assert built_in.compute_units == 7  # matched to system_profiler by model name
    assert radeon.compute_units is None
    m1_sample, radeon_sample = prober.sample()
    assert m1_sample.util_pct == 2.0
    assert radeon_sample.util_pct is None
    assert radeon_sample.error == "no IOAccelerator entry for this device in ioreg"


def test_discover_is_unavailable_off_macos() -> None:
    prober = AppleProber(runner=FakeRunner(), metal=lambda: [m1()], platform="linux")
    with pytest.raises(ProberUnavailable, match="macOS"):
        prober.discover()


def test_discover_is_unavailable_without_pyobjc() -> None:
    def no_metal() -> list[MetalDevice]:
        raise ImportError("No module named 'Metal'")

    prober = AppleProber(runner=FakeRunner(), metal=no_metal, platform="darwin")
    with pytest.raises(ProberUnavailable, match="pyobjc"):
        prober.discover()


def test_discover_is_unavailable_without_devices() -> None:
    with pytest.raises(ProberUnavailable, match="no device"):
        make_prober(FakeRunner()).discover()


def test_importing_the_module_does_not_import_metal() -> None:
    # With Metal made unimportable, the module must still import (in a fresh interpreter).
    code = "import sys; sys.modules['Metal'] = None; import probers.apple, probers.sim"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


class FakeMtlDevice:
    """Answers like a pyobjc MTLDevice proxy: properties are methods."""

    def name(self) -> str:
        return "Apple M1"

    def registryID(self) -> int:
        return M1_REGISTRY_ID

    def hasUnifiedMemory(self) -> bool:
        return True

    def recommendedMaxWorkingSetSize(self) -> int:
        return M1_WORKING_SET


def test_metal_devices_reads_pyobjc(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("Metal")
    fake.MTLCopyAllDevices = lambda: [FakeMtlDevice()]  # type: ignore[attr-defined]
    fake.MTLCreateSystemDefaultDevice = lambda: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "Metal", fake)
    assert metal_devices() == [m1()]


def test_metal_devices_falls_back_to_the_default_device(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("Metal")
    fake.MTLCopyAllDevices = lambda: None  # type: ignore[attr-defined]
    fake.MTLCreateSystemDefaultDevice = FakeMtlDevice  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "Metal", fake)
    assert metal_devices() == [m1()]


def test_default_prober_is_unavailable_without_pyobjc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "Metal", None)  # makes `import Metal` raise ImportError
    prober = AppleProber(runner=FakeRunner(), platform="darwin")
    with pytest.raises(ProberUnavailable, match="pyobjc"):
        prober.discover()


@pytest.mark.skipif(sys.platform != "darwin", reason="Metal exists on macOS only")
def test_real_mac() -> None:
    prober = AppleProber()
    devices = prober.discover()
    assert devices
    assert all(d.backend == "metal" for d in devices)
    samples = prober.sample()
    assert [s.key for s in samples] == [d.key for d in devices]
    for sample in samples:
        assert sample.util_pct is None or 0 <= sample.util_pct <= 100
