"""How a followed output (``shoal logs -f``, ``shoal events -f``) ends: at Ctrl-C, promptly.

``asyncio.run`` turns the first SIGINT into one cancellation of the main task and only the second
into ``KeyboardInterrupt``; a cancellation that a library swallows on its way (a request that
completed in the same instant, say) would leave the command following until a second Ctrl-C,
which a script or service manager never sends. Here SIGINT is the loop's own signal handler (it
also replaces a SIGINT disposition of "ignore" inherited from the parent): it cancels the
followed call, and again every :data:`RECANCEL_S` until the call has ended, and the command ends
as a follow should, with status 0. Where the loop cannot take signals (Windows), Ctrl-C is
``KeyboardInterrupt`` as before, which the caller takes as the end of the follow.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

RECANCEL_S = 0.5
"""Until the followed call has ended, Ctrl-C's cancellation is repeated this often."""


async def _awaited(follow: Callable[[], Awaitable[T]]) -> T:
    return await follow()


async def until_interrupted(follow: Callable[[], Awaitable[T]]) -> T | None:
    """``await follow()``; None if SIGINT ended it."""
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(_awaited(follow))
    interrupted = False

    def cancel() -> None:
        if not task.done():
            task.cancel()
            loop.call_later(RECANCEL_S, cancel)

    def on_sigint() -> None:
        nonlocal interrupted
        if not interrupted:
            interrupted = True
            cancel()

    try:
        loop.add_signal_handler(signal.SIGINT, on_sigint)
    except (NotImplementedError, RuntimeError, ValueError):
        return await task  # no loop signal handlers here: Ctrl-C is KeyboardInterrupt
    try:
        return await task
    except asyncio.CancelledError:
        if not interrupted:
            raise  # cancelled from outside: not Ctrl-C
        return None
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.remove_signal_handler(signal.SIGINT)
