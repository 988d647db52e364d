"""Vivaldi network coordinates, as Serf's ``coordinate`` package computes them.

Each node keeps a point in 8-dimensional Euclidean space plus a height (the access-link latency
that no direction explains) and an adjustment (the mean recent error, Serf's window of 20). Every
probe RTT pulls the node's own point toward or away from the peer's; gravity toward the origin
keeps the whole cloud from drifting. The distance between two coordinates estimates their RTT.
"""

from __future__ import annotations

import math
import random
import struct
from dataclasses import dataclass, field
from operator import sub

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
    """One node's coordinate, the state that updates it, and what it learned of each peer."""

    config: VivaldiConfig
    rng: random.Random
    coord: Coordinate = field(init=False)
    _origin: Coordinate = field(init=False)
    _adjust: list[float] = field(init=False)
    _adjust_idx: int = 0
    _peers: dict[str, bytes] = field(default_factory=dict)
    """Per peer measured: its last coordinate and our last few RTT samples to it, packed as
    doubles (``_layout``). A 1,000-node mesh keeps ~1,000 of these on every node, so one flat
    bytes object each, not a coordinate, a tuple and a dozen floats."""
    _measured: set[str] = field(default_factory=set)
    """The peers of ``_peers`` with RTT samples: those this node probes (a few, whatever N)."""
    _layout: struct.Struct = field(init=False)
    """vec, error, adjustment, height, the number of samples, the samples (zero-padded)."""
    _window: struct.Struct = field(init=False)
    """The number of samples and the samples: the tail of ``_layout``."""

    def __post_init__(self) -> None:
        self._origin = origin(self.config)
        self.coord = self._origin
        self._adjust = [0.0] * self.config.adjustment_window
        cfg = self.config
        self._layout = struct.Struct(f"<{cfg.dimensionality + 4 + cfg.latency_filter_size}d")
        self._window = struct.Struct(f"<{1 + cfg.latency_filter_size}d")

    def forget(self, node: str) -> None:
        """Drop our RTT samples to ``node`` (it died); its coordinate stays until :meth:`drop`."""
        rec = self._peers.get(node)
        if rec is not None:
            self._peers[node] = self._pack(self._unpack(rec), ())
        self._measured.discard(node)

    def drop(self, node: str) -> None:
        """Forget everything about ``node``."""
        self._peers.pop(node, None)
        self._measured.discard(node)

    def measured(self) -> frozenset[str]:
        """The peers with RTT samples (those probed lately): a few, whatever the mesh's size."""
        return frozenset(self._measured)

    def coordinate_of(self, node: str) -> Coordinate | None:
        """The last valid coordinate ``node`` reported to us, if any."""
        rec = self._peers.get(node)
        return None if rec is None else self._unpack(rec)

    def measured_rtt_s(self, node: str) -> float | None:
        """The median of the recent measured probe RTTs to ``node`` (what its coordinate is
        fitted to), ``None`` before the first."""
        rec = self._peers.get(node)
        window = () if rec is None else self._samples(rec)
        return sorted(window)[len(window) // 2] if window else None

    def _pack(self, c: Coordinate, samples: tuple[float, ...]) -> bytes:
        pad = (0.0,) * (self.config.latency_filter_size - len(samples))
        return self._layout.pack(
            *c.vec, c.error, c.adjustment_s, c.height_s, float(len(samples)), *samples, *pad
        )

    def _unpack(self, rec: bytes) -> Coordinate:
        dim = self.config.dimensionality
        f = self._layout.unpack(rec)
        return Coordinate(f[:dim], f[dim], f[dim + 1], f[dim + 2])

    def _samples(self, rec: bytes) -> tuple[float, ...]:
        f = self._window.unpack_from(rec, 8 * (self.config.dimensionality + 3))
        return f[1 : 1 + int(f[0])]

    def update(self, node: str, other: Coordinate, rtt_s: float) -> None:
        """Fold one RTT sample to ``node`` (at ``other``) into our coordinate."""
        cfg = self.config
        ov = other.vec
        if len(ov) != cfg.dimensionality or not other.is_valid():
            return
        rec = self._peers.get(node)
        window = () if rec is None else self._samples(rec)
        if not (0.0 < rtt_s <= 10.0):
            self._peers[node] = self._pack(other, window)
            return
        window = (*window, rtt_s)[-cfg.latency_filter_size :]
        self._peers[node] = self._pack(other, window)
        self._measured.add(node)
        rtt = sorted(window)[len(window) // 2]
        if rtt < _ZERO:
            rtt = _ZERO
        c = self.coord
        v = c.vec
        height, error = c.height_s, c.error
        oh = other.height_s
        height_min = cfg.height_min_s
        # Vivaldi step (Serf's updateVivaldi)
        mag = math.dist(v, ov)
        raw = mag + height + oh
        adjusted = raw + c.adjustment_s + other.adjustment_s
        dist = adjusted if adjusted > 0.0 else raw
        wrongness = abs(dist - rtt) / rtt
        total_error = error + other.error
        weight = error / (total_error if total_error > _ZERO else _ZERO)
        ce_weight = cfg.ce * weight
        error = ce_weight * wrongness + error * (1.0 - ce_weight)
        if error > cfg.error_max:
            error = cfg.error_max
        force = cfg.cc * weight * (rtt - dist)
        if mag > _ZERO:  # move along v - ov: v + (v - ov) * force / |v - ov|
            k = force / mag
            vec = [a + (a - b) * k for a, b in zip(v, ov, strict=True)]
            height = (height + oh) * k + height
            if height < height_min:
                height = height_min
            moved = mag * abs(1.0 + k)  # |vec - ov|: vec - ov is (v - ov) * (1 + k)
        else:
            vec = list(v)
            height = self._push(vec, list(map(sub, v, ov)), mag, height, force, oh)
            moved = math.dist(vec, ov)
        # adjustment window (Serf's updateAdjustment)
        adjustment = c.adjustment_s
        if cfg.adjustment_window:
            self._adjust[self._adjust_idx] = rtt - (moved + height + oh)
            self._adjust_idx = (self._adjust_idx + 1) % cfg.adjustment_window
            adjustment = sum(self._adjust) / (2.0 * cfg.adjustment_window)
        # gravity toward the origin (Serf's updateGravity); the origin's vec is all zeros
        o = self._origin
        mag = math.hypot(*vec)
        raw = mag + height + o.height_s
        adjusted = raw + adjustment + o.adjustment_s
        dist = adjusted if adjusted > 0.0 else raw
        force = -((dist / cfg.gravity_rho) ** 2)
        if mag > _ZERO:
            k = force / mag
            new = tuple([a + a * k for a in vec])
            height = (height + o.height_s) * k + height
            if height < height_min:
                height = height_min
        else:
            height = self._push(vec, vec[:], mag, height, force, o.height_s)
            new = tuple(vec)
        if math.isfinite(sum(new) + error + adjustment + height):  # Coordinate.is_valid
            self.coord = Coordinate(new, error, adjustment, height)
        else:
            self.coord = self._origin

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
