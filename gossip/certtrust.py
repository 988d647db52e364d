"""The real :class:`~gossip.trust.Signer` and :class:`~gossip.trust.Trust`: certificates signed
by the cluster CA, Ed25519 signatures, and the revocation list.

``CertTrust`` parses and checks each distinct certificate once (CA signature, id = hash of key,
role present) and caches the verdict by the SHA-256 of its DER bytes in a bounded LRU; what
changes with time (validity window, revocation) is checked on every ``admit``. ``verify`` has no
clock of its own, so it refuses keys whose certificate had expired at the latest ``now`` this
trust was given (by ``admit``, ``expire`` or ``apply_revocations``).
"""

from __future__ import annotations

import enum
import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from gossip import revocation
from gossip.identity import (
    IdentityError,
    NodeIdentity,
    Role,
    certificate_node_id,
    role_of_certificate,
)
from gossip.revocation import RevocationList

DEFAULT_CACHE_SIZE = 4096
DEFAULT_MAX_ADMITTED = 100_000


class CertSigner:
    """This node's :class:`~gossip.trust.Signer`: its node id, DER certificate and Ed25519 key."""

    __slots__ = ("_credential", "_identity")

    def __init__(self, identity: NodeIdentity) -> None:
        self._identity = identity
        self._credential = identity.certificate_der

    @property
    def node_id(self) -> str:
        return self._identity.node_id

    @property
    def credential(self) -> bytes:
        return self._credential

    @property
    def role(self) -> Role:
        return self._identity.role

    def sign(self, data: bytes) -> bytes:
        return self._identity.key.sign(data)


class Admission(enum.Enum):
    """Why a credential was, or was not, admitted."""

    ADMITTED = "admitted"
    MALFORMED = "malformed"  # not a DER certificate, not Ed25519, no role
    WRONG_CA = "wrong_ca"  # not signed by this cluster's CA
    ID_MISMATCH = "id_mismatch"  # CN is not the hash of the key, or not the claimed node id
    NOT_YET_VALID = "not_yet_valid"
    EXPIRED = "expired"
    REVOKED = "revoked"


@dataclass(frozen=True, slots=True)
class _Checked:
    """The time-independent facts of one certificate whose CA signature was verified."""

    node_id: str
    role: Role
    serial: int
    not_before_s: float
    not_after_s: float
    key: Ed25519PublicKey


class CertTrust:
    """Trust anchored in the cluster CA, minus the revocation list. Not thread-safe."""

    def __init__(
        self,
        ca_certificate: x509.Certificate,
        revocations: RevocationList | None = None,
        *,
        cache_size: int = DEFAULT_CACHE_SIZE,
        max_admitted: int = DEFAULT_MAX_ADMITTED,
    ) -> None:
        """``revocations`` is taken as given (the caller's own stored copy, verified earlier)."""
        self._ca = ca_certificate
        self._revocations = revocations or RevocationList.empty()
        self._cache: OrderedDict[bytes, _Checked | Admission] = OrderedDict()
        self._cache_size = cache_size
        self._admitted: dict[str, _Checked] = {}
        self._max_admitted = max_admitted
        self._now_s = float("-inf")

    @property
    def revocations(self) -> RevocationList:
        return self._revocations

    def _parse(self, credential: bytes) -> _Checked | Admission:
        try:
            cert = x509.load_der_x509_certificate(credential)
        except ValueError:
            return Admission.MALFORMED
        try:
            cert.verify_directly_issued_by(self._ca)
        except (ValueError, TypeError, InvalidSignature):
            return Admission.WRONG_CA
        try:
            basic = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
            if basic.ca:
                return Admission.MALFORMED
            role = role_of_certificate(cert)
        except (x509.ExtensionNotFound, IdentityError, ValueError):
            return Admission.MALFORMED
        try:
            node_id = certificate_node_id(cert)
        except IdentityError:
            return Admission.ID_MISMATCH
        key = cert.public_key()
        assert isinstance(key, Ed25519PublicKey)  # certificate_node_id checked it
        return _Checked(
            node_id=node_id,
            role=role,
            serial=cert.serial_number,
            not_before_s=cert.not_valid_before_utc.timestamp(),
            not_after_s=cert.not_valid_after_utc.timestamp(),
            key=key,
        )

    def _checked(self, credential: bytes) -> _Checked | Admission:
        fingerprint = hashlib.sha256(credential).digest()
        hit = self._cache.get(fingerprint)
        if hit is not None:
            self._cache.move_to_end(fingerprint)
            return hit
        result = self._parse(credential)
        self._cache[fingerprint] = result
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return result

    def _tick(self, now: float) -> None:
        self._now_s = max(self._now_s, now)

    def check(self, node_id: str, credential: bytes, now: float) -> Admission:
        """Admit ``credential`` as ``node_id``'s if it is good at ``now``; say why not otherwise."""
        self._tick(now)
        checked = self._checked(credential)
        if isinstance(checked, Admission):
            return checked
        if checked.node_id != node_id:
            return Admission.ID_MISMATCH
        if now < checked.not_before_s:
            return Admission.NOT_YET_VALID
        if now > checked.not_after_s:
            return Admission.EXPIRED
        if self._revocations.revokes(node_id, checked.serial):
            return Admission.REVOKED
        current = self._admitted.get(node_id)
        if (
            current is None
            or current.not_after_s < now
            or checked.not_before_s >= current.not_before_s
        ):
            self._admitted.pop(node_id, None)
            self._admitted[node_id] = checked
            while len(self._admitted) > self._max_admitted:
                del self._admitted[next(iter(self._admitted))]
        return Admission.ADMITTED

    def admit(self, node_id: str, credential: bytes, now: float) -> bool:
        return self.check(node_id, credential, now) is Admission.ADMITTED

    def verify(self, node_id: str, data: bytes, signature: bytes) -> bool:
        checked = self._admitted.get(node_id)
        if checked is None or checked.not_after_s < self._now_s:
            return False
        if self._revocations.revokes(node_id, checked.serial):
            return False
        try:
            checked.key.verify(signature, data)
        except InvalidSignature:
            return False
        return True

    def is_revoked(self, node_id: str) -> bool:
        if node_id in self._revocations.node_ids:
            return True
        checked = self._admitted.get(node_id)
        return checked is not None and checked.serial in self._revocations.serials

    def role_of(self, node_id: str) -> Role | None:
        """The role of an admitted, unexpired, unrevoked node; None for anyone else."""
        checked = self._admitted.get(node_id)
        if checked is None or checked.not_after_s < self._now_s or self.is_revoked(node_id):
            return None
        return checked.role

    def expire(self, now: float) -> list[str]:
        """Forget nodes whose certificate has expired by ``now``; return their ids."""
        self._tick(now)
        gone = [n for n, c in self._admitted.items() if c.not_after_s < now]
        for node_id in gone:
            del self._admitted[node_id]
        return gone

    def apply_revocations(self, incoming: RevocationList, now: float) -> bool:
        """Verify and merge a revocation list; True if it replaced ours. Raises RevocationError.

        The signer must be an admitted operator that our current list does not revoke. Nodes the
        winning list revokes are forgotten at once (``admit`` and ``verify`` refuse them).
        """
        revocation.verify(incoming, self, now)
        winner = revocation.newer(self._revocations, incoming)
        if winner is self._revocations:
            return False
        self._revocations = winner
        for node_id in [n for n, c in self._admitted.items() if winner.revokes(n, c.serial)]:
            del self._admitted[node_id]
        return True
