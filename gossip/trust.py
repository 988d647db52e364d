"""The seams between the gossip core and cryptography.

The core never touches keys or certificates: it asks a :class:`Trust` whether a peer's credential
is acceptable and whether a signature is the origin's, and it asks its own :class:`Signer` to sign.
Real implementations (Ed25519 keys certified by the cluster CA) live in ``gossip.identity``; the
simulator may use cheaper ones with the same behaviour for forged input.
"""

from __future__ import annotations

from typing import Protocol


class Signer(Protocol):
    """This node's identity: its id, the credential peers check it by, and its signing key."""

    @property
    def node_id(self) -> str: ...

    @property
    def credential(self) -> bytes:
        """What a peer needs to verify this node's signatures (a DER certificate for real nodes)."""
        ...

    def sign(self, data: bytes) -> bytes: ...


class Trust(Protocol):
    """Which nodes are members in good standing, and whose signature is whose."""

    def admit(self, node_id: str, credential: bytes, now: float) -> bool:
        """Accept ``credential`` as ``node_id``'s: valid, unexpired, unrevoked, id matches key."""
        ...

    def verify(self, node_id: str, data: bytes, signature: bytes) -> bool:
        """True only if ``signature`` over ``data`` is by ``node_id``'s admitted key."""
        ...

    def is_revoked(self, node_id: str) -> bool: ...
