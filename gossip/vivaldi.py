"""Vivaldi network coordinates, as Serf's ``coordinate`` package computes them.

Each node keeps a point in 8-dimensional Euclidean space plus a height (the access-link latency
that no direction explains) and an adjustment (the mean recent error, Serf's window of 20). Every
probe RTT pulls the node's own point toward or away from the peer's; gravity toward the origin
keeps the whole cloud from drifting. The distance between two coordinates estimates their RTT.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

_ZERO = 1.0e-6


@dataclass(frozen=True, slots=True)
class Coordinate:
    """A Vivaldi position: ``vec`` and ``height_s`` in seconds, ``error`` unitless (<= 1.5)."""

    vec: tuple[float, ...]
    error: float
    adjustment_s: float
    height_s: float

    def is_valid(self) -> bool:
        # a sum is finite only if every term is (inf - inf is nan, also not finite)
        return math.isfinite(sum(self.vec) + self.error + self.adjustment_s + self.height_s)

    def raw_distance_s(self, other: Coordinate) -> float:
        return math.dist(self.vec, other.vec) + self.height_s + other.height_s

    def distance_s(self, other: Coordinate) -> float:
        """Estimated RTT in seconds (Serf's ``DistanceTo``)."""
        dist = self.raw_distance_s(other)
        adjusted = dist + self.adjustment_s + other.adjustment_s
        return adjusted if adjusted > 0.0 else dist


@dataclass(frozen=True, slots=True)
class VivaldiConfig:
    """Serf's ``DefaultConfig`` values."""

    dimensionality: int = 8
    error_max: float = 1.5
    ce: float = 0.25
    cc: float = 0.25
    adjustment_window: int = 20
    height_min_s: float = 10.0e-6
    latency_filter_size: int = 3
    gravity_rho: float = 150.0


def origin(config: VivaldiConfig) -> Coordinate:
    return Coordinate((0.0,) * config.dimensionality, config.error_max, 0.0, config.height_min_s)


@dataclass(slots=True)
class VivaldiClient:
    """One node's coordinate and the state that updates it."""

    config: VivaldiConfig
    rng: random.Random
    coord: Coordinate = field(init=False)
    _origin: Coordinate = field(init=False)
    _adjust: list[float] = field(init=False)
    _adjust_idx: int = 0
    _filters: dict[str, tuple[float, ...]] = field(default_factory=dict)
    """The last few RTT samples per peer (a tuple: a 1,000-node mesh keeps 1,000 of these)."""

    def __post_init__(self) -> None:
        self._origin = origin(self.config)
        self.coord = self._origin
        self._adjust = [0.0] * self.config.adjustment_window

    def forget(self, node: str) -> None:
        self._filters.pop(node, None)

    def update(self, node: str, other: Coordinate, rtt_s: float) -> None:
        """Fold one RTT sample to ``node`` (at ``other``) into our coordinate."""
        cfg = self.config
        if len(other.vec) != cfg.dimensionality or not other.is_valid():
            return
        if not (0.0 < rtt_s <= 10.0):
            return
        window = (*self._filters.get(node, ()), rtt_s)[-cfg.latency_filter_size :]
        self._filters[node] = window
        rtt = max(sorted(window)[len(window) // 2], _ZERO)
        c = self.coord
        vec = list(c.vec)
        height, error = c.height_s, c.error
        ov, oh = other.vec, other.height_s
        # Vivaldi step (Serf's updateVivaldi)
        diff = [a - b for a, b in zip(vec, ov, strict=True)]
        mag = math.hypot(*diff)
        raw = mag + height + oh
        adjusted = raw + c.adjustment_s + other.adjustment_s
        dist = adjusted if adjusted > 0.0 else raw
        wrongness = abs(dist - rtt) / rtt
        weight = error / max(error + other.error, _ZERO)
        error = min(cfg.ce * weight * wrongness + error * (1.0 - cfg.ce * weight), cfg.error_max)
        height = self._push(vec, diff, mag, height, cfg.cc * weight * (rtt - dist), oh)
        # adjustment window (Serf's updateAdjustment)
        adjustment = c.adjustment_s
        if cfg.adjustment_window:
            raw = math.dist(vec, ov) + height + oh
            self._adjust[self._adjust_idx] = rtt - raw
            self._adjust_idx = (self._adjust_idx + 1) % cfg.adjustment_window
            adjustment = sum(self._adjust) / (2.0 * cfg.adjustment_window)
        # gravity toward the origin (Serf's updateGravity); the origin's vec is all zeros
        o = self._origin
        mag = math.hypot(*vec)
        raw = mag + height + o.height_s
        adjusted = raw + adjustment + o.adjustment_s
        dist = adjusted if adjusted > 0.0 else raw
        height = self._push(vec, vec[:], mag, height, -((dist / cfg.gravity_rho) ** 2), o.height_s)
        new = Coordinate(tuple(vec), error, adjustment, height)
        self.coord = new if new.is_valid() else self._origin

    def _push(
        self,
        vec: list[float],
        diff: list[float],
        mag: float,
        height: float,
        force: float,
        other_height_s: float,
    ) -> float:
        """Move ``vec`` (in place) by ``force`` along ``diff`` (``vec`` minus the other point,
        of length ``mag``); return the new height."""
        if mag > _ZERO:
            k = force / mag
            for i, d in enumerate(diff):
                vec[i] += d * k
            return max((height + other_height_s) * k + height, self.config.height_min_s)
        rnd = [self.rng.random() - 0.5 for _ in diff]
        rmag = math.hypot(*rnd)
        if rmag <= _ZERO:
            rnd, rmag = [1.0] + [0.0] * (len(diff) - 1), 1.0
        for i, d in enumerate(rnd):
            vec[i] += d / rmag * force
        return height
