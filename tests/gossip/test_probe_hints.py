"""A hint that a member may be gone (its connection ended, or another member suspects it) moves
it to the front of the probe order: probed at the next tick instead of its turn, never faster
than the probe interval, and at most once a round per member. Single cores, then the simulator."""

from __future__ import annotations

from gossip.messages import Ack, Compound, MemberState, Message, Ping
from gossip.peer import Peer
from tests.gossip.helpers import alive, make_peer, suspect

OTHERS = [f"n{i}" for i in range(8)]


def _peer() -> Peer:
    p = make_peer()
    p.preload([alive(n, 1) for n in OTHERS], 0.0)
    p.events()
    return p


def _parts(sent: list[tuple[str, Message]], to: str | None = None) -> list[Message]:
    return [
        part
        for addr, msg in sent
        if to is None or addr == to
        for part in (msg.parts if isinstance(msg, Compound) else (msg,))
    ]


def _probed(p: Peer, now: float) -> str | None:
    """Run the probe tick at ``now``; the member it pinged, which acks at once (None: no probe
    started)."""
    p.handle_timer(now)
    for part in _parts(p.messages_to_send()):
        if isinstance(part, Ping) and part.source == "me":
            p.receive(f"{part.target}:1", Ack(part.seq, part.target, None), now + 0.001)
            p.messages_to_send()
            return part.target
    return None


def test_a_hinted_member_is_probed_at_the_next_tick_not_at_its_turn() -> None:
    p = _peer()
    first = _probed(p, 1.0)
    assert first is not None
    last = p._probe_order[-1]  # its turn would be the round's last probe
    assert p.probe_soon(last, 1.1)
    assert _probed(p, 1.0 + p.config.probe_interval_s) == last
    assert p.stats.probes_hinted == 1


def test_hints_change_the_order_never_the_pace() -> None:
    """A flood of hints: still one probe per interval, and each member moved once a round."""
    p = _peer()
    _probed(p, 1.0)
    step = p.config.probe_interval_s
    sent = p.stats.probes_sent
    moved = 0
    for i in range(40):
        now = 1.0 + i * step
        for n in OTHERS:
            moved += p.probe_soon(n, now)
        _probed(p, now + step)
    assert p.stats.probes_sent - sent == 40  # one a tick, as without hints
    round_s = p.live_count() * step
    assert moved <= len(OTHERS) * (40 * step / round_s + 1)


def test_only_an_alive_member_other_than_itself_is_hinted() -> None:
    p = _peer()
    p.receive("n1:1", suspect("n0", 1, "n1"), 1.0)  # n0 suspect: being judged already
    assert p.member("n0") is not None and p.member("n0").state is MemberState.SUSPECT  # type: ignore[union-attr]
    hinted = p.stats.probes_hinted
    assert not p.probe_soon("n0", 1.2)
    assert not p.probe_soon("me", 1.2)
    assert not p.probe_soon("stranger", 1.2)
    assert p.stats.probes_hinted == hinted


def test_another_members_suspicion_is_looked_into_at_the_next_tick() -> None:
    """A confirmation if the suspect is gone; if it lives, the ping carries the accusation
    (buddy system) and it refutes sooner."""
    p = _peer()
    _probed(p, 1.0)
    target = p._probe_order[-1]  # the round's last
    accuser = next(n for n in OTHERS if n != target)
    p.receive(f"{accuser}:1", suspect(target, 1, accuser), 1.1)
    p.handle_timer(1.0 + p.config.probe_interval_s)
    parts = _parts(p.messages_to_send(), to=f"{target}:1")
    assert any(isinstance(x, Ping) and x.target == target for x in parts)
    assert any(x == suspect(target, 1, accuser) for x in parts)  # the accusation, first
