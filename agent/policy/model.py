"""The throughput model: how fast a job class runs on a device model, and how much work a job is.

Speeds start from what is known before anything ran and are refined by what jobs report:

- Gavel's measured matrix (:mod:`agent.policy.gavel`) where the job class is one of its models and
  the device one of its worker types (V100, P100, K80), at 1, 2, 4 or 8 GPUs, on one server or
  spread over several;
- otherwise the catalog's datasheet figures for the job's kind (:mod:`agent.policy.prior`),
  anchored on whatever is measured for the class on other models;
- online, the rates running jobs report (:meth:`ThroughputModel.observe`), per job class x device
  model x GPU count, in log space, robust to outliers (a report far from the estimate moves it by
  a clipped amount, as a Huber estimator does) and decaying (old reports lose half their weight
  every ``half_life_s``).

A rate is in the job class's own units (steps/s, samples/s); what the policy uses is the ratio of
two speeds of one class, so units never mix. Work is counted in *reference seconds*: the time the
job would take on the reference model (:data:`REFERENCE_MODEL`) with its own GPU count. Before a
job runs its work is unknown; the model keeps the distribution of the work of the jobs of its class
that finished (lognormal, decaying) and answers with p50 and p90. Nothing here reads a clock:
``now`` is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from agent.policy.gavel import WORKER_TYPES, gavel_matrix, gavel_model
from agent.policy.prior import REFERENCE_MODEL, catalog_speed

Z90: Final = 1.2816
"""The standard normal's 90th percentile."""


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """How the throughput model weighs what it learns."""

    half_life_s: float = 7 * 86400.0
    """Reports lose half their weight in this long (hardware and software change)."""
    clip_sd: float = 2.5
    """A report further than this many deviations from the estimate counts as this far."""
    floor_sd: float = 0.05
    """The least deviation assumed (log space), so a few equal reports do not freeze it."""
    gavel_weight: float = 3.0
    """Gavel's measured figure counts as this many reports."""
    prior_work_p50_s: float = 3600.0
    prior_work_p90_s: float = 8 * 3600.0
    """Work of a job of a class never seen finishing, in reference seconds."""
    prior_work_weight: float = 1.0
    scale_efficiency: float = 0.9
    """Each doubling of GPUs, absent a measurement, keeps this fraction of linear speedup."""
    spread_factor: float = 0.8
    """A job spread over servers, absent a measurement, keeps this fraction of its speed."""


@dataclass(slots=True)
class _Stat:
    """Decayed weighted mean and variance of a log quantity."""

    mean: float
    var: float
    weight: float
    at: float

    def add(self, x: float, now: float, cfg: ModelConfig, *, robust: bool) -> None:
        dt = max(0.0, now - self.at)
        w = self.weight * 0.5 ** (dt / cfg.half_life_s)
        r = x - self.mean
        if robust and w >= 2.0:
            bound = cfg.clip_sd * max(math.sqrt(self.var), cfg.floor_sd)
            r = max(-bound, min(bound, r))
        total = w + 1.0
        self.mean += r / total
        self.var = (w / total) * (self.var + r * r / total)
        self.weight = total
        self.at = max(self.at, now)

    @property
    def sd(self) -> float:
        return math.sqrt(self.var)


@dataclass(frozen=True, slots=True)
class Estimate:
    """A speed (class units per second) and its uncertainty as a relative standard deviation."""

    value: float
    rel_sd: float
    source: str
    """``measured`` (Gavel), ``learned``, ``extrapolated``, ``catalog`` or ``unknown``."""


class ThroughputModel:
    """Speeds of job classes on device models, learned online. See the module doc."""

    def __init__(self, config: ModelConfig | None = None) -> None:
        self.config = config or ModelConfig()
        self._rates: dict[tuple[str, str, int], _Stat] = {}
        self._classes_seen: dict[str, set[tuple[str, int]]] = {}
        self._work: dict[str, _Stat] = {}
        self._version: dict[str, int] = {}
        self._cache: dict[tuple[str, str, str, int, bool], tuple[int, Estimate]] = {}

    # -- learning --------------------------------------------------------------------------------

    def observe(self, job_class: str, model: str, gpus: int, rate: float, now: float) -> None:
        """A job of ``job_class`` ran at ``rate`` (its own units per second) on ``gpus`` GPUs
        of ``model``. Non-positive or non-finite rates are ignored."""
        if not rate > 0.0 or not math.isfinite(rate):
            return
        key = (job_class, model, gpus)
        stat = self._rates.get(key)
        x = math.log(rate)
        if stat is None:
            self._rates[key] = _Stat(x, self.config.floor_sd**2, 1.0, now)
        else:
            stat.add(x, now, self.config, robust=True)
        self._classes_seen.setdefault(job_class, set()).add((model, gpus))
        self._version[job_class] = self._version.get(job_class, 0) + 1

    def observe_work(self, job_class: str, work_ref_s: float, now: float) -> None:
        """A job of ``job_class`` finished after ``work_ref_s`` reference seconds of work."""
        if not work_ref_s > 0.0 or not math.isfinite(work_ref_s):
            return
        x = math.log(work_ref_s)
        for key in (job_class, ""):
            stat = self._work.get(key)
            if stat is None:
                self._work[key] = _Stat(x, 0.0, 1.0, now)
            else:
                stat.add(x, now, self.config, robust=False)

    # -- speeds ----------------------------------------------------------------------------------

    def speed(
        self, job_class: str, kind: str, model: str, gpus: int = 1, *, consolidated: bool = True
    ) -> Estimate:
        """Expected speed of ``job_class`` on ``gpus`` GPUs of ``model`` (see the module doc)."""
        key = (job_class, kind, model, gpus, consolidated)
        version = self._version.get(job_class, 0)
        held = self._cache.get(key)
        if held is not None and held[0] == version:
            return held[1]
        estimate = self._speed(job_class, kind, model, gpus, consolidated)
        if len(self._cache) > 50_000:
            self._cache.clear()
        self._cache[key] = (version, estimate)
        return estimate

    def class_version(self, job_class: str) -> int:
        """Changes whenever what is known of ``job_class`` changes (for callers' caches)."""
        return self._version.get(job_class, 0)

    def relative(
        self, job_class: str, kind: str, model: str, gpus: int = 1, *, consolidated: bool = True
    ) -> float:
        """Speed on ``model`` over speed on the reference model, same class and GPU count: the
        reference seconds one second on ``model`` does."""
        here = self.speed(job_class, kind, model, gpus, consolidated=consolidated).value
        ref = self.speed(job_class, kind, REFERENCE_MODEL, gpus).value
        return here / ref if ref > 0 else 1.0

    def _direct(self, job_class: str, model: str, gpus: int, consolidated: bool) -> _Stat | None:
        """What is measured or learned for exactly this class, model and GPU count."""
        parts: list[tuple[float, float, float]] = []  # (log value, weight, var)
        name = gavel_model(job_class)
        if name is not None and model in WORKER_TYPES:
            v = gavel_matrix().steps_per_s(name, model, gpus, consolidated=consolidated)
            if v:
                parts.append((math.log(v), self.config.gavel_weight, 0.0025))
        if consolidated:
            stat = self._rates.get((job_class, model, gpus))
            if stat is not None:
                parts.append((stat.mean, stat.weight, stat.var))
        if not parts:
            return None
        total = sum(w for _, w, _ in parts)
        mean = sum(x * w for x, w, _ in parts) / total
        var = sum(w * (v + (x - mean) ** 2) for x, w, v in parts) / total
        return _Stat(mean, var, total, 0.0)

    def _anchor_models(self, job_class: str, gpus: int) -> list[str]:
        models = {m for m, g in self._classes_seen.get(job_class, ()) if g == gpus}
        if gavel_model(job_class) is not None:
            models.update(WORKER_TYPES)
        return sorted(models)

    def _speed(
        self, job_class: str, kind: str, model: str, gpus: int, consolidated: bool
    ) -> Estimate:
        direct = self._direct(job_class, model, gpus, consolidated)
        if direct is not None:
            learned = (job_class, model, gpus) in self._rates
            sd = max(direct.sd, self.config.floor_sd) / math.sqrt(max(direct.weight, 1.0))
            return Estimate(math.exp(direct.mean), sd, "learned" if learned else "measured")
        anchors = []
        here_cat = catalog_speed(model, kind)
        for other in self._anchor_models(job_class, gpus):
            if other == model:
                continue
            stat = self._direct(job_class, other, gpus, True)
            if stat is None:
                continue
            other_cat = catalog_speed(other, kind)
            if here_cat is not None and other_cat is not None:
                gap = math.log(here_cat / other_cat)
                anchors.append((stat.mean + gap, 1.0 / (1.0 + abs(gap))))
            else:
                anchors.append((stat.mean, 0.5))
        if anchors:
            total = sum(w for _, w in anchors)
            log_v = sum(x * w for x, w in anchors) / total
            if not consolidated:
                log_v += math.log(self.config.spread_factor)
            return Estimate(math.exp(log_v), 0.3, "extrapolated")
        if gpus > 1:
            one = self._speed(job_class, kind, model, 1, True)
            scaled = one.value * gpus * self.config.scale_efficiency ** math.log2(gpus)
            if not consolidated:
                scaled *= self.config.spread_factor
            return Estimate(scaled, one.rel_sd + 0.1, one.source)
        if here_cat is not None:
            return Estimate(here_cat, 0.5, "catalog")
        return Estimate(1.0, 0.8, "unknown")

    # -- sharing ---------------------------------------------------------------------------------

    def share_factor(self, job_class: str, others: Sequence[str], model: str) -> float:
        """The fraction of its isolated speed a job keeps beside ``others`` on one GPU."""
        if not others:
            return 1.0
        matrix = gavel_matrix()
        name = gavel_model(job_class)
        factor = 1.0
        for other in others:
            other_name = gavel_model(other)
            pair = None
            if name is not None and other_name is not None and model in WORKER_TYPES:
                pair = matrix.share_factor(name, other_name, model)
            factor *= pair if pair is not None else matrix.mean_share_factor
        return max(factor, 1.0 / (len(others) + 1))

    # -- work ------------------------------------------------------------------------------------

    def work_ref_s(self, job_class: str) -> tuple[float, float]:
        """p50 and p90 of a job's work in reference seconds, from the jobs of its class that
        finished (every class's, while its own have too few), blended with the prior."""
        cfg = self.config
        prior_mean = math.log(cfg.prior_work_p50_s)
        prior_sd = (math.log(cfg.prior_work_p90_s) - prior_mean) / Z90
        stat = self._work.get(job_class)
        if stat is None or stat.weight < 3.0:
            stat = self._work.get("")
        if stat is None:
            return cfg.prior_work_p50_s, cfg.prior_work_p90_s
        w0 = cfg.prior_work_weight
        total = w0 + stat.weight
        mean = (prior_mean * w0 + stat.mean * stat.weight) / total
        var = (w0 * (prior_sd**2 + (prior_mean - mean) ** 2)) / total + (
            stat.weight * (stat.var + (stat.mean - mean) ** 2)
        ) / total
        sd = math.sqrt(var)
        return math.exp(mean), math.exp(mean + Z90 * sd)
