"""Which agent-to-agent calls ride the gossip streams: one-segment ``/v1/internal/<call>`` only;
the content store's routes (checkpoints among them) and log streams stay on HTTP."""

from __future__ import annotations

import pytest

from agent.mesh.peers import stream_call_op


@pytest.mark.parametrize(
    ("path", "op"),
    [
        ("/v1/internal/command", "command"),
        ("/v1/internal/start", "start"),
        ("/v1/internal/replicate", "replicate"),
        ("/v1/internal/checkpoint_of", "checkpoint_of"),
        ("/v1/internal/content/chunk/ab?of=cd", None),
        ("/v1/internal/content/ab/have", None),
        ("/v1/internal/logs/j1?lines=10", None),
        ("/v1/internal/", None),
        ("/v1/internal", None),
        ("/v1/commands", None),
    ],
)
def test_only_single_segment_internal_calls_ride_streams(path: str, op: str | None) -> None:
    assert stream_call_op(path) == op
