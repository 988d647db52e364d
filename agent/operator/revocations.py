"""Revoking a removed node: the operator's revocation list, kept in the cluster directory.

``revocations.bin`` beside the CA holds the latest list this operator signed (lists are
cumulative and versioned, see :mod:`gossip.revocation`). Revoking adds the node id, signs the
next version and offers it to the mesh as a ``revoke`` command; an agent that does not accept
that command leaves the list issued and saved here, and the caller says so. Used by
``shoal revoke`` and by ``shoal bootstrap --uninstall``.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path

from agent.operator.client import ApiClient, ApiError
from gossip import revocation
from gossip.certtrust import CertSigner
from gossip.identity import ClusterIdentity
from gossip.revocation import REVOCATIONS_FILE, RevocationError, RevocationList


def load_revocations(cluster_dir: Path) -> RevocationList:
    return revocation.load(cluster_dir / REVOCATIONS_FILE) or RevocationList.empty()


def revoke_nodes(
    cluster: ClusterIdentity, node_ids: set[str], now: float | None = None
) -> RevocationList:
    """Sign and save the next list, revoking ``node_ids`` on top of everything revoked before."""
    current = load_revocations(cluster.directory)
    signed = revocation.issue_revocations(
        CertSigner(cluster.operator),
        current.node_ids | node_ids,
        current.serials,
        current.version + 1,
        time.time() if now is None else now,
    )
    revocation.save(cluster.directory / REVOCATIONS_FILE, signed)
    return signed


async def publish(client: ApiClient, signed: RevocationList) -> str | None:
    """Offer the list to the mesh; None when accepted, else the one-line reason."""
    body = {"revocations": base64.b64encode(revocation.encode(signed)).decode("ascii")}
    try:
        await client.command("revoke", body)
    except ApiError as exc:
        return str(exc)
    return None


__all__ = ["RevocationError", "load_revocations", "publish", "revoke_nodes"]
