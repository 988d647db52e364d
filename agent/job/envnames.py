"""What a job's ``env`` may name: shell variable names, never the ones Shoal sets.

A rule of the job spec (:mod:`agent.job.jobspec` refuses a spec that breaks it), kept apart from the
code that launches jobs (:mod:`agent.execution.jobenv`, :mod:`agent.execution.pinning`), which
applies the same names.
"""

from __future__ import annotations

import re
from typing import Final

RESERVED_ENV: Final[frozenset[str]] = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "ROCR_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
        "ZE_AFFINITY_MASK",
        "ZE_FLAT_DEVICE_HIERARCHY",
        "ZE_ENABLE_PCI_ID_DEVICE_ORDER",
        "ONEAPI_DEVICE_SELECTOR",
    }
)
"""Variables that choose GPUs (or change what an index means): Shoal's to set, never a job's."""
RESERVED_PREFIX: Final = "SHOAL_"


_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_NAME_CHARS: Final = 256


def env_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a job's variable (one line), or ``None`` when it can."""
    if len(name) > _MAX_NAME_CHARS:
        return f"env: a variable name is at most {_MAX_NAME_CHARS} characters"
    if not _NAME.fullmatch(name):
        return (
            f"env: {name!r} is not a variable name (letters, digits and _, not starting with "
            "a digit)"
        )
    return None


def reserved_env(name: str) -> str | None:
    """Why a job may not set ``name`` (a one-line reason), or ``None`` when it may.

    Compared case-insensitively: Windows environments are, and a spec may run anywhere.
    """
    upper = name.upper()
    if upper in RESERVED_ENV or upper.startswith(RESERVED_PREFIX):
        return f"env {name} is set by Shoal"
    return None
