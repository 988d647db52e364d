"""Signed operator commands (submit, drain, cancel, migrate, ...) and their checks.

An envelope is a msgpack map carrying the operator's node id and DER certificate (so an agent that
has never heard of this operator can still check it), a uuid4 command id, ``issued_at`` (seconds
since the epoch), a ``kind``, opaque ``body`` bytes, and an Ed25519 signature over a
domain-separated encoding of all of them. :func:`open` refuses anything that is not a fresh, unique
command signed by an admitted, unrevoked operator, raising one exception class per reason; agents
cannot issue commands.
"""

from __future__ import annotations

import math
import re
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar

import msgpack

from gossip.certtrust import Admission, CertTrust
from gossip.identity import PERSON_ROLES
from gossip.replay import ReplayGuard, Verdict
from gossip.trust import Signer

WIRE_VERSION = 1
SIGNING_CONTEXT = b"shoal/command/v1\x00"
DEFAULT_MAX_BYTES = 1024 * 1024
MAX_KIND_CHARS = 64
_COMMAND_ID = re.compile(r"[0-9a-f]{32}")


class EnvelopeError(Exception):
    """A command was refused; ``reason`` names the counter it is counted under."""

    reason: ClassVar[str] = "rejected"


class Oversized(EnvelopeError):
    reason = "oversized"


class Malformed(EnvelopeError):
    reason = "malformed"


class Unsigned(EnvelopeError):
    reason = "unsigned"


class UntrustedSigner(EnvelopeError):
    """The operator's certificate is not admitted (another CA, expired, id mismatch, ...)."""

    reason = "untrusted_signer"


class Revoked(EnvelopeError):
    reason = "revoked"


class Forged(EnvelopeError):
    reason = "forged"


class NotOperator(EnvelopeError):
    reason = "not_operator"


class Replayed(EnvelopeError):
    reason = "replayed"


class Skewed(EnvelopeError):
    """Issued outside the clock-skew window (too old, or too far in the future)."""

    reason = "skewed"


@dataclass(frozen=True, slots=True)
class Command:
    """A checked command: who issued it, when, what kind, and its opaque body."""

    operator_id: str
    command_id: str
    issued_at: float
    kind: str
    body: bytes


def signed_payload(command: Command) -> bytes:
    """The bytes an operator signs: a domain tag, then every field of the command."""
    payload: bytes = msgpack.packb(
        [
            WIRE_VERSION,
            command.operator_id,
            command.command_id,
            command.issued_at,
            command.kind,
            command.body,
        ],
        use_bin_type=True,
    )
    return SIGNING_CONTEXT + payload


def seal(
    signer: Signer, kind: str, body: bytes, now: float, *, command_id: str | None = None
) -> bytes:
    """Sign a command as ``signer`` and encode it; ``command_id`` defaults to a fresh uuid4."""
    if not kind or len(kind) > MAX_KIND_CHARS:
        raise ValueError(f"command kind must be 1..{MAX_KIND_CHARS} characters")
    cid = command_id if command_id is not None else uuid.uuid4().hex
    issued_at = float(now)
    signature = signer.sign(signed_payload(Command(signer.node_id, cid, issued_at, kind, body)))
    data: bytes = msgpack.packb(
        {
            "v": WIRE_VERSION,
            "op": signer.node_id,
            "cred": signer.credential,
            "id": cid,
            "at": issued_at,
            "kind": kind,
            "body": body,
            "sig": signature,
        },
        use_bin_type=True,
    )
    return data


def _get(doc: dict[str, Any], name: str, kind: type) -> Any:
    value = doc.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise Malformed(f"envelope field {name!r} missing or not {kind.__name__}")
    return value


def _decode(data: bytes) -> tuple[Command, bytes, bytes]:
    try:
        doc = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        raise Malformed(f"envelope is not msgpack: {e}") from e
    if not isinstance(doc, dict):
        raise Malformed("envelope is not a map")
    if _get(doc, "v", int) != WIRE_VERSION:
        raise Malformed(f"unknown envelope version {doc['v']}")
    issued_at = doc.get("at")
    if not isinstance(issued_at, float) or not math.isfinite(issued_at):
        raise Malformed("envelope field 'at' missing or not a finite float")
    command_id = _get(doc, "id", str)
    if not _COMMAND_ID.fullmatch(command_id):
        raise Malformed("command id is not 32 lower-case hex digits")
    kind = _get(doc, "kind", str)
    if not kind or len(kind) > MAX_KIND_CHARS:
        raise Malformed(f"command kind must be 1..{MAX_KIND_CHARS} characters")
    command = Command(
        operator_id=_get(doc, "op", str),
        command_id=command_id,
        issued_at=issued_at,
        kind=kind,
        body=_get(doc, "body", bytes),
    )
    return command, _get(doc, "cred", bytes), _get(doc, "sig", bytes)


def signer_of(data: bytes) -> str:
    """The node id that signed a command :func:`open` already checked (who gives it)."""
    return _decode(data)[0].operator_id


def _authentic(data: bytes, trust: CertTrust, now: float, max_bytes: int) -> Command:
    if len(data) > max_bytes:
        raise Oversized(f"envelope of {len(data)} bytes exceeds {max_bytes}")
    command, credential, signature = _decode(data)
    if not signature:
        raise Unsigned("envelope carries no signature")
    if trust.is_revoked(command.operator_id):
        raise Revoked(f"{command.operator_id} is revoked")
    admission = trust.check(command.operator_id, credential, now)
    if admission is Admission.REVOKED:
        raise Revoked(f"{command.operator_id}'s certificate is revoked")
    if admission is not Admission.ADMITTED:
        raise UntrustedSigner(f"{command.operator_id}'s certificate: {admission.value}")
    if not trust.verify(command.operator_id, signed_payload(command), signature):
        raise Forged(f"signature does not match {command.operator_id}'s key")
    if trust.role_of(command.operator_id) not in PERSON_ROLES:
        raise NotOperator(f"{command.operator_id} is not a person (an operator or a user)")
    return command


def _open(data: bytes, trust: CertTrust, guard: ReplayGuard, now: float, max_bytes: int) -> Command:
    command = _authentic(data, trust, now, max_bytes)
    verdict = guard.check(command.command_id, command.issued_at, now)
    if verdict is Verdict.REPLAYED:
        raise Replayed(f"command {command.command_id} was already executed")
    if verdict is not Verdict.ACCEPTED:
        raise Skewed(
            f"command issued at {command.issued_at:.3f}, now {now:.3f} "
            f"(window {guard.window_s:g} s, {verdict.value})"
        )
    return command


def open(
    data: bytes,
    trust: CertTrust,
    guard: ReplayGuard,
    now: float,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    rejections: Counter[str] | None = None,
) -> Command:
    """Check and decode a sealed command; raises an :class:`EnvelopeError` subclass on refusal.

    When ``rejections`` is given, each refusal increments ``rejections[error.reason]``.
    """
    try:
        return _open(data, trust, guard, now, max_bytes)
    except EnvelopeError as e:
        if rejections is not None:
            rejections[e.reason] += 1
        raise


def authenticate(
    data: bytes,
    trust: CertTrust,
    now: float,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Command:
    """Check that ``data`` is a command an operator signed and may still stand behind: a valid
    signature by an operator whose certificate is admitted and unrevoked at ``now``.

    Unlike :func:`open`, neither freshness nor uniqueness is checked: this is for a signed
    command that travels on as the authority for later actions (a job's submission is shown by
    its owner to every runner it offers the job to, for as long as the job lives).
    """
    return _authentic(data, trust, now, max_bytes)
