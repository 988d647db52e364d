"""What a node samples into its history: unsupported is never a value, a failed read is a gap."""

from __future__ import annotations

from pathlib import Path

from agent.history.history import SeriesKey, Unsupported
from agent.history.history_sample import (
    CgroupCounters,
    DeviceFields,
    HostCounters,
    NodeSampler,
    host_readings,
    job_readings,
    link_readings,
    read_cgroup,
)
from probers.records import Device, DeviceSample, DeviceStatic


def _gpu(**sample: object) -> Device:
    static = DeviceStatic(key="GPU-a", vendor="nvidia", backend="cuda", name="H100", source="nvml")
    return Device(0, static, DeviceSample(key="GPU-a", **sample))  # type: ignore[arg-type]


def test_a_field_never_given_is_unsupported_and_a_lost_one_a_gap() -> None:
    fields = DeviceFields()
    first = fields.readings([_gpu(util_pct=40.0, temp_c=None)])
    assert first[SeriesKey("gpu.util_pct", "GPU-a")] == 40.0
    assert isinstance(first[SeriesKey("gpu.temp_c", "GPU-a")], Unsupported)
    assert isinstance(first[SeriesKey("gpu.mem_bw_pct", "GPU-a")], Unsupported)
    later = fields.readings([_gpu(util_pct=None, temp_c=None)])
    assert later[SeriesKey("gpu.util_pct", "GPU-a")] is None  # given before: a gap
    assert isinstance(later[SeriesKey("gpu.temp_c", "GPU-a")], Unsupported)
    sick = fields.readings([_gpu(util_pct=99.0, healthy=False)])
    assert sick[SeriesKey("gpu.util_pct", "GPU-a")] is None


def test_the_memory_bandwidth_clock_throttle_and_pcie_series() -> None:
    fields = DeviceFields()
    got = fields.readings(
        [_gpu(mem_bw_pct=62.0, sm_clock_mhz=1980.0, throttled=True, pcie_rx_bytes_per_s=3e9)]
    )
    gpu = {k.name: v for k, v in got.items()}
    assert gpu["gpu.mem_bw_pct"] == 62.0 and gpu["gpu.sm_clock_mhz"] == 1980.0
    assert gpu["gpu.throttle"] == 1.0 and gpu["gpu.pcie_rx_bytes_per_s"] == 3e9
    assert isinstance(gpu["gpu.pcie_tx_bytes_per_s"], Unsupported)  # never given: not 0
    calm = fields.readings([_gpu(mem_bw_pct=0.0, throttled=False)])
    assert calm[SeriesKey("gpu.throttle", "GPU-a")] == 0.0  # a real 0: it was given
    assert calm[SeriesKey("gpu.mem_bw_pct", "GPU-a")] == 0.0


def test_a_links_round_trips_in_milliseconds_and_unknown_a_gap() -> None:
    got = link_readings({"peer-a": (0.0021, 0.0018), "peer-b": (None, 0.004)})
    assert got[SeriesKey("link.rtt_ms", "peer-a")] == 2.1
    assert got[SeriesKey("link.probe_rtt_ms", "peer-a")] == 1.8
    assert got[SeriesKey("link.rtt_ms", "peer-b")] is None  # no coordinate yet: a gap
    assert got[SeriesKey("link.probe_rtt_ms", "peer-b")] == 4.0


def _host(at_s: float, rx: int | None, disk: int | None = 0) -> HostCounters:
    return HostCounters(at_s, 12.5, 1 << 30, 0, rx, rx, disk, disk)


def test_host_rates_come_from_two_readings() -> None:
    first = host_readings(None, _host(10.0, 1000, None))
    assert first[SeriesKey("host.net_rx_bytes_per_s")] is None
    assert isinstance(first[SeriesKey("host.disk_read_bytes_per_s")], Unsupported)
    second = host_readings(_host(10.0, 1000), _host(12.0, 5000))
    assert second[SeriesKey("host.net_rx_bytes_per_s")] == 2000.0
    assert second[SeriesKey("host.cpu_pct")] == 12.5
    reset = host_readings(_host(10.0, 5000), _host(11.0, 10))
    assert reset[SeriesKey("host.net_rx_bytes_per_s")] is None  # a counter went back: a gap


def test_job_progress_and_cgroup(tmp_path: Path) -> None:
    (tmp_path / "cpu.stat").write_text("usage_usec 3000000\nuser_usec 1\n")
    (tmp_path / "memory.current").write_text("4096\n")
    now = read_cgroup(tmp_path)
    assert (now.cpu_usec, now.mem_bytes) == (3_000_000, 4096)
    before = CgroupCounters(now.at_s - 2.0, 2_000_000, 0)
    out = job_readings({"j1": 0.25, "j2": None}, {"j1": (before, now)})
    assert out[SeriesKey("job.progress_pct", "j1")] == 25.0
    assert abs(out[SeriesKey("job.cpu_pct", "j1")] - 50.0) < 1e-6  # type: ignore[operator]
    assert out[SeriesKey("job.mem_bytes", "j1")] == 4096.0
    assert out[SeriesKey("job.progress_pct", "j2")] is None
    assert isinstance(out[SeriesKey("job.cpu_pct", "j2")], Unsupported)


def test_the_node_sampler_reads_this_host() -> None:
    sampler = NodeSampler()
    sampler.sample([], {}, {})
    out = sampler.sample([_gpu(util_pct=1.0)], {"j": 0.5}, {"j": None})
    assert isinstance(out[SeriesKey("host.mem_used_bytes")], float)
    assert out[SeriesKey("gpu.util_pct", "GPU-a")] == 1.0
    assert out[SeriesKey("job.progress_pct", "j")] == 50.0
