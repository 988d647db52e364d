"""What a job asks for: the job spec, its resources, and the size/duration parsers.

A spec is what an operator submits and signs. It is immutable; its wire form (``to_dict``) is plain
JSON-able data with every field present, and ``from_dict`` refuses unknown keys, wrong types and
negative numbers with a one-line ``ValueError`` that names the field. A TOML job file
(``JobSpec.from_toml``) uses the same keys and also accepts human sizes (``"40GiB"``) and durations
(``"2h"``) where a field holds bytes or seconds.

The job id is not part of the spec: it is made at submission (``new_job_id``).

Features: a spec lists the features it uses (``features``, computed from its fields, and the
``spec_version`` that brings them; both left out when it uses none, so a plain spec reads the
same to every version). An agent never runs a job whose meaning it does not fully understand: a
feature it does not know refuses the spec with the version it needs (:class:`UnknownFeatures`),
one it knows but does not run (:data:`SUPPORTED_FEATURES`) makes it decline the offer, and the
owner places the job only on agents whose inventory lists the feature.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
import tomllib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any, Final, Literal, cast, get_args

from agent.common.parsing import toml_loads
from agent.job.envnames import env_name_problem, reserved_env
from agent.wire.codec import integer as wire_integer
from agent.wire.place import dataset_name_problem

JobKind = Literal["training", "inference", "batch"]
BackendName = Literal["cuda", "rocm", "xpu", "metal", "cpu"]
InterconnectKind = Literal["nvlink", "xgmi", "pcie"]

JOB_KINDS: Final[tuple[str, ...]] = get_args(JobKind)
BACKENDS: Final[tuple[str, ...]] = get_args(BackendName)
INTERCONNECTS: Final[tuple[str, ...]] = get_args(InterconnectKind)
CHECKPOINT_SIGNALS: Final[tuple[str, ...]] = (
    "SIGTERM",
    "SIGINT",
    "SIGHUP",
    "SIGQUIT",
    "SIGUSR1",
    "SIGUSR2",
)
"""Signals a job may ask to receive before it is stopped (names, so a spec reads the same on every
OS; the executor maps them to numbers, falling back to SIGTERM's behaviour where one is missing)."""

_JOB_ID_RE: Final = re.compile(r"[0-9a-f]{32}")

SPEC_VERSION: Final = 3
"""The job-spec version this code reads and writes: 1 is the spec before features."""
FEATURES: Final[Mapping[str, int]] = {
    "elastic": 3,
    "gang": 2,
    "image": 2,
    "interconnect": 2,
    "os": 3,
    "share": 3,
}
"""Every feature a spec can use, with the spec version that brought it: ``elastic`` (a range of
GPUs, ``gpus = "2-8"``), ``gang`` (more than one node), ``image`` (a container image),
``interconnect`` (a required link between the GPUs), ``os`` (a required operating system),
``share`` (part of one GPU, by fraction or memory)."""
SUPPORTED_FEATURES: Final[frozenset[str]] = frozenset(
    {"elastic", "gang", "interconnect", "os", "share"}
)
"""The features this agent runs, advertised in its inventory: ``elastic`` (the runner admits
an offer of any number of devices in the job's range: ``agent.running.admission``); ``gang`` (all
members start or none: ``agent.owning.gang``); ``interconnect``, ``os`` and ``share``, which the
runner checks against its own node before it admits an offer (``agent.running.admission``: the link
between the devices offered, its OS, and the memory a share holds on its device). Container
images are still to come: a job that uses one is placed on no agent of this version, and its
reason says which feature it waits for."""


class UnknownFeatures(ValueError):
    """A spec that uses features this version does not know; the message names the version."""


def _check_declared(data: Mapping[str, Any]) -> None:
    """Refuse a spec that declares a feature this version does not know, naming the version."""
    declared = data.get("features")
    if declared is None:
        return
    if not isinstance(declared, list | tuple) or not all(isinstance(f, str) for f in declared):
        raise ValueError("features: expected a list of strings")
    unknown = sorted(f for f in declared if f not in FEATURES)
    if unknown:
        wanted = data.get("spec_version")
        version = wanted if isinstance(wanted, int) and not isinstance(wanted, bool) else "newer"
        raise UnknownFeatures(
            f"the job needs job-spec version {version} (feature{'s' * (len(unknown) > 1)}"
            f" {', '.join(unknown)}); this agent reads version {SPEC_VERSION}"
        )


def lacking_reason(features: tuple[str, ...]) -> str:
    """Why an agent declines a job that uses ``features`` (known, not run here)."""
    need = max(FEATURES[f] for f in features)
    return (
        f"the job needs feature{'s' * (len(features) > 1)} {', '.join(features)} (job-spec"
        f" version {need}), which this agent (job-spec version {SPEC_VERSION}) does not run"
    )


def new_job_id() -> str:
    """A fresh job id: a uuid4 as 32 lowercase hex digits."""
    return uuid.uuid4().hex


def check_job_id(job_id: str) -> str:
    """Return ``job_id`` when it is 32 lowercase hex digits (safe as a folder name), else raise."""
    if not isinstance(job_id, str) or not _JOB_ID_RE.fullmatch(job_id):
        raise ValueError(f"job id must be 32 lowercase hex digits, got {job_id!r}")
    return job_id


# -- sizes and durations -------------------------------------------------------------------------

_SIZE_UNITS: Final[dict[str, int]] = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "k": 1024,
    "m": 1024**2,
    "g": 1024**3,
    "t": 1024**4,
    "ki": 1024,
    "mi": 1024**2,
    "gi": 1024**3,
    "ti": 1024**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE_RE: Final = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*([A-Za-z]*)\s*")

_DURATION_UNITS: Final[dict[str, float]] = {
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 604800.0,
}
_DURATION_PART_RE: Final = re.compile(r"(\d+(?:\.\d+)?|\.\d+)(ms|s|m|h|d|w)")


def parse_size(text: str) -> int:
    """Bytes from ``"40GiB"``, ``"512 MiB"``, ``"1.5G"``, ``"80GB"`` or ``"1024"``.

    Units are case-insensitive. ``KiB/MiB/GiB/TiB`` (and ``Ki``.., and bare ``K/M/G/T`` as in
    ``docker run --memory``) are powers of 1024; ``KB/MB/GB/TB`` are powers of 1000. A fractional
    result is rounded down to whole bytes.
    """
    match = _SIZE_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"not a size: {text!r} (expected e.g. 40GiB, 512MiB, 80GB)")
    number, unit = match.groups()
    factor: int | None = _SIZE_UNITS.get(unit.lower())
    if factor is None:
        raise ValueError(f"unknown size unit {unit!r} in {text!r} (use B, KiB, MiB, GiB, TiB, GB)")
    if "." in number:
        whole, _, frac = number.partition(".")
        scale: int = 10 ** len(frac)
        return (int(whole or "0") * scale + int(frac)) * factor // scale
    return int(number) * factor


def parse_duration(text: str) -> float:
    """Seconds from ``"2h"``, ``"1h30m"``, ``"90s"``, ``"1.5d"``, ``"500ms"`` or ``"3600"``."""
    if not isinstance(text, str):
        raise ValueError(f"not a duration: {text!r} (expected e.g. 2h, 90m, 1h30m)")
    compact = text.strip().replace(" ", "").lower()
    if re.fullmatch(r"\d+(?:\.\d+)?|\.\d+", compact):
        seconds = float(compact)
    elif not compact or _DURATION_PART_RE.sub("", compact) != "":
        raise ValueError(f"not a duration: {text!r} (expected e.g. 2h, 90m, 1h30m, 45s)")
    else:
        seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in _DURATION_PART_RE.findall(compact))
    if not math.isfinite(seconds):
        raise ValueError(f"not a duration: {text[:20]!r}... is too long")
    return seconds


# -- the spec ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Resources:
    """What a job needs from the hosts it runs on."""

    gpus_per_node: int = 0
    """GPUs on each node of the job; 0 for a CPU-only job, which runs on any host. A job asks
    for GPUs, as under Slurm or Kubernetes: without a count it gets none, unless it states what
    each GPU must be (memory, a GPU backend, compute capability, architecture), which asks for
    one (:meth:`from_dict`)."""
    nodes: int = 1
    """Nodes the job spans; more than one makes it a gang (feature ``gang``): one member per
    node, each with ``gpus_per_node`` GPUs, placed all together or not at all, started with
    ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE``/``NODE_RANK``/``NNODES``/
    ``MASTER_ADDR``/``MASTER_PORT`` (one process per member: ``agent.execution.pinning``), and ended
    or requeued as a whole when any member ends (``agent.owning.gang``)."""
    min_mem_per_gpu_bytes: int | None = None
    """Least memory each GPU must have; ``None`` accepts any."""
    backends: tuple[BackendName, ...] = ()
    """Accepted backends; empty accepts any."""
    min_compute_capability: str | None = None
    """Least NVIDIA compute capability (``"8.0"``); only NVIDIA devices can meet it."""
    archs: tuple[str, ...] = ()
    """Accepted architectures (``"hopper"``, ``"gfx942"``); empty accepts any."""
    interconnect: InterconnectKind | None = None
    """Required link between the job's GPUs on a node (every GPU it is given linked to the others
    by it: ``nvlink``, ``xgmi``; ``pcie`` is every GPU's); ``None`` accepts any. The owner places
    the job only where such a group is free, and the runner declines an offer of GPUs that its
    own inventory does not show so linked."""
    os: str | None = None
    """Required operating system of the node, as ``platform.system().lower()`` names it
    (``linux``, ``darwin``, ``windows``); ``None`` accepts any."""
    share_fraction: float | None = None
    """A share of one GPU as a fraction of its memory (0 < f < 1; ``gpus_per_node = 0.5`` in a
    job file, ``--gpus 0.5``): the job is given one device, which other shares may run on too
    while their memory fits in it. ``None``: whole GPUs."""
    share_mem_bytes: int | None = None
    """A share of one GPU by memory (``share_mem_bytes = "10GiB"``, ``--gpu-mem 10GiB``), instead
    of a fraction. Either makes the job a share (``gpus_per_node`` is 1, one node)."""
    gpus_max_per_node: int | None = None
    """An elastic job (feature ``elastic``; ``gpus = "2-8"`` in a job file, ``--gpus 2-8``): the
    most GPUs it takes, ``gpus_per_node`` being the fewest. It runs on one node, with as many as
    fit there when it starts (``SHOAL_GPUS`` names them, so the program knows its world size).
    ``None``: exactly ``gpus_per_node``."""

    @property
    def is_share(self) -> bool:
        return self.share_fraction is not None or self.share_mem_bytes is not None

    @property
    def is_elastic(self) -> bool:
        return self.gpus_max_per_node is not None

    def gpus_text(self) -> str:
        """``4``, or an elastic job's range ``2-4``."""
        if self.gpus_max_per_node is None:
            return str(self.gpus_per_node)
        return f"{self.gpus_per_node}-{self.gpus_max_per_node}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus_per_node": self.gpus_per_node,
            "nodes": self.nodes,
            "min_mem_per_gpu_bytes": self.min_mem_per_gpu_bytes,
            "backends": list(self.backends),
            "min_compute_capability": self.min_compute_capability,
            "archs": list(self.archs),
            "interconnect": self.interconnect,
        } | {  # fields of version 3, written only when used (a version 2 agent reads the rest)
            k: v
            for k, v in (
                ("os", self.os),
                ("share_fraction", self.share_fraction),
                ("share_mem_bytes", self.share_mem_bytes),
                ("gpus_max_per_node", self.gpus_max_per_node),
            )
            if v is not None
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, human: bool = False) -> Resources:
        """Build from the wire form; ``human`` also accepts a size string for memory, ``gpus``
        for ``gpus_per_node``, and a fraction of one GPU there (``0.5``: a share)."""
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
        out = cls(
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


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A job as an operator submits it (see DESIGN.md, "Jobs and masterless scheduling")."""

    command: tuple[str, ...]
    """The argv to run; never empty. Run directly, not through a shell."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables added to the job's clean environment. Parsing refuses names that are not shell
    variable names (``agent.job.envnames.env_name_problem``) and the names Shoal sets (GPU pinning,
    ``SHOAL_*``: ``agent.job.envnames.reserved_env``)."""
    workdir: str | None = None
    """Working directory on the runner; ``None`` runs in the job's own folder."""
    image: str | None = None
    """Container image to run the command in; ``None`` runs it on the host."""
    resources: Resources = field(default_factory=Resources)
    kind: JobKind = "batch"
    priority: int = 0
    """Higher runs first and may preempt lower preemptible jobs."""
    preemptible: bool = False
    deadline: float | None = None
    """Absolute time (epoch seconds) the job should end by; orders the queue within a priority.
    One that passes before the job ends is said once by its owner (``agent.job.deadlines``: an event
    ``deadline_missed``, a counter) and shown as ``missed`` by ``shoal jobs``."""
    max_runtime_s: float | None = None
    """Wall-clock limit of one attempt; the executor stops the job when it is reached."""
    datasets: tuple[str, ...] = ()
    """Names of datasets the job reads, so placement can prefer hosts that hold them."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """The job's own labels (shown in listings, matched by other jobs' selectors)."""
    affinity: Mapping[str, str] = field(default_factory=dict)
    """Node labels the runner must carry, every one (``zone = "eu-1"``)."""
    anti_affinity: Mapping[str, str] = field(default_factory=dict)
    """Node labels the runner must not carry, any one."""
    checkpoint_dir: str | None = None
    """A checkpoint folder the operator manages (shared storage, the same path on every node):
    ``SHOAL_CHECKPOINT_DIR`` points at it and Shoal does not copy it. ``None``: Shoal's own folder,
    copied to the job's owner and moved with the job on migration, drain and restart."""
    checkpoint_signal: str = "SIGTERM"
    """Sent to the job's process group before it is stopped (cancel, preemption, migration)."""
    retries: int = 0
    """Further attempts after a failed one."""

    def __post_init__(self) -> None:
        if not self.command:
            raise ValueError("command must not be empty")

    @property
    def is_gang(self) -> bool:
        return self.resources.nodes > 1

    @property
    def features(self) -> tuple[str, ...]:
        """The features this spec uses (:data:`FEATURES`), sorted."""
        used = []
        if self.resources.nodes > 1:
            used.append("gang")
        if self.image is not None:
            used.append("image")
        if self.resources.interconnect is not None:
            used.append("interconnect")
        if self.resources.os is not None:
            used.append("os")
        if self.resources.is_share:
            used.append("share")
        if self.resources.is_elastic:
            used.append("elastic")
        return tuple(sorted(used))

    @property
    def lacking(self) -> tuple[str, ...]:
        """The features this spec uses that this agent does not run."""
        return tuple(f for f in self.features if f not in SUPPORTED_FEATURES)

    def to_dict(self) -> dict[str, Any]:
        """The stable wire form: every field, JSON-able, keys in declaration order; then the
        features it uses and their spec version, when it uses any."""
        doc: dict[str, Any] = {
            "command": list(self.command),
            "env": dict(self.env),
            "workdir": self.workdir,
            "image": self.image,
            "resources": self.resources.to_dict(),
            "kind": self.kind,
            "priority": self.priority,
            "preemptible": self.preemptible,
            "deadline": self.deadline,
            "max_runtime_s": self.max_runtime_s,
            "datasets": list(self.datasets),
            "labels": dict(self.labels),
            "affinity": dict(self.affinity),
            "anti_affinity": dict(self.anti_affinity),
            "checkpoint_dir": self.checkpoint_dir,
            "checkpoint_signal": self.checkpoint_signal,
            "retries": self.retries,
        }
        features = self.features
        if features:
            doc["features"] = list(features)
            doc["spec_version"] = max(FEATURES[f] for f in features)
        return doc

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        """Validate and build from the wire form; missing keys take their defaults."""
        return _from_mapping(data, human=False, now=None)

    @classmethod
    def from_human(cls, data: Mapping[str, Any], *, now: float | None = None) -> JobSpec:
        """Build from the wire keys with the human forms :meth:`from_toml` accepts."""
        return _from_mapping(data, human=True, now=now)

    @classmethod
    def from_toml(cls, text: str, *, now: float | None = None) -> JobSpec:
        """Build from a TOML job file.

        The keys are the wire keys. Human forms are accepted too: ``max_runtime_s = "2h"``,
        ``resources.min_mem_per_gpu_bytes = "40GiB"``, and ``deadline`` as epoch seconds, a TOML
        date-time with an offset, or a duration from ``now`` (``deadline = "6h"``).
        """
        try:
            data = toml_loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"job file is not valid TOML: {exc}") from None
        return _from_mapping(data, human=True, now=now)


# -- validation ----------------------------------------------------------------------------------


def _from_mapping(data: Mapping[str, Any], *, human: bool, now: float | None) -> JobSpec:
    if not isinstance(data, Mapping):
        raise ValueError(f"job spec must be a table/object, got {type(data).__name__}")
    _check_declared(data)
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
        resources=Resources.from_dict(resources_raw, human=human),
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
        """Dataset names, each one path component (``agent.wire.place.dataset_name_problem``)."""
        values = self.str_tuple(key)
        for value in values:
            if (problem := dataset_name_problem(value)) is not None:
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
