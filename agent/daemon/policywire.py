"""How an agent wires the team policy (:mod:`agent.people.keeper`) into gossip: it publishes the
policy it holds as its own record, learns a newer one gossiped by others, lets only an admin
revoke, and names a submitter's person and team for accounting."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from agent.people.keeper import PolicyKeeper, PolicyRefused
from agent.wire.policy import POLICY

log = logging.getLogger("shoal.agent")


class PolicyWire:
    def __init__(self, people: PolicyKeeper, publish: Callable[[str, bytes], None]) -> None:
        self.people = people
        self._publish = publish

    def publish_policy(self) -> None:
        """Gossip the team policy held here as this agent's own record: every agent that holds
        it spreads it, so it outlives any one publisher (each receiver verifies the admin's
        signature inside)."""
        record = self.people.encoded()
        if record is not None:
            self._publish(POLICY, record)

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

    def learn_policy(self, origin: str, payload: bytes) -> None:
        try:
            if self.people.offer(payload, time.time()):
                log.info("team policy version %d, gossiped by %s", self.people.version, origin)
                self.publish_policy()
        except PolicyRefused as exc:
            log.warning("refused a team policy gossiped by %s: %s", origin[:10], exc)
