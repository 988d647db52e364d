"""The simulated fleet: a ``type:count`` spec or an openb node list, as nodes of devices.

``--cluster v100:36,p100:36,k80:36 --gpus-per-node 8``: 36 GPUs of each type (as Gavel's
``-c 36:36:36``), grouped into nodes of 8 (the last node of a type holds the remainder). Types are
catalog keys (``v100``, ``a100-80gb``, ``h100``...). An openb node list gives each node's GPU
count and model, CPU and memory.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from agent.policy.prior import catalog_model

GIB = 1024**3
OPENB_MEM_GIB = {"T4": 16, "P100": 16, "V100M16": 16, "V100M32": 32, "A10": 24, "G2": 16, "G3": 16}
"""GPU memory of the openb models (the trace names G2 and G3 without saying what they are)."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    node_id: str
    model: str
    gpus: int
    mem_bytes: int
    cpu_milli: int | None = None
    host_mem_bytes: int | None = None
    zone: str | None = None


def parse_spec(text: str) -> list[tuple[str, int]]:
    """``"v100:36,p100:36"`` -> ``[("v100", 36), ("p100", 36)]``."""
    out: list[tuple[str, int]] = []
    for part in text.split(","):
        name, sep, count = part.strip().partition(":")
        if not sep or not name:
            raise ValueError(f"cluster spec {part!r}: expected TYPE:COUNT")
        try:
            n = int(count)
        except ValueError:
            raise ValueError(f"cluster spec {part!r}: COUNT must be an integer") from None
        if n <= 0:
            raise ValueError(f"cluster spec {part!r}: COUNT must be positive")
        out.append((name, n))
    return out


def nodes_from_spec(text: str, gpus_per_node: int) -> list[NodeSpec]:
    nodes: list[NodeSpec] = []
    for name, count in parse_spec(text):
        model = catalog_model(name)
        mem = model.mem_bytes if model is not None and model.mem_bytes else 16 * GIB
        key = model.key if model is not None else name
        for i in range(math.ceil(count / gpus_per_node)):
            gpus = min(gpus_per_node, count - i * gpus_per_node)
            nodes.append(NodeSpec(f"{key}-{i:04d}", key, gpus, mem))
    return nodes


def nodes_from_openb(path: Path) -> list[NodeSpec]:
    nodes: list[NodeSpec] = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            gpus = int(row["gpu"])
            model = row.get("model") or "G2"
            nodes.append(
                NodeSpec(
                    row["sn"],
                    model,
                    gpus,
                    OPENB_MEM_GIB.get(model, 16) * GIB,
                    cpu_milli=int(row["cpu_milli"]),
                    host_mem_bytes=int(row["memory_mib"]) * 1024**2,
                )
            )
    return nodes
