"""What the datasheets say a device model is worth to each kind of job, before anything ran.

A job kind leans on compute or on memory bandwidth: training is about half each, inference mostly
bandwidth (decoding reads every weight per token). The relative speed of a model for a kind is a
weighted geometric mean of its effective TFLOPs and its memory bandwidth, both from
``probers/catalog.toml``. Effective TFLOPs damp the tensor-core peak (FP16/BF16) toward the FP32
figure: measured training speedups are far below the ratio of matrix peaks (Gavel measures a V100
at 4x a K80, the datasheets' FP16-vs-FP32 peaks say 28x). A model the catalog lacks has no prior
(``None``): the throughput model then treats it as the fleet's median until jobs report.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Final

from probers.catalog import AcceleratorModel, load_catalog, lookup, model_key

REFERENCE_MODEL: Final = "v100"
"""Work is counted in seconds on one of these (Gavel's reference device)."""

_BANDWIDTH_SHARE: Final = {"training": 0.5, "batch": 0.5, "inference": 0.75}
_TENSOR_DAMPING: Final = 0.25
"""Effective TFLOPs = FP32 x (matrix peak / FP32) ** this."""
CPU_SPEED: Final = 0.02
"""A CPU 'device' relative to the reference GPU (a job that accepts the CPU backend)."""


def _effective_tflops(m: AcceleratorModel) -> float | None:
    matrix = m.bf16_tflops or m.fp16_tflops
    if m.fp32_tflops:
        if matrix and matrix > m.fp32_tflops:
            return float(m.fp32_tflops * (matrix / m.fp32_tflops) ** _TENSOR_DAMPING)
        return m.fp32_tflops
    return matrix


@cache
def catalog_model(name: str) -> AcceleratorModel | None:
    """The catalog entry a device model name (a key, a name or an alias) is, if any."""
    catalog = load_catalog()
    if name in catalog:
        return catalog[name]
    try:
        return lookup(name)
    except KeyError:
        return None


@cache
def catalog_speed(model: str, kind: str) -> float | None:
    """Relative speed of ``model`` for a job ``kind`` (1.0 = the reference model), or ``None``."""
    if model == "cpu":
        return CPU_SPEED
    here, ref = catalog_model(model), catalog_model(REFERENCE_MODEL)
    if here is None or ref is None:
        return None
    share = _BANDWIDTH_SHARE.get(kind, 0.5)
    tf_here, tf_ref = _effective_tflops(here), _effective_tflops(ref)
    bw_here, bw_ref = here.mem_bandwidth_gbps, ref.mem_bandwidth_gbps
    log_speed = 0.0
    if tf_here and tf_ref and bw_here and bw_ref:
        log_speed = (1 - share) * math.log(tf_here / tf_ref) + share * math.log(bw_here / bw_ref)
    elif bw_here and bw_ref:
        log_speed = math.log(bw_here / bw_ref)
    elif tf_here and tf_ref:
        log_speed = math.log(tf_here / tf_ref)
    else:
        return None
    return math.exp(log_speed)


@cache
def catalog_watts(model: str) -> float | None:
    """Board power (TDP) of a model, for performance per watt."""
    m = catalog_model(model)
    return m.tdp_w if m is not None else None


def catalog_key(name: str) -> str:
    """The catalog key of a device name where the catalog knows it, else the name itself."""
    return model_key(name)
