"""A mesh forming: a joiner sends its full exchange to one seed, not to every seed at once, and
keeps trying random seeds at the catch-up pace until one answers."""

from __future__ import annotations

import random

from gossip.config import GossipConfig
from gossip.messages import PushPull
from gossip.peer import Peer
from gossip.simkeys import SimSigner, SimTrust
from tests.gossip.helpers import KEYRING

SEEDS = ["s1:1", "s2:1", "s3:1", "s4:1"]


def _joiner(seed: int) -> Peer:
    cfg = GossipConfig(node_id="me", addr="me:1", boot_incarnation=100)
    return Peer(cfg, SimSigner("me", KEYRING), SimTrust(KEYRING), SEEDS, 0.0, random.Random(seed))


def _push_pulls(peer: Peer) -> list[str]:
    out, reliable = peer.take_outgoing()
    return [addr for addr, m in out + reliable if isinstance(m, PushPull)]


def test_a_joiner_sends_its_exchange_to_one_seed_and_the_seeds_share_the_joins() -> None:
    first = [_push_pulls(_joiner(i)) for i in range(40)]
    assert all(len(sent) == 1 and sent[0] in SEEDS for sent in first)
    assert {sent[0] for sent in first} == set(SEEDS)  # spread over the seeds


def test_a_joiner_nobody_answered_tries_random_seeds_at_the_catch_up_pace() -> None:
    peer = _joiner(1)
    tried = set(_push_pulls(peer))
    now = 0.0
    while now < 30.0:
        now = peer.get_timer() or now + 0.5
        peer.handle_timer(now)
        for addr in _push_pulls(peer):
            tried.add(addr)
    assert tried == set(SEEDS)
