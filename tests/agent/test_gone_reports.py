"""Who tells the mesh that a member died or left (sans-I/O: ``agent.mesh.mesh``); the real-agent
test is ``test_member_events``."""

from __future__ import annotations

from agent.mesh.mesh import GONE_KEPT_S, GoneReports, reporter_of


def test_the_reporter_is_the_first_live_agent_after_the_gone_one_wrapping_round() -> None:
    live = ["b", "d", "f"]
    assert reporter_of("c", live) == "d"
    assert reporter_of("d", live) == "f"  # the gone one may still be listed: never itself
    assert reporter_of("g", live) == "b"  # past the last: the first
    assert reporter_of("a", []) is None
    assert reporter_of("a", ["a"]) is None


def test_the_successor_of_two_neighbours_gone_together_reports_both() -> None:
    """``a`` and ``b`` die together: ``c`` sees ``a`` dead while ``b`` still looks alive, so ``b``
    is named to report it and ``c`` only logs it; when ``b`` is declared dead, ``c`` is the
    successor of both and reports ``a`` too, late, where ``a``'s death would never have reached
    the feed. ``d`` reports neither."""
    c, d = GoneReports("c"), GoneReports("d")
    assert c.gone("a", "dead", ["b", "c", "d"], 10.0) == []
    assert d.gone("a", "dead", ["b", "c", "d"], 10.0) == []
    assert c.gone("b", "dead", ["c", "d"], 14.0) == [("b", "dead"), ("a", "dead")]
    assert d.gone("b", "dead", ["c", "d"], 14.0) == []
    assert c.gone("cc", "left", ["c", "d"], 15.0) == []  # d tells; nothing more of a or b


def test_a_death_another_was_to_report_is_forgotten_after_a_while() -> None:
    c = GoneReports("c")
    assert c.gone("a", "left", ["b", "c"], 0.0) == []
    assert c.gone("b", "dead", ["c"], GONE_KEPT_S + 1.0) == [("b", "dead")]


def test_a_member_never_reports_its_own_end() -> None:
    a = GoneReports("a")
    assert a.gone("a", "left", ["b"], 0.0) == []
    assert a.gone("b", "dead", ["c"], 1.0) == []  # c tells of b; a kept nothing of itself
