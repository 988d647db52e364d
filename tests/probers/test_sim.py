"""The simulated prober: profiles, catalog facts, and the response to load over fake time."""

from __future__ import annotations

import math

import pytest

from probers.apple import APPLE_NO_THERMAL_NOTE
from probers.catalog import GIB, load_catalog
from probers.sim import PRESETS, SimProber, parse_profile

MIB = 1024**2


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(profile: str, seed: int = 0) -> tuple[SimProber, FakeClock]:
    clock = FakeClock()
    return SimProber(profile, seed=seed, clock=clock, host_id="h1"), clock


def test_demo_is_a_mixed_vendor_host() -> None:
    prober, _ = make("demo")
    devices = prober.discover()
    assert [d.key for d in devices] == ["sim:h1:0", "sim:h1:1", "sim:h1:2", "sim:h1:3"]
    assert [(d.vendor, d.backend, d.vendor_index) for d in devices] == [
        ("nvidia", "cuda", 0),
        ("nvidia", "cuda", 1),
        ("amd", "rocm", 0),
        ("intel", "xpu", 0),
    ]
    assert [d.name for d in devices] == [
        "NVIDIA H100 SXM (simulated)",
        "NVIDIA H100 SXM (simulated)",
        "AMD Instinct MI300X (simulated)",
        "Intel Arc A770 16GB (simulated)",
    ]
    assert {d.source for d in devices} == {"sim"}
    assert prober.source == "sim"
    # Only NVIDIA devices carry a UUID (what CUDA_VISIBLE_DEVICES takes); all are distinct.
    assert devices[0].uuid is not None and devices[0].uuid.startswith("GPU-")
    assert devices[0].uuid != devices[1].uuid
    assert devices[2].uuid is None
    assert len({d.pci_bus_id for d in devices}) == 4


def test_devices_carry_their_catalog_facts() -> None:
    prober, _ = make("demo")
    catalog = load_catalog()
    h100, mi300x, a770 = prober.discover()[1:]
    assert h100.mem_total_bytes == 80 * GIB
    assert h100.compute_capability == "9.0"
    assert h100.arch == "Hopper"
    assert h100.compute_units == 132
    assert mi300x.mem_total_bytes == 192 * GIB
    assert mi300x.compute_capability == "gfx942"
    assert mi300x.compute_units == 304
    assert a770.mem_total_bytes == 16 * GIB
    assert a770.compute_capability is None
    limits = [s.power_limit_mw for s in prober.sample()]
    assert limits == [700_000, 700_000, 750_000, 225_000]
    assert catalog["arc-a770"].tdp_w == 225.0


def test_dgx_h100_links_every_pair_over_nvlink() -> None:
    prober, _ = make("dgx-h100")
    devices = prober.discover()
    keys = {d.key for d in devices}
    assert len(devices) == 8
    for device in devices:
        assert {link.peer for link in device.links} == keys - {device.key}
        assert {link.kind for link in device.links} == {"nvlink"}
        assert {link.bandwidth_mbps for link in device.links} == {7_200_000}  # 900 GB/s
        assert {link.detail for link in device.links} == {"NV18"}


def test_mi300x_8_links_every_pair_over_xgmi() -> None:
    prober, _ = make("mi300x-8")
    devices = prober.discover()
    assert [d.vendor_index for d in devices] == list(range(8))
    for device in devices:
        assert len(device.links) == 7
        assert {link.kind for link in device.links} == {"xgmi"}
        assert {link.bandwidth_mbps for link in device.links} == {1_024_000}  # 896/7 GB/s


def test_workstation_has_no_gpu_fabric() -> None:
    prober, _ = make("workstation")
    rtx, arc = prober.discover()
    assert (rtx.vendor, rtx.name) == ("nvidia", "NVIDIA GeForce RTX 4090 (simulated)")
    assert (arc.vendor, arc.name) == ("intel", "Intel Arc B580 (simulated)")
    assert rtx.links == () and arc.links == ()


def test_m2_ultra_behaves_like_a_mac() -> None:
    prober, clock = make("m2-ultra")
    (device,) = prober.discover()
    assert (device.vendor, device.backend) == ("apple", "metal")
    assert device.unified_memory is True
    assert device.mem_total_bytes == 144 * GIB  # 3/4 of 192 GiB, like Metal's working set
    assert device.mem_note is not None and "working set" in device.mem_note
    assert device.pci_bus_id is None
    assert device.temp_slowdown_c is None
    prober.set_load(device.key, 80.0, 10 * GIB)
    clock.now += 60
    (sample,) = prober.sample()
    assert 78.0 <= (sample.util_pct or 0) <= 82.0
    assert sample.mem_used_bytes == 10 * GIB + 512 * MIB
    assert sample.temp_c is None
    assert sample.power_mw is None
    assert sample.power_limit_mw is None
    assert sample.error == APPLE_NO_THERMAL_NOTE


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        ("h100:8", [("h100", 8)]),
        ("h100", [("h100", 1)]),
        ("a100-80gb:4,mi300x:2", [("a100-80gb", 4), ("mi300x", 2)]),
        (" A100 : 2 , MI300X ", [("a100-80gb", 2), ("mi300x", 1)]),
        ("NVIDIA H100 80GB HBM3:2", [("h100", 2)]),
        ("DGX-H100", [("h100", 8)]),
        ("demo", [("h100", 2), ("mi300x", 1), ("arc-a770", 1)]),
    ],
)
def test_profiles_parse(profile: str, expected: list[tuple[str, int]]) -> None:
    assert [(model.key, count) for model, count in parse_profile(profile)] == expected


def test_every_preset_builds() -> None:
    for name in PRESETS:
        assert make(name)[0].discover()


def test_mix_numbers_vendor_indexes_per_vendor() -> None:
    prober, _ = make("a100-80gb:2,mi300x:2,h100:1")
    devices = prober.discover()
    assert [(d.vendor, d.vendor_index) for d in devices] == [
        ("nvidia", 0),
        ("nvidia", 1),
        ("amd", 0),
        ("amd", 1),
        ("nvidia", 2),
    ]
    # Links join same-model devices only.
    assert [link.peer for link in devices[0].links] == ["sim:h1:1"]
    assert devices[4].links == ()


@pytest.mark.parametrize("profile", ["foo", "", "h100:0", "h100:x", "h100:-1", "h100,", "b200:8"])
def test_unknown_profile_is_a_one_line_value_error(profile: str) -> None:
    with pytest.raises(ValueError, match="unknown sim profile") as info:
        SimProber(profile)
    message = str(info.value)
    assert "\n" not in message
    assert f"{profile!r}" in message
    for form in ("demo", "dgx-h100", "h100:8", "a100-80gb:4,mi300x:2", "mi300x"):
        assert form in message


def test_too_many_devices_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown sim profile"):
        SimProber("h100:65")


def test_idle_sample() -> None:
    prober, _ = make("h100")
    (sample,) = prober.sample()
    assert sample.key == "sim:h1:0"
    assert sample.util_pct is not None and 0.0 <= sample.util_pct <= 1.0
    assert sample.mem_used_bytes == 512 * MIB
    assert sample.temp_c == 34.5  # 30 C inlet + 45 C * 10 % idle power
    assert sample.power_mw is not None and 70_000 <= sample.power_mw <= 76_300
    assert sample.healthy is True and sample.error is None


def test_load_raises_util_power_and_temperature_over_time() -> None:
    prober, clock = make("h100")
    key = prober.discover()[0].key
    idle = prober.sample()[0]
    prober.set_load(key, 90.0, 40 * GIB)
    assert prober.load(key) is not None
    clock.now += 20  # one thermal time constant
    busy = prober.sample()[0]
    assert busy.util_pct is not None and 88.0 <= busy.util_pct <= 92.0
    assert busy.mem_used_bytes == 40 * GIB + 512 * MIB
    assert busy.power_mw is not None and idle.power_mw is not None
    assert 620_000 <= busy.power_mw <= 650_000  # 70 W + 630 W * (90 +- 2) %
    # Target 30 + 45 * 637/700 = 70.95 C; after one time constant from 34.5 C:
    # 70.95 - 36.45 / e = 57.54 C.
    assert busy.temp_c == 57.5
    temps: list[float] = []
    for _ in range(10):
        clock.now += 30
        temp = prober.sample()[0].temp_c
        assert temp is not None
        temps.append(temp)
    assert temps == sorted(temps)
    assert temps[-1] == pytest.approx(70.95, abs=0.1)
    assert temps[-1] < prober.discover()[0].temp_slowdown_c  # type: ignore[operator]


def test_clearing_the_load_cools_the_device() -> None:
    prober, clock = make("h100")
    key = prober.discover()[0].key
    prober.sample()
    prober.set_load(key, 90.0, 40 * GIB)
    clock.now += 300
    hot = prober.sample()[0]
    prober.clear_load(key)
    assert prober.load(key) is None
    clock.now += 20
    cooling = prober.sample()[0]
    assert cooling.util_pct is not None and cooling.util_pct <= 1.0
    assert cooling.mem_used_bytes == 512 * MIB
    assert cooling.power_mw is not None and hot.power_mw is not None
    assert cooling.power_mw < hot.power_mw / 5
    # From 70.95 C toward 34.5 C for one time constant: 34.5 + 36.45 / e = 47.9 C.
    expected = 34.5 + (30 + 45 * 637 / 700 - 34.5) / math.e
    assert cooling.temp_c == pytest.approx(expected, abs=0.1)
    assert cooling.temp_c == 47.9
    clock.now += 600
    assert prober.sample()[0].temp_c == 34.5


def test_load_set_between_samples_heats_only_from_then() -> None:
    prober, clock = make("h100")
    key = prober.discover()[0].key
    prober.sample()
    clock.now += 100
    prober.set_load(key, 90.0, 0)  # idle until now, loaded from now
    clock.now += 20
    assert prober.sample()[0].temp_c == 57.5


def test_memory_used_never_exceeds_the_device() -> None:
    prober, _ = make("l4")
    key = prober.discover()[0].key
    prober.set_load(key, 50.0, 100 * GIB)
    assert prober.sample()[0].mem_used_bytes == 24 * GIB


def test_load_leaves_other_devices_idle() -> None:
    prober, clock = make("dgx-h100")
    devices = prober.discover()
    prober.sample()
    prober.set_load(devices[3].key, 100.0, GIB)
    clock.now += 120
    samples = prober.sample()
    assert [s.util_pct is not None and s.util_pct > 50 for s in samples] == [
        i == 3 for i in range(8)
    ]
    assert {s.temp_c for i, s in enumerate(samples) if i != 3} == {34.5}


def test_same_seed_and_clock_give_the_same_samples() -> None:
    def run(seed: int) -> list[object]:
        prober, clock = make("demo", seed=seed)
        prober.set_load("sim:h1:2", 55.0, 8 * GIB)
        out: list[object] = []
        for _ in range(5):
            clock.now += 7
            out.extend(prober.sample())
        return out

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_bad_loads_are_refused() -> None:
    prober, _ = make("h100")
    key = prober.discover()[0].key
    with pytest.raises(KeyError):
        prober.set_load("sim:h1:9", 10.0, 0)
    with pytest.raises(KeyError):
        prober.clear_load("cpu:0")
    with pytest.raises(ValueError, match="util_pct"):
        prober.set_load(key, 120.0, 0)
    with pytest.raises(ValueError, match="mem_used_bytes"):
        prober.set_load(key, 10.0, -1)


def test_host_id_makes_keys_unique_across_simulated_hosts() -> None:
    one = SimProber("h100", seed=1).discover()[0]
    two = SimProber("h100", seed=2).discover()[0]
    assert one.key.startswith("sim:") and one.key.endswith(":0")
    assert one.key != two.key
    assert one.uuid != two.uuid
    assert SimProber("h100", seed=1).discover()[0].key == one.key
