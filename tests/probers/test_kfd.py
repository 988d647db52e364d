"""KFD topology parsing against the captured Phoenix APU and multi-MI210 trees."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from probers.kfd import (
    IOLINK_TYPE_PCIE,
    IOLINK_TYPE_XGMI,
    KfdNode,
    KfdTopology,
    gfx_target_name,
    parse_properties,
    read_topology,
)
from tests.support import SYSFS

NODES = Path("sys/class/kfd/kfd/topology/nodes")
HIVE_A = {2, 3, 4, 5}
HIVE_B = {6, 7, 8, 9}


def _topology(fixture: str) -> KfdTopology:
    topology = read_topology(SYSFS / fixture)
    assert topology is not None
    return topology


@pytest.fixture(scope="module")
def mi210() -> KfdTopology:
    return _topology("amd-mi210-xgmi-kfd")


@pytest.fixture(scope="module")
def phoenix() -> KfdTopology:
    return _topology("amd-phoenix")


@pytest.mark.parametrize(
    ("version", "name"),
    [
        (90010, "gfx90a"),
        (110003, "gfx1103"),
        (100300, "gfx1030"),
        (90402, "gfx942"),
        (80003, "gfx803"),
        (90012, "gfx90c"),
        (120001, "gfx1201"),
        (0, None),
        (None, None),
        (90016, None),  # a stepping of 16 cannot be one hex digit: not a real target
    ],
)
def test_gfx_target_name_decodes_like_rocm(version: int | None, name: str | None) -> None:
    assert gfx_target_name(version) == name


def test_parse_properties_keeps_unsigned_integers_only() -> None:
    text = (
        "cpu_cores_count 16\nsimd_count 0\nname ip discovery\nbad -3\n\n"
        "unique_id 18446744073709551615"
    )
    assert parse_properties(text) == {
        "cpu_cores_count": 16,
        "simd_count": 0,
        "unique_id": 18446744073709551615,
    }
    assert parse_properties(None) == {}


def test_phoenix_cpu_node(phoenix: KfdTopology) -> None:
    assert [node.node_id for node in phoenix.nodes] == [0, 1]
    cpu = phoenix.nodes[0]
    assert cpu.is_cpu and not cpu.is_gpu
    assert cpu.cpu_cores_count == 16
    assert cpu.gpu_id == 0
    assert cpu.gfx_target is None
    assert cpu.compute_units is None
    assert cpu.pci_bus_id is None
    assert cpu.drm_render_minor is None
    assert len(cpu.io_links) == 1
    assert cpu.io_links[0].node_to == 1


def test_phoenix_gpu_node(phoenix: KfdTopology) -> None:
    gpu = phoenix.gpus[0]
    assert gpu.node_id == 1
    assert gpu.gpu_id == 35218
    assert gpu.cpu_cores_count == 0  # a recent kernel: the APU's GPU is a node of its own
    assert gpu.simd_count == 24
    assert gpu.simd_per_cu == 2
    assert gpu.compute_units == 12
    assert gpu.gfx_target_version == 110003
    assert gpu.gfx_target == "gfx1103"
    assert gpu.vendor_id == 0x1002
    assert gpu.device_id == 0x15BF
    assert gpu.location_id == 25600
    assert gpu.pci_bus_id == "0000:64:00.0"
    assert gpu.unique_id is None
    assert gpu.unique_id_hex is None
    assert gpu.drm_render_minor == 128
    assert gpu.hive_id is None
    (link,) = gpu.io_links
    assert (link.node_from, link.node_to, link.link_type) == (1, 0, IOLINK_TYPE_PCIE)
    assert link.kind == "pcie"
    assert link.weight == 20
    assert link.min_bandwidth_mbytes_s is None
    assert link.max_bandwidth_mbytes_s == 32000
    assert not link.indirect
    assert gpu.p2p_links == ()


def test_mi210_nodes(mi210: KfdTopology) -> None:
    assert [node.node_id for node in mi210.nodes] == list(range(10))
    assert [node.cpu_cores_count for node in mi210.nodes[:2]] == [64, 64]
    assert all(node.is_cpu for node in mi210.nodes[:2])
    assert [node.node_id for node in mi210.gpus] == [2, 3, 4, 5, 6, 7, 8, 9]
    for gpu in mi210.gpus:
        assert gpu.gfx_target == "gfx90a"
        assert gpu.compute_units == 104  # 416 SIMDs, 4 per CU
        assert gpu.device_id == 0x740F
        assert gpu.gpu_id is None  # this capture has no gpu_id files
    assert [gpu.pci_bus_id for gpu in mi210.gpus] == [
        "0000:63:00.0",
        "0000:43:00.0",
        "0000:03:00.0",
        "0000:26:00.0",
        "0000:e3:00.0",
        "0000:c3:00.0",
        "0000:83:00.0",
        "0000:a3:00.0",
    ]
    assert [gpu.drm_render_minor for gpu in mi210.gpus] == list(range(128, 136))
    node2 = mi210.node(2)
    assert node2 is not None
    assert node2.unique_id == 1801979520617338022
    assert node2.unique_id_hex == "1901ead3a2ecd4a6"
    hives = {gpu.node_id: gpu.hive_id for gpu in mi210.gpus}
    assert {hives[n] for n in HIVE_A} == {12609507387757274807}
    assert {hives[n] for n in HIVE_B} == {18091350218769748594}
    assert mi210.node(10) is None


def test_mi210_xgmi_graph(mi210: KfdTopology) -> None:
    xgmi = [
        link for node in mi210.nodes for link in node.io_links if link.link_type == IOLINK_TYPE_XGMI
    ]
    assert len(xgmi) == 24  # two hives of four, every GPU linked to its three hive peers
    pairs = {frozenset((link.node_from, link.node_to)) for link in xgmi}
    expected = {
        frozenset((a, b)) for hive in (HIVE_A, HIVE_B) for a in hive for b in hive if a != b
    }
    assert pairs == expected
    assert len(pairs) == 12
    assert {link.max_bandwidth_mbytes_s for link in xgmi} == {50000}
    assert {link.min_bandwidth_mbytes_s for link in xgmi} == {50000}
    assert {link.weight for link in xgmi} == {15}
    assert {link.kind for link in xgmi} == {"xgmi"}


def test_mi210_pcie_and_cpu_links(mi210: KfdTopology) -> None:
    node2, node6, cpu0 = mi210.node(2), mi210.node(6), mi210.node(0)
    assert node2 is not None and node6 is not None and cpu0 is not None
    up2 = [link for link in node2.io_links if link.link_type == IOLINK_TYPE_PCIE]
    up6 = [link for link in node6.io_links if link.link_type == IOLINK_TYPE_PCIE]
    assert [(link.node_to, link.weight) for link in up2] == [(0, 20)]
    assert [(link.node_to, link.weight) for link in up6] == [(1, 20)]
    assert up2[0].min_bandwidth_mbytes_s == 312
    assert up2[0].max_bandwidth_mbytes_s == 32000
    cpu_link = cpu0.io_links[0]
    assert (cpu_link.node_to, cpu_link.link_type, cpu_link.weight) == (1, 1, 32)
    assert cpu_link.kind is None
    assert cpu_link.max_bandwidth_mbytes_s is None


def test_mi210_p2p_links(mi210: KfdTopology) -> None:
    node2 = mi210.node(2)
    assert node2 is not None
    assert [(link.node_to, link.weight) for link in node2.p2p_links] == [
        (1, 52),
        (6, 72),
        (7, 72),
        (8, 72),
        (9, 72),
    ]
    assert all(link.indirect and link.kind == "pcie" for link in node2.p2p_links)
    assert all(not link.indirect for link in node2.io_links)


def test_hops_follow_direct_links(mi210: KfdTopology) -> None:
    assert mi210.hops(2, 3) == 1
    assert mi210.hops(2, 0) == 1
    assert mi210.hops(0, 9) == 2
    assert mi210.hops(2, 6) == 3  # GPU -> CPU 0 -> CPU 1 -> GPU
    assert mi210.hops(2, 2) == 0
    assert mi210.hops(2, 42) is None


def test_gpu_for_matches_by_pci_then_render_minor_then_unique_id(mi210: KfdTopology) -> None:
    by_pci = mi210.gpu_for(pci_bus_id="0000:43:00.0")
    assert by_pci is not None and by_pci.node_id == 3
    upper = mi210.gpu_for(pci_bus_id="0000:E3:00.0")
    assert upper is not None and upper.node_id == 6
    by_minor = mi210.gpu_for(pci_bus_id="0000:99:00.0", render_minor=133)
    assert by_minor is not None and by_minor.node_id == 7
    by_uid = mi210.gpu_for(unique_id_hex="AEA834AA2723EB57")
    assert by_uid is not None and by_uid.node_id == 6
    assert mi210.gpu_for(pci_bus_id="0000:99:00.0", render_minor=200) is None
    assert mi210.gpu_for() is None


def test_no_kfd_is_none(tmp_path: Path) -> None:
    assert read_topology(SYSFS / "amd-rx6900xt") is None
    assert read_topology(tmp_path) is None


def test_nul_padding_and_broken_entries(tmp_path: Path) -> None:
    shutil.copytree(SYSFS / "amd-phoenix", tmp_path, dirs_exist_ok=True)
    nodes = tmp_path / NODES
    props = nodes / "1" / "properties"
    props.write_bytes(props.read_bytes().ljust(4096, b"\0"))
    (nodes / "0" / "io_links" / "0" / "properties").write_text("")
    (nodes / "7").mkdir()  # a node folder without properties is skipped
    topology = read_topology(tmp_path)
    assert topology is not None
    assert [node.node_id for node in topology.nodes] == [0, 1]
    assert topology.nodes[0].io_links == ()
    assert topology.gpus[0].gfx_target == "gfx1103"
    assert topology.gpus[0].compute_units == 12


def test_pci_bus_id_decodes_device_and_function() -> None:
    node = KfdNode(
        node_id=3,
        gpu_id=1234,
        cpu_cores_count=0,
        simd_count=8,
        simd_per_cu=4,
        gfx_target_version=90402,
        vendor_id=0x1002,
        device_id=0x74A1,
        location_id=0x6312,  # bus 0x63, device 2, function 2
        domain=1,
        unique_id=None,
        drm_render_minor=None,
        hive_id=None,
    )
    assert node.pci_bus_id == "0001:63:02.2"
    assert node.compute_units == 2
    assert node.gfx_target == "gfx942"
    assert replace(node, simd_count=0).pci_bus_id is None
