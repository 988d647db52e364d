"""The wire's framing and field readers: the version, the 4 KiB record limit, msgpack, and the
typed readers every decoder of :mod:`agent.wire` is written with.

A reader takes the raw value of one field (``None`` when the field is missing) and its name, and
returns the typed value or raises :class:`WireError` naming the field. Fields a decoder does not
ask for are never looked at: that is how a reader ignores what a newer writer added.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final, TypeVar

import msgpack

WIRE_VERSION: Final = 2
"""The version this code writes, as ``v`` in every record. 1 is the encoding before the typed
contract (no ``v``: device links and MIG instances not gossiped, an inventory cut at 4 KiB);
2 adds links, MIG instances, the split inventory and the agent's job-spec features."""
ENVELOPE_CONTENT_TYPE: Final = "application/octet-stream"
"""The content type of a sealed, signed command envelope, as operators send it and agents
require it (``POST /v1/commands`` and the calls agents make of each other)."""
MAX_RECORD_BYTES: Final = 4096
"""The largest payload of one gossip record (``gossip.config.max_record_payload_bytes``)."""

MAX_WIRE_INT: Final = 2**53 - 1
"""The largest magnitude of any integer on the wire (every integer field of every record, call
and document): what a JSON number holds exactly, and far enough below msgpack's and SQLite's
64-bit limits that a counter taken from the wire (a job's ``gen``, an ``attempt``) can still be
counted up. A value beyond it is refused as malformed (:func:`integer`)."""

EMPTY_MAP: Final[Mapping[str, Any]] = MappingProxyType({})
"""The default of a mapping field (immutable, shared)."""

T = TypeVar("T")
Reader = Callable[[Any, str], T]


class WireError(ValueError):
    """A record or document that does not decode; the message names the field, in one line."""


def pack(doc: Mapping[str, Any]) -> bytes:
    data: bytes = msgpack.packb(dict(doc), use_bin_type=True)
    return data


def unpack(payload: bytes) -> dict[str, Any]:
    """A msgpack map, or :class:`WireError` for anything else (garbage, another type)."""
    try:
        doc = msgpack.unpackb(payload, raw=False)
    except Exception:  # msgpack raises several unrelated types on garbage
        raise WireError("not msgpack") from None
    if not isinstance(doc, dict):
        raise WireError(f"a record must be a map, not {type(doc).__name__}")
    return doc


def obj(data: Any, name: str = "document") -> Mapping[str, Any]:
    """``data`` as a mapping (a JSON object, a msgpack map)."""
    if not isinstance(data, dict | Mapping):
        raise WireError(f"{name}: expected an object, got {type(data).__name__}")
    return data


def row(value: Any, name: str, least: int) -> Sequence[Any]:
    """``value`` when it is a list of at least ``least`` values, else a one-line error."""
    if not isinstance(value, list | tuple) or len(value) < least:
        raise WireError(f"{name}: expected a list of at least {least} values")
    return value


def _type_error(name: str, what: str, value: Any) -> WireError:
    return WireError(f"{name}: expected {what}, got {type(value).__name__}")


def text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise _type_error(name, "a string", value)
    return value


def opt_text(value: Any, name: str) -> str | None:
    return None if value is None else text(value, name)


def integer(value: Any, name: str) -> int:
    """An integer within :data:`MAX_WIRE_INT` either side of zero: the one reader of every
    integer field, so none reaches a handler out of range."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _type_error(name, "an integer", value)
    if not -MAX_WIRE_INT <= value <= MAX_WIRE_INT:
        raise WireError(
            f"{name}: {value} is out of range (at most {MAX_WIRE_INT} either side of 0)"
        )
    return value


def opt_integer(value: Any, name: str) -> int | None:
    return None if value is None else integer(value, name)


def number(value: Any, name: str) -> float:
    """A finite number: NaN and the infinities are refused (they are not JSON, and no field
    means them)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _type_error(name, "a number", value)
    if isinstance(value, int):
        integer(value, name)  # an integer is bounded in a number field too
    out = float(value)
    if not math.isfinite(out):
        raise WireError(f"{name}: expected a finite number, got {out}")
    return out


def opt_number(value: Any, name: str) -> float | None:
    return None if value is None else number(value, name)


def flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise _type_error(name, "true or false", value)
    return value


def texts(value: Any, name: str) -> tuple[str, ...]:
    """A list of strings; missing is empty."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise WireError(f"{name}: expected a list of strings")
    return tuple(value)


def text_map(value: Any, name: str) -> dict[str, str]:
    """An object of strings; missing is empty."""
    if value is None:
        return {}
    if not isinstance(value, dict | Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise WireError(f"{name}: expected an object of strings")
    return dict(value)


def items(value: Any, name: str, decode: Callable[[Any, str], T]) -> tuple[T, ...]:
    """A list whose every element ``decode`` reads; missing is empty."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise _type_error(name, "a list", value)
    return tuple(decode(v, f"{name}[{i}]") for i, v in enumerate(value))


def or_default(read: Reader[T], default: T) -> Reader[T]:
    """``read``, with ``default`` for a missing (``None``) value: a field an older writer lacks."""

    def reader(value: Any, name: str) -> T:
        return default if value is None else read(value, name)

    return reader


def one_of(choices: Iterable[str], default: str | None = None) -> Reader[str]:
    """A string among ``choices``; ``default`` (when given) for a missing value."""
    allowed = frozenset(choices)

    def reader(value: Any, name: str) -> str:
        if value is None and default is not None:
            return default
        got = text(value, name)
        if got not in allowed:
            raise WireError(f"{name}: {got!r} is not one of {', '.join(sorted(allowed))}")
        return got

    return reader


def field(data: Mapping[str, Any], key: str, read: Reader[T], prefix: str = "") -> T:
    """Field ``key`` of ``data``, read by ``read``."""
    return read(data.get(key), prefix + key)
