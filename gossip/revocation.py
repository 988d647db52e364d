"""The cluster's revocation list: which nodes (or single certificates) are shunned.

An operator signs the whole list; it travels as one msgpack blob and is gossiped like any record.
Lists are cumulative and totally ordered by ``version``: a node keeps the highest version it has
verified (:func:`newer`), and equal versions with different contents (two operators racing) are
ordered by the SHA-256 of their signed payload so that every node converges on the same one.
A list names node ids (every certificate of that node) and certificate serials (one certificate,
e.g. a superseded operator certificate); see ``CertTrust.apply_revocations``.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgpack

from gossip.identity import Role
from gossip.trust import Signer

SIGNING_CONTEXT = b"shoal/revocations/v1\x00"
REVOCATIONS_FILE = "revocations.bin"
"""Where a list is kept: beside the CA on the operator's machine, in each agent's data folder."""
MAX_REVOCATIONS_BYTES = 4 * 1024 * 1024
MAX_ENTRIES = 100_000
SERIAL_BYTES = 20


class RevocationError(Exception):
    """A revocation list is malformed, unsigned, forged or not signed by an operator."""


@dataclass(frozen=True, slots=True)
class RevocationList:
    """One signed version of the revocation list. ``issued_at`` is seconds since the epoch."""

    version: int
    issued_at: float
    node_ids: frozenset[str]
    serials: frozenset[int]
    signer_id: str
    signer_credential: bytes
    signature: bytes

    @classmethod
    def empty(cls) -> RevocationList:
        """Version 0: revokes nothing, signed by nobody; what a node starts from."""
        return cls(0, 0.0, frozenset(), frozenset(), "", b"", b"")

    def revokes(self, node_id: str, serial: int | None = None) -> bool:
        return node_id in self.node_ids or (serial is not None and serial in self.serials)

    def signed_payload(self) -> bytes:
        payload: bytes = msgpack.packb(
            [
                self.version,
                self.issued_at,
                sorted(self.node_ids),
                [_serial_bytes(s) for s in sorted(self.serials)],
                self.signer_id,
            ],
            use_bin_type=True,
        )
        return SIGNING_CONTEXT + payload

    def digest(self) -> bytes:
        return hashlib.sha256(self.signed_payload()).digest()


class OperatorTrust(Protocol):
    """What verification needs from a Trust (``CertTrust`` provides it)."""

    def admit(self, node_id: str, credential: bytes, now: float) -> bool: ...

    def verify(self, node_id: str, data: bytes, signature: bytes) -> bool: ...

    def role_of(self, node_id: str) -> Role | None: ...


def _serial_bytes(serial: int) -> bytes:
    if serial < 0 or serial.bit_length() > SERIAL_BYTES * 8:
        raise RevocationError(f"certificate serial out of range: {serial}")
    return serial.to_bytes(SERIAL_BYTES, "big")


def issue_revocations(
    signer: Signer,
    node_ids: Iterable[str],
    serials: Iterable[int],
    version: int,
    now: float,
) -> RevocationList:
    """Build and sign a revocation list as ``signer`` (who must hold an operator certificate)."""
    if version < 1:
        raise RevocationError("a signed revocation list starts at version 1")
    unsigned = RevocationList(
        version=version,
        issued_at=float(now),
        node_ids=frozenset(node_ids),
        serials=frozenset(serials),
        signer_id=signer.node_id,
        signer_credential=signer.credential,
        signature=b"",
    )
    if len(unsigned.node_ids) + len(unsigned.serials) > MAX_ENTRIES:
        raise RevocationError(f"more than {MAX_ENTRIES} revocations")
    signature = signer.sign(unsigned.signed_payload())
    return RevocationList(
        version=unsigned.version,
        issued_at=unsigned.issued_at,
        node_ids=unsigned.node_ids,
        serials=unsigned.serials,
        signer_id=unsigned.signer_id,
        signer_credential=unsigned.signer_credential,
        signature=signature,
    )


def encode(revocations: RevocationList) -> bytes:
    data: bytes = msgpack.packb(
        {
            "v": revocations.version,
            "at": revocations.issued_at,
            "ids": sorted(revocations.node_ids),
            "serials": [_serial_bytes(s) for s in sorted(revocations.serials)],
            "by": revocations.signer_id,
            "cred": revocations.signer_credential,
            "sig": revocations.signature,
        },
        use_bin_type=True,
    )
    return data


def _field(doc: dict[str, Any], name: str, kind: type) -> Any:
    value = doc.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise RevocationError(f"revocation list field {name!r} missing or not {kind.__name__}")
    return value


def decode(data: bytes, max_bytes: int = MAX_REVOCATIONS_BYTES) -> RevocationList:
    """Parse a revocation list (not yet verified: call :func:`verify`)."""
    if len(data) > max_bytes:
        raise RevocationError(f"revocation list of {len(data)} bytes exceeds {max_bytes}")
    try:
        doc = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        raise RevocationError(f"malformed revocation list: {e}") from e
    if not isinstance(doc, dict):
        raise RevocationError("malformed revocation list: not a map")
    version = _field(doc, "v", int)
    issued_at = doc.get("at")
    if not isinstance(issued_at, float) or not math.isfinite(issued_at):
        raise RevocationError("revocation list field 'at' missing or not a finite float")
    ids = _field(doc, "ids", list)
    raw_serials = _field(doc, "serials", list)
    if len(ids) + len(raw_serials) > MAX_ENTRIES:
        raise RevocationError(f"more than {MAX_ENTRIES} revocations")
    if not all(isinstance(i, str) for i in ids):
        raise RevocationError("revocation list node ids must be strings")
    if not all(isinstance(s, bytes) and len(s) == SERIAL_BYTES for s in raw_serials):
        raise RevocationError(f"revocation list serials must be {SERIAL_BYTES}-byte strings")
    if version < 0:
        raise RevocationError("negative revocation list version")
    return RevocationList(
        version=version,
        issued_at=issued_at,
        node_ids=frozenset(ids),
        serials=frozenset(int.from_bytes(s, "big") for s in raw_serials),
        signer_id=_field(doc, "by", str),
        signer_credential=_field(doc, "cred", bytes),
        signature=_field(doc, "sig", bytes),
    )


def verify(revocations: RevocationList, trust: OperatorTrust, now: float) -> None:
    """Raise RevocationError unless an admitted, unrevoked operator signed ``revocations``."""
    if not revocations.signature:
        raise RevocationError("revocation list is unsigned")
    if not trust.admit(revocations.signer_id, revocations.signer_credential, now):
        raise RevocationError(f"revocation list signer {revocations.signer_id} is not admitted")
    if trust.role_of(revocations.signer_id) != "operator":
        raise RevocationError(f"revocation list signer {revocations.signer_id} is not an operator")
    if not trust.verify(revocations.signer_id, revocations.signed_payload(), revocations.signature):
        raise RevocationError("revocation list signature is forged")


def newer(current: RevocationList, incoming: RevocationList) -> RevocationList:
    """Merge two verified lists: the higher version wins; equal versions break by digest."""
    if incoming.version != current.version:
        return incoming if incoming.version > current.version else current
    if incoming.digest() > current.digest():
        return incoming
    return current


def save(path: Path, revocations: RevocationList) -> None:
    """Write the list to ``path`` (mode 0600 whatever the umask), replacing it atomically."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(encode(revocations))
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o600)  # an existing file keeps its mode through O_CREAT
    os.replace(tmp, path)


def load(path: Path) -> RevocationList | None:
    """The list kept at ``path`` (parsed, not yet verified), or None when there is none."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return decode(data)
