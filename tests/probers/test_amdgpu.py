"""The amdgpu sysfs prober against captured cards, and variants of them built in tmp_path."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from probers.amdgpu import AmdgpuProber, parse_amdgpu_ids
from probers.base import ProberUnavailable
from probers.gpu_metrics import parse as parse_metrics
from probers.records import DeviceStatic
from tests.support import SYSFS

RX6900 = Path("sys/class/drm/card0/device")
RX580 = Path("sys/class/drm/card0/device")
PHOENIX = Path("sys/class/drm/card1/device")
RX6900_HWMON = RX6900 / "hwmon/hwmon5"
KFD_NODES = Path("sys/class/kfd/kfd/topology/nodes")


def _copy(fixture: str, tmp_path: Path) -> Path:
    root = tmp_path / fixture
    shutil.copytree(SYSFS / fixture, root)
    return root


def _only(prober: AmdgpuProber) -> DeviceStatic:
    (static,) = prober.discover()
    return static


# --- the captured cards, as they are -------------------------------------------------------------


def test_rx6900xt_static() -> None:
    prober = AmdgpuProber(SYSFS / "amd-rx6900xt")
    static = _only(prober)
    assert static.key == "amd:946d7e1ef9b172dd"
    assert static.uuid == "GPU-946d7e1ef9b172dd"
    assert static.vendor == "amd"
    assert static.backend == "rocm"
    assert static.source == "amdgpu-sysfs"
    assert static.name == "AMD Radeon RX 6900 XT"  # product_name is empty: PCI 73BF rev C0
    assert static.pci_bus_id == "0000:0c:00.0"
    assert static.vendor_index == 0
    assert static.arch == "gfx1030"
    assert static.compute_capability == "gfx1030"
    assert static.unified_memory is False
    assert static.mem_total_bytes == 17163091968
    assert static.mem_note is None
    assert static.compute_units is None  # no KFD in this capture
    assert static.temp_slowdown_c == 110.0  # the junction sensor's crit, not edge's 100
    assert static.links == ()
    (card,) = prober.cards
    assert card.temp_label == "junction"
    assert card.apu_reason is None
    assert card.pcie == "PCIe 16.0 GT/s x16, max 16.0 GT/s x16"
    assert card.kfd_node is None


def test_rx6900xt_sample() -> None:
    (sample,) = AmdgpuProber(SYSFS / "amd-rx6900xt").sample()
    assert sample.key == "amd:946d7e1ef9b172dd"
    assert sample.mem_used_bytes == 668274688
    assert sample.util_pct == 3.0
    assert sample.temp_c == 59.0  # junction; edge reads 56
    assert sample.power_mw == 36000  # power1_average 36000000 uW
    assert sample.power_limit_mw == 289000
    assert sample.healthy is True
    assert sample.error is None
    # mem_busy_percent (0); the gpu_metrics 1.3 blob: current gfx clock 500 MHz (pp_dpm_sclk
    # marks 500Mhz too), no throttling, PCIe 16 GT/s x16 (as current_link_speed/width say)
    assert sample.mem_bw_pct == 0.0
    assert sample.sm_clock_mhz == 500.0 and sample.throttled is False
    assert sample.pcie_link_bytes_per_s == pytest.approx(31.5e9, rel=0.01)
    assert sample.pcie_rx_bytes_per_s is None  # amdgpu has no PCIe byte counters: unsupported


def test_gpu_metrics_blob_fields_and_refusals() -> None:
    blob = (SYSFS / "amd-rx6900xt/sys/class/drm/card0/device/gpu_metrics").read_bytes()
    revision, metrics = parse_metrics(blob)
    assert revision == "1.3" and metrics.umc_activity_pct == 0.0
    busy = bytearray(blob)
    busy[18:20] = (87).to_bytes(2, "little")  # average_umc_activity
    busy[68:72] = (0x2).to_bytes(4, "little")  # a throttle status bit
    assert parse_metrics(bytes(busy))[1] == replace(metrics, umc_activity_pct=87.0, throttled=True)
    unfilled = bytearray(blob)
    unfilled[18:20] = b"\xff\xff"
    assert parse_metrics(bytes(unfilled))[1].umc_activity_pct is None  # not filled: unsupported
    with pytest.raises(ValueError, match="bytes of 120"):
        parse_metrics(blob[:60])


def test_rx580_static_and_sample() -> None:
    prober = AmdgpuProber(SYSFS / "amd-rx580")
    static = _only(prober)
    assert static.key == "drm:card0"  # no unique_id on Polaris
    assert static.uuid is None
    assert static.name == "AMD Radeon RX 580 Series"  # PCI 67DF rev E7
    assert static.pci_bus_id == "0000:09:00.0"
    assert static.arch == "gfx803"
    assert static.unified_memory is False
    assert static.mem_total_bytes == 4294967296
    assert static.temp_slowdown_c == 94.0  # edge is its only sensor
    assert prober.cards[0].pcie == "PCIe max 8.0 GT/s x16"  # no current_link_* files
    (sample,) = prober.sample()
    assert sample.key == "drm:card0"
    assert sample.mem_used_bytes == 536870912
    assert sample.util_pct == 11.0
    assert sample.mem_bw_pct == 2.0  # mem_busy_percent; Polaris has no gpu_metrics blob
    assert sample.sm_clock_mhz is None and sample.throttled is None
    assert sample.temp_c == 44.0
    assert sample.power_mw == 41045
    assert sample.power_limit_mw == 155000
    assert sample.error is None


def test_phoenix_apu() -> None:
    prober = AmdgpuProber(SYSFS / "amd-phoenix")
    static = _only(prober)
    assert static.key == "drm:card1"  # unique_id is empty and KFD's is 0
    assert static.uuid is None
    assert static.name == "AMD Radeon 780M Graphics"  # no product_name: PCI 15BF rev DD
    assert static.pci_bus_id == "0000:64:00.0"
    assert static.arch == "gfx1103"  # from KFD node 1
    assert static.compute_units == 12
    assert static.vendor_index == 0
    assert static.unified_memory is True
    assert static.mem_total_bytes == 4294967296 + 31433977856
    assert static.mem_note == "APU: 4.0 GiB VRAM carve-out + 29.3 GiB GTT (shared system memory)"
    assert static.temp_slowdown_c is None  # the APU's edge sensor has no crit
    assert static.links == ()  # its only KFD link goes to the CPU node
    (card,) = prober.cards
    assert card.kfd_node == 1
    assert card.apu_reason == "gpu_metrics format 2 (APU layout)"
    (sample,) = prober.sample()
    assert sample.mem_used_bytes == 1272893440 + 211398656  # VRAM used + GTT used
    assert sample.util_pct == 0.0
    assert sample.temp_c == 25.0
    assert sample.power_mw == 3103  # power1_average wins over power1_input (3142000)
    assert sample.power_limit_mw is None
    # its gpu_metrics is the APUs' 2.1, a layout not read yet: said so, its fields unsupported
    assert sample.error == "gpu_metrics 2.1: a layout not read yet"
    assert sample.mem_bw_pct is None and sample.sm_clock_mhz is None and sample.throttled is None


# --- unavailable ---------------------------------------------------------------------------------


def test_no_drm_at_all_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(ProberUnavailable):
        AmdgpuProber(tmp_path).discover()
    with pytest.raises(ProberUnavailable):
        AmdgpuProber(SYSFS / "amd-mi210-xgmi-kfd").discover()  # KFD alone, no DRM card
    assert AmdgpuProber(tmp_path).sample() == []


def test_other_drivers_only_is_unavailable() -> None:
    with pytest.raises(ProberUnavailable):
        AmdgpuProber(SYSFS / "nvidia-rtx4080").discover()
    with pytest.raises(ProberUnavailable):
        AmdgpuProber(SYSFS / "intel-a380-xe").discover()


def test_card_with_other_driver_is_ignored(tmp_path: Path) -> None:
    root = _copy("amd-rx6900xt", tmp_path)
    nvidia = SYSFS / "nvidia-rtx4080/sys/class/drm/card1"
    shutil.copytree(nvidia, root / "sys/class/drm/card1")
    prober = AmdgpuProber(root)
    assert [s.key for s in prober.discover()] == ["amd:946d7e1ef9b172dd"]
    assert [s.key for s in prober.sample()] == ["amd:946d7e1ef9b172dd"]


# --- variants ----------------------------------------------------------------------------------


def test_no_hwmon(tmp_path: Path) -> None:
    root = _copy("amd-rx6900xt", tmp_path)
    shutil.rmtree(root / RX6900 / "hwmon")
    prober = AmdgpuProber(root)
    static = _only(prober)
    assert static.temp_slowdown_c is None
    assert static.mem_total_bytes == 17163091968
    (sample,) = prober.sample()
    assert (sample.temp_c, sample.power_mw, sample.power_limit_mw) == (None, None, None)
    assert sample.mem_used_bytes == 668274688
    assert sample.util_pct == 3.0
    assert sample.healthy is True
    assert sample.error is None  # nothing that answered at discovery went missing


def test_power1_input_only(tmp_path: Path) -> None:
    root = _copy("amd-rx6900xt", tmp_path)
    (root / RX6900_HWMON / "power1_average").unlink()
    (root / RX6900_HWMON / "power1_input").write_text("45500000\n")
    (sample,) = AmdgpuProber(root).sample()
    assert sample.power_mw == 45500


def test_empty_unique_id_falls_back_to_card(tmp_path: Path) -> None:
    root = _copy("amd-rx6900xt", tmp_path)
    (root / RX6900 / "unique_id").write_bytes(b"\0" * 4096)
    prober = AmdgpuProber(root)
    static = _only(prober)
    assert static.key == "drm:card0"
    assert static.uuid is None
    assert prober.sample()[0].key == "drm:card0"


def test_missing_gpu_busy_percent(tmp_path: Path) -> None:
    root = _copy("amd-rx6900xt", tmp_path)
    (root / RX6900 / "gpu_busy_percent").unlink()
    (sample,) = AmdgpuProber(root).sample()
    assert sample.util_pct is None
    assert sample.mem_used_bytes == 668274688
    assert sample.error is None  # never there: nothing to explain


def test_reading_that_vanishes_is_named(tmp_path: Path) -> None:
    root = _copy("amd-rx6900xt", tmp_path)
    prober = AmdgpuProber(root)
    prober.discover()
    (root / RX6900 / "gpu_busy_percent").unlink()
    (root / RX6900_HWMON / "temp2_input").unlink()
    (sample,) = prober.sample()
    assert sample.util_pct is None
    assert sample.temp_c is None
    assert sample.healthy is True
    assert sample.error == "not readable now: gpu_busy_percent, temp2_input"


def test_device_gone_is_unhealthy_not_raised(tmp_path: Path) -> None:
    root = _copy("amd-rx6900xt", tmp_path)
    prober = AmdgpuProber(root)
    prober.discover()
    shutil.rmtree(root / "sys/class/drm/card0")
    (sample,) = prober.sample()
    assert sample.key == "amd:946d7e1ef9b172dd"
    assert sample.healthy is False
    assert sample.error == "device folder is gone"
    assert sample.mem_used_bytes is None


def test_samples_reread_dynamic_files(tmp_path: Path) -> None:
    root = _copy("amd-rx6900xt", tmp_path)
    prober = AmdgpuProber(root)
    prober.discover()
    assert prober.sample()[0].util_pct == 3.0
    (root / RX6900 / "gpu_busy_percent").write_text("87\n")
    (root / RX6900 / "mem_info_vram_used").write_text("1073741824\n")
    (root / RX6900_HWMON / "temp2_input").write_text("91000\n")
    (root / RX6900_HWMON / "power1_average").write_text("250123000\n")
    (sample,) = prober.sample()
    assert sample.util_pct == 87.0
    assert sample.mem_used_bytes == 1073741824
    assert sample.temp_c == 91.0
    assert sample.power_mw == 250123


def test_edge_reported_when_no_junction(tmp_path: Path) -> None:
    root = _copy("amd-rx6900xt", tmp_path)
    for name in ("temp2_input", "temp2_label", "temp2_crit"):
        (root / RX6900_HWMON / name).unlink()
    prober = AmdgpuProber(root)
    assert _only(prober).temp_slowdown_c == 100.0  # edge crit
    assert prober.sample()[0].temp_c == 56.0


def test_zero_power_cap_is_unknown(tmp_path: Path) -> None:
    root = _copy("amd-rx580", tmp_path)
    (root / RX580 / "hwmon/hwmon4/power1_cap").write_text("0\n")
    assert AmdgpuProber(root).sample()[0].power_limit_mw is None


def test_power2_cap_is_never_the_limit(tmp_path: Path) -> None:
    # Van Gogh's fastPPT (power2_cap) is a short-window limit: only power1_cap is taken.
    root = _copy("amd-rx580", tmp_path)
    hwmon = root / RX580 / "hwmon/hwmon4"
    (hwmon / "power2_cap").write_text("200000000\n")
    assert AmdgpuProber(root).sample()[0].power_limit_mw == 155000
    (hwmon / "power1_cap").write_text("\n")  # amdgpu prints an empty line when it has no limit
    assert AmdgpuProber(root).sample()[0].power_limit_mw is None


# --- names ---------------------------------------------------------------------------------------


def test_product_name_wins(tmp_path: Path) -> None:
    root = _copy("amd-rx580", tmp_path)
    (root / RX580 / "product_name").write_text("Radeon Test Board\n")
    assert _only(AmdgpuProber(root)).name == "Radeon Test Board"


def test_libdrm_ids_under_root(tmp_path: Path) -> None:
    root = _copy("amd-rx580", tmp_path)
    ids = root / "usr/share/libdrm/amdgpu.ids"
    ids.parent.mkdir(parents=True)
    ids.write_text("# comment\n1.0.0\n67DF,\tE7,\tAMD Radeon RX 580 2048SP\n")
    assert _only(AmdgpuProber(root)).name == "AMD Radeon RX 580 2048SP"


def test_unknown_device_id(tmp_path: Path) -> None:
    root = _copy("amd-rx580", tmp_path)
    uevent = root / RX580 / "uevent"
    uevent.write_text(uevent.read_text().replace("PCI_ID=1002:67DF", "PCI_ID=1002:ABCD"))
    static = _only(AmdgpuProber(root))
    assert static.name == "AMD GPU [1002:ABCD]"
    assert static.arch is None


def test_parse_amdgpu_ids() -> None:
    text = "# header\n1.0.0\n73BF,\tC0,\tAMD Radeon RX 6900 XT\nbroken line\nZZZZ,\t00,\tx\n"
    assert parse_amdgpu_ids(text) == {(0x73BF, 0xC0): "AMD Radeon RX 6900 XT"}


# --- the APU rule --------------------------------------------------------------------------------


def test_small_vram_with_gtt_is_apu(tmp_path: Path) -> None:
    root = _copy("amd-rx580", tmp_path)
    (root / RX580 / "mem_info_vram_total").write_text("536870912\n")
    prober = AmdgpuProber(root)
    static = _only(prober)
    assert static.unified_memory is True
    assert static.mem_total_bytes == 536870912 + 8342712320
    assert static.mem_note == "APU: 0.5 GiB VRAM carve-out + 7.8 GiB GTT (shared system memory)"
    assert prober.cards[0].apu_reason == "VRAM carve-out under 1 GiB with GTT"
    assert prober.sample()[0].mem_used_bytes == 536870912 + 92377088


def test_kfd_node_with_cpu_cores_is_apu(tmp_path: Path) -> None:
    root = _copy("amd-phoenix", tmp_path)
    (root / PHOENIX / "gpu_metrics").unlink()
    props = root / KFD_NODES / "1/properties"
    props.write_text(props.read_text().replace("cpu_cores_count 0", "cpu_cores_count 4"))
    prober = AmdgpuProber(root)
    assert _only(prober).unified_memory is True
    assert prober.cards[0].apu_reason == "KFD node 1 has 4 CPU cores"


def test_large_carve_out_without_other_signs_is_not_apu(tmp_path: Path) -> None:
    root = _copy("amd-phoenix", tmp_path)
    (root / PHOENIX / "gpu_metrics").unlink()
    prober = AmdgpuProber(root)
    static = _only(prober)
    assert static.unified_memory is False
    assert static.mem_total_bytes == 4294967296
    assert static.mem_note is None
    assert prober.sample()[0].mem_used_bytes == 1272893440


def test_dgpu_metrics_header_is_not_apu() -> None:
    prober = AmdgpuProber(SYSFS / "amd-rx6900xt")
    prober.discover()
    assert prober.cards[0].apu_reason is None  # gpu_metrics format revision 1


# --- a multi-MI210 host: the captured KFD topology with DRM cards added ------------------------

# (card, PCI address, KFD node, unique id as amdgpu prints it); cards in PCI order, nodes not.
MI210_CARDS = [
    ("card0", "0000:03:00.0", 4, "93bb3629c01aea1c"),
    ("card1", "0000:26:00.0", 5, "4344e78b718814cd"),
    ("card2", "0000:43:00.0", 3, "51276ac12ce05db3"),
    ("card3", "0000:63:00.0", 2, "1901ead3a2ecd4a6"),
    ("card4", "0000:83:00.0", 8, "f83f06efb714e6cf"),
    ("card5", "0000:a3:00.0", 9, "c34ec50444dd0a6d"),
    ("card6", "0000:c3:00.0", 7, "a3781b5a10fcf54a"),
    ("card7", "0000:e3:00.0", 6, "aea834aa2723eb57"),
]
MI210_KEY = {node: f"amd:{uid}" for _, _, node, uid in MI210_CARDS}


@pytest.fixture
def mi210(tmp_path: Path) -> AmdgpuProber:
    root = _copy("amd-mi210-xgmi-kfd", tmp_path)
    for card, bus_id, _node, uid in MI210_CARDS:
        device = root / "sys/class/drm" / card / "device"
        device.mkdir(parents=True)
        (device / "uevent").write_text(
            f"DRIVER=amdgpu\nPCI_CLASS=38000\nPCI_ID=1002:740F\nPCI_SLOT_NAME={bus_id}\n"
        )
        (device / "revision").write_text("0x02\n")
        (device / "mem_info_vram_total").write_text("68702699520\n")
        (device / "mem_info_gtt_total").write_text("270479671296\n")
        if card != "card5":  # card5 has no unique_id file: its key comes from KFD
            (device / "unique_id").write_text(f"{uid}\n")
    return AmdgpuProber(root)


def test_mi210_devices(mi210: AmdgpuProber) -> None:
    statics = mi210.discover()
    assert [s.key for s in statics] == [f"amd:{uid}" for *_, uid in MI210_CARDS]
    assert [s.vendor_index for s in statics] == [2, 3, 1, 0, 6, 7, 5, 4]  # KFD node order
    assert [c.kfd_node for c in mi210.cards] == [node for _, _, node, _ in MI210_CARDS]
    for static in statics:
        assert static.name == "AMD Instinct MI210"
        assert static.arch == "gfx90a"
        assert static.compute_units == 104
        assert static.unified_memory is False
        assert static.mem_total_bytes == 68702699520
    assert statics[5].uuid == "GPU-c34ec50444dd0a6d"


def test_mi210_xgmi_link_graph(mi210: AmdgpuProber) -> None:
    statics = mi210.discover()
    by_node = {card.kfd_node: card.static for card in mi210.cards}
    xgmi_pairs = set()
    for static in statics:
        xgmi = [link for link in static.links if link.kind == "xgmi"]
        assert len(xgmi) == 3
        for link in xgmi:
            assert link.bandwidth_mbps == 400000  # 50000 MB/s
            assert link.detail == "hops=1 weight=15"
            xgmi_pairs.add(frozenset((static.key, link.peer)))
    hive_a = [MI210_KEY[n] for n in (2, 3, 4, 5)]
    hive_b = [MI210_KEY[n] for n in (6, 7, 8, 9)]
    expected = {
        frozenset((a, b)) for hive in (hive_a, hive_b) for a in hive for b in hive if a != b
    }
    assert xgmi_pairs == expected
    assert len(xgmi_pairs) == 12
    node2 = by_node[2]
    assert [link.peer for link in node2.links if link.kind == "xgmi"] == [
        MI210_KEY[3],
        MI210_KEY[4],
        MI210_KEY[5],
    ]


def test_mi210_pcie_peers_across_sockets(mi210: AmdgpuProber) -> None:
    mi210.discover()
    node2 = next(card.static for card in mi210.cards if card.kfd_node == 2)
    pcie = [link for link in node2.links if link.kind == "pcie"]
    assert [link.peer for link in pcie] == [MI210_KEY[n] for n in (6, 7, 8, 9)]
    assert {link.detail for link in pcie} == {"p2p hops=3 weight=72"}
    assert {link.bandwidth_mbps for link in pcie} == {None}  # KFD reports 0 for these
    assert len(node2.links) == 7


def test_mi210_samples_without_dynamic_files(mi210: AmdgpuProber) -> None:
    samples = mi210.sample()
    assert len(samples) == 8
    for sample in samples:
        assert sample.healthy is True
        assert sample.mem_used_bytes is None
        assert sample.util_pct is None
        assert sample.error is None
