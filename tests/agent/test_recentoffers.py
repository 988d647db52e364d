"""An owner counts the devices of its recent offers in use until gossip can have said so, under
either placement: it neither offers its own just-started devices again nor goes back at once to
devices a runner declined as in use."""

from __future__ import annotations

import pytest

from agent.job.jobspec import JobSpec, Resources
from agent.owning.placement import FirstFit, ShoalPlacement
from agent.owning.recentoffers import HOLD_S, RecentOffers, mark_held
from agent.policy.adapt import BUSY
from agent.policy.snapshot import Device, Node, Share
from tests.agent.nodeviews import node_view


def test_offers_are_held_for_a_while_then_forgotten() -> None:
    recent = RecentOffers(hold_s=3.0)
    recent.note("n1", ("d0", "d1"), now=10.0)
    recent.note("n2", ("d0",), now=11.0)
    assert recent.held(12.0) == {"n1": {"d0", "d1"}, "n2": {"d0"}}
    recent.note("n1", ("d1",), now=12.5)  # offered again: held from then
    assert recent.held(13.0) == {"n1": {"d1"}, "n2": {"d0"}}
    assert recent.held(16.0) == {}


def test_held_devices_are_busy_and_busy_ones_keep_their_holder() -> None:
    share = Share("j9", 1, 0.5)
    node = Node(
        "n1",
        devices=(
            Device(key="d0", model="h100"),
            Device(key="d1", model="h100", whole_job="j1"),
            Device(key="d2", model="h100"),
            Device(key="d3", model="h100", shares=(share,)),
        ),
    )
    other = Node("n2", devices=(Device(key="d0", model="l4"),))
    marked = mark_held([node, other], {"n1": frozenset({"d0", "d1", "d3"})})
    assert [d.whole_job for d in marked[0].devices] == [BUSY, "j1", None, None]
    assert marked[1] == other


@pytest.mark.parametrize("kind", ["fifo", "shoal"])
def test_a_placement_skips_what_it_offered_until_the_hold_ends(kind: str) -> None:
    now = [100.0]
    placement = (
        FirstFit(clock=lambda: now[0]) if kind == "fifo" else ShoalPlacement(clock=lambda: now[0])
    )
    # "a" sorts first (first fit) and has the H100s (the policy's pick for this class).
    views = [node_view("a", 2, "NVIDIA H100 SXM"), node_view("b", 2, "NVIDIA L4")]
    spec = JobSpec(
        command=("x",), resources=Resources(gpus_per_node=1), labels={"class": "ResNet-50"}
    )
    first = placement.candidates(spec, views)[0]
    assert first.node_id == "a"
    placement.offered(first)  # started (or declined): the view still says free
    second = placement.candidates(spec, views)[0]
    assert second.node_id == "a" and second.devices != first.devices
    placement.offered(second)
    assert [c.node_id for c in placement.candidates(spec, views)] == ["b"]
    now[0] += HOLD_S
    assert placement.candidates(spec, views)[0] == first  # the view is to be believed again


@pytest.mark.parametrize("kind", ["fifo", "shoal"])
def test_a_job_that_ended_gives_its_devices_back_before_the_hold_ends(kind: str) -> None:
    """A job that ends a moment after its start (a short job, a crash at launch): the runner's
    report is newer than the offer, so the next job may have the GPU at once."""
    now = [100.0]
    placement = (
        FirstFit(clock=lambda: now[0]) if kind == "fifo" else ShoalPlacement(clock=lambda: now[0])
    )
    views = [node_view("a", 1, "NVIDIA H100 SXM")]
    spec = JobSpec(command=("x",), resources=Resources(gpus_per_node=1))
    first = placement.candidates(spec, views)[0]
    placement.offered(first)
    assert placement.candidates(spec, views) == []
    placement.released(first.node_id, first.devices)
    assert placement.candidates(spec, views)[0] == first
    recent = RecentOffers(hold_s=3.0)
    recent.note("n1", ("d0", "d1"), now=10.0)
    recent.forget("n1", ("d0", "d9"))
    assert recent.held(11.0) == {"n1": {"d1"}}


@pytest.mark.parametrize("kind", ["fifo", "shoal"])
def test_an_answered_offer_is_held_until_the_runner_says_more(kind: str) -> None:
    """After its answer, an offer's devices are held until the runner's next status record (it
    says what became of them); an offer on its way, for the whole hold."""
    now = [100.0]
    placement = (
        FirstFit(clock=lambda: now[0]) if kind == "fifo" else ShoalPlacement(clock=lambda: now[0])
    )
    view = node_view("a", 1, "NVIDIA H100 SXM")
    spec = JobSpec(command=("x",), resources=Resources(gpus_per_node=1))
    first = placement.candidates(spec, [view])[0]
    placement.reserving(first)
    fresh = node_view("a", 1, "NVIDIA H100 SXM")  # a newer record, still saying free
    assert placement.candidates(spec, [fresh]) == []  # the offer is on its way: held
    placement.offered(first)  # declined, say: the devices were taken meanwhile
    assert placement.candidates(spec, [fresh]) == []
    newer = node_view("a", 1, "NVIDIA H100 SXM")  # what the runner said after the answer
    assert placement.candidates(spec, [newer])[0] == first
