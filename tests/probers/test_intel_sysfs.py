"""The xe/i915 sysfs prober against captured Arc A380 (xe, i915), Arc B580 (xe, two kernels) and
Tiger Lake (xe) trees."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from probers.base import ProberUnavailable
from probers.intel_sysfs import (
    IntelFrequency,
    IntelSysfsProber,
    busy_pct_from_idle,
    intel_model,
    intel_name,
    power_mw_from_energy,
    read_frequency,
    read_hwmon,
    read_idle_residency_ms,
    read_power_limit,
)
from tests.support import SYSFS

XE_CARD = "sys/class/drm/card0"
I915_CARD = "sys/class/drm/card1"
XE_HWMON = f"{XE_CARD}/device/hwmon/hwmon0"
I915_HWMON = f"{I915_CARD}/device/hwmon/hwmon1"
XE_IDLE = f"{XE_CARD}/device/tile0/gt0/gtidle/idle_residency_ms"
I915_RC6 = f"{I915_CARD}/gt/gt0/rc6_residency_ms"

B580 = "intel-b580-xe"  # power1_cap and power1_crit, no powerN_max
B580_616 = "intel-b580-xe-6.16"  # kernel 6.16: power1_crit only
B580_CARD = "sys/class/drm/card1"
B580_HWMON = f"{B580_CARD}/device/hwmon/hwmon3"
B580_616_HWMON = f"{B580_CARD}/device/hwmon/hwmon4"

XE_ENERGY_UJ = 59540970520  # energy2_input, label "pkg"
I915_ENERGY_UJ = 25637161804  # energy1_input, no label
XE_IDLE_MS = 2547784
I915_RC6_MS = 6534


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def copy_tree(name: str, tmp_path: Path) -> Path:
    root = tmp_path / name
    shutil.copytree(SYSFS / name, root)
    return root


def write(root: Path, rel: str, value: int | str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}\n")


# --- the captures as they are -------------------------------------------------------------------


def test_xe_a380_static() -> None:
    prober = IntelSysfsProber(SYSFS / "intel-a380-xe", clock=FakeClock())
    (dev,) = prober.discover()
    assert dev.key == "pci:0000:08:00.0"
    assert dev.pci_bus_id == "0000:08:00.0"
    assert dev.name == "Intel Arc A380 Graphics"
    assert dev.arch == "dg2/xe-hpg"
    assert dev.source == "xe-sysfs"
    assert (dev.vendor, dev.backend, dev.vendor_index) == ("intel", "xpu", 0)
    assert dev.unified_memory is False
    assert dev.mem_total_bytes is None
    assert dev.mem_note is not None and "VRAM" in dev.mem_note
    assert prober.source == "intel-sysfs"


def test_xe_a380_hwmon_and_frequency() -> None:
    card = SYSFS / "intel-a380-xe" / XE_CARD
    hwmon = read_hwmon(card / "device")
    assert hwmon is not None
    assert hwmon.energy_uj == XE_ENERGY_UJ
    assert hwmon.energy_label == "pkg"
    assert hwmon.power_limit_mw == 55000  # power2_max 55000000 uW, label pkg
    assert hwmon.power_limit_file == "power2_max"
    assert hwmon.temp_c == 56.0  # temp2 pkg
    assert hwmon.vram_temp_c == 54.0  # temp3 vram
    assert hwmon.power_crit_mw is None
    assert read_frequency(card, "xe") == IntelFrequency(cur_mhz=300, act_mhz=0, max_mhz=2450)
    assert read_idle_residency_ms(card, "xe") == (XE_IDLE_MS, 1)


def test_xe_a380_first_sample_after_discover() -> None:
    clock = FakeClock()
    prober = IntelSysfsProber(SYSFS / "intel-a380-xe", clock=clock)
    prober.discover()
    clock.now += 1.0
    (sample,) = prober.sample()
    assert sample.key == "pci:0000:08:00.0"
    assert sample.healthy is True
    assert sample.temp_c == 56.0
    assert sample.power_limit_mw == 55000
    assert sample.mem_used_bytes is None
    # A frozen capture: the counter did not move, so power is unknown, not 0.
    assert sample.power_mw is None
    assert sample.error == "energy counter did not advance"


def test_i915_a380() -> None:
    clock = FakeClock()
    prober = IntelSysfsProber(SYSFS / "intel-a380-i915", clock=clock)
    (dev,) = prober.discover()
    assert dev.key == "pci:0000:0b:00.0"
    assert dev.name == "Intel Arc A380 Graphics"
    assert dev.arch == "dg2/xe-hpg"
    assert dev.source == "i915-sysfs"
    assert dev.unified_memory is False
    card = SYSFS / "intel-a380-i915" / I915_CARD
    hwmon = read_hwmon(card / "device")
    assert hwmon is not None
    assert hwmon.energy_uj == I915_ENERGY_UJ
    assert hwmon.energy_label is None
    assert hwmon.temp_c == 55.0
    assert hwmon.power_limit_mw == 55000  # power1_max 55000000 uW, no label
    assert hwmon.power_limit_file == "power1_max"
    assert hwmon.power_crit_mw is None
    assert read_frequency(card, "i915") == IntelFrequency(cur_mhz=600, act_mhz=600, max_mhz=2450)
    assert read_idle_residency_ms(card, "i915") == (I915_RC6_MS, 1)
    clock.now += 1.0
    (sample,) = prober.sample()
    assert (sample.temp_c, sample.power_limit_mw) == (55.0, 55000)
    assert prober.frequency(dev.key) == IntelFrequency(600, 600, 2450)


def test_tigerlake_igpu_without_hwmon() -> None:
    clock = FakeClock()
    prober = IntelSysfsProber(SYSFS / "intel-tigerlake", clock=clock)
    (dev,) = prober.discover()
    assert dev.key == "pci:0000:00:02.0"
    assert dev.name == "Intel Iris Xe Graphics"
    assert dev.arch == "tgl/xe-lp"
    assert dev.source == "xe-sysfs"
    assert dev.unified_memory is True
    assert dev.mem_total_bytes is None
    assert dev.mem_note is not None and "system memory" in dev.mem_note
    card = SYSFS / "intel-tigerlake" / XE_CARD
    assert read_hwmon(card / "device") is None
    assert read_frequency(card, "xe") == IntelFrequency(cur_mhz=1100, act_mhz=0, max_mhz=1300)
    assert read_idle_residency_ms(card, "xe") == (5708894, 1)
    clock.now += 1.0
    (sample,) = prober.sample()
    assert sample.healthy is True
    assert (sample.temp_c, sample.power_mw, sample.power_limit_mw) == (None, None, None)
    assert sample.error is not None and "hwmon" in sample.error


def test_xe_b580_static() -> None:
    prober = IntelSysfsProber(SYSFS / B580, clock=FakeClock())
    (dev,) = prober.discover()
    assert dev.key == "pci:0000:0b:00.0"
    assert dev.name == "Intel Arc B580 Graphics"
    assert dev.arch == "bmg/xe2-hpg"
    assert dev.source == "xe-sysfs"
    assert dev.unified_memory is False
    assert dev.temp_slowdown_c is None  # no temp2_crit in this capture


def test_xe_b580_limit_is_the_burst_limit_when_no_sustained_one() -> None:
    card = SYSFS / B580 / B580_CARD
    hwmon = read_hwmon(card / "device")
    assert hwmon is not None
    assert hwmon.power_limit_mw == 180000  # power1_cap 180000000 uW, label card
    assert hwmon.power_limit_file == "power1_cap"
    assert hwmon.power_crit_mw == 380000  # power1_crit 380000000 uW: kept apart
    assert (hwmon.energy_uj, hwmon.energy_label) == (435636211730, "card")
    assert (hwmon.temp_c, hwmon.vram_temp_c) == (62.0, 64.0)
    assert read_frequency(card, "xe") == IntelFrequency(cur_mhz=2850, act_mhz=2733, max_mhz=2850)
    assert read_idle_residency_ms(card, "xe") == (3200280, 1)  # gt1, the media GT, left out


def test_xe_b580_sample_reports_the_limit() -> None:
    clock = FakeClock()
    prober = IntelSysfsProber(SYSFS / B580, clock=clock)
    prober.discover()
    clock.now += 1.0
    (sample,) = prober.sample()
    assert sample.healthy is True
    assert sample.power_limit_mw == 180000
    assert sample.temp_c == 62.0


def test_xe_b580_616_publishes_no_limit() -> None:
    card = SYSFS / B580_616 / B580_CARD
    hwmon = read_hwmon(card / "device")
    assert hwmon is not None
    assert (hwmon.power_limit_mw, hwmon.power_limit_file) == (None, None)
    assert hwmon.power_crit_mw == 380000  # power1_crit is there but is not a limit to report
    assert (hwmon.temp_c, hwmon.vram_temp_c) == (46.0, 48.0)
    clock = FakeClock()
    prober = IntelSysfsProber(SYSFS / B580_616, clock=clock)
    (dev,) = prober.discover()
    assert dev.name == "Intel Arc B580 Graphics"
    clock.now += 1.0
    (sample,) = prober.sample()
    assert sample.power_limit_mw is None
    # This kernel's card counter (energy1_input) reads 0; the pkg one (energy2) is not used.
    assert (sample.power_mw, sample.error) == (None, "energy counter reads 0")


# --- variants in copies -------------------------------------------------------------------------


def test_power_from_energy_between_samples(tmp_path: Path) -> None:
    root = copy_tree("intel-a380-xe", tmp_path)
    clock = FakeClock(10.0)
    prober = IntelSysfsProber(root, clock=clock)
    prober.discover()  # baseline: 59540970520 uJ at t=10
    write(root, f"{XE_HWMON}/energy2_input", XE_ENERGY_UJ + 12_500_000)  # +12.5 J
    clock.now = 12.0
    (first,) = prober.sample()
    assert first.power_mw == 6250  # 12.5 J / 2 s
    assert first.error is None
    write(root, f"{XE_HWMON}/energy2_input", XE_ENERGY_UJ + 12_500_000 + 30_000_000)  # +30 J
    clock.now = 12.5
    (second,) = prober.sample()
    assert second.power_mw == 60000  # 30 J / 0.5 s


def test_i915_unlabelled_energy_counter(tmp_path: Path) -> None:
    root = copy_tree("intel-a380-i915", tmp_path)
    clock = FakeClock(0.0)
    prober = IntelSysfsProber(root, clock=clock)
    prober.discover()
    write(root, f"{I915_HWMON}/energy1_input", I915_ENERGY_UJ + 17_000_000)
    clock.now = 4.0
    (sample,) = prober.sample()
    assert sample.power_mw == 4250  # 17 J / 4 s


def test_clock_not_advancing_keeps_baseline(tmp_path: Path) -> None:
    root = copy_tree("intel-a380-xe", tmp_path)
    clock = FakeClock(5.0)
    prober = IntelSysfsProber(root, clock=clock)
    prober.discover()
    write(root, f"{XE_HWMON}/energy2_input", XE_ENERGY_UJ + 1_000_000)
    (same_instant,) = prober.sample()
    assert same_instant.power_mw is None
    clock.now = 6.0
    (later,) = prober.sample()
    assert later.power_mw == 1000  # measured against the discover() baseline


def test_energy_counter_zero(tmp_path: Path) -> None:
    root = copy_tree("intel-a380-xe", tmp_path)
    write(root, f"{XE_HWMON}/energy2_input", 0)
    clock = FakeClock()
    prober = IntelSysfsProber(root, clock=clock)
    prober.discover()
    clock.now += 1.0
    (sample,) = prober.sample()
    assert sample.power_mw is None
    assert sample.error == "energy counter reads 0"
    assert sample.temp_c == 56.0


def test_energy_counter_wrap(tmp_path: Path) -> None:
    root = copy_tree("intel-a380-xe", tmp_path)
    clock = FakeClock(0.0)
    prober = IntelSysfsProber(root, clock=clock)
    prober.discover()
    write(root, f"{XE_HWMON}/energy2_input", 4_000_000)
    clock.now = 1.0
    (wrapped,) = prober.sample()
    assert wrapped.power_mw is None
    assert wrapped.error is not None and "backwards" in wrapped.error
    write(root, f"{XE_HWMON}/energy2_input", 4_000_000 + 9_000_000)
    clock.now = 3.0
    (after,) = prober.sample()
    assert after.power_mw == 4500  # 9 J / 2 s from the post-wrap reading


def test_busy_from_xe_idle_residency(tmp_path: Path) -> None:
    root = copy_tree("intel-a380-xe", tmp_path)
    clock = FakeClock(0.0)
    prober = IntelSysfsProber(root, clock=clock)
    prober.discover()
    write(root, XE_IDLE, XE_IDLE_MS + 1500)
    clock.now = 2.0
    (sample,) = prober.sample()
    assert sample.util_pct == pytest.approx(25.0)  # idle 1.5 s of 2 s
    write(root, XE_IDLE, XE_IDLE_MS + 1500 + 1000)
    clock.now = 3.0
    (idle,) = prober.sample()
    assert idle.util_pct == pytest.approx(0.0)


def test_busy_from_i915_rc6_residency(tmp_path: Path) -> None:
    root = copy_tree("intel-a380-i915", tmp_path)
    clock = FakeClock(50.0)
    prober = IntelSysfsProber(root, clock=clock)
    prober.discover()
    write(root, I915_RC6, I915_RC6_MS + 100)
    clock.now = 50.4
    (sample,) = prober.sample()
    assert sample.util_pct == pytest.approx(75.0)  # idle 100 ms of 400 ms


def test_i915_legacy_rc6_path(tmp_path: Path) -> None:
    root = copy_tree("intel-a380-i915", tmp_path)
    (root / I915_RC6).unlink()
    write(root, f"{I915_CARD}/power/rc6_residency_ms", 777)
    assert read_idle_residency_ms(root / I915_CARD, "i915") == (777, 1)


def test_busy_clamped_when_idle_exceeds_wall(tmp_path: Path) -> None:
    root = copy_tree("intel-tigerlake", tmp_path)
    clock = FakeClock(0.0)
    prober = IntelSysfsProber(root, clock=clock)
    prober.discover()
    write(root, XE_IDLE, 5708894 + 1200)
    clock.now = 1.0
    (sample,) = prober.sample()
    assert sample.util_pct == 0.0


def test_two_tiles_average_and_media_gt_ignored(tmp_path: Path) -> None:
    root = copy_tree("intel-a380-xe", tmp_path)
    write(root, f"{XE_CARD}/device/tile1/gt1/gtidle/idle_residency_ms", 1000)
    write(root, f"{XE_CARD}/device/tile0/gt2/gtidle/idle_residency_ms", 999999)  # media GT
    assert read_idle_residency_ms(root / XE_CARD, "xe") == (XE_IDLE_MS + 1000, 2)
    clock = FakeClock(0.0)
    prober = IntelSysfsProber(root, clock=clock)
    prober.discover()
    write(root, XE_IDLE, XE_IDLE_MS + 1000)  # tile 0 idle the whole second
    write(root, f"{XE_CARD}/device/tile1/gt1/gtidle/idle_residency_ms", 1000)  # tile 1 busy
    clock.now = 1.0
    (sample,) = prober.sample()
    assert sample.util_pct == pytest.approx(50.0)


def test_no_hwmon_on_discrete_card(tmp_path: Path) -> None:
    root = copy_tree("intel-a380-xe", tmp_path)
    shutil.rmtree(root / XE_CARD / "device" / "hwmon")
    clock = FakeClock()
    prober = IntelSysfsProber(root, clock=clock)
    (dev,) = prober.discover()
    assert dev.name == "Intel Arc A380 Graphics"
    clock.now += 1.0
    (sample,) = prober.sample()
    assert sample.healthy is True
    assert (sample.temp_c, sample.power_mw, sample.power_limit_mw) == (None, None, None)
    assert sample.error is not None and "hwmon" in sample.error


def test_vram_size_and_temp_crit_when_published(tmp_path: Path) -> None:
    root = copy_tree("intel-a380-xe", tmp_path)
    write(root, f"{XE_CARD}/device/tile0/physical_vram_size_bytes", 6442450944)
    write(root, f"{XE_HWMON}/temp2_crit", 105000)
    (dev,) = IntelSysfsProber(root, clock=FakeClock()).discover()
    assert dev.mem_total_bytes == 6442450944
    assert dev.mem_note is None
    assert dev.temp_slowdown_c == 105.0


def test_missing_power1_cap_leaves_the_limit_unknown(tmp_path: Path) -> None:
    root = copy_tree(B580, tmp_path)
    (root / B580_HWMON / "power1_cap").unlink()
    hwmon = read_hwmon(root / B580_CARD / "device")
    assert hwmon is not None
    assert (hwmon.power_limit_mw, hwmon.power_limit_file) == (None, None)
    assert hwmon.power_crit_mw == 380000
    clock = FakeClock()
    prober = IntelSysfsProber(root, clock=clock)
    prober.discover()
    clock.now += 1.0
    assert prober.sample()[0].power_limit_mw is None


def test_missing_power_max_leaves_the_a380_limit_unknown(tmp_path: Path) -> None:
    root = copy_tree("intel-a380-xe", tmp_path)
    (root / XE_HWMON / "power2_max").unlink()
    assert read_power_limit(root / XE_HWMON) is None
    hwmon = read_hwmon(root / XE_CARD / "device")
    assert hwmon is not None and hwmon.power_limit_mw is None


def test_sustained_limit_preferred_over_burst(tmp_path: Path) -> None:
    root = copy_tree(B580, tmp_path)
    write(root, f"{B580_HWMON}/power1_max", 150000000)
    assert read_power_limit(root / B580_HWMON) == (150000000, "power1_max")


def test_disabled_sustained_limit_falls_back_to_burst(tmp_path: Path) -> None:
    root = copy_tree(B580, tmp_path)
    write(root, f"{B580_HWMON}/power1_max", 0)  # the ABI: 0 means PL1 is disabled
    assert read_power_limit(root / B580_HWMON) == (180000000, "power1_cap")
    write(root, f"{B580_HWMON}/power1_cap", 0)
    assert read_power_limit(root / B580_HWMON) is None  # power1_crit is never taken


def test_limit_follows_the_energy_counter_domain(tmp_path: Path) -> None:
    root = copy_tree(B580, tmp_path)
    write(root, f"{B580_HWMON}/power2_max", 120000000)
    write(root, f"{B580_HWMON}/power2_label", "pkg")
    # The card's burst limit bounds the card power being reported; the package's PL1 does not.
    assert read_power_limit(root / B580_HWMON) == (180000000, "power1_cap")
    (root / B580_HWMON / "power1_cap").unlink()
    assert read_power_limit(root / B580_HWMON) == (120000000, "power2_max")


def test_rated_max_is_not_a_limit(tmp_path: Path) -> None:
    root = copy_tree("intel-a380-i915", tmp_path)
    (root / I915_HWMON / "power1_max").unlink()  # power1_rated_max (the default TDP) stays
    assert (root / I915_HWMON / "power1_rated_max").is_file()
    hwmon = read_hwmon(root / I915_CARD / "device")
    assert hwmon is not None
    assert (hwmon.power_limit_mw, hwmon.power_limit_file) == (None, None)


def test_card_label_preferred_over_pkg(tmp_path: Path) -> None:
    root = copy_tree("intel-a380-xe", tmp_path)
    write(root, f"{XE_HWMON}/energy1_input", 123456789)
    write(root, f"{XE_HWMON}/energy1_label", "card")
    write(root, f"{XE_HWMON}/power1_max", 190000000)
    write(root, f"{XE_HWMON}/power1_label", "card")
    hwmon = read_hwmon(root / XE_CARD / "device")
    assert hwmon is not None
    assert (hwmon.energy_uj, hwmon.energy_label, hwmon.power_limit_mw) == (
        123456789,
        "card",
        190000,
    )


def test_non_intel_card_ignored(tmp_path: Path) -> None:
    root = copy_tree("intel-a380-xe", tmp_path)
    shutil.copytree(SYSFS / "nvidia-rtx4080" / "sys/class/drm/card1", root / "sys/class/drm/card1")
    devices = IntelSysfsProber(root, clock=FakeClock()).discover()
    assert [d.key for d in devices] == ["pci:0000:08:00.0"]


def test_igpu_and_dgpu_numbered_in_card_order(tmp_path: Path) -> None:
    root = copy_tree("intel-tigerlake", tmp_path)
    shutil.copytree(SYSFS / "intel-a380-i915" / I915_CARD, root / I915_CARD)
    devices = IntelSysfsProber(root, clock=FakeClock()).discover()
    assert [(d.key, d.vendor_index, d.source) for d in devices] == [
        ("pci:0000:00:02.0", 0, "xe-sysfs"),
        ("pci:0000:0b:00.0", 1, "i915-sysfs"),
    ]


def test_only_non_intel_cards_is_unavailable() -> None:
    with pytest.raises(ProberUnavailable):
        IntelSysfsProber(SYSFS / "nvidia-rtx4080").discover()


def test_no_cards_is_unavailable(tmp_path: Path) -> None:
    prober = IntelSysfsProber(tmp_path)
    with pytest.raises(ProberUnavailable):
        prober.discover()
    assert prober.sample() == []


def test_unknown_device_id(tmp_path: Path) -> None:
    root = copy_tree("intel-tigerlake", tmp_path)
    uevent = root / XE_CARD / "device/uevent"
    uevent.write_text(uevent.read_text().replace("PCI_ID=8086:9A49", "PCI_ID=8086:FFF1"))
    (dev,) = IntelSysfsProber(root, clock=FakeClock()).discover()
    assert dev.name == "Intel GPU [8086:FFF1]"
    assert dev.arch is None
    assert dev.unified_memory is True  # still at 0000:00:02.0


def test_device_gone_is_unhealthy(tmp_path: Path) -> None:
    root = copy_tree("intel-a380-xe", tmp_path)
    prober = IntelSysfsProber(root, clock=FakeClock())
    prober.discover()
    shutil.rmtree(root / XE_CARD / "device")
    (sample,) = prober.sample()
    assert sample.healthy is False
    assert sample.error == "xe device is gone"


def test_model_table() -> None:
    a380 = intel_model(0x56A5)
    assert a380 is not None and (a380.arch, a380.integrated) == ("dg2/xe-hpg", False)
    max1100 = intel_model(0x0BDA)
    assert max1100 is not None and max1100.name == "Intel Data Center GPU Max 1100"
    assert max1100.arch == "pvc/xe-hpc"
    assert intel_model(0x1234) is None
    assert intel_name(0x56A5) == "Intel Arc A380 Graphics"
    assert intel_name(0x56BA) == "Intel GPU [8086:56BA]"


def test_counter_helpers() -> None:
    assert power_mw_from_energy(1_000_000, 0.0, 3_000_000, 0.5) == (4000, None)
    assert power_mw_from_energy(None, 0.0, 3_000_000, 1.0) == (None, None)
    assert power_mw_from_energy(5, 0.0, 0, 1.0) == (None, "energy counter reads 0")
    assert busy_pct_from_idle(100, 0.0, 350, 1.0) == pytest.approx(75.0)
    assert busy_pct_from_idle(100, 0.0, 90, 1.0) is None  # went backwards
    assert busy_pct_from_idle(100, 1.0, 100, 1.0) is None  # no time passed
    assert busy_pct_from_idle(0, 0.0, 500, 1.0, gts=2) == pytest.approx(75.0)
