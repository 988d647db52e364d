"""The simulator's cheap identity: a simulated cluster CA that derives each node's key and
credential from one secret, and the signer and trust seams (:mod:`gossip.trust`) over it. Keyed
BLAKE2b MACs: cheap, and forged or altered data fails exactly as with real keys.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass


class SimKeyring:
    """The simulated cluster CA: derives each node's key and credential from one secret."""

    def __init__(self, secret: bytes = b"shoal-sim-ca") -> None:
        self._secret = secret
        self._keys: dict[str, bytes] = {}
        self._creds: dict[str, bytes] = {}
        self._verified: dict[tuple[str, bytes, bytes], bool] = {}
        self.revoked: set[str] = set()

    def key(self, node: str) -> bytes:
        k = self._keys.get(node)
        if k is None:
            k = hashlib.blake2b(node.encode(), key=self._secret, digest_size=32).digest()
            self._keys[node] = k
        return k

    def credential(self, node: str) -> bytes:
        c = self._creds.get(node)
        if c is None:
            tag = hashlib.blake2b(b"cert:" + node.encode(), key=self._secret, digest_size=32)
            c = self._creds[node] = b"simcert:" + tag.digest()
        return c

    def verify(self, node: str, data: bytes, signature: bytes) -> bool:
        """Check a MAC, remembering the answer: every node verifies every update once, and the
        answer depends only on these three values (a forgery still fails)."""
        key = (node, data, signature)
        ok = self._verified.get(key)
        if ok is None:
            mac = hashlib.blake2b(data, key=self.key(node), digest_size=32).digest()
            ok = hmac.compare_digest(mac, signature)
            if len(self._verified) >= 1 << 18:
                self._verified.clear()
            self._verified[key] = ok
        return ok


@dataclass(frozen=True, slots=True)
class SimSigner:
    node: str
    keyring: SimKeyring

    @property
    def node_id(self) -> str:
        return self.node

    @property
    def credential(self) -> bytes:
        return self.keyring.credential(self.node)

    def sign(self, data: bytes) -> bytes:
        return hashlib.blake2b(data, key=self.keyring.key(self.node), digest_size=32).digest()


@dataclass(frozen=True, slots=True)
class SimTrust:
    keyring: SimKeyring

    def admit(self, node_id: str, credential: bytes, now: float) -> bool:
        keyring = self.keyring
        if node_id in keyring.revoked:
            return False
        issued = keyring._creds.get(node_id) or keyring.credential(node_id)
        return hmac.compare_digest(credential, issued)

    def verify(self, node_id: str, data: bytes, signature: bytes) -> bool:
        return self.keyring.verify(node_id, data, signature)

    def is_revoked(self, node_id: str) -> bool:
        return node_id in self.keyring.revoked


# -- the simulated cluster -------------------------------------------------------------------------
