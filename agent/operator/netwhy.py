"""Why a connection failed, in the words an operator reads (never ``[Errno 111]``).

:func:`why` is the phrase of a one-line error (``connection refused: nothing listens there``);
:func:`short_why` the word or two of a list (``refused``, ``timeout``). Both read the standard
library's exceptions and anything that carries one (aiohttp's connector errors are ``OSError``\\ s
with the original as ``os_error``; asyncssh's are wrapped the same way), so this module imports
neither.
"""

from __future__ import annotations

import errno
import re
import socket
import ssl

_ERRNO_PREFIX = re.compile(r"^\[Errno -?\d+\]\s*")

_BY_ERRNO: dict[int, tuple[str, str]] = {
    errno.ECONNREFUSED: ("refused", "connection refused: nothing listens there"),
    errno.ETIMEDOUT: ("timeout", "no answer: the connection timed out"),
    errno.EHOSTUNREACH: ("unreachable", "no route to the host"),
    errno.ENETUNREACH: ("unreachable", "the network is unreachable"),
    errno.EHOSTDOWN: ("unreachable", "the host is down"),
    errno.ECONNRESET: ("reset", "the connection was reset"),
    errno.EADDRNOTAVAIL: ("bad address", "the address is not available here"),
}


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc``, what it wraps (``os_error``), and its causes, outermost first."""
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo and len(seen) < 8:
        item = todo.pop(0)
        if item is None or any(item is s for s in seen):
            continue
        seen.append(item)
        wrapped = getattr(item, "os_error", None)
        todo += [wrapped if isinstance(wrapped, BaseException) else None]
        todo += [item.__cause__, item.__context__]
    return seen


def _classify(exc: BaseException) -> tuple[str, str] | None:
    for item in _causes(exc):
        if isinstance(item, socket.gaierror):
            return "unknown host", "the host name does not resolve"
        if isinstance(item, ssl.SSLCertVerificationError):
            detail = getattr(item, "verify_message", None) or "certificate not accepted"
            return "TLS refused", f"TLS handshake refused: {detail}"
        if isinstance(item, ssl.SSLError):
            detail = getattr(item, "reason", None) or _plain(item)
            return "TLS refused", f"TLS handshake failed: {detail}"
        if isinstance(item, ConnectionRefusedError):
            return _BY_ERRNO[errno.ECONNREFUSED]
        if isinstance(item, TimeoutError):
            return _BY_ERRNO[errno.ETIMEDOUT]
        if isinstance(item, OSError) and item.errno in _BY_ERRNO:
            return _BY_ERRNO[item.errno]
        if "Disconnected" in type(item).__name__:
            return "closed", "the agent closed the connection (does it accept your certificate?)"
    return None


def _plain(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[0].lower() + exc.strerror[1:]
    text = _ERRNO_PREFIX.sub("", str(exc).strip().splitlines()[0] if str(exc).strip() else "")
    return text or type(exc).__name__


def why(exc: BaseException) -> str:
    """The phrase for a one-line error: ``connection refused: nothing listens there``."""
    known = _classify(exc)
    return known[1] if known else _plain(exc)


def short_why(exc: BaseException) -> str:
    """A word or two for a list of failures: ``refused``, ``timeout``, ``unknown host``."""
    known = _classify(exc)
    return known[0] if known else _plain(exc)
