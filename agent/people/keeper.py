"""The team policy an agent holds: verified, the newest kept, saved across restarts.

A record (:mod:`agent.wire.policy`) is believed only when the person who signed it may sign one:

- their certificate is admitted and unrevoked now, and an ``operator`` certificate (the kind an
  admin holds: ``shoal init``'s, or one ``shoal user add --role admin`` issued); a ``user``
  certificate never signs a believed policy, whatever a record says;
- the record names them an admin (an admin cannot sign themselves out of being one);
- when a policy is held already, it names them an admin too (a person that policy does not make
  an admin cannot replace it);
- the signature is theirs, over the record's very bytes.

The gossiped record (:class:`~agent.wire.policy.PolicyRecord`) only names the body by content
digest: :meth:`PolicyKeeper.consider` checks what it can before the body is fetched (the signer
admitted, an admin's certificate, an admin in the policy held; a newer version, or the same one
with another body), and :meth:`PolicyKeeper.offer_body` believes it only once the body is held:
the body's size and version must be the record's (else ``body_mismatch``) and the signature
verifies over the body's bytes, exactly as it does over a whole record.

Of two believed records the higher version wins; an equal version with other contents (two
admins racing) goes to the higher SHA-256 of the signed bytes, so every agent settles on the
same one. Anything else is refused and counted by reason (``shoal_policy_refused_total``), and
nothing of it is kept. The held record is written to the agent's data folder (0600, replaced
atomically) and read back, verified again, at the next start.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections import Counter
from pathlib import Path
from typing import Protocol

from agent.wire.codec import WireError
from agent.wire.policy import BodyMismatch, PolicyBody, PolicyRecord, SignedPolicy

log = logging.getLogger(__name__)


class PolicyRefused(Exception):
    """A record not believed; ``reason`` labels the counter, the message is one line."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class PersonTrust(Protocol):
    """What verifying needs of a :class:`gossip.certtrust.CertTrust`."""

    def admit(self, node_id: str, credential: bytes, now: float) -> bool: ...

    def verify(self, node_id: str, data: bytes, signature: bytes) -> bool: ...

    def role_of(self, node_id: str) -> str | None: ...


def _digest(record: SignedPolicy) -> bytes:
    return hashlib.sha256(record.signed_payload()).digest()


def _is_admin(body: PolicyBody, node_id: str) -> bool:
    person = body.person_by_id(node_id)
    return person is not None and person.role == "admin"


class PolicyKeeper:
    """The newest believed policy, and what was refused."""

    def __init__(self, trust: PersonTrust, path: Path | None) -> None:
        self._trust = trust
        self._path = path
        self.held: SignedPolicy | None = None
        self.refused: Counter[str] = Counter()

    @property
    def body(self) -> PolicyBody | None:
        return None if self.held is None else self.held.body

    @property
    def version(self) -> int:
        return 0 if self.held is None else self.held.version

    def encoded(self) -> bytes | None:
        return None if self.held is None else self.held.encode()

    def load(self, now: float) -> None:
        """The record kept before a restart, verified again (a bad file is logged, not held)."""
        if self._path is None:
            return
        try:
            data = self._path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("cannot read %s: %s", self._path, exc)
            return
        try:
            self.offer(data, now, save=False)
        except PolicyRefused as exc:
            log.warning("ignoring %s: %s", self._path, exc)

    def consider(self, data: bytes, now: float, held_digest: str | None) -> PolicyRecord | None:
        """A gossiped record (``data``): the one to fetch the body of, or ``None`` when it is
        the held one (content ``held_digest``) or older. Raises :class:`PolicyRefused`
        (counted) for one whose signer may not sign a policy."""
        try:
            record = PolicyRecord.decode(data)
            if not record.signature:
                raise PolicyRefused("unsigned", "policy record refused: unsigned")
            self._check_signer(record.signer_id, record.signer_credential, now)
            self._check_held_admin(record.signer_id)
        except WireError as exc:
            self.refused["malformed"] += 1
            raise PolicyRefused("malformed", f"policy record refused: {exc}") from None
        except PolicyRefused as exc:
            self.refused[exc.reason] += 1
            raise
        if record.version < self.version:
            self.refused["older"] += 1
            return None
        if record.version == self.version and record.digest == held_digest:
            return None
        return record

    def offer_body(
        self, record: PolicyRecord, body_bytes: bytes, now: float, *, save: bool = True
    ) -> bool:
        """Take in ``record`` with ``body_bytes``, the content its digest names (the caller
        read them by that digest): True when it is now the held policy. Raises
        :class:`PolicyRefused` (counted): ``body_mismatch`` for a body that is not the record's,
        and as :meth:`offer` does."""
        try:
            signed = record.joined(body_bytes)
        except BodyMismatch as exc:
            self.refused["body_mismatch"] += 1
            raise PolicyRefused("body_mismatch", f"policy record refused: {exc}") from None
        except WireError as exc:
            self.refused["malformed"] += 1
            raise PolicyRefused("malformed", f"policy body refused: {exc}") from None
        return self._take(signed, now, save)

    def offer(self, data: bytes, now: float, *, save: bool = True) -> bool:
        """Take a whole signed record (``data``) in: True when it is now the held record, False
        when it is the held one or older. Raises :class:`PolicyRefused` (counted) for one not
        believed."""
        try:
            record = SignedPolicy.decode(data)
        except WireError as exc:
            self.refused["malformed"] += 1
            raise PolicyRefused("malformed", f"policy record refused: {exc}") from None
        return self._take(record, now, save)

    def _take(self, record: SignedPolicy, now: float, save: bool) -> bool:
        try:
            self.verify(record, now)
        except PolicyRefused as exc:
            self.refused[exc.reason] += 1
            raise
        held = self.held
        if held is not None and (
            record.version < held.version
            or (record.version == held.version and _digest(record) <= _digest(held))
        ):
            if record.version < held.version:
                self.refused["older"] += 1
            return False
        self.held = record
        if save and self._path is not None:
            self._save(record.encode())
        return True

    def verify(self, record: SignedPolicy, now: float) -> None:
        """Raise :class:`PolicyRefused` unless an admin who may sign it signed ``record``."""
        signer = record.signer_id
        if not record.signature:
            raise PolicyRefused("unsigned", "policy record refused: unsigned")
        self._check_signer(signer, record.signer_credential, now)
        if not self._trust.verify(signer, record.signed_payload(), record.signature):
            raise PolicyRefused("forged", "policy record refused: the signature is forged")
        if not _is_admin(record.body, signer):
            raise PolicyRefused("not_admin", f"policy signer {signer[:10]} is no admin in it")
        self._check_held_admin(signer)

    def _check_held_admin(self, signer: str) -> None:
        """A person the policy held here does not make an admin cannot replace it."""
        held = self.body
        if held is not None and not _is_admin(held, signer):
            raise PolicyRefused(
                "not_admin", f"policy signer {signer[:10]} is no admin in the policy held here"
            )

    def _check_signer(self, signer: str, credential: bytes, now: float) -> None:
        if not self._trust.admit(signer, credential, now):
            raise PolicyRefused("untrusted_signer", f"policy signer {signer[:10]} is not admitted")
        if self._trust.role_of(signer) != "operator":
            raise PolicyRefused(
                "not_admin", f"policy signer {signer[:10]} holds no admin's certificate"
            )

    def _save(self, data: bytes) -> None:
        assert self._path is not None
        tmp = self._path.with_name(self._path.name + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self._path)
        except OSError as exc:  # held in memory all the same; gossip brings it back
            log.warning("cannot keep the team policy in %s: %s", self._path, exc)
