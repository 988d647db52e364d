"""Gavel's measured throughput matrix: steps/s of 26 models on K80, P100 and V100.

Read from ``gavel_throughputs.json`` beside this module (derived from Gavel's own file; see
``SOURCES.txt``). A job whose class is one of Gavel's models (``ResNet-50 (batch size 64)``)
starts from these measured figures instead of the catalog's datasheet estimate, and two such jobs
sharing one GPU slow down by Gavel's space-sharing figures.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Final

WORKER_TYPES: Final = ("v100", "p100", "k80")
SCALES: Final = (1, 2, 4, 8)


@dataclass(frozen=True, slots=True)
class GavelMatrix:
    models: tuple[str, ...]
    isolated: dict[tuple[str, str, int, bool], float]
    """``(model, worker type, GPUs, on one server)`` -> steps/s."""
    shared: dict[tuple[str, str, str], tuple[float, float]]
    """``(model, other model, worker type)`` -> steps/s of each when they share one GPU."""
    mean_share_factor: float
    """Over every measured pair: the fraction of its isolated speed a job keeps when sharing."""

    def steps_per_s(
        self, model: str, worker_type: str, gpus: int = 1, *, consolidated: bool = True
    ) -> float | None:
        return self.isolated.get((model, worker_type, gpus, consolidated))

    def share_factor(self, model: str, other: str, worker_type: str) -> float | None:
        """The fraction of its isolated speed ``model`` keeps beside ``other`` on one GPU."""
        pair = self.shared.get((model, other, worker_type))
        alone = self.isolated.get((model, worker_type, 1, True))
        if pair is None or not alone:
            return None
        return pair[0] / alone


def _parse(doc: dict[str, Any]) -> GavelMatrix:
    models = tuple(str(m) for m in doc["models"])
    isolated: dict[tuple[str, str, int, bool], float] = {}
    shared: dict[tuple[str, str, str], tuple[float, float]] = {}
    factors: list[float] = []
    for wt, table in doc["types"].items():
        for variant, consolidated in (("isolated", True), ("unconsolidated", False)):
            for scale, row in table[variant].items():
                for model, value in zip(models, row, strict=True):
                    if value:
                        isolated[(model, wt, int(scale), consolidated)] = float(value)
        for model, row in zip(models, table["shared"], strict=True):
            for other, pair in zip(models, row, strict=True):
                if pair:
                    shared[(model, other, wt)] = (float(pair[0]), float(pair[1]))
                    alone = isolated.get((model, wt, 1, True))
                    if alone:
                        factors.append(float(pair[0]) / alone)
    mean = sum(factors) / len(factors) if factors else 0.5
    return GavelMatrix(models, isolated, shared, mean)


@cache
def gavel_matrix() -> GavelMatrix:
    """The matrix, read once."""
    text = resources.files("agent.policy").joinpath("gavel_throughputs.json").read_text()
    return _parse(json.loads(text))


def _compact(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def load() -> None:
    """Read the matrix now (an agent does at start, so its first job does not wait for it)."""
    _names()


@cache
def _names() -> dict[str, str]:
    return {_compact(m): m for m in gavel_matrix().models}


def gavel_model(job_class: str) -> str | None:
    """Gavel's name for a job class, ignoring case and punctuation; ``None`` if not Gavel's."""
    if not job_class:
        return None
    return _names().get(_compact(job_class))
