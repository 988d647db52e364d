"""Fuzzing what the probers read: captured sysfs trees with one file's contents replaced by hostile
bytes, and the tools' outputs (xpu-smi, ioreg, system_profiler, amdgpu.ids, KFD properties)
changed in place. A sysfs prober discovers or raises ``ProberUnavailable`` and its samples never
raise; a tool's parser returns its records or raises ``ValueError`` (the prober's "unavailable"),
and the parsers documented as forgiving never raise."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from probers import apple, kfd, xpu_smi
from probers.amdgpu import AmdgpuProber, parse_amdgpu_ids
from probers.base import ProberUnavailable
from probers.intel_sysfs import IntelSysfsProber
from probers.nvidia_pci import NvidiaPciProber
from probers.sim import parse_profile
from tests.hostile import FUZZ, FUZZ_EACH, JSON, NASTY_TEXT, mutated
from tests.support import FIXTURES, SYSFS

HOSTILE_BYTES = (
    st.binary(max_size=40)
    | NASTY_TEXT.map(lambda t: t.encode("utf-8", "surrogateescape"))
    | st.sampled_from([b"\xb2", b"0x" + b"f" * 40, b"1 \xb2\n", b"inf\n", b"-5\n", b"\x00\x00"])
)
TREES = ["amd-rx6900xt", "intel-a380-xe", "nvidia-rtx4080"]


@pytest.fixture(scope="module", params=TREES)
def tree(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sysfs") / request.param
    shutil.copytree(SYSFS / request.param, root, symlinks=True)
    return root


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def _probe(root: Path) -> Iterator[str]:
    for make in (AmdgpuProber, IntelSysfsProber, NvidiaPciProber):
        prober = make(root)
        try:
            prober.discover()
        except ProberUnavailable:
            continue
        prober.sample()
        prober.close()
        yield prober.source


@FUZZ_EACH
@given(data=st.data(), content=HOSTILE_BYTES)
def test_a_sysfs_tree_with_a_hostile_file_probes_or_is_unavailable(
    tree: Path, data: st.DataObject, content: bytes
) -> None:
    assert list(_probe(tree)), "the captured tree itself is found"
    path = data.draw(st.sampled_from(_files(tree)), label="file")
    original = path.read_bytes()
    path.write_bytes(content)
    try:
        list(_probe(tree))
    finally:
        path.write_bytes(original)


# -- tools' outputs ------------------------------------------------------------------------------


def _text(name: str) -> str:
    return (FIXTURES / name).read_text("utf-8")


@st.composite
def _edited(draw: Any, text: str) -> str:
    """``text`` with a slice of it replaced by hostile text."""
    start = draw(st.integers(0, len(text)))
    end = draw(st.integers(start, min(len(text), start + 40)))
    return text[:start] + draw(NASTY_TEXT | st.text(max_size=10)) + text[end:]


_XPU_INF_DUMP = (
    "Timestamp, DeviceId, GPU Utilization (%), GPU Power (W), GPU Memory Used (MiB)\n"
    "21:48:07.398, 0, nan, 1e999, inf\n"
)


def test_xpu_smi_readings_that_are_not_finite_are_no_readings() -> None:
    (row,) = xpu_smi.parse_dump(_XPU_INF_DUMP)
    assert (row.util_pct, row.power_mw, row.mem_used_bytes) == (None, None, None)


def _json_variants(name: str) -> st.SearchStrategy[str]:
    text = _text(name)
    return _edited(text) | mutated(json.loads(text), JSON).map(json.dumps)


@FUZZ
@given(
    discovery=_json_variants("intel-xpu-smi/discovery.json"),
    detail=_json_variants("intel-xpu-smi/discovery-d0-partial.json"),
    dump=_edited(_text("intel-xpu-smi/dump.csv")),
)
@example(discovery='{"device_list": 5}', detail="[" * 5000, dump="DeviceId,x\n1,\x00")
@example(discovery="[" * 5000, detail='{"number_of_tiles": "inf"}', dump="DeviceId\n" + "9" * 5000)
@example(discovery="{}", detail='{"memory_physical_size_byte": "1e999"}', dump="DeviceId\n" + "inf")
# Found by this test in CI: a memory reading of "inf" (or a power of "1e999") overflowed.
@example(discovery="{}", detail="{}", dump=_XPU_INF_DUMP)
def test_xpu_smi_output_parses_or_is_a_value_error(discovery: str, detail: str, dump: str) -> None:
    for parse, text in (
        (xpu_smi.parse_discovery, discovery),
        (xpu_smi.parse_discovery_device, detail),
        (xpu_smi.parse_dump, dump),
    ):
        with contextlib.suppress(ValueError):
            parse(text)


@FUZZ
@given(
    ioreg=_edited(_text("apple/ioreg-m1pro-macos12.txt")),
    profiler=_json_variants("apple/system_profiler-m1.json"),
)
@example(ioreg="", profiler='{"SPDisplaysDataType": [{"sppci_model": "M", "sppci_cores": "²"}]}')
@example(ioreg="", profiler="[" * 5000)
def test_apple_tool_output_never_raises(ioreg: str, profiler: str) -> None:
    apple.parse_ioreg(ioreg)
    apple.parse_system_profiler(profiler)


@FUZZ
@given(text=st.text(max_size=60) | NASTY_TEXT)
@example(text="simd_count ²")
@example(text="1002,\t²,\tname")
def test_kfd_properties_and_amdgpu_ids_never_raise(text: str) -> None:
    kfd.parse_properties(text)
    parse_amdgpu_ids(text)


@FUZZ
@given(text=st.text(max_size=30) | NASTY_TEXT)
@example(text="h100:²")
@example(text="h100:" + "9" * 5000)
def test_a_sim_profile_parses_or_is_a_value_error(text: str) -> None:
    with contextlib.suppress(ValueError):
        parse_profile(text)
