"""NvmlProber against the NVML stand-in fed by the captured 2x A10 host (driver 535, memory v1)."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import PurePosixPath
from types import SimpleNamespace

import pynvml
import pytest

from probers.base import ProberUnavailable
from probers.nvml import NvmlProber, normalise_bus_id, shadowing_pynvml_warning
from probers.records import Link, MigDevice
from tests.probers.nvml_standin import MigSlot, StandinNvml, install, load_capture

UUID0 = "GPU-749a4951-86af-0c5a-2a58-67aa5ebf9d4e"
UUID1 = "GPU-b1ff00c5-3253-827e-131a-a988b71d5e7b"
A10_TOTAL = 24146608128


@pytest.fixture
def nvml() -> StandinNvml:
    return load_capture()


@pytest.fixture(autouse=True)
def no_pynvml_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests see no deprecated ``pynvml`` distribution unless one says otherwise."""

    def missing(name: str) -> object:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)


def start(monkeypatch: pytest.MonkeyPatch, nvml: StandinNvml) -> NvmlProber:
    install(monkeypatch, nvml)
    prober = NvmlProber()
    return prober


# -- the captured host, as is ---------------------------------------------------------------


def test_capture_static_facts(monkeypatch: pytest.MonkeyPatch, nvml: StandinNvml) -> None:
    statics = start(monkeypatch, nvml).discover()
    assert [s.key for s in statics] == [UUID0, UUID1]
    first, second = statics
    assert first.uuid == UUID0 and second.uuid == UUID1
    assert first.name == "NVIDIA A10" and second.name == "NVIDIA A10"
    assert (first.vendor, first.backend, first.source) == ("nvidia", "cuda", "nvml")
    assert [s.vendor_index for s in statics] == [0, 1]
    assert first.driver_version == "535.129.03"
    assert first.arch == "ampere"
    assert first.compute_capability == "8.6"
    assert first.mem_total_bytes == A10_TOTAL and second.mem_total_bytes == A10_TOTAL
    # Not captured, so not known: never a made-up number.
    assert first.pci_bus_id is None
    assert first.temp_slowdown_c is None
    assert first.links == () and first.mig_devices == ()


def test_memory_v1_fallback_and_readings(
    monkeypatch: pytest.MonkeyPatch, nvml: StandinNvml
) -> None:
    prober = start(monkeypatch, nvml)
    prober.discover()
    gpu0, gpu1 = prober.sample()
    assert gpu0.key == UUID0 and gpu1.key == UUID1
    assert gpu0.healthy and gpu1.healthy
    assert gpu0.mem_used_bytes == 1257242624
    assert gpu1.mem_used_bytes == 541917184
    assert gpu0.power_mw == 64810 and gpu1.power_mw == 15749
    assert gpu0.util_pct == 0.0 and gpu1.util_pct == 0.0
    assert gpu0.temp_c is None and gpu0.power_limit_mw is None
    assert gpu0.error is not None
    assert "temp_c: Not Supported" in gpu0.error
    assert "power_limit_mw: Not Supported" in gpu0.error


def test_missing_v2_is_remembered_per_device(
    monkeypatch: pytest.MonkeyPatch, nvml: StandinNvml
) -> None:
    prober = start(monkeypatch, nvml)
    prober.discover()
    prober.sample()
    prober.sample()
    # v2 tried once per GPU; v1 answered discover and both samples on both GPUs.
    assert nvml.calls["nvmlDeviceGetMemoryInfo_v2"] == 2
    assert nvml.calls["nvmlDeviceGetMemoryInfo_v1"] == 6


def test_memory_v2_preferred(monkeypatch: pytest.MonkeyPatch, nvml: StandinNvml) -> None:
    # Made-up v2 readings for the variant (the capture has v1 only): v2 keeps the driver's
    # reservation out of "used", which v1 folds in.
    nvml.memory_v2 = True
    nvml.gpus[0].memory_v2 = (A10_TOTAL, 536870912, 23426236416, 720371712)
    nvml.gpus[1].memory_v2 = (A10_TOTAL, 536870912, 23604690944, 5046272)
    prober = start(monkeypatch, nvml)
    statics = prober.discover()
    assert statics[0].mem_total_bytes == A10_TOTAL
    gpu0, gpu1 = prober.sample()
    assert gpu0.mem_used_bytes == 720371712
    assert gpu1.mem_used_bytes == 5046272
    assert nvml.calls["nvmlDeviceGetMemoryInfo_v1"] == 0


def test_memory_v2_refused_falls_back_without_forgetting_v2(
    monkeypatch: pytest.MonkeyPatch, nvml: StandinNvml
) -> None:
    # The driver has v2 but this device answers Not Supported: v1 answers, v2 is asked again.
    nvml.memory_v2 = True
    prober = start(monkeypatch, nvml)
    prober.discover()
    gpu0, _ = prober.sample()
    assert gpu0.mem_used_bytes == 1257242624
    assert nvml.calls["nvmlDeviceGetMemoryInfo_v2"] == 4


def test_close_shuts_nvml_down_once(monkeypatch: pytest.MonkeyPatch, nvml: StandinNvml) -> None:
    prober = start(monkeypatch, nvml)
    prober.discover()
    prober.close()
    prober.close()
    assert nvml.calls["nvmlInit"] == 1
    assert nvml.calls["nvmlShutdown"] == 1
    assert all(not s.healthy for s in prober.sample())


# -- NVML missing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
    ],
)
def test_init_failure_is_unavailable(
    monkeypatch: pytest.MonkeyPatch, nvml: StandinNvml, code: int, words: str
) -> None:
    nvml.init_error = code
    prober = start(monkeypatch, nvml)
    with pytest.raises(ProberUnavailable, match=words):
        prober.discover()
    assert nvml.calls["nvmlShutdown"] == 0


def test_bindings_missing_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(ProberUnavailable, match="nvidia-ml-py"):
        NvmlProber().discover()


def test_no_gpu_is_unavailable(monkeypatch: pytest.MonkeyPatch, nvml: StandinNvml) -> None:
    nvml.gpus = []
    with pytest.raises(ProberUnavailable, match="no NVIDIA GPU"):
        start(monkeypatch, nvml).discover()
    assert nvml.calls["nvmlShutdown"] == 1


# -- devices that stop answering ------------------------------------------------------------


def test_gpu_lost_during_sample(monkeypatch: pytest.MonkeyPatch, nvml: StandinNvml) -> None:
    prober = start(monkeypatch, nvml)
    prober.discover()
    nvml.gpus[1].lost = True
    gpu0, gpu1 = prober.sample()
    assert gpu0.healthy and gpu0.mem_used_bytes == 1257242624
    assert gpu1.key == UUID1
    assert not gpu1.healthy
    assert gpu1.error == "GPU is lost"
    assert gpu1.mem_used_bytes is None and gpu1.power_mw is None


def test_gpu_lost_during_discover(monkeypatch: pytest.MonkeyPatch, nvml: StandinNvml) -> None:
    nvml.gpus[1].lost = True
    nvml.topology = {(0, 1): pynvml.NVML_TOPOLOGY_HOSTBRIDGE}
    prober = start(monkeypatch, nvml)
    first, second = prober.discover()
    assert first.key == UUID0 and first.mem_total_bytes == A10_TOTAL
    assert first.links == () and second.links == ()
    assert second.key == "nvml:1" and second.uuid is None and second.mem_total_bytes is None
    assert [(s.key, s.healthy, s.error) for s in prober.sample()][1] == (
        "nvml:1",
        False,
        "GPU is lost",
    )


# -- MIG ------------------------------------------------------------------------------------


def test_mig_children_and_no_utilization(
    monkeypatch: pytest.MonkeyPatch, nvml: StandinNvml
) -> None:
    # Made-up MIG layout (the A10 has no MIG): slot 1 is empty and must be skipped.
    mig_a = "MIG-5d8a3b1e-0000-4000-8000-000000000001"
    mig_b = "MIG-5d8a3b1e-0000-4000-8000-000000000002"
    nvml.gpus[0].mig_slots = [
        MigSlot(mig_a, "NVIDIA A10 MIG 1g.11gb", 11811160064),
        None,
        MigSlot(mig_b, "NVIDIA A10 MIG 1g.11gb", 11811160064),
    ]
    prober = start(monkeypatch, nvml)
    first, second = prober.discover()
    assert first.mig_devices == (
        MigDevice(
            "MIG-5d8a3b1e-0000-4000-8000-000000000001", "NVIDIA A10 MIG 1g.11gb", 11811160064
        ),
        MigDevice(
            "MIG-5d8a3b1e-0000-4000-8000-000000000002", "NVIDIA A10 MIG 1g.11gb", 11811160064
        ),
    )
    assert second.mig_devices == ()
    gpu0, gpu1 = prober.sample()
    assert gpu0.healthy and gpu0.util_pct is None
    assert gpu0.error is not None and "util_pct: Not Supported" in gpu0.error
    assert gpu0.mem_used_bytes == 1257242624
    assert gpu1.util_pct == 0.0


# -- links ----------------------------------------------------------------------------------


def with_bus_ids(nvml: StandinNvml) -> StandinNvml:
    # Made-up PCI addresses for the link variants (the capture has none), in NVML's form.
    nvml.gpus[0].bus_id = "00000000:17:00.0"
    nvml.gpus[1].bus_id = "00000000:CA:00.0"
    return nvml


def test_pci_bus_id_is_normalised(monkeypatch: pytest.MonkeyPatch, nvml: StandinNvml) -> None:
    statics = start(monkeypatch, with_bus_ids(nvml)).discover()
    assert [s.pci_bus_id for s in statics] == ["0000:17:00.0", "0000:ca:00.0"]


def test_nvlink_between_the_two(monkeypatch: pytest.MonkeyPatch, nvml: StandinNvml) -> None:
    # Made-up NVLink variant (the A10 has none): four active links of six each way, 25 GB/s
    # per lane per direction; links 4 and 5 inactive. The topology answer must go unused.
    with_bus_ids(nvml)
    nvml.gpus[0].nvlink_count = nvml.gpus[1].nvlink_count = 6
    nvml.gpus[0].nvlink_peers = {link: "00000000:CA:00.0" for link in range(4)}
    nvml.gpus[1].nvlink_peers = {link: "00000000:17:00.0" for link in range(4)}
    nvml.gpus[0].nvlink_speed_mbytes = nvml.gpus[1].nvlink_speed_mbytes = 25000
    nvml.topology = {(0, 1): pynvml.NVML_TOPOLOGY_SYSTEM}
    first, second = start(monkeypatch, nvml).discover()
    assert first.links == (Link(UUID1, "nvlink", bandwidth_mbps=800000, detail="4"),)
    assert second.links == (Link(UUID0, "nvlink", bandwidth_mbps=800000, detail="4"),)


def test_nvlink_speed_unknown(monkeypatch: pytest.MonkeyPatch, nvml: StandinNvml) -> None:
    with_bus_ids(nvml)
    nvml.gpus[0].nvlink_count = nvml.gpus[1].nvlink_count = 2
    nvml.gpus[0].nvlink_peers = {1: "00000000:CA:00.0"}
    nvml.gpus[1].nvlink_peers = {0: "00000000:17:00.0"}
    first, _ = start(monkeypatch, nvml).discover()
    assert first.links == (Link(UUID1, "nvlink", bandwidth_mbps=None, detail="1"),)


def test_nvswitch_links_every_pair(monkeypatch: pytest.MonkeyPatch, nvml: StandinNvml) -> None:
    # Made-up NVSwitch variant: each GPU's links all go to switches, so the pair talks over
    # the fewer of their lanes.
    with_bus_ids(nvml)
    nvml.gpus[0].nvlink_count = nvml.gpus[1].nvlink_count = 18
    nvml.gpus[0].nvswitch_links = set(range(18))
    nvml.gpus[1].nvswitch_links = set(range(12))
    first, second = start(monkeypatch, nvml).discover()
    assert first.links == (Link(UUID1, "nvlink", detail="12"),)
    assert second.links == (Link(UUID0, "nvlink", detail="12"),)


@pytest.mark.parametrize(
    ("level", "word"),
    [
        (pynvml.NVML_TOPOLOGY_SINGLE, "PIX"),
        (pynvml.NVML_TOPOLOGY_MULTIPLE, "PXB"),
        (pynvml.NVML_TOPOLOGY_HOSTBRIDGE, "PHB"),
        (pynvml.NVML_TOPOLOGY_NODE, "NODE"),
        (pynvml.NVML_TOPOLOGY_SYSTEM, "SYS"),
    ],
)
def test_topology_common_ancestor(
    monkeypatch: pytest.MonkeyPatch, nvml: StandinNvml, level: int, word: str
) -> None:
    nvml.topology = {(0, 1): level}
    first, second = start(monkeypatch, nvml).discover()
    assert first.links == (Link(UUID1, "pcie", detail=word),)
    assert second.links == (Link(UUID0, "pcie", detail=word),)


# -- the deprecated pynvml distribution -----------------------------------------------------


def fake_distribution(files: list[str] | None) -> object:
    def distribution(name: str) -> object:
        assert name == "pynvml"
        paths = None if files is None else [PurePosixPath(f) for f in files]
        return SimpleNamespace(version="11.5.0", files=paths)

    return distribution


def test_no_warning_without_pynvml_distribution() -> None:
    assert shadowing_pynvml_warning() is None


def test_shadowing_warning(monkeypatch: pytest.MonkeyPatch, nvml: StandinNvml) -> None:
    monkeypatch.setattr(
        importlib.metadata, "distribution", fake_distribution(["pynvml.py", "smi.py"])
    )
    warning = shadowing_pynvml_warning()
    assert warning is not None and "\n" not in warning
    assert "11.5.0" in warning and "shadows" in warning
    prober = start(monkeypatch, nvml)
    prober.discover()
    prober.discover()
    assert prober.warnings == [warning]


def test_pynvml_without_module_is_only_deprecated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        importlib.metadata, "distribution", fake_distribution(["pynvml_utils/__init__.py"])
    )
    warning = shadowing_pynvml_warning()
    assert warning is not None and "deprecated" in warning and "shadows" not in warning


# -- bus id form ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("00000000:3B:00.0", "0000:3b:00.0"),
        (b"00000001:CA:1F.7", "0001:ca:1f.7"),
        ("0000:09:00.0", "0000:09:00.0"),
        ("09:00.0", "0000:09:00.0"),
        ("", None),
        ("garbage", None),
        ("0000:zz:00.0", None),
    ],
)
def test_normalise_bus_id(raw: str | bytes, expected: str | None) -> None:
    assert normalise_bus_id(raw) == expected


def test_memory_bandwidth_clocks_throttle_and_pcie(
    monkeypatch: pytest.MonkeyPatch, nvml: StandinNvml
) -> None:
    """The capture's memory utilization (0: an idle A10) is memory-bandwidth activity; what the
    capture does not hold (clocks, throttle reasons, PCIe) the stand-in refuses as NVML does on
    a device without them: unsupported, never 0, and not asked again."""
    prober = start(monkeypatch, nvml)
    prober.discover()
    gpu0, gpu1 = prober.sample()
    assert gpu0.mem_bw_pct == 0.0 and gpu1.mem_bw_pct == 0.0
    assert gpu0.sm_clock_mhz is None and gpu0.throttled is None
    assert gpu0.pcie_rx_bytes_per_s is None and gpu0.pcie_link_bytes_per_s is None
    assert gpu0.error is not None and "sm_clock_mhz: Not Supported" in gpu0.error
    assert "pcie_rx: Not Supported" in gpu0.error
    asked = nvml.calls["nvmlDeviceGetClockInfo"]
    again = prober.sample()[0]
    assert nvml.calls["nvmlDeviceGetClockInfo"] == asked  # refused once: not asked again
    assert again.error is not None and "sm_clock_mhz: Not Supported" in again.error

    # An A10 is PCIe 4.0 x16 (NVIDIA's published specifications); traffic and clocks set here.
    for gpu in nvml.gpus:
        gpu.sm_clock_mhz, gpu.pcie_gen, gpu.pcie_width = 1695, 4, 16
        gpu.throttle_reasons = 0x1  # idle: not a slowdown
        gpu.pcie_kb_per_s = (2_000_000, 500_000)
    nvml.gpus[1].throttle_reasons = 0x4 | 0x1  # the software power cap
    fresh = start(monkeypatch, nvml)
    fresh.discover()
    first = fresh.sample()
    assert first[0].sm_clock_mhz == 1695.0 and first[0].throttled is False
    assert first[1].throttled is True
    assert first[0].pcie_link_bytes_per_s == pytest.approx(31.5e9, rel=0.01)
    assert first[0].pcie_rx_bytes_per_s == 2_000_000 * 1024
    assert first[1].pcie_rx_bytes_per_s is None  # its turn is the next sample
    second = fresh.sample()
    assert second[1].pcie_tx_bytes_per_s == 500_000 * 1024
    assert second[0].pcie_rx_bytes_per_s == 2_000_000 * 1024  # its last reading, kept
    # rx and tx of one GPU a sample: four samples in all (two refused, two read), not sixteen
    assert nvml.calls["nvmlDeviceGetPcieThroughput"] == 4 * 2
