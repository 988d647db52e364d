"""How an agent wires the team policy (:mod:`agent.people.keeper`) into gossip and its content
store: it publishes the policy it holds as its own small record (the version, the body's content
digest and size, the admin's signature), fetches the body of a newer record from the members that
gossip it, believes it only once the body is held and verified, lets only an admin revoke, and
names a submitter's person and team for accounting.

The body moves only as content of kind ``policy`` (:mod:`agent.content.policybody`): from the
record's origin and every member that gossips the same record, through the store's fetcher (each
chunk checked against its digest), at most :data:`FETCH_TRIES` starts. The body believed is kept
content (never evicted), and so is one being fetched. A record refused after its body came (its
size or version not the record's: ``body_mismatch``; a forged signature) is remembered and never
fetched again; one whose body no member served is counted ``body_unfetched`` and fetched again
when a member gossips it anew. Until then the agent keeps the policy it has.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

from agent.content.fetch import Fetcher, FetchError, Holder
from agent.content.manifest import ContentError
from agent.content.policybody import check_body_manifest, pointer_of, put_body, read_body
from agent.content.store_api import ContentStore
from agent.mesh.peers import PeerError
from agent.people.keeper import PolicyKeeper, PolicyRefused
from agent.storage.sqlitefile import StoreFull
from agent.wire.codec import WireError
from agent.wire.policy import POLICY, PolicyRecord, SignedPolicy

log = logging.getLogger("shoal.agent")

FETCH_TRIES: Final = 12
RETRY_WAIT_S: Final = 0.5
"""The wait before the second start of a body's fetch; it doubles for each further one, up to
:data:`RETRY_MAX_WAIT_S` (twelve starts span some 75 s: a holder just restarted, or not yet
known alive to this agent, is asked again once it is)."""
RETRY_MAX_WAIT_S: Final = 10.0
MAX_PENDING: Final = 8
"""Records whose bodies are being fetched at once (the oldest is given up past it)."""
MAX_REFUSED_KEPT: Final = 256


class PolicyWire:
    def __init__(
        self,
        people: PolicyKeeper,
        publish: Callable[[str, bytes], None],
        store: ContentStore,
        fetcher: Fetcher,
        holder_at: Callable[[str], Holder | None],
    ) -> None:
        """``holder_at``: a member as a holder of content (``None``: no address known)."""
        self.people = people
        self._publish = publish
        self._store = store
        self._fetcher = fetcher
        self._holder_at = holder_at
        self.digest: str | None = None
        """The content digest of the body held (``None``: no policy held)."""
        self._holders: OrderedDict[PolicyRecord, set[str]] = OrderedDict()
        """Records whose bodies are wanted -> the members that gossiped them."""
        self._tasks: dict[PolicyRecord, asyncio.Task[None]] = {}
        self._refused: OrderedDict[PolicyRecord, None] = OrderedDict()

    def keep_held_body(self) -> None:
        """At start: the body of the policy kept from before (``policy.bin``, of this version or
        an older one, which held the body inline) put in the store, so members can fetch it.
        Blocking."""
        held = self.people.held
        if held is None:
            return
        try:
            self.digest = put_body(self._store, held.body_bytes)
        except (ContentError, StoreFull) as exc:  # still gossiped: other members serve it
            self.digest = pointer_of(held).digest
            log.warning("cannot keep the team policy's body in the store: %s", exc)

    def kept(self) -> set[str]:
        """Content never evicted: the body believed and those being fetched."""
        digests = {r.digest for r in self._holders}
        return digests | ({self.digest} if self.digest else set())

    def publish_policy(self) -> None:
        """Gossip the team policy held here as this agent's own record: every agent that holds
        it spreads it, so it outlives any one publisher (each receiver fetches the body from the
        members that hold it and verifies the admin's signature over it)."""
        held = self.people.held
        if held is not None and self.digest is not None:
            self._publish(POLICY, held.pointer(self.digest).encode())

    def may_revoke(self, signer: str) -> bool:
        """Only an admin revokes: with a team policy held, one it names admin (an operator
        certificate alone, with none; :mod:`agent.people.rules`)."""
        body = self.people.body
        person = None if body is None else body.person_by_id(signer)
        return body is None or (person is not None and person.role == "admin")

    def person(self, node_id: str | None) -> tuple[str | None, str | None]:
        """A submitter's name and team in the policy held now (``None``s: not named)."""
        body = self.people.body
        person = None if body is None or node_id is None else body.person_by_id(node_id)
        return (None, None) if person is None else (person.name, person.team)

    # -- learning a newer one ------------------------------------------------------------------

    def learn_policy(self, origin: str, payload: bytes) -> None:
        """A member gossiped ``payload``: fetch its body when it may be newer than the held."""
        try:
            record = self.people.consider(payload, time.time(), self.digest)
        except PolicyRefused as exc:
            log.warning("refused a team policy gossiped by %s: %s", origin[:10], exc)
            return
        if record is None or record in self._refused:
            return
        self._holders.setdefault(record, set()).add(origin)
        self._holders.move_to_end(record)
        while len(self._holders) > MAX_PENDING:
            gone, _ = self._holders.popitem(last=False)
            task = self._tasks.pop(gone, None)
            if task is not None:
                task.cancel()
        if record not in self._tasks:
            self._tasks[record] = asyncio.create_task(self._fetch(record), name="policy")

    async def _fetch(self, record: PolicyRecord) -> None:
        try:
            body = await self._fetch_body(record)
            if body is not None:
                self._take(record, body)
        except PolicyRefused as exc:
            self._remember_refused(record)
            log.warning("refused team policy version %d: %s", record.version, exc)
        finally:
            self._tasks.pop(record, None)
            self._holders.pop(record, None)

    async def _fetch_body(self, record: PolicyRecord) -> bytes | None:
        """The body ``record`` names, fetched from its holders and read back; ``None`` when no
        holder served it. :class:`PolicyRefused` (counted) for content that is no policy body
        of the record's size."""
        for tries in range(FETCH_TRIES):
            if tries:
                await asyncio.sleep(min(RETRY_MAX_WAIT_S, RETRY_WAIT_S * 2 ** (tries - 1)))
            holders = [h for node in self._holders.get(record, ()) if (h := self._holder_at(node))]
            try:
                manifest = await self._fetcher.learn(record.digest, holders)
                try:
                    check_body_manifest(manifest)
                    if manifest.total_bytes != record.size_bytes:
                        raise ContentError(f"{manifest.total_bytes} bytes, not {record.size_bytes}")
                except ContentError as exc:
                    self.people.refused["body_mismatch"] += 1
                    raise PolicyRefused("body_mismatch", f"policy body refused: {exc}") from None
                await self._fetcher.fetch(record.digest, holders)
                return await asyncio.to_thread(read_body, self._store, record.digest)
            except (FetchError, ContentError, PeerError, StoreFull) as exc:
                log.info("team policy body %s (try %d): %s", record.digest[:12], tries + 1, exc)
        self.people.refused["body_unfetched"] += 1
        log.warning("team policy version %d: no member served its body", record.version)
        return None

    def _take(self, record: PolicyRecord, body: bytes) -> bool:
        if not self.people.offer_body(record, body, time.time()):
            return False
        self.digest = record.digest
        log.info("team policy version %d (body %s)", record.version, record.digest[:12])
        self.publish_policy()
        return True

    def _remember_refused(self, record: PolicyRecord) -> None:
        self._refused[record] = None
        while len(self._refused) > MAX_REFUSED_KEPT:
            self._refused.popitem(last=False)

    # -- the admin's command -------------------------------------------------------------------

    async def offer(self, data: bytes) -> bool:
        """The ``policy`` command's record: the small one, whose body the admin put to this
        agent's store first (``policy_missing``, ``policy_put``), or a whole signed record
        (its body put in the store here). True when it is now the held policy; raises
        :class:`PolicyRefused` (counted) or ``ValueError`` (no such body held here)."""
        try:
            record = PolicyRecord.decode(data)
        except WireError:
            return await self._offer_whole(data)
        try:
            body = await asyncio.to_thread(read_body, self._store, record.digest)
        except ContentError as exc:
            raise ValueError(f"{exc}: put the body first (policy_missing, policy_put)") from None
        return self._take(record, body)

    async def _offer_whole(self, data: bytes) -> bool:
        try:
            signed = SignedPolicy.decode(data)
        except WireError:
            return self.people.offer(data, time.time())  # refused, counted as malformed
        try:
            digest = await asyncio.to_thread(put_body, self._store, signed.body_bytes)
        except (ContentError, StoreFull) as exc:
            raise ValueError(f"cannot keep the policy body: {exc}") from None
        return self._take(signed.pointer(digest), signed.body_bytes)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
