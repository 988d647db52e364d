"""One policy everywhere: the agents' owners, the TUI and the simulator call the same functions,
and on the same fleet they rank the same way."""

from __future__ import annotations

import agent.operator.fit as submit_fit
import agent.owning.placement as placement
import agent.policy.decision as policy_decide
import agent.policy.filters as filters
import agent.policy.preview as preview
import bench.sched.policies as sim
import tui.preview as tui_preview
import tui.simmesh as tui_sim
from agent.job.jobspec import JobSpec, Resources
from agent.policy import adapt, baselines
from agent.policy.decision import context, rank_any
from agent.policy.model import ThroughputModel
from agent.policy.snapshot import Snapshot
from probers.records import DeviceStatic
from tests.policy.helpers import GIB


def test_the_agents_the_tui_and_the_simulator_import_the_same_functions() -> None:
    assert placement.rank_any is policy_decide.rank_any  # the owners' Shoal placement
    assert placement.context is policy_decide.context
    assert preview.rank_any is policy_decide.rank_any  # the TUI's preview
    assert tui_preview.preview is preview.preview  # the submit form and the migrate picker
    assert tui_sim.offers is tui_preview.offers  # shoal tui --sim places and explains with it
    assert sim.decide is policy_decide.decide  # the simulator's shoal
    assert placement.first_fit is baselines.first_fit is sim.first_fit  # fifo, both sides
    assert submit_fit.static_fit is filters.static_fit  # shoal submit's "never fits"
    assert placement.never_reason is preview.never_reason  # the "why waiting" line


class _View:
    """What an agent's gossip view holds of a node (``agent.mesh.view.NodeView``'s fields)."""

    def __init__(self, node_id: str, name: str, n: int, mem_gib: int, free: list[int]) -> None:
        self.node_id = node_id
        self.inventory = {"labels": {"zone": "z"}, "host": {"os": "linux"}}
        self.status = None  # the node record the fields below stand for
        self.statics = [
            DeviceStatic(
                f"{node_id}-{i}", "nvidia", "cuda", name, "sim", mem_total_bytes=mem_gib * GIB
            )
            for i in range(n)
        ]
        self.samples: dict[str, object] = {}
        self.drain = "schedulable"
        self.free = [f"{node_id}-{i}" for i in free]
        self.features: frozenset[str] = frozenset()
        self.datasets: dict[str, int] = {}
        self.place = None
        self.shares: dict[str, dict[str, int]] = {}


class _Host:
    """What the TUI holds of a host (``tui.model.HostView``'s fields)."""

    def __init__(self, view: _View) -> None:
        self.node_id = view.node_id
        self.drain = view.drain
        self.labels = {"zone": "z"}
        self.os = "linux"
        self.devices = [_Dev(s) for s in view.statics]
        self.features: tuple[str, ...] = ()


class _Dev:
    def __init__(self, s: DeviceStatic) -> None:
        self.key, self.vendor, self.backend, self.name = s.key, s.vendor, s.backend, s.name
        self.arch, self.compute_capability = s.arch, s.compute_capability
        self.mem_total_bytes = s.mem_total_bytes
        self.temp_c = self.temp_slowdown_c = None
        self.power_mw = self.power_limit_mw = None


def test_owner_tui_and_simulator_rank_alike() -> None:
    views = [
        _View("n1-rx", "AMD Radeon RX 7900 XTX", 1, 24, [0]),
        _View("n2-a100", "NVIDIA A100-SXM4-80GB", 2, 80, [0, 1]),
        _View("n3-v100", "Tesla V100-SXM2-32GB", 4, 32, [1, 2]),
    ]
    spec = JobSpec(
        command=("serve",),
        kind="inference",
        resources=Resources(gpus_per_node=1, min_mem_per_gpu_bytes=16 * GIB),
        labels={"class": "llm"},
    )
    owner = placement.ShoalPlacement(clock=lambda: 0.0)
    by_owner = [c.node_id for c in owner.candidates(spec, views)]  # type: ignore[arg-type]
    hosts = [_Host(v) for v in views]
    busy = {v.node_id: {s.key for s in v.statics if s.key not in v.free} for v in views}
    answer = preview.preview(spec, hosts, busy)  # type: ignore[arg-type]
    by_tui = [c.node_id for c in answer.candidates]
    nodes = tuple(adapt.node_from_view(v) for v in views)  # type: ignore[arg-type]
    ctx, _ = context(Snapshot(now=0.0, nodes=nodes), ThroughputModel())
    by_sim = [c.node_id for c in rank_any(adapt.job_from_spec("j", spec), ctx, limit=10)]
    assert by_owner[0] == by_tui[0] == by_sim[0] == "n2-a100"
    assert set(by_owner) == set(by_tui) == set(by_sim) == {"n1-rx", "n2-a100", "n3-v100"}
    first_fit = [c.node_id for c in placement.FirstFit().candidates(spec, views)]  # type: ignore[arg-type]
    assert first_fit == ["n1-rx", "n2-a100", "n3-v100"]
