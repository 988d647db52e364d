"""Data gravity and latency facts: the ``place`` record, the datasets scan, and real agents
gossiping both (datasets with their sizes, changing at run time; network coordinates)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.common.errors import UserError
from agent.daemon.config import config_from_mapping
from agent.daemon.datasets import DatasetScanner, scan_datasets
from agent.wire.codec import MAX_RECORD_BYTES, WireError, pack, unpack
from agent.wire.place import PlaceRecord, coord_moved_s, dataset_name_problem
from gossip.vivaldi import Coordinate
from tests.agent.agents import Mesh
from tests.agent.test_attacks import metric

NAMES = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/\\"),
    min_size=1,
    max_size=40,
).filter(lambda n: dataset_name_problem(n) is None)
COORDS = st.builds(
    Coordinate,
    vec=st.lists(st.floats(-1.0, 1.0), min_size=8, max_size=8).map(tuple),
    error=st.floats(0.0, 1.5),
    adjustment_s=st.floats(-0.01, 0.01),
    height_s=st.floats(0.0, 0.01),
)


@given(st.dictionaries(NAMES, st.integers(0, 2**50), max_size=20), st.none() | COORDS)
def test_a_place_record_round_trips(datasets: dict[str, int], coord: Coordinate | None) -> None:
    payload, left_out = PlaceRecord(datasets, coord).encode()
    assert left_out == 0
    back = PlaceRecord.decode(unpack(payload))
    assert dict(back.datasets) == datasets and back.coord == coord


def test_what_does_not_fit_is_the_smallest_and_is_counted() -> None:
    datasets = {f"shard-{i:04d}-of-a-large-corpus": 1000 + i for i in range(400)}
    payload, left_out = PlaceRecord(datasets).encode()
    assert len(payload) <= MAX_RECORD_BYTES
    kept = PlaceRecord.decode(unpack(payload)).datasets
    assert left_out == 400 - len(kept) > 0
    assert min(kept.values()) > max(v for k, v in datasets.items() if k not in kept)


@pytest.mark.parametrize(
    "doc",
    [
        {"datasets": [["../etc", 1]]},
        {"datasets": [[".hidden", 1]]},
        {"datasets": [["a/b", 1]]},
        {"datasets": [["", 1]]},
        {"datasets": [["imagenet", -1]]},
        {"datasets": [["imagenet"]]},
        {"datasets": "imagenet"},
        {"coord": [[math.nan] * 8, 0.1, 0.0, 0.0]},
        {"coord": [[math.inf] * 8, 0.1, 0.0, 0.0]},
        {"coord": [[0.0] * 17, 0.1, 0.0, 0.0]},
        {"coord": [[], 0.1, 0.0, 0.0]},
        {"coord": [[0.0] * 8, 0.1, 0.0, -1.0]},
        {"coord": [[7200.0] * 8, 0.1, 0.0, 0.0]},
        {"coord": "near"},
    ],
)
def test_a_lying_or_broken_place_record_is_refused(doc: dict[str, object]) -> None:
    with pytest.raises(WireError):
        PlaceRecord.decode(unpack(pack(doc)))


def test_rtt_and_movement_between_coordinates() -> None:
    a = Coordinate((0.0,) * 8, 0.2, 0.0, 0.001)
    b = Coordinate((0.003,) + (0.0,) * 7, 0.2, 0.0, 0.001)
    assert PlaceRecord(coord=a).rtt_s(PlaceRecord(coord=b)) == pytest.approx(0.005)
    assert PlaceRecord(coord=a).rtt_s(PlaceRecord()) is None
    assert coord_moved_s(a, b) == pytest.approx(0.003)
    assert coord_moved_s(None, None) == 0.0 and coord_moved_s(None, a) == math.inf


def test_the_scan_measures_each_entry_and_follows_no_link_inside(tmp_path: Path) -> None:
    held = tmp_path / "datasets"
    (held / "imagenet" / "train").mkdir(parents=True)
    (held / "imagenet" / "train" / "0.tar").write_bytes(b"x" * 3000)
    (held / "imagenet" / "labels.txt").write_bytes(b"y" * 100)
    (held / "imagenet" / "loop").symlink_to(held / "imagenet")  # not followed: no loop
    (held / "imagenet" / "out").symlink_to("/etc")  # nor out
    (held / "in1k").symlink_to(held / "imagenet")  # another name for one inside: measured
    (held / "weights.safetensors").write_bytes(b"w" * 42)
    (held / ".partial").mkdir()
    found = scan_datasets(held, named=("laion", "imagenet"))
    assert found.held == {
        "laion": 0,
        "imagenet": 3100,
        "in1k": 3100,
        "weights.safetensors": 42,
    }
    assert found.refused == ()


def test_the_scan_follows_no_link_out_and_takes_no_unsafe_name(tmp_path: Path) -> None:
    held = tmp_path / "datasets"
    held.mkdir()
    (held / "c4").write_bytes(b"c" * 7)
    elsewhere = tmp_path / "other-agent"
    elsewhere.mkdir()
    (elsewhere / "node.key").write_bytes(b"k" * 99)
    for name, target in (
        ("etc", Path("/etc")),
        ("root", Path("/")),
        ("peer", elsewhere),
        ("itself", held),
        ("up", held / ".."),
        ("dangling", tmp_path / "missing"),
    ):
        (held / name).symlink_to(target)
    for name in ("a$(id)b", "-rf", "with space", "tab\there", "ünïcode", "semi;colon"):
        (held / name).write_bytes(b"x")
    found = scan_datasets(held)
    assert found.held == {"c4": 7}
    links = sorted(r.entry for r in found.refused if r.reason == "link_out")
    assert links == ["dangling", "etc", "itself", "peer", "root", "up"]
    names = sorted(r.entry for r in found.refused if r.reason == "name")
    assert names == sorted(["a$(id)b", "-rf", "with space", "tab\there", "ünïcode", "semi;colon"])
    assert all("\n" not in r.why and "not gossiped" in r.why for r in found.refused)


def test_a_refused_entry_is_said_and_counted_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    held = tmp_path / "datasets"
    held.mkdir()
    (held / "etc").symlink_to("/etc")
    (held / "a b").write_bytes(b"x")
    scanner = DatasetScanner(held, ("laion",))
    with caplog.at_level("WARNING", logger="shoal.agent"):
        for _ in range(3):
            assert scanner.scan() == {"laion": 0}
    assert scanner.refused == {"link_out": 1, "name": 1}
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "'etc' is a link out of the folder" in said[1], said


def test_a_missing_folder_leaves_the_named_datasets(tmp_path: Path) -> None:
    assert scan_datasets(tmp_path / "absent", named=("laion",)).held == {"laion": 0}
    assert scan_datasets(None).held == {}


def test_the_config_takes_a_datasets_folder_and_refuses_a_name_that_is_a_path() -> None:
    config = config_from_mapping({"datasets_dir": "/data/sets", "datasets_rescan_s": 5})
    assert config.datasets_dir == Path("/data/sets") and config.datasets_rescan_s == 5.0
    with pytest.raises(UserError, match="one path component"):
        config_from_mapping({"datasets": ["../../etc"]})


def test_agents_gossip_datasets_with_sizes_as_they_change_and_their_coordinates(
    tmp_path: Path,
) -> None:
    mesh = Mesh(tmp_path, ["a100-80gb:2", "l4:1", "t4:1"], extra=("--datasets-rescan-s", "0.5"))
    holder = mesh.agents[1]
    (holder.datasets_dir / "imagenet").mkdir(parents=True)
    (holder.datasets_dir / "imagenet" / "train.tar").write_bytes(os.urandom(5000))
    try:
        mesh.start_all()
        observer = mesh.agents[2]

        def node(a_id: str) -> dict[str, object]:
            listing = mesh.get(observer, "/v1/nodes")["nodes"]
            return next(n for n in listing if n["node_id"] == a_id)

        mesh.wait("imagenet seen", lambda: node(holder.node_id)["datasets"] == {"imagenet": 5000})
        assert node(mesh.agents[0].node_id)["datasets"] == {}

        (holder.datasets_dir / "c4").write_bytes(b"c" * 1234)  # a dataset arrives at run time
        mesh.wait(
            "c4 seen",
            lambda: node(holder.node_id)["datasets"] == {"imagenet": 5000, "c4": 1234},
        )
        (holder.datasets_dir / "c4").unlink()  # and goes
        mesh.wait("c4 gone", lambda: node(holder.node_id)["datasets"] == {"imagenet": 5000})

        def rtts() -> list[object]:
            return [node(a.node_id)["rtt_s"] for a in mesh.agents if a is not observer]

        mesh.wait("coordinates gossiped", lambda: all(isinstance(r, float) for r in rtts()))
        assert all(0.0 < r < 1.0 for r in rtts())  # type: ignore[operator]
    finally:
        mesh.stop_all()


def test_an_agent_gossips_no_link_out_of_its_folder_and_no_unsafe_name(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, ["l4:1", "t4:1"], extra=("--datasets-rescan-s", "0.5"))
    holder, other = mesh.agents
    folder = holder.datasets_dir
    (folder / "imagenet").mkdir(parents=True)
    (folder / "imagenet" / "train.tar").write_bytes(b"i" * 5000)
    (folder / "etc").symlink_to("/etc")
    (folder / "peer").symlink_to(other.directory)  # another agent's folder, its key inside
    for name in ("a$(id)b", "-rf", "with space"):
        (folder / name).write_bytes(b"x" * 10)
    try:
        mesh.start_all()

        def datasets() -> object:
            listing = mesh.get(other, "/v1/nodes")["nodes"]
            return next(n for n in listing if n["node_id"] == holder.node_id)["datasets"]

        mesh.wait("imagenet seen", lambda: datasets() == {"imagenet": 5000})
        (folder / "c4").write_bytes(b"c" * 1234)  # a rescan later: still only what is safe
        mesh.wait("c4 seen", lambda: datasets() == {"imagenet": 5000, "c4": 1234})
        refused = {
            reason: metric(mesh, holder, "shoal_datasets_refused_total", reason=reason)
            for reason in ("link_out", "name")
        }
        assert refused == {"link_out": 2, "name": 3}  # each once, however many rescans
        said = holder.log_path.read_text()
        assert "dataset 'peer' is a link out of the folder" in said
        assert "dataset 'a$(id)b': a name has only letters" in said
    finally:
        mesh.stop_all()


def test_the_policy_reads_datasets_and_coordinates_from_the_place_record() -> None:
    from agent.mesh.view import NodeView
    from agent.policy import adapt

    coord = Coordinate((0.001,) + (0.0,) * 7, 0.2, 0.0, 0.0001)
    holder = NodeView("a", place=PlaceRecord({"imagenet": 150 * 2**30}, coord))
    other = NodeView("b", place=PlaceRecord({"imagenet": 2**30}))
    node = adapt.node_from_view(holder)
    assert node.datasets == frozenset({"imagenet"}) and node.coord == coord
    assert adapt.node_from_view(NodeView("c")).coord is None
    assert adapt.dataset_bytes([holder, other]) == {"imagenet": 150 * 2**30}
