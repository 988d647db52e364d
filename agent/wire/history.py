"""``GET /v1/history``: a node's stored samples, the query and the answer.

The query (URL parameters, all optional): ``series`` (comma-separated names or prefixes:
``gpu`` is every ``gpu.*``; default every series), ``node`` (must be the agent asked: each node
answers from its own store), ``device`` (a device key, or its index as ``shoal nodes`` shows it),
``job`` (a job id: that job's series), ``from`` and ``to`` (seconds since the epoch; default the
last hour), ``step`` (seconds between points; default about 600 points) and ``hints`` (``1``:
add the bottleneck hints of each GPU over the five minutes before ``to``,
:mod:`agent.history.history_hints`).

The answer: ``{"node", "from", "to", "series": [...]}``, each series ``{"name", "subject",
"unsupported", "tier", "step_s", "points"}`` with ``points`` a list of ``[t, min, avg, max]``
(``null`` in a step with no sample); ``unsupported`` says why a device does not expose the
series (its ``points`` are then empty). With ``hints=1``, ``hints`` lists ``{"device", "rule",
"evidence", "unjudged"}``: the rules that fired, and those that could not judge.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

from agent.wire import codec as c

MAX_QUERY_SERIES_TEXT: Final = 2000
"""The longest ``series`` parameter."""
DEFAULT_SPAN_S: Final = 3600


class HistoryQuery(NamedTuple):
    """A history request, checked (every mistake is a one-line :class:`codec.WireError`)."""

    series: tuple[str, ...]
    node: str | None
    device: str | None
    job: str | None
    from_s: int
    to_s: int
    step_s: int | None
    hints: bool = False

    @classmethod
    def from_params(cls, params: Mapping[str, str], now_s: float) -> HistoryQuery:
        text = params.get("series", "")
        if len(text) > MAX_QUERY_SERIES_TEXT:
            raise c.WireError(f"series: at most {MAX_QUERY_SERIES_TEXT} characters")
        names = tuple(n.strip() for n in text.split(",") if n.strip())
        for name in names:
            if not all(ch.isalnum() or ch in "._" for ch in name):
                raise c.WireError(f"series: {name[:40]!r} is not a series name")
        to_s = _seconds(params, "to", now_s)
        from_s = _seconds(params, "from", to_s - DEFAULT_SPAN_S)
        if from_s >= to_s:
            raise c.WireError("from: must be before 'to'")
        step = None
        if "step" in params:
            step = int(_seconds(params, "step", 0))
            if step < 1:
                raise c.WireError("step: must be at least 1 second")
        return cls(
            series=names,
            node=params.get("node") or None,
            device=params.get("device") or None,
            job=params.get("job") or None,
            from_s=int(from_s),
            to_s=math.ceil(to_s),
            step_s=step,
            hints=_flag(params.get("hints", "0")),
        )

    def to_params(self) -> dict[str, str]:
        out = {"from": str(self.from_s), "to": str(self.to_s)}
        if self.series:
            out["series"] = ",".join(self.series)
        for name, value in (("node", self.node), ("device", self.device), ("job", self.job)):
            if value is not None:
                out[name] = value
        if self.step_s is not None:
            out["step"] = str(self.step_s)
        if self.hints:
            out["hints"] = "1"
        return out


def _flag(text: str) -> bool:
    if text not in ("0", "1"):
        raise c.WireError(f"hints: expected 0 or 1, got {text[:20]!r}")
    return text == "1"


def _seconds(params: Mapping[str, str], name: str, default: float) -> float:
    text = params.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise c.WireError(f"{name}: expected seconds, got {text[:20]!r}") from None
    if not math.isfinite(value) or not 0 <= value < 1e11:
        raise c.WireError(f"{name}: {text[:20]!r} is out of range")
    return value


class HistorySeries(NamedTuple):
    name: str
    subject: str
    unsupported: str | None
    tier: str
    step_s: int
    points: tuple[tuple[int, float | None, float | None, float | None], ...]
    """``(t, min, avg, max)``, one per step."""

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "subject": self.subject,
            "unsupported": self.unsupported,
            "tier": self.tier,
            "step_s": self.step_s,
            "points": [list(p) for p in self.points],
        }

    @classmethod
    def from_wire(cls, value: Any, name: str = "series") -> HistorySeries:
        d = c.obj(value, name)
        return cls(
            name=c.field(d, "name", c.text, name + "."),
            subject=c.field(d, "subject", c.or_default(c.text, ""), name + "."),
            unsupported=c.field(d, "unsupported", c.opt_text, name + "."),
            tier=c.field(d, "tier", c.text, name + "."),
            step_s=c.field(d, "step_s", c.integer, name + "."),
            points=c.field(d, "points", _points, name + "."),
        )


def _points(
    value: Any, name: str
) -> tuple[tuple[int, float | None, float | None, float | None], ...]:
    if not isinstance(value, list):
        raise c.WireError(f"{name}: expected a list, got {type(value).__name__}")
    out = []
    for i, point in enumerate(value):
        where = f"{name}[{i}]"
        if not isinstance(point, list) or len(point) != 4:
            raise c.WireError(f"{where}: expected [t, min, avg, max]")
        out.append(
            (
                c.integer(point[0], where),
                c.opt_number(point[1], where),
                c.opt_number(point[2], where),
                c.opt_number(point[3], where),
            )
        )
    return tuple(out)


class HistoryHint(NamedTuple):
    """A bottleneck rule that fired on a GPU (or could not judge it)."""

    device: str
    rule: str
    evidence: str
    unjudged: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "rule": self.rule,
            "evidence": self.evidence,
            "unjudged": self.unjudged,
        }

    @classmethod
    def from_wire(cls, value: Any, name: str = "hint") -> HistoryHint:
        d = c.obj(value, name)
        return cls(
            device=c.field(d, "device", c.text, name + "."),
            rule=c.field(d, "rule", c.text, name + "."),
            evidence=c.field(d, "evidence", c.or_default(c.text, ""), name + "."),
            unjudged=c.field(d, "unjudged", c.or_default(c.flag, False), name + "."),
        )


class HistoryDoc(NamedTuple):
    """``GET /v1/history``'s answer."""

    node: str
    from_s: int
    to_s: int
    series: tuple[HistorySeries, ...]
    hints: tuple[HistoryHint, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "from": self.from_s,
            "to": self.to_s,
            "series": [s.to_wire() for s in self.series],
            "hints": [h.to_wire() for h in self.hints],
        }

    @classmethod
    def from_wire(cls, value: Any) -> HistoryDoc:
        d = c.obj(value)
        return cls(
            node=c.field(d, "node", c.text),
            from_s=c.field(d, "from", c.integer),
            to_s=c.field(d, "to", c.integer),
            series=c.field(d, "series", lambda v, n: c.items(v, n, HistorySeries.from_wire)),
            hints=c.field(d, "hints", lambda v, n: c.items(v, n, HistoryHint.from_wire)),
        )
