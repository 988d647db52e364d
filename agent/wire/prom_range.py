"""A subset of Prometheus's ``query_range`` API on an agent, over the node's own history, so a
Grafana Prometheus data source can read a node directly.

``GET /api/v1/query_range?query=SELECTOR&start=T&end=T&step=S`` where ``SELECTOR`` is one
series by name, with optional exact-match labels: ``gpu_util_pct``,
``gpu_util_pct{subject="GPU-0"}``, ``link_rtt_ms{subject=~".*"}`` is not taken (only ``=``).
A history series' name is its Prometheus name with the first ``_`` for the dot
(``gpu.util_pct`` is ``gpu_util_pct``, ``host.cpu_pct`` ``host_cpu_pct``). Labels: ``subject``
(a device key, a job id, a peer's node id; ``""`` for the host) and ``node`` (this node's id:
another node's is refused, each node answers for itself). ``start`` and ``end`` are seconds
since the epoch (decimals allowed) or RFC 3339; ``step`` seconds (``15``, ``15s``, ``1m``).
The answer is Prometheus's matrix: one result per series, each point the step's average, a
step with no sample left out (as Prometheus leaves out what it has no sample for). Anything
else (functions, operators, regex matchers) is refused in Prometheus's error shape with
``errorType`` ``bad_data``. Sans I/O: parsing and rendering only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

MAX_POINTS: Final = 11_000
"""Prometheus's own limit on the points of one series in a range query."""
_NAME: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_MATCHER: Final = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_DURATION: Final = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)?$")
_UNITS: Final = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


class PromError(ValueError):
    """A query this subset does not take (Prometheus's ``bad_data``)."""


@dataclass(frozen=True, slots=True)
class RangeQuery:
    name: str
    """The history series (``gpu.util_pct``)."""
    prom_name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    start_s: float = 0.0
    end_s: float = 0.0
    step_s: int = 1


def history_name(prom_name: str) -> str:
    head, sep, tail = prom_name.partition("_")
    if not sep or not tail:
        raise PromError(f"{prom_name!r}: not a history series (gpu_util_pct, host_cpu_pct, ...)")
    return f"{head}.{tail}"


def prom_name(history_name: str) -> str:
    return history_name.replace(".", "_", 1)


def parse_selector(text: str) -> tuple[str, dict[str, str]]:
    text = text.strip()
    m = _NAME.match(text)
    if m is None:
        raise PromError(f"query {text[:60]!r}: only a series selector is taken here")
    name, rest = m.group(0), text[m.end() :].strip()
    labels: dict[str, str] = {}
    if rest:
        if not (rest.startswith("{") and rest.endswith("}")):
            raise PromError(f"query {text[:60]!r}: only a series selector is taken here")
        body, at = rest[1:-1], 0
        while at < len(body.rstrip()):
            lm = _MATCHER.match(body, at)
            if lm is None:
                raise PromError(f'label matchers {body[:60]!r}: only label="value" is taken')
            labels[lm.group(1)] = re.sub(r"\\(.)", r"\1", lm.group(2))
            at = lm.end()
    for label in labels:
        if label not in ("subject", "node", "__name__"):
            raise PromError(f"label {label!r}: a history series has subject and node")
    return name, labels


def parse_time(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise PromError(f"{what} {text[:40]!r}: not a time (epoch seconds or RFC 3339)") from None


def parse_step(text: str) -> int:
    m = _DURATION.match(text.strip())
    if m is None:
        raise PromError(f"step {text[:40]!r}: not a duration (15, 15s, 1m)")
    seconds = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if seconds < 1:
        raise PromError(f"step {text!r}: at least one second (history's finest)")
    return int(seconds)


def parse(params: Mapping[str, str]) -> RangeQuery:
    """A ``query_range`` request's parameters; :class:`PromError` for anything outside the
    subset."""
    for need in ("query", "start", "end", "step"):
        if not params.get(need):
            raise PromError(f"missing parameter {need!r}")
    name, labels = parse_selector(params["query"])
    start, end = parse_time(params["start"], "start"), parse_time(params["end"], "end")
    step = parse_step(params["step"])
    if end < start:
        raise PromError("end timestamp must not be before start time")
    if (end - start) / step > MAX_POINTS:
        raise PromError(
            "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the "
            "query resolution (?step=XX)"
        )
    return RangeQuery(history_name(name), name, labels, start, end, step)


def _value(v: float) -> str:
    return repr(float(v)) if v != int(v) or abs(v) >= 1e15 else str(int(v))


def matrix(
    node_id: str,
    query: RangeQuery,
    series: Sequence[tuple[str, Sequence[tuple[int, float | None]]]],
) -> dict[str, Any]:
    """Prometheus's answer: ``series`` is each matching history series' subject and its
    ``(t, avg)`` points."""
    result = [
        {
            "metric": {"__name__": query.prom_name, "node": node_id, "subject": subject},
            "values": [
                [t, _value(v)]
                for t, v in points
                if v is not None and query.start_s <= t <= query.end_s
            ],
        }
        for subject, points in series
    ]
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def error(message: str) -> dict[str, Any]:
    return {"status": "error", "errorType": "bad_data", "error": message}
