"""Messages to bytes and back: msgpack arrays ``[PROTOCOL_VERSION, kind, *fields]``.

Decoding is strict: every field's type, every string's and byte string's length, every count and
the whole message size are checked, and anything wrong raises :class:`DecodeError` (and nothing
else). :func:`signing_bytes` is the canonical byte string an update's signature covers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import msgpack

from gossip.messages import (
    Ack,
    Alive,
    Compound,
    Dead,
    IndirectPingReq,
    MemberDigest,
    MemberState,
    Message,
    Nack,
    Ping,
    PushPull,
    Record,
    RecordDigest,
    Suspect,
    Update,
)
from gossip.vivaldi import Coordinate

if TYPE_CHECKING:
    from gossip.trust import Signer

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 1 << 20
MAX_ID_CHARS = 256
MAX_CREDENTIAL_BYTES = 16384
MAX_SIGNATURE_BYTES = 1024
MAX_ITEMS = 65536
MAX_DIMENSIONS = 64
_MAX_INT = (1 << 63) - 1

_PING, _IPING, _ACK, _NACK, _ALIVE, _SUSPECT, _DEAD, _RECORD, _PUSHPULL, _COMPOUND = range(1, 11)


class DecodeError(ValueError):
    """The bytes are not a well-formed message of this protocol version."""


class EncodeError(ValueError):
    """The message cannot be encoded within the limits (a bug in the caller)."""


# -- encoding ------------------------------------------------------------------------------------


def _coord(c: Coordinate | None) -> list[Any] | None:
    if c is None:
        return None
    return [list(c.vec), c.error, c.adjustment_s, c.height_s]


def _enc(m: Message) -> list[Any]:
    if isinstance(m, Ping):
        return [_PING, m.seq, m.source, m.target]
    if isinstance(m, Ack):
        return [_ACK, m.seq, m.source, _coord(m.coordinate)]
    if isinstance(m, Alive):
        return [_ALIVE, m.node, m.incarnation, m.addr, m.credential, m.signature]
    if isinstance(m, Suspect):
        return [_SUSPECT, m.node, m.incarnation, m.accuser, m.signature]
    if isinstance(m, Dead):
        return [_DEAD, m.node, m.incarnation, m.accuser, m.signature]
    if isinstance(m, Record):
        return [_RECORD, m.origin, m.kind, m.incarnation, m.counter, m.payload, m.signature]
    if isinstance(m, IndirectPingReq):
        return [_IPING, m.seq, m.source, m.target, m.target_addr, m.nack]
    if isinstance(m, Nack):
        return [_NACK, m.seq, m.source]
    if isinstance(m, PushPull):
        return [
            _PUSHPULL,
            m.source,
            m.phase,
            [[d.node, d.incarnation, int(d.state)] for d in m.members],
            [[d.origin, d.kind, d.incarnation, d.counter] for d in m.records],
            [_enc(u) for u in m.updates],
        ]
    if isinstance(m, Compound):
        return [_COMPOUND, [_enc(p) for p in m.parts]]
    raise EncodeError(f"not a message: {type(m).__name__}")


def encode(message: Message, max_bytes: int = MAX_MESSAGE_BYTES) -> bytes:
    """Encode ``message``; raise :class:`EncodeError` above ``max_bytes``."""
    body = _enc(message)
    body.insert(0, PROTOCOL_VERSION)
    data: bytes = msgpack.packb(body, use_bin_type=True)
    if len(data) > max_bytes:
        raise EncodeError(f"message of {len(data)} bytes exceeds {max_bytes}")
    return data


_UPDATE_TYPES = (Alive, Suspect, Dead, Record)

LIVE_REMEMBERED_UPDATES = 512
"""Updates a live member remembers the size and signing bytes of (by identity, see
:func:`remember_updates`)."""
SIM_REMEMBERED_UPDATES = 1 << 16
"""The same in the simulator, where every core asks about the same update objects."""


@dataclass(slots=True)
class _Remembered:
    updates: int = LIVE_REMEMBERED_UPDATES


_remembered = _Remembered()


def remembered_updates() -> int:
    """The bound :func:`remember_updates` set."""
    return _remembered.updates


def remember_updates(entries: int) -> None:
    """How many updates' sizes and signing bytes are remembered, by object identity.

    Each entry holds its update (so its id stays unique), payload and all. A live member asks
    about an update a few times in a row (signs it, queues it, sends it; or decodes, verifies
    and queues it) and never again: it keeps :data:`LIVE_REMEMBERED_UPDATES` (at 65,536 an agent
    under load held every record it had seen for hours: ~4 KB each, 270 MB at the bound). The
    simulator, whose cores all ask about the very same update objects, keeps many more. The
    record stores' shared digest lines (:mod:`gossip.records`) follow the same bound."""
    _remembered.updates = entries


_sizes: dict[int, tuple[object, int]] = {}
"""Sizes of updates by object identity (the entry holds the object, so its id stays unique)."""


_str_sizes: dict[str, int] = {}


def _str_size(s: str) -> int:
    """msgpack size of ``s`` (node ids and addresses recur, so remembered)."""
    n = _str_sizes.get(s)
    if n is None:
        b = len(s.encode())
        n = b + (1 if b < 32 else 2 if b < 256 else 3 if b < 65536 else 5)
        if len(_str_sizes) >= 1 << 16:
            _str_sizes.clear()
        _str_sizes[s] = n
    return n


_UINT_SIZES = tuple(
    1 if b < 8 else 2 if b < 9 else 3 if b < 17 else 5 if b < 33 else 9 for b in range(65)
)
"""msgpack size of a non-negative int by its bit length."""


def _uint_size(v: int) -> int:
    """msgpack size of a non-negative int (the only ints the protocol has)."""
    return _UINT_SIZES[v.bit_length()]


_known_str = _str_sizes.get  # most ids were sized before: looked up without a call


def _ping_size(m: Ping) -> int:
    src = _known_str(m.source) or _str_size(m.source)
    dst = _known_str(m.target) or _str_size(m.target)
    return 2 + _UINT_SIZES[m.seq.bit_length()] + src + dst


def _ack_size(m: Ack) -> int:
    c = m.coordinate
    if c is None:
        coord = 1
    else:  # [vec, error, adjustment, height], every float a 9-byte float64
        n = len(c.vec)
        coord = (2 if n < 16 else 4 if n < 1 << 16 else 6) + 9 * n + 27
    src = _known_str(m.source) or _str_size(m.source)
    return 2 + _UINT_SIZES[m.seq.bit_length()] + src + coord


def _nack_size(m: Nack) -> int:
    return 2 + _uint_size(m.seq) + _str_size(m.source)


def _iping_size(m: IndirectPingReq) -> int:
    ids = _str_size(m.source) + _str_size(m.target) + _str_size(m.target_addr)
    return 3 + _uint_size(m.seq) + ids


_PROBE_SIZES: dict[type, Callable[[Any], int]] = {
    Ping: _ping_size,
    Ack: _ack_size,
    Nack: _nack_size,
    IndirectPingReq: _iping_size,
}
"""Bytes of a ping, ack, nack or indirect ping as a compound part, counted field by field (the
most frequent messages; no encoding needed), by exact type."""


def _probe_size(m: Message) -> int:
    """:data:`_PROBE_SIZES` for ``m``, or -1 for any other message."""
    size = _PROBE_SIZES.get(type(m))
    return -1 if size is None else size(m)


def encoded_size(message: Message) -> int:
    """Bytes ``message`` takes as a part of a compound (its array without the version).

    Updates are immutable and one update object is sized by every node that queues or relays
    it, so their sizes are remembered (by identity; an equal copy is simply sized again)."""
    hit = _sizes.get(id(message))
    if hit is not None and hit[0] is message:
        return hit[1]
    probe = _probe_size(message)
    if probe >= 0:
        return probe
    size = len(msgpack.packb(_enc(message), use_bin_type=True))
    if type(message) in _UPDATE_TYPES:
        if len(_sizes) >= _remembered.updates:
            _sizes.clear()
        _sizes[id(message)] = (message, size)
    return size


@functools.lru_cache(maxsize=1 << 17)
def _member_digest_size(d: MemberDigest) -> int:
    return len(msgpack.packb([d.node, d.incarnation, int(d.state)], use_bin_type=True))


@functools.lru_cache(maxsize=1 << 16)
def _record_digest_size(d: RecordDigest) -> int:
    return len(msgpack.packb([d.origin, d.kind, d.incarnation, d.counter], use_bin_type=True))


def _array_header_size(n: int) -> int:
    return 1 if n < 16 else (3 if n < 1 << 16 else 5)


def compound_sizes(message: Compound) -> tuple[int, int]:
    """:func:`wire_size` of a compound, and how many of those bytes its records' parts take
    (the simulator tells membership from application traffic)."""
    total = records = 0
    known = _sizes.get  # most parts are updates sized before: look them up without a call
    probe = _PROBE_SIZES.get
    for p in message.parts:
        hit = known(id(p))
        if hit is not None and hit[0] is p:
            size = hit[1]
        else:
            sizer = probe(type(p))
            size = encoded_size(p) if sizer is None else sizer(p)
        total += size
        if type(p) is Record:
            records += size
    # [version, kind, [parts]]: three bytes and the parts' array header
    n = len(message.parts)
    return total + (4 if n < 16 else 6 if n < 1 << 16 else 8), records


def wire_size(message: Message) -> int:
    """``len(encode(message))``, without encoding what was sized before: a compound's updates
    and a push-pull's digest lines are sized once each (the simulator counts every byte)."""
    # exact types first (a subclass of one is sized by encoding it, at the end)
    if type(message) is Compound:
        return compound_sizes(message)[0]
    if type(message) is PushPull:
        members, records, updates = message.members, message.records, message.updates
        # [version, kind, source, phase] packs with the same one-byte header as the 6-array
        head = [PROTOCOL_VERSION, _PUSHPULL, message.source, message.phase]
        hit = _digest_sizes.get(id(members))
        if hit is not None and hit[0] is members:
            members_size = hit[1]
        else:
            members_size = sum(map(_member_digest_size, members))
            if len(members) > 64:  # a core reuses its digest until it changes: size it once
                if len(_digest_sizes) >= 1 << 12:
                    _digest_sizes.clear()
                _digest_sizes[id(members)] = (members, members_size)
        return (
            len(msgpack.packb(head, use_bin_type=True))
            + _array_header_size(len(members))
            + members_size
            + _array_header_size(len(records))
            + sum(map(_record_digest_size, records))
            + _array_header_size(len(updates))
            + sum(map(encoded_size, updates))
        )
    sizer = _PROBE_SIZES.get(type(message))
    if sizer is not None:
        return sizer(message) + 1  # the version
    return len(encode(message))


_digest_sizes: dict[int, tuple[tuple[MemberDigest, ...], int]] = {}
"""The bytes of a push-pull's member digest lines, by the identity of the digest (the entry
holds it, so its id stays unique): a core sends the same digest tuple until its view changes."""

_signing: dict[int, tuple[Update, bytes]] = {}
""":func:`signing_bytes` by update identity (the entry holds the update, so its id stays unique):
in the simulator every core verifies the very same update objects, and asking this costs no
hashing of the whole update. At most :func:`remember_updates` entries."""


def signing_bytes(update: Update) -> bytes:
    """The canonical bytes an update's signature covers (every field but the signature)."""
    hit = _signing.get(id(update))
    if hit is not None and hit[0] is update:
        return hit[1]
    data = _signing_bytes(update)
    if len(_signing) >= _remembered.updates:
        _signing.clear()
    _signing[id(update)] = (update, data)
    return data


def _signing_bytes(update: Update) -> bytes:
    if isinstance(update, Alive):
        body: list[Any] = [b"shoal-alive", update.node, update.incarnation, update.addr]
        body.append(update.credential)
    elif isinstance(update, Suspect):
        body = [b"shoal-suspect", update.node, update.incarnation, update.accuser]
    elif isinstance(update, Dead):
        body = [b"shoal-dead", update.node, update.incarnation, update.accuser]
    else:
        body = [b"shoal-record", update.origin, update.kind, update.incarnation, update.counter]
        body.append(update.payload)
    return msgpack.packb(body, use_bin_type=True)  # type: ignore[no-any-return]


def signed_alive(signer: Signer, incarnation: int, addr: str) -> Alive:
    """The signer's own Alive at ``incarnation``, reachable at ``addr``."""
    cred = signer.credential
    u = Alive(signer.node_id, incarnation, addr, cred, b"")
    return Alive(u.node, incarnation, addr, cred, signer.sign(signing_bytes(u)))


def signed_record(
    signer: Signer, kind: str, incarnation: int, counter: int, payload: bytes
) -> Record:
    """The signer's record of ``kind`` at version ``(incarnation, counter)``."""
    u = Record(signer.node_id, kind, incarnation, counter, payload, b"")
    return Record(u.origin, kind, incarnation, counter, payload, signer.sign(signing_bytes(u)))


_Accusation = TypeVar("_Accusation", Suspect, Dead)


def signed_accusation(
    signer: Signer, kind: type[_Accusation], node: str, incarnation: int
) -> _Accusation:
    """A Suspect or Dead about ``node`` at ``incarnation``, signed by ``signer`` as accuser."""
    u = kind(node, incarnation, signer.node_id, b"")
    return kind(node, incarnation, signer.node_id, signer.sign(signing_bytes(u)))


# -- decoding ------------------------------------------------------------------------------------


def _fail(what: str) -> DecodeError:
    return DecodeError(what)


def _str(v: object, what: str) -> str:
    if type(v) is not str or not v or len(v) > MAX_ID_CHARS:
        raise _fail(f"{what}: expected a non-empty string of <= {MAX_ID_CHARS} chars")
    return v


def _int(v: object, what: str) -> int:
    if type(v) is not int or v < 0 or v > _MAX_INT:
        raise _fail(f"{what}: expected a non-negative 63-bit int")
    return v


def _bytes(v: object, what: str, limit: int) -> bytes:
    if type(v) is not bytes or len(v) > limit:
        raise _fail(f"{what}: expected bytes of <= {limit}")
    return v


def _bool(v: object, what: str) -> bool:
    if type(v) is not bool:
        raise _fail(f"{what}: expected a bool")
    return v


def _float(v: object, what: str) -> float:
    if type(v) is not float or not math.isfinite(v):
        raise _fail(f"{what}: expected a finite float")
    return v


def _list(v: object, what: str, n: int | None = None) -> list[Any]:
    if type(v) is not list:
        raise _fail(f"{what}: expected an array")
    if n is not None and len(v) != n:
        raise _fail(f"{what}: expected {n} fields, got {len(v)}")
    if len(v) > MAX_ITEMS:
        raise _fail(f"{what}: too many items")
    return v


def _dec_coord(v: object) -> Coordinate | None:
    if v is None:
        return None
    f = _list(v, "coordinate", 4)
    vec = _list(f[0], "coordinate.vec")
    if not 1 <= len(vec) <= MAX_DIMENSIONS:
        raise _fail("coordinate.vec: bad dimensionality")
    return Coordinate(
        tuple(_float(x, "coordinate.vec[]") for x in vec),
        _float(f[1], "coordinate.error"),
        _float(f[2], "coordinate.adjustment"),
        _float(f[3], "coordinate.height"),
    )


def _dec_update(v: object) -> Update:
    m = _dec(v, nested=True)
    if not isinstance(m, Alive | Suspect | Dead | Record):
        raise _fail("push-pull update: not an update")
    return m


def _dec(v: object, nested: bool) -> Message:
    f = _list(v, "message")
    if not f:
        raise _fail("empty message")
    kind = f[0]
    n = len(f)
    if kind == _PING and n == 4:
        return Ping(_int(f[1], "seq"), _str(f[2], "source"), _str(f[3], "target"))
    if kind == _ACK and n == 4:
        return Ack(_int(f[1], "seq"), _str(f[2], "source"), _dec_coord(f[3]))
    if kind == _ALIVE and n == 6:
        return Alive(
            _str(f[1], "node"),
            _int(f[2], "incarnation"),
            _str(f[3], "addr"),
            _bytes(f[4], "credential", MAX_CREDENTIAL_BYTES),
            _bytes(f[5], "signature", MAX_SIGNATURE_BYTES),
        )
    if kind == _SUSPECT and n == 5:
        return Suspect(
            _str(f[1], "node"),
            _int(f[2], "incarnation"),
            _str(f[3], "accuser"),
            _bytes(f[4], "signature", MAX_SIGNATURE_BYTES),
        )
    if kind == _DEAD and n == 5:
        return Dead(
            _str(f[1], "node"),
            _int(f[2], "incarnation"),
            _str(f[3], "accuser"),
            _bytes(f[4], "signature", MAX_SIGNATURE_BYTES),
        )
    if kind == _RECORD and n == 7:
        return Record(
            _str(f[1], "origin"),
            _str(f[2], "kind"),
            _int(f[3], "incarnation"),
            _int(f[4], "counter"),
            _bytes(f[5], "payload", MAX_MESSAGE_BYTES),
            _bytes(f[6], "signature", MAX_SIGNATURE_BYTES),
        )
    if kind == _IPING and n == 6:
        return IndirectPingReq(
            _int(f[1], "seq"),
            _str(f[2], "source"),
            _str(f[3], "target"),
            _str(f[4], "target_addr"),
            _bool(f[5], "nack"),
        )
    if kind == _NACK and n == 3:
        return Nack(_int(f[1], "seq"), _str(f[2], "source"))
    if kind == _PUSHPULL and n == 6:
        phase = _int(f[2], "phase")
        if phase > 2:
            raise _fail("push-pull: bad phase")
        members = []
        for d in _list(f[3], "members"):
            g = _list(d, "member digest", 3)
            state = _int(g[2], "state")
            if state > MemberState.LEFT:
                raise _fail("member digest: bad state")
            members.append(MemberDigest(_str(g[0], "node"), _int(g[1], "inc"), MemberState(state)))
        records = []
        for d in _list(f[4], "records"):
            g = _list(d, "record digest", 4)
            records.append(
                RecordDigest(
                    _str(g[0], "origin"), _str(g[1], "kind"), _int(g[2], "inc"), _int(g[3], "ctr")
                )
            )
        updates = tuple(_dec_update(u) for u in _list(f[5], "updates"))
        return PushPull(_str(f[1], "source"), phase, tuple(members), tuple(records), updates)
    if kind == _COMPOUND and n == 2 and not nested:
        parts = tuple(_dec(p, nested=True) for p in _list(f[1], "parts"))
        if not parts:
            raise _fail("compound: no parts")
        return Compound(parts)
    raise _fail(f"unknown message kind or arity: {kind!r}/{n}")


def decode(data: bytes, max_bytes: int = MAX_MESSAGE_BYTES) -> Message:
    """Decode one message; raise :class:`DecodeError` on anything malformed."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise DecodeError("expected bytes")
    if len(data) > max_bytes:
        raise DecodeError(f"message of {len(data)} bytes exceeds {max_bytes}")
    try:
        obj = msgpack.unpackb(
            data,
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_array_len=MAX_ITEMS,
            max_map_len=0,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises a zoo of types; all mean "malformed"
        raise DecodeError(f"not msgpack: {exc}") from None
    try:
        f = _list(obj, "envelope")
        if len(f) < 2 or f[0] != PROTOCOL_VERSION or type(f[0]) is not int:
            raise DecodeError("unsupported protocol version")
        return _dec(f[1:], nested=False)
    except DecodeError:
        raise
    except RecursionError:
        raise DecodeError("nesting too deep") from None


def frame(sender_addr: str, message: Message, max_bytes: int) -> bytes:
    """A message as one request's body: the sender's address and the encoded message."""
    body: bytes = msgpack.packb([sender_addr, encode(message, max_bytes)], use_bin_type=True)
    return body


def unframe(body: bytes, max_bytes: int) -> tuple[str, Message]:
    """The sender's address and its message; :class:`DecodeError` for anything malformed."""
    try:
        outer = msgpack.unpackb(body, raw=False, max_bin_len=max_bytes, max_str_len=512)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise DecodeError(f"bad frame: {type(exc).__name__}") from None
    if (
        not isinstance(outer, list)
        or len(outer) != 2
        or not isinstance(outer[0], str)
        or not isinstance(outer[1], bytes)
    ):
        raise DecodeError("bad frame: expected [address, message]")
    return outer[0], decode(outer[1], max_bytes)
