"""Builders shared by the gossip tests: a single core wired to the simulator's cheap identity."""

from __future__ import annotations

import random

from gossip.codec import signing_bytes
from gossip.config import GossipConfig
from gossip.messages import Alive, Dead, Record, Suspect
from gossip.peer import Peer
from gossip.simkeys import SimKeyring, SimSigner, SimTrust

KEYRING = SimKeyring()


def make_peer(node: str = "me", boot: int = 100) -> Peer:
    cfg = GossipConfig(node_id=node, addr=f"{node}:1", boot_incarnation=boot)
    return Peer(cfg, SimSigner(node, KEYRING), SimTrust(KEYRING), [], 0.0, random.Random(1))


def alive(node: str, inc: int, signer: str | None = None) -> Alive:
    cred = KEYRING.credential(node)
    u = Alive(node, inc, f"{node}:1", cred, b"")
    sig = SimSigner(signer or node, KEYRING).sign(signing_bytes(u))
    return Alive(node, inc, f"{node}:1", cred, sig)


def suspect(node: str, inc: int, accuser: str) -> Suspect:
    u = Suspect(node, inc, accuser, b"")
    return Suspect(node, inc, accuser, SimSigner(accuser, KEYRING).sign(signing_bytes(u)))


def dead(node: str, inc: int, accuser: str) -> Dead:
    u = Dead(node, inc, accuser, b"")
    return Dead(node, inc, accuser, SimSigner(accuser, KEYRING).sign(signing_bytes(u)))


def record(origin: str, kind: str, inc: int, ctr: int, payload: bytes, signer: str = "") -> Record:
    u = Record(origin, kind, inc, ctr, payload, b"")
    sig = SimSigner(signer or origin, KEYRING).sign(signing_bytes(u))
    return Record(origin, kind, inc, ctr, payload, sig)
