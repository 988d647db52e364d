"""How fast jobs really run in the simulator: Gavel's measured matrix (its "oracle throughputs"),
extended to other device models by the catalog; optionally off by a seeded random factor per job
class and device model (``--truth-noise``), which the policies' throughput model must then learn
from the rates jobs report."""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Sequence

from agent.policy.model import ThroughputModel


class Truth:
    def __init__(self, noise: float = 0.0, seed: int = 0) -> None:
        self._model = ThroughputModel()
        self._noise = noise
        self._seed = seed
        self._cache: dict[tuple[str, str, int, bool], float] = {}

    def _bias(self, job_class: str, model: str) -> float:
        if not self._noise:
            return 1.0
        rng = random.Random(zlib.crc32(f"{self._seed}/{job_class}/{model}".encode()))
        return math.exp(rng.gauss(0.0, self._noise))

    def rate(self, job_class: str, model: str, gpus: int, consolidated: bool = True) -> float:
        """Steps per second of ``job_class`` on ``gpus`` GPUs of ``model``."""
        key = (job_class, model, gpus, consolidated)
        held = self._cache.get(key)
        if held is None:
            est = self._model.speed(job_class, "training", model, gpus, consolidated=consolidated)
            held = self._cache[key] = est.value * self._bias(job_class, model)
        return held

    def share_factor(self, job_class: str, others: Sequence[str], model: str) -> float:
        return self._model.share_factor(job_class, others, model)
