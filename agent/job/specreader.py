"""The job spec's strict reader: a :class:`~agent.job.jobspec.JobSpec` from its wire form, a TOML
job file, or the human forms ``shoal submit`` takes.

It refuses unknown keys, wrong types, negative numbers and a feature this version does not know
(:class:`~agent.job.jobspec.UnknownFeatures`) with a one-line ``ValueError`` that names the field;
where a field holds bytes or seconds, the human forms also take a size (``"40GiB"``) or a duration
(``"2h"``: ``agent.job.units``).
"""

from __future__ import annotations

import datetime as _dt
import math
import re
import tomllib
from collections.abc import Mapping
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any, Final, cast

from agent.common.parsing import toml_loads
from agent.job.envnames import env_name_problem, reserved_env
from agent.job.jobspec import (
    BACKENDS,
    CHECKPOINT_SIGNALS,
    INTERCONNECTS,
    JOB_KINDS,
    BackendName,
    InterconnectKind,
    JobKind,
    JobSpec,
    PythonEnv,
    Resources,
    check_declared,
)
from agent.job.units import parse_duration, parse_size
from agent.wire.codec import integer as wire_integer
from agent.wire.place import dataset_ref_problem


def spec_from_mapping(data: Mapping[str, Any], *, human: bool, now: float | None) -> JobSpec:
    """Validate and build a :class:`JobSpec` from the wire keys (``human``: with the human forms
    of a job file too; ``now`` anchors a relative deadline)."""
    if not isinstance(data, Mapping):
        raise ValueError(f"job spec must be a table/object, got {type(data).__name__}")
    check_declared(data)
    r = _Reader(data, "")
    declared = r.str_tuple("features")
    r.get("spec_version")
    command = r.str_tuple("command")
    if not command:
        raise ValueError("command: must be a non-empty list of strings")
    resources_raw = r.get("resources", {})
    if not isinstance(resources_raw, Mapping):
        raise ValueError("resources: must be a table/object")
    max_runtime = r.get("max_runtime_s")
    if human and isinstance(max_runtime, str):
        max_runtime_s: float | None = _duration_field(max_runtime, "max_runtime_s")
    else:
        max_runtime_s = r.opt_float("max_runtime_s")
    if max_runtime_s is not None and max_runtime_s <= 0:
        raise ValueError("max_runtime_s: must be positive")
    deadline = _deadline(r, human=human, now=now)
    signal_name = r.str_("checkpoint_signal", "SIGTERM").upper()
    if not signal_name.startswith("SIG"):
        signal_name = "SIG" + signal_name
    if signal_name not in CHECKPOINT_SIGNALS:
        raise ValueError(
            f"checkpoint_signal: {signal_name} is not one of {', '.join(CHECKPOINT_SIGNALS)}"
        )
    env = r.str_map("env")
    for name in env:
        reason = env_name_problem(name) or reserved_env(name)
        if reason is not None:
            raise ValueError(reason)
    spec = JobSpec(
        command=command,
        env=env,
        workdir=r.path("workdir"),
        image=r.opt_str("image"),
        workdir_digest=r.opt_str("workdir_digest"),
        python_env=_python_env(r.get("python_env")),
        resources=resources_from_mapping(resources_raw, human=human),
        kind=cast(JobKind, r.choice("kind", JOB_KINDS, "batch")),
        priority=r.int_("priority", 0, least=None),
        preemptible=r.bool_("preemptible", False),
        deadline=deadline,
        max_runtime_s=max_runtime_s,
        datasets=r.datasets("datasets"),
        labels=r.str_map("labels"),
        affinity=r.str_map("affinity"),
        anti_affinity=r.str_map("anti_affinity"),
        checkpoint_dir=r.path("checkpoint_dir"),
        checkpoint_signal=signal_name,
        retries=r.int_("retries", 0),
    )
    r.done()
    if "features" in data and tuple(sorted(declared)) != spec.features:
        raise ValueError(
            f"features: the spec declares {list(declared)} but uses {list(spec.features)}"
        )
    return spec


def _python_env(value: Any) -> PythonEnv | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or len(value) != 1:
        raise ValueError('python_env: must be {lock = "FILE"} or {requirements = "FILE"}')
    ((kind, file),) = value.items()
    if kind not in ("lock", "requirements") or not isinstance(file, str):
        raise ValueError('python_env: must be {lock = "FILE"} or {requirements = "FILE"}')
    return PythonEnv(kind, file)


def spec_from_toml(text: str, *, now: float | None) -> JobSpec:
    """Build a :class:`JobSpec` from a TOML job file (the wire keys, with their human forms)."""
    try:
        data = toml_loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"job file is not valid TOML: {exc}") from None
    return spec_from_mapping(data, human=True, now=now)


def resources_from_mapping(data: Mapping[str, Any], *, human: bool) -> Resources:
    """Build :class:`Resources` from the wire form; ``human`` also accepts a size string for
    memory, ``gpus`` for ``gpus_per_node``, and a fraction of one GPU there (``0.5``: a share)."""
    if human:
        data = _human_gpus(data)
    r = _Reader(data, "resources")
    mem_bytes = r.opt_size("min_mem_per_gpu_bytes", human=human)
    if mem_bytes is not None and mem_bytes < 0:
        raise ValueError("resources.min_mem_per_gpu_bytes: must not be negative")
    backends = cast(tuple[BackendName, ...], r.choices("backends", BACKENDS))
    fraction, share_mem = _share(r, human=human)
    share = fraction is not None or share_mem is not None
    per_gpu = (
        mem_bytes is not None
        or any(b != "cpu" for b in backends)
        or data.get("min_compute_capability") is not None
        or bool(data.get("archs"))
    )
    out = Resources(
        gpus_per_node=r.int_("gpus_per_node", 1 if per_gpu or share else 0),
        nodes=r.int_("nodes", 1, least=1),
        min_mem_per_gpu_bytes=mem_bytes,
        backends=backends,
        min_compute_capability=_compute_capability(r.opt_str("min_compute_capability")),
        archs=r.str_tuple("archs"),
        interconnect=cast(InterconnectKind | None, r.opt_choice("interconnect", INTERCONNECTS)),
        os=_os_name(r.opt_str("os")),
        share_fraction=fraction,
        share_mem_bytes=share_mem,
        gpus_max_per_node=r.opt_int("gpus_max_per_node"),
    )
    r.done()
    _check_range(out)
    if share and out.gpus_per_node != 1:
        raise ValueError("resources.gpus_per_node: a share is of one GPU")
    if share and out.nodes != 1:
        raise ValueError("resources.nodes: a share of a GPU runs on one node")
    return out


def _deadline(r: _Reader, *, human: bool, now: float | None) -> float | None:
    raw = r.get("deadline")
    if human and isinstance(raw, _dt.datetime):
        if raw.tzinfo is None:
            raise ValueError("deadline: a date-time needs a UTC offset (e.g. 2025-01-31T18:00Z)")
        return raw.timestamp()
    if human and isinstance(raw, str):
        if now is None:
            import time

            now = time.time()
        return now + _duration_field(raw, "deadline")
    value = r.opt_float("deadline")
    if value is not None and value < 0:
        raise ValueError("deadline: must not be negative")
    return value


def _size_field(text: str, name: str) -> int:
    try:
        size = parse_size(text)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    return wire_integer(size, name)


def _duration_field(text: str, name: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def _human_gpus(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """A job file's ``gpus`` (short for ``gpus_per_node``) and a fraction of one GPU there."""
    out = dict(data)
    if "gpus" in out:
        if "gpus_per_node" in out:
            raise ValueError("resources: give gpus or gpus_per_node, not both")
        out["gpus_per_node"] = out.pop("gpus")
    gpus = out.get("gpus_per_node")
    if isinstance(gpus, str):
        if out.get("gpus_max_per_node") is not None:
            raise ValueError("resources: a range in gpus and gpus_max_per_node both")
        out["gpus_per_node"], most = _gpu_range(gpus)
        if most is not None:
            out["gpus_max_per_node"] = most
    elif isinstance(gpus, float) and not isinstance(gpus, bool):
        if gpus.is_integer():
            out["gpus_per_node"] = int(gpus)
        elif 0 < gpus < 1:
            if out.get("share_fraction") is not None:
                raise ValueError("resources: a fraction of a GPU in gpus and share_fraction both")
            out["gpus_per_node"], out["share_fraction"] = 1, gpus
        else:
            raise ValueError(
                f"resources.gpus_per_node: {gpus:g} is neither a whole number of GPUs nor a"
                " share of one (between 0 and 1)"
            )
    return out


_RANGE_RE: Final = re.compile(r"\s*(\d+)\s*-\s*(\d+)\s*")


def _gpu_range(text: str) -> tuple[int, int | None]:
    """``gpus = "2-8"`` (an elastic job: fewest, most) or ``"4"``."""
    if text.strip().isdigit():
        return int(text), None
    match = _RANGE_RE.fullmatch(text)
    if match is None:
        raise ValueError(
            f"resources.gpus_per_node: {text[:40]!r} is neither a number of GPUs nor a range"
            " such as 2-8"
        )
    return int(match[1]), int(match[2])


def _check_range(r: Resources) -> None:
    """Refuse an elastic range that cannot be run, in one line."""
    most = r.gpus_max_per_node
    if most is None:
        return
    if r.gpus_per_node < 1:
        raise ValueError("resources.gpus_per_node: an elastic job needs at least 1 GPU")
    if most <= r.gpus_per_node:
        raise ValueError(
            f"resources.gpus_max_per_node: {most} is not more than gpus_per_node"
            f" {r.gpus_per_node} (a range runs between the two)"
        )
    if r.nodes != 1:
        raise ValueError("resources.nodes: an elastic job (a range of GPUs) runs on one node")
    if r.is_share:
        raise ValueError("resources: a range of GPUs is of whole GPUs, not a share of one")


def _share(r: _Reader, *, human: bool) -> tuple[float | None, int | None]:
    """A share's fraction of a GPU and its memory (``human``: a size string for memory)."""
    fraction = r.opt_float("share_fraction")
    if fraction is not None and not 0 < fraction < 1:
        raise ValueError(f"resources.share_fraction: must be between 0 and 1, not {fraction:g}")
    mem_bytes = r.opt_size("share_mem_bytes", human=human)
    if mem_bytes is not None and mem_bytes <= 0:
        raise ValueError("resources.share_mem_bytes: must be positive")
    if fraction is not None and mem_bytes is not None:
        raise ValueError(
            "resources: a share is a fraction of a GPU or an amount of its memory, not both"
        )
    return fraction, mem_bytes


def _os_name(value: str | None) -> str | None:
    if value is not None and not re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", value.lower()):
        raise ValueError(f"resources.os: expected an OS name such as linux, got {value[:40]!r}")
    return None if value is None else value.lower()


def _compute_capability(value: str | None) -> str | None:
    if value is not None and not re.fullmatch(r"\d+\.\d+", value):
        raise ValueError(f"resources.min_compute_capability: expected MAJOR.MINOR, got {value!r}")
    return value


_MISSING: Final = object()


class _Reader:
    """Typed, named access to one mapping that remembers which keys were read."""

    def __init__(self, data: Mapping[str, Any], prefix: str) -> None:
        self._data = data
        self._prefix = f"{prefix}." if prefix else ""
        self._seen: set[str] = set()

    def name(self, key: str) -> str:
        return self._prefix + key

    def get(self, key: str, default: Any = None) -> Any:
        self._seen.add(key)
        return self._data.get(key, default)

    def done(self) -> None:
        unknown = sorted(str(k) for k in self._data if k not in self._seen)
        if unknown:
            raise ValueError(f"unknown key {self.name(unknown[0])!r}")

    def _type_error(self, key: str, what: str, value: Any) -> ValueError:
        return ValueError(f"{self.name(key)}: expected {what}, got {type(value).__name__}")

    def int_(self, key: str, default: int, *, least: int | None = 0) -> int:
        value = wire_integer(self.get(key, default), self.name(key))
        if least is not None and value < least:
            word = "negative" if least == 0 else f"less than {least}"
            raise ValueError(f"{self.name(key)}: must not be {word}")
        return value

    def opt_int(self, key: str) -> int | None:
        value = self.get(key)
        if value is None:
            return None
        return wire_integer(value, self.name(key))

    def opt_size(self, key: str, *, human: bool) -> int | None:
        """Bytes; ``human`` also takes a size string (``"40GiB"``)."""
        value = self.get(key)
        if human and isinstance(value, str):
            return _size_field(value, self.name(key))
        return self.opt_int(key)

    def opt_float(self, key: str) -> float | None:
        value = self.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._type_error(key, "a number", value)
        if not math.isfinite(value):
            raise ValueError(f"{self.name(key)}: must be a finite number, not {value}")
        return float(value)

    def bool_(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise self._type_error(key, "true or false", value)
        return value

    def _text(self, key: str, value: str) -> str:
        """``value``, refused when no argv, path, environment or UTF-8 record can carry it."""
        if "\x00" in value:
            raise ValueError(f"{self.name(key)}: a NUL character is not allowed")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{self.name(key)}: not valid Unicode (a lone surrogate)") from None
        return value

    def str_(self, key: str, default: str) -> str:
        value = self.get(key, default)
        if not isinstance(value, str):
            raise self._type_error(key, "a string", value)
        return self._text(key, value)

    def opt_str(self, key: str) -> str | None:
        value = self.get(key)
        if value is not None and not isinstance(value, str):
            raise self._type_error(key, "a string", value)
        return None if value is None else self._text(key, value)

    def str_tuple(self, key: str) -> tuple[str, ...]:
        value = self.get(key, ())
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{self.name(key)}: expected a list of strings")
        return tuple(self._text(key, v) for v in value)

    def str_map(self, key: str) -> dict[str, str]:
        value = self.get(key, {})
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise ValueError(f"{self.name(key)}: expected a table of strings")
        return {self._text(key, k): self._text(key, v) for k, v in value.items()}

    def path(self, key: str) -> str | None:
        """An absolute path on the runner (POSIX, or Windows with its drive) with no ``..`` in
        it, or ``None``: a relative one would depend on where the agent was started."""
        value = self.opt_str(key)
        if value is None:
            return None
        posix, windows = PurePosixPath(value), PureWindowsPath(value)
        if not (posix.is_absolute() or windows.is_absolute()) or ".." in (
            *posix.parts,
            *windows.parts,
        ):
            raise ValueError(
                f"{self.name(key)}: must be an absolute path without '..', not {value[:80]!r}"
            )
        return value

    def datasets(self, key: str) -> tuple[str, ...]:
        """Datasets, each ``NAME`` (its newest version) or ``NAME@DIGEST`` (one version):
        ``agent.wire.place.parse_dataset_ref``."""
        values = self.str_tuple(key)
        for value in values:
            if (problem := dataset_ref_problem(value)) is not None:
                raise ValueError(f"{self.name(key)}: {problem}")
        return values

    def choice(self, key: str, allowed: tuple[str, ...], default: str) -> str:
        value = self.str_(key, default)
        if value not in allowed:
            raise ValueError(f"{self.name(key)}: {value!r} is not one of {', '.join(allowed)}")
        return value

    def opt_choice(self, key: str, allowed: tuple[str, ...]) -> str | None:
        value = self.opt_str(key)
        if value is not None and value not in allowed:
            raise ValueError(f"{self.name(key)}: {value!r} is not one of {', '.join(allowed)}")
        return value

    def choices(self, key: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
        values = self.str_tuple(key)
        for value in values:
            if value not in allowed:
                raise ValueError(f"{self.name(key)}: {value!r} is not one of {', '.join(allowed)}")
        return values
