"""The stage command's body: what it refuses, in one line each; and a stage's one-line reason."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agent.content import stage
from agent.content.fetch import FetchError
from agent.content.stage import StageAsk, StageState
from agent.content.store import DiskStore
from agent.content.swarm import Progress
from tests.content.memstore import MemStore
from tests.content.test_fetch import dataset

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
        ({"name": "x", "digest": D, "nodes": ["n"], "poll": 1}, "poll"),
        ({"name": "x", "nodes": ["n"], "cancel": True, "poll": True}, "not both"),
        ({"name": "x", "digest": D, "nodes": ["n"], "wait": True}, "unknown field 'wait'"),
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
    poll = StageAsk.from_body({"name": "imagenet", "digest": D, "nodes": ["a"], "poll": True})
    assert poll.poll and not poll.cancel and poll.key == D


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


def test_a_stage_with_no_holder_yet_looks_again_before_it_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Just after an agent starts its view may not list the members that hold what it lacks: a
    stage looks for a member it has not asked yet (what it fetched is kept) instead of failing at
    once; one whose members were all asked fails once its time to look is up."""
    monkeypatch.setattr(stage, "FIND_HOLDERS_RETRY_S", 0.01)
    mesh = SimpleNamespace(is_gone=lambda _node: False)
    stager = stage.Stager("me", None, mesh, MemStore(), tmp_path, Counter())  # type: ignore[arg-type]
    dead, holder = SimpleNamespace(name="dead"), SimpleNamespace(name="holder")
    views = iter([[dead], [dead], [], [dead, holder]])
    stager.holders = lambda digest=None: next(views)  # type: ignore[assignment,method-assign]
    asked: list[list[str]] = []
    done = Progress(100, 100, 1.0, 1, 0.0)

    async def fetch(digest: str, holders: list[Any], **_: Any) -> Any:
        asked.append([h.name for h in holders])
        if "holder" not in asked[-1]:
            raise FetchError("slow: no holder has 3 of its chunks")
        return SimpleNamespace(progress=done, manifest=SimpleNamespace(name="imagenet"))

    stager.fetcher.fetch = fetch  # type: ignore[method-assign]
    asyncio.run(stager._from_peers(D, "imagenet", D))
    assert asked == [["dead"], ["dead", "holder"]]

    monkeypatch.setattr(stage, "FIND_HOLDERS_S", 0.05)
    monkeypatch.setattr(stage, "FIND_HOLDERS_SETTLED_S", 0.05)
    stager.holders = lambda digest=None: [dead]  # type: ignore[assignment,method-assign]
    asked.clear()
    with pytest.raises(FetchError, match="no holder"):
        asyncio.run(stager._from_peers(D, "imagenet", D))
    assert asked == [["dead"]]


def test_a_settled_view_looks_for_other_holders_briefly_a_filling_one_longer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The long look (:data:`stage.FIND_HOLDERS_S`) is for a view that lacks what some live
    member holds (just after the agent's start); once every live member has said, a stage that
    finds no holder fails after the short one: the job waits for a holder with the reason that
    says so, not on a stage that cannot end."""
    monkeypatch.setattr(stage, "FIND_HOLDERS_RETRY_S", 0.01)
    monkeypatch.setattr(stage, "FIND_HOLDERS_S", 30.0)
    monkeypatch.setattr(stage, "FIND_HOLDERS_SETTLED_S", 0.1)
    mesh = SimpleNamespace(is_gone=lambda _node: False)
    stager = stage.Stager("me", None, mesh, MemStore(), tmp_path, Counter())  # type: ignore[arg-type]
    stager.holders = lambda digest=None: [SimpleNamespace(name="dead")]  # type: ignore[assignment,method-assign]

    async def fetch(digest: str, holders: list[Any], **_: Any) -> Any:
        raise FetchError("no holder has 3 of its chunks")

    stager.fetcher.fetch = fetch  # type: ignore[method-assign]

    async def failed_within(limit_s: float) -> bool:
        try:
            await asyncio.wait_for(stager._from_peers(D, "imagenet", D), limit_s)
        except FetchError:
            return True
        except TimeoutError:
            return False
        raise AssertionError("a stage with no holder succeeded")

    stager.started_at -= stage.VIEW_YOUNG_S
    assert not asyncio.run(failed_within(0.5))  # filling: still looking
    stager.view_filling = lambda: False
    assert asyncio.run(failed_within(5.0))
    stager.started_at = time.monotonic()  # just started: it may not know every member yet
    assert not asyncio.run(failed_within(0.5))


def test_bytes_known_by_another_name_where_they_came_from_are_kept_under_the_name_staged(
    tmp_path: Path,
) -> None:
    """Two datasets of equal bytes are one manifest: staging ``imnet2`` from a holder that knows
    the digest as ``imagenet`` keeps it here under ``imnet2`` too, so this node lists it by the
    name asked for (a job asking for ``imnet2`` finds it), not only under the holder's."""
    store = DiskStore(tmp_path / "store")
    mesh = SimpleNamespace(is_gone=lambda _node: False)
    stager = stage.Stager("me", None, mesh, store, tmp_path, Counter())  # type: ignore[arg-type]
    stager.holders = lambda digest=None: [SimpleNamespace(name="holder")]  # type: ignore[assignment,method-assign]
    manifest, _ = dataset(2, name="imagenet")

    async def fetch(digest: str, holders: list[Any], **_: Any) -> Any:
        store.add_manifest(manifest)  # as the fetcher keeps what it learned of the holder
        return SimpleNamespace(progress=Progress(1, 1, 1.0, 1, 0.0), manifest=manifest)

    stager.fetcher.fetch = fetch  # type: ignore[method-assign]
    asyncio.run(stager._from_peers(manifest.digest, "imnet2", manifest.digest))
    assert set(store.names_of(manifest.digest)) == {"imagenet", "imnet2"}
