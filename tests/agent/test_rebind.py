"""Late binding on the runner: the devices each placement chooses on the runner's own node when
those an offer named were taken meanwhile, always of the offered models."""

from __future__ import annotations

import pytest

from agent.job.jobspec import JobSpec, Resources
from agent.owning.placement import FirstFit, Placement, ShoalPlacement
from agent.running.admission import NodeFacts, NotAdmitted, admit_or_rebind, local_node
from probers.records import DeviceStatic


def _gpu(key: str, name: str) -> DeviceStatic:
    return DeviceStatic(key=key, vendor="nvidia", backend="cuda", name=name, source="sim")


STATICS = [_gpu("h0", "H100"), _gpu("h1", "H100"), _gpu("h2", "H100"), _gpu("l0", "L4")]


def _spec(gpus: int, nodes: int = 1) -> JobSpec:
    return JobSpec(command=("true",), resources=Resources(gpus_per_node=gpus, nodes=nodes))


@pytest.mark.parametrize("placement", [FirstFit(), ShoalPlacement(owner="o" * 32)])
def test_other_devices_of_the_offered_model_or_none(placement: Placement) -> None:
    def chosen(taken: list[str], offered: tuple[str, ...], gpus: int) -> tuple[str, ...]:
        node = local_node("n" * 32, NodeFacts(), STATICS, {k: {f"job-{k}": 0} for k in taken})
        keys, share_bytes = admit_or_rebind(_spec(gpus), node, offered, placement.rebind)
        assert share_bytes == 0
        return keys

    assert chosen([], ("h0",), 1) == ("h0",)  # free: as offered
    assert chosen(["h0"], ("h0",), 1) in {("h1",), ("h2",)}
    assert set(chosen(["h0"], ("h0", "h1"), 2)) == {"h1", "h2"}
    with pytest.raises(NotAdmitted, match="device h0 is in use"):
        chosen(["h0", "h1", "h2"], ("h0",), 1)  # the L4 is free, but no H100
    with pytest.raises(NotAdmitted, match="device h0 is in use"):
        chosen(["h0"], ("h0", "h1", "h2"), 3)
    with pytest.raises(NotAdmitted, match="offered 1 device"):
        chosen(["h0"], ("h0",), 2)  # a wrong offer is declined as such, never rebound
    # A gang's member (a prepare): the member's part of the job, on this one node.
    node = local_node("n" * 32, NodeFacts(), STATICS, {"h0": {"job-h0": 0}})
    keys, _ = admit_or_rebind(_spec(1, nodes=2), node, ("h0",), placement.rebind)
    assert keys in {("h1",), ("h2",)}


def test_without_leave_to_choose_a_taken_device_is_declined() -> None:
    node = local_node("n" * 32, NodeFacts(), STATICS, {"h0": {"job": 0}})
    with pytest.raises(NotAdmitted, match="device h0 is in use"):
        admit_or_rebind(_spec(1), node, ("h0",))
