"""What one node keeps in its content store, for ``shoal cache``: every piece of content by kind
(datasets, working folders, Python environments, exported images), its size and how much of it is
held, whether it is pinned, when a job last used it and how often.

``GET /v1/cache`` answers this node's; the CLI asks each live node for its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from agent.content.storeindex import Held

KIND_ORDER: Final = ("dataset", "image", "env", "workdir", "checkpoint", "policy")


def cache_doc(
    node_id: str, held: Sequence[Held], store_bytes: int, budget_bytes: int
) -> dict[str, Any]:
    """The ``/v1/cache`` answer: ``{node, store_bytes, budget_bytes, items}``, items sorted by
    kind, then name."""
    rank = {k: i for i, k in enumerate(KIND_ORDER)}
    rows = sorted(held, key=lambda h: (rank.get(h.kind, len(rank)), h.name, h.created_s))
    return {
        "node": node_id,
        "store_bytes": store_bytes,
        "budget_bytes": budget_bytes,
        "items": [
            {
                "kind": h.kind,
                "name": h.name,
                "digest": h.digest,
                "total_bytes": h.total_bytes,
                "held_bytes": h.held_bytes,
                "pinned": h.pinned,
                "last_use_s": h.last_use_s or None,
                "uses": h.uses,
                "in_place": h.origin is not None,
            }
            for h in rows
        ],
    }
