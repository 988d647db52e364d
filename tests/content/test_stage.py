"""The stage command's body: what it refuses, in one line each; and a stage's one-line reason."""

from __future__ import annotations

from typing import Any

import pytest

from agent.content.stage import StageAsk, StageState
from agent.content.swarm import Progress

D = "ab" * 32


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"digest": D, "nodes": ["n"]}, "name"),
        ({"name": "../etc", "digest": D, "nodes": ["n"]}, "one path component"),
        ({"name": "x", "digest": "AB" * 32, "nodes": ["n"]}, "64 lowercase hex"),
        ({"name": "x", "digest": 5, "nodes": ["n"]}, "64 lowercase hex"),
        ({"name": "x", "source": "file:///etc/passwd", "nodes": ["n"]}, "http"),
        ({"name": "x", "source": "http://h/" + "a" * 3000, "nodes": ["n"]}, "at most"),
        ({"name": "x", "digest": D, "source": "http://h/", "nodes": ["n"]}, "not both"),
        ({"name": "x", "nodes": ["n"]}, "digest"),
        ({"name": "x", "digest": D, "nodes": []}, "nodes"),
        ({"name": "x", "digest": D, "nodes": "n"}, "nodes"),
        ({"name": "x", "digest": D, "nodes": ["n"] * 300}, "nodes"),
        ({"name": "x", "digest": D, "nodes": ["n"], "cancel": "yes"}, "cancel"),
    ],
)
def test_a_bad_stage_body_is_refused_with_its_reason(body: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        StageAsk.from_body(body)


def test_a_good_body_and_a_cancel_by_name() -> None:
    ask = StageAsk.from_body({"name": "imagenet", "digest": D, "nodes": ["a", "b", "a"]})
    assert ask.nodes == ("a", "b") and ask.key == D and not ask.cancel
    cancel = StageAsk.from_body({"name": "imagenet", "nodes": ["a"], "cancel": True})
    assert cancel.key == "imagenet" and cancel.cancel


def test_a_stage_says_where_it_stands_in_one_line() -> None:
    s = StageState("imagenet", D, "peers", "staging")
    assert s.line() == "staging imagenet: finding holders"
    p = Progress(43, 100, 1.2e9, 3, 40.0)
    assert s.__class__("imagenet", D, "peers", "staging", p).to_wire()["line"] == (
        "staging imagenet 43% (1.2 GB/s from 3 holders, ~40 s)"
    )
    failed = StageState("imagenet", D, "peers", "failed", error="no holder has 3 of its chunks")
    assert failed.line() == "staging imagenet failed: no holder has 3 of its chunks"
    url = StageState("cifar", None, "http://h/c/", "staging", Progress(5000, 0, 10.0, 1, None))
    assert url.line() == "staging cifar: 5000 bytes from http://h/c/ so far"
