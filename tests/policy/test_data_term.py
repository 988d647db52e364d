"""The data term counts the bytes a node really lacks at the rates it measured from their
holders: a node that fetches fast from the holders beats one that fetches slowly, a node that
holds most of a version beats one that holds none, and with nothing measured the link's guess
stands."""

from __future__ import annotations

from agent.policy.context import Context
from agent.policy.decision import context
from agent.policy.model import ThroughputModel
from agent.policy.scoring import fetch_rate, transfer_s
from agent.policy.snapshot import Job, Node, Snapshot
from tests.policy.helpers import job, node

DIGEST = "ab" * 32
REF = f"imagenet@{DIGEST}"
SIZE = 100 * 10**9


def ctx_of(*nodes: Node) -> Context:
    snapshot = Snapshot(now=0.0, nodes=nodes, dataset_bytes={REF: SIZE, "imagenet": SIZE})
    return context(snapshot, ThroughputModel())[0]


def reader() -> Job:
    return job("j", job_class="x", datasets=(REF,))


def holder() -> Node:
    return node("h", "v100", 1, busy=[0], datasets=frozenset({REF}), dataset_held={REF: SIZE})


def test_measured_rates_rank_the_nodes_not_the_guessed_link() -> None:
    slow = node("a", "v100", 1, fetch_rates={"h": 10e6})
    fast = node("b", "v100", 1, fetch_rates={"h": 1e9})
    ctx = ctx_of(holder(), slow, fast)
    assert transfer_s(reader(), slow, ctx) == SIZE / 10e6
    assert transfer_s(reader(), fast, ctx) == SIZE / 1e9
    unmeasured = node("c", "v100", 1)
    assert transfer_s(reader(), unmeasured, ctx) == SIZE / (unmeasured.network_gbps * 1e9 / 8)
    # A rate measured from a node that does not hold it says nothing about this dataset.
    elsewhere = node("d", "v100", 1, fetch_rates={"x": 1.0})
    assert fetch_rate(elsewhere, {"h"}) == elsewhere.network_gbps * 1e9 / 8


def test_only_the_missing_bytes_count_and_holders_add_up() -> None:
    most = node("a", "v100", 1, dataset_held={REF: SIZE - 10**6}, fetch_rates={"h": 1e6})
    ctx = ctx_of(holder(), most)
    assert transfer_s(reader(), most, ctx) == 1.0
    second = node("h2", "v100", 1, busy=[0], datasets=frozenset({REF}), dataset_held={REF: SIZE})
    both = node("b", "v100", 1, fetch_rates={"h": 1e9, "h2": 1e9})
    ctx = ctx_of(holder(), second, both)
    assert transfer_s(reader(), both, ctx) == SIZE / 2e9


def test_an_image_counts_its_missing_bytes_as_a_dataset_does() -> None:
    from types import SimpleNamespace

    from agent.job.jobspec import JobSpec
    from agent.policy import adapt
    from agent.wire.place import HeldContent, PlaceRecord

    image = "reg.example:5000/team/train:1"
    size = 2 * 10**9
    place = PlaceRecord(content=(HeldContent("image", image, "cd" * 32, size),))
    view = SimpleNamespace(datasets={}, place=place)
    assert adapt.dataset_bytes([view]) == {adapt.image_key(image): size}  # type: ignore[list-item]
    spec = JobSpec(command=("python", "train.py"), image=image)
    wanted = adapt.job_from_spec("j", spec)
    assert wanted.datasets == (adapt.image_key(image),)
    key = adapt.image_key(image)
    keeper = node("h", "v100", 1, busy=[0], datasets=frozenset({key}), dataset_held={key: size})
    lacking = node("a", "v100", 1, fetch_rates={"h": 1e9})
    snapshot = Snapshot(now=0.0, nodes=(keeper, lacking), dataset_bytes={key: size})
    ctx = context(snapshot, ThroughputModel())[0]
    assert transfer_s(wanted, lacking, ctx) == size / 1e9
    assert transfer_s(wanted, keeper, ctx) == 0.0
