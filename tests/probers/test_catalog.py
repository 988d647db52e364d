"""The accelerator catalog: every row sourced and sane, aliases resolve, datasheet spot values."""

from __future__ import annotations

import dataclasses
import tomllib
from importlib import resources

import pytest

from probers.catalog import GIB, AcceleratorModel, load_catalog, lookup, match_device_name

REQUIRED = {
    "a100-80gb",
    "h100",
    "h200",
    "l4",
    "rtx-4090",
    "mi250x",
    "mi300x",
    "rx-7900-xtx",
    "m2-ultra",
    "m3-max",
    "arc-a770",
    "arc-b580",
    "max-1100",
    "a10",
    "v100",
    "p100",
    "k80",
    "t4",
}

NUMBER_FIELDS = (
    "devices_per_board",
    "compute_units",
    "mem_bytes",
    "mem_bandwidth_gbps",
    "fp32_tflops",
    "fp16_tflops",
    "bf16_tflops",
    "fp8_tflops",
    "tdp_w",
    "interconnect_gbps",
    "interconnect_links",
)


def test_catalog_holds_every_required_model() -> None:
    assert set(load_catalog()) >= REQUIRED


def test_catalog_is_cached() -> None:
    assert load_catalog() is load_catalog()


@pytest.mark.parametrize("key", sorted(load_catalog()))
def test_every_row_is_sourced_typed_and_positive(key: str) -> None:
    model = load_catalog()[key]
    assert model.key == key
    assert model.source_name.strip()
    assert model.source_url.startswith("https://")
    assert model.backend in {"cuda", "rocm", "xpu", "metal", "cpu"}
    expected_backend = {"nvidia": "cuda", "amd": "rocm", "intel": "xpu", "apple": "metal"}
    assert model.backend == expected_backend[model.vendor]
    assert model.unified_memory is (model.vendor == "apple")
    assert model.mem_bytes is not None
    assert model.mem_bandwidth_gbps is not None
    for field in NUMBER_FIELDS:
        value = getattr(model, field)
        assert value is None or value > 0, f"{key}.{field} = {value}"
    # A dense FP8 rate, where there is one, is never below the FP16 rate.
    if model.fp8_tflops is not None and model.fp16_tflops is not None:
        assert model.fp8_tflops >= model.fp16_tflops


def test_every_table_in_the_data_file_names_a_source() -> None:
    text = resources.files("probers").joinpath("catalog.toml").read_text(encoding="utf-8")
    for key, table in tomllib.loads(text).items():
        assert set(table["source"]) == {"name", "url"}, key


def test_model_is_frozen() -> None:
    model = load_catalog()["h100"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.tdp_w = 1.0  # type: ignore[misc]


# Spot values, each checked by hand against the vendor page the row cites.
@pytest.mark.parametrize(
    ("key", "field", "expected"),
    [
        ("h100", "mem_bytes", 80 * GIB),
        ("h100", "mem_bandwidth_gbps", 3350.0),
        ("h100", "bf16_tflops", 989.4),
        ("h100", "fp8_tflops", 1978.9),
        ("h100", "tdp_w", 700.0),
        ("h100", "interconnect", "nvlink4"),
        ("h100", "interconnect_gbps", 900.0),
        ("h100", "compute_capability", "9.0"),
        ("h200", "mem_bytes", 141 * GIB),
        ("h200", "mem_bandwidth_gbps", 4800.0),
        ("a100-80gb", "bf16_tflops", 312.0),
        ("a100-80gb", "mem_bandwidth_gbps", 2039.0),
        ("a100-80gb", "fp8_tflops", None),
        ("a100-80gb", "tdp_w", 400.0),
        ("l4", "fp16_tflops", 121.0),
        ("l4", "tdp_w", 72.0),
        ("rtx-4090", "bf16_tflops", 165.2),
        ("rtx-4090", "fp8_tflops", 330.3),
        ("rtx-4090", "mem_bandwidth_gbps", 1008.0),
        ("t4", "fp16_tflops", 65.0),
        ("t4", "bf16_tflops", None),
        ("v100", "fp16_tflops", 125.0),
        ("v100", "compute_capability", "7.0"),
        ("mi300x", "mem_bytes", 192 * GIB),
        ("mi300x", "mem_bandwidth_gbps", 5300.0),
        ("mi300x", "bf16_tflops", 1307.4),
        ("mi300x", "fp8_tflops", 2614.9),
        ("mi300x", "tdp_w", 750.0),
        ("mi300x", "compute_capability", "gfx942"),
        ("rx-7900-xtx", "compute_capability", "gfx1100"),
        ("rx-7900-xtx", "fp16_tflops", 122.8),
        ("arc-a770", "mem_bandwidth_gbps", 560.0),
        ("arc-b580", "mem_bytes", 12 * GIB),
        ("max-1100", "mem_bandwidth_gbps", 1228.8),
        ("m2-ultra", "mem_bandwidth_gbps", 800.0),
        ("m3-max", "mem_bytes", 128 * GIB),
    ],
)
def test_spot_values_match_the_datasheets(key: str, field: str, expected: object) -> None:
    assert getattr(load_catalog()[key], field) == expected


def test_apple_rows_leave_unpublished_figures_out() -> None:
    for key in ("m2-ultra", "m3-max", "m1-pro"):
        model = load_catalog()[key]
        assert model.bf16_tflops is None
        assert model.fp16_tflops is None
        assert model.tdp_w is None
        assert model.note is not None and "publishes no" in model.note


def test_multi_device_boards_are_split_per_device() -> None:
    mi250x = load_catalog()["mi250x"]  # datasheet: 128 GB, 3.2768 TB/s, 383 TFLOPS, 220 CUs
    assert mi250x.devices_per_board == 2
    assert mi250x.mem_bytes == 64 * GIB
    assert mi250x.mem_bandwidth_gbps == pytest.approx(1638.4)
    assert mi250x.bf16_tflops == pytest.approx(191.5)
    assert mi250x.compute_units == 110
    assert mi250x.tdp_w == pytest.approx(250.0)
    k80 = load_catalog()["k80"]  # datasheet: 24 GB, 480 GB/s, 4992 cores on two GK210s
    assert k80.mem_bytes == 12 * GIB
    assert k80.mem_bandwidth_gbps == pytest.approx(240.0)
    assert k80.compute_units == 13


def test_peer_link_bandwidth() -> None:
    assert load_catalog()["mi300x"].peer_link_gbps == pytest.approx(128.0)
    assert load_catalog()["l4"].peer_link_gbps is None


@pytest.mark.parametrize(
    ("spelling", "key"),
    [
        ("h100", "h100"),
        ("H100", "h100"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("h100-sxm5", "h100"),
        ("a100", "a100-80gb"),
        ("A100-80GB", "a100-80gb"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("mi300x", "mi300x"),
        ("AMD Instinct MI300X", "mi300x"),
        ("m2-ultra", "m2-ultra"),
        ("M2 Ultra", "m2-ultra"),
        ("Apple M2 Ultra", "m2-ultra"),
        ("rtx 4090", "rtx-4090"),
        ("4090", "rtx-4090"),
        ("7900xtx", "rx-7900-xtx"),
        ("Intel(R) Arc(TM) A770 Graphics", "arc-a770"),
        ("max1100", "max-1100"),
        ("Tesla T4", "t4"),
        ("Tesla V100-SXM2-32GB", "v100"),
        ("NVIDIA H200 141GB HBM3e", "h200"),
    ],
)
def test_lookup_resolves_aliases(spelling: str, key: str) -> None:
    assert lookup(spelling).key == key


def test_lookup_unknown_raises_key_error() -> None:
    with pytest.raises(KeyError, match="no accelerator model 'b200'"):
        lookup("b200")


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA A10", "a10"),
        ("Tesla K80", "k80"),
        ("Tesla P100-PCIE-16GB", "p100"),
        ("AMD Instinct MI250X/MI250", "mi250x"),
        ("AMD Radeon RX 7900 XTX", "rx-7900-xtx"),
        ("Intel(R) Data Center GPU Max 1100", "max-1100"),
        ("Intel(R) Arc(TM) B580 Graphics", "arc-b580"),
        ("Apple M3 Max", "m3-max"),
        ("Apple M1 Pro", "m1-pro"),
    ],
)
def test_match_device_name_finds_real_device_names(name: str, key: str) -> None:
    model = match_device_name(name)
    assert isinstance(model, AcceleratorModel)
    assert model.key == key


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA A100-SXM4-40GB",  # the 40 GB part is not the 80 GB model
        "NVIDIA H100 PCIe",  # PCIe is not the SXM part
        "NVIDIA H100 NVL",
        "Tesla V100-SXM2-16GB",
        "NVIDIA GeForce RTX 4090 Laptop GPU",
        "AMD Radeon RX 7900 XT",  # XT, not XTX
        "Apple M2 Max",  # M2 but not Ultra
        "Apple M1",
        "Intel(R) Data Center GPU Max 1550",
        "llvmpipe (LLVM 15.0.7, 256 bits)",
        "",
    ],
)
def test_match_device_name_refuses_other_parts(name: str) -> None:
    assert match_device_name(name) is None


def test_a10_and_a100_are_told_apart() -> None:
    a10, a100 = match_device_name("NVIDIA A10"), match_device_name("NVIDIA A100 80GB PCIe")
    assert a10 is not None and a10.key == "a10"
    assert a100 is None  # PCIe A100 is a different part from the SXM row
    model = match_device_name("NVIDIA A100-SXM4-80GB")
    assert model is not None and model.key == "a100-80gb"
