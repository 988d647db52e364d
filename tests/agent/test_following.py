"""Ctrl-C ends a follow promptly with status 0: even when a library swallows the cancellation on
its way, and even when the follower was started with SIGINT ignored. Real processes, real
signals."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest

from agent.operator.following import RECANCEL_S

FOLLOWER = textwrap.dedent(
    """
    import asyncio, sys
    from agent.operator.following import until_interrupted

    swallowed = 0

    async def follow():
        # polls like 'shoal events -f'; the first cancellation is lost on its way, as a
        # request completing in the same instant can lose it
        global swallowed
        print("following", flush=True)
        while True:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                if swallowed == 0:
                    swallowed += 1
                    continue
                raise

    result = asyncio.run(until_interrupted(follow))
    print(f"ended {result} after swallowing {swallowed}", flush=True)
    """
)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("before", [None, _ignore_sigint], ids=["default", "sigint-ignored"])
def test_ctrl_c_ends_a_follow_that_swallows_a_cancellation(
    before: Callable[[], None] | None,
) -> None:
    follower = subprocess.Popen(
        [sys.executable, "-c", FOLLOWER],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=before,
    )
    try:
        assert follower.stdout is not None
        assert follower.stdout.readline().strip() == "following"
        follower.send_signal(signal.SIGINT)
        out, err = follower.communicate(timeout=10 * RECANCEL_S + 10)
    finally:
        follower.kill()
    assert follower.returncode == 0, err
    assert out.strip() == "ended None after swallowing 1"
