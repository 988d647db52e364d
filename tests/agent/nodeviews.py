"""Node views as an owner's gossip holds them, for placement tests without agents."""

from __future__ import annotations

from agent.mesh.view import NodeView
from agent.wire.inventory import InventoryRecord
from agent.wire.records import NodeRecord
from probers.records import DeviceStatic, HostInfo


def node_view(node_id: str, count: int, model: str = "NVIDIA H100 SXM", busy: int = 0) -> NodeView:
    """A schedulable node of ``count`` GPUs named ``<node_id>-<i>``, the first ``busy`` in use."""
    devices = tuple(
        DeviceStatic(
            key=f"{node_id}-{i}",
            vendor="nvidia",
            backend="cuda",
            name=model,
            source="sim",
            compute_capability="9.0",
            mem_total_bytes=80 * 1024**3,
        )
        for i in range(count)
    )
    host = HostInfo("h", "linux", "x86_64", None, None)
    return NodeView(
        node_id,
        inventory=InventoryRecord(host, None, {}, 1, devices),
        status=NodeRecord(drain="schedulable", free=tuple(d.key for d in devices[busy:])),
    )
