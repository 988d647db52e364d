"""The agent's wiring of the team policy to gossip and the content store, in one process: a
gossiped record's body is fetched through a real fetcher from in-process holders and believed
only once verified; content of another shape is refused before a chunk is asked; a body nobody
serves is counted, the held policy kept."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.content.fetch import Fetcher
from agent.content.manifest import ContentFile, ContentManifest
from agent.content.policybody import pointer_of, put_body
from agent.daemon import policywire
from agent.daemon.policywire import PolicyWire
from agent.people.keeper import PolicyKeeper
from agent.wire.policy import POLICY, sign_policy
from gossip.certtrust import CertSigner
from tests.agent.test_people_policy import People
from tests.content.memstore import MemStore
from tests.content.test_fetch import LocalHolder


class Wired:
    """One agent's wire, and the members that hold content for it."""

    def __init__(self, people: People) -> None:
        self.people = people
        self.keeper = PolicyKeeper(people.trust(), None)
        self.store = MemStore()
        self.holders: dict[str, LocalHolder] = {}
        self.published: list[tuple[str, bytes]] = []
        self.wire = PolicyWire(
            self.keeper,
            lambda kind, payload: self.published.append((kind, payload)),
            self.store,
            Fetcher(self.store),
            self.holders.get,
        )

    def member(self, name: str) -> MemStore:
        store = MemStore()
        self.holders[name] = LocalHolder(name, store)
        return store


@pytest.fixture
def wired(tmp_path: Path) -> Wired:
    return Wired(People(tmp_path))


async def until(check: Callable[[], bool]) -> None:
    for _ in range(500):  # bounded: 5 s at most
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not reached in 5 s")


async def test_a_body_fetched_from_the_origin_is_believed_and_gossiped_on(wired: Wired) -> None:
    signed = sign_policy(wired.people.body(2), CertSigner(wired.people.admin))
    put_body(wired.member("origin"), signed.body_bytes)
    record = pointer_of(signed)
    wired.wire.learn_policy("origin", record.encode())
    assert wired.keeper.held is None  # nothing believed before the body is held
    await until(lambda: wired.keeper.version == 2)
    assert wired.keeper.held == signed
    assert wired.wire.digest == record.digest and record.digest in wired.wire.kept()
    assert wired.published == [(POLICY, record.encode())]
    assert wired.holders["origin"].asked >= 1


async def test_content_of_another_shape_is_refused_before_a_chunk_is_asked(
    wired: Wired,
) -> None:
    signed = sign_policy(wired.people.body(2), CertSigner(wired.people.admin))
    # A member serves, under the digest the record names, a 4 TiB dataset's manifest.
    huge = ContentManifest(
        "dataset", "big", 16 << 20, (ContentFile("x", 4 << 40, 0o644, ("a" * 64,) * 262144),)
    )
    wired.member("liar").add_manifest(huge)
    lying = pointer_of(signed)._replace(digest=huge.digest)
    wired.wire.learn_policy("liar", lying.encode())
    await until(lambda: wired.keeper.refused["body_mismatch"] == 1)
    assert wired.holders["liar"].asked == 0 and wired.keeper.held is None
    # Gossiped again, a refused record is not fetched again.
    wired.wire.learn_policy("liar", lying.encode())
    await asyncio.sleep(0.05)
    assert wired.keeper.refused["body_mismatch"] == 1


async def test_a_body_nobody_serves_is_counted_and_the_held_policy_kept(
    wired: Wired, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(policywire, "RETRY_WAIT_S", 0.0)
    one = sign_policy(wired.people.body(1), CertSigner(wired.people.admin))
    assert wired.keeper.offer(one.encode(), time.time())
    two = sign_policy(wired.people.body(2), CertSigner(wired.people.admin))
    wired.member("empty")  # holds nothing
    wired.wire.learn_policy("empty", pointer_of(two).encode())
    await until(lambda: wired.keeper.refused["body_unfetched"] == 1)
    assert wired.keeper.version == 1
