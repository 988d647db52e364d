"""What a job asks for: the job spec and its resources.

A spec is what an operator submits and signs. It is immutable; its wire form (``to_dict``) is plain
JSON-able data with every field present, and ``from_dict`` refuses unknown keys, wrong types and
negative numbers with a one-line ``ValueError`` that names the field. A TOML job file
(``JobSpec.from_toml``) uses the same keys and also accepts human sizes (``"40GiB"``) and durations
(``"2h"``) where a field holds bytes or seconds. The reading is ``agent.job.specreader``'s, the
size and duration parsers ``agent.job.units``'.

The job id is not part of the spec: it is made at submission (``new_job_id``).

Features: a spec lists the features it uses (``features``, computed from its fields, and the
``spec_version`` that brings them; both left out when it uses none, so a plain spec reads the
same to every version). An agent never runs a job whose meaning it does not fully understand: a
feature it does not know refuses the spec with the version it needs (:class:`UnknownFeatures`),
one it knows but does not run (:data:`SUPPORTED_FEATURES`) makes it decline the offer, and the
owner places the job only on agents whose inventory lists the feature.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

from agent.job.imageref import check_image_ref

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
    "workdir": 4,
    "python_env": 4,
}
"""Every feature a spec can use, with the spec version that brought it: ``elastic`` (a range of
GPUs, ``gpus = "2-8"``), ``gang`` (more than one node), ``image`` (a container image),
``interconnect`` (a required link between the GPUs), ``os`` (a required operating system),
``share`` (part of one GPU, by fraction or memory)."""
SUPPORTED_FEATURES: Final[frozenset[str]] = frozenset(
    {"elastic", "gang", "image", "interconnect", "os", "python_env", "share", "workdir"}
)
"""The features this agent runs, advertised in its inventory: ``elastic`` (the runner admits
an offer of any number of devices in the job's range: ``agent.running.admission``); ``gang`` (all
members start or none: ``agent.owning.gang``); ``interconnect``, ``os`` and ``share``, which the
runner checks against its own node before it admits an offer (``agent.running.admission``: the link
between the devices offered, its OS, and the memory a share holds on its device); ``image`` (the
job runs in a container: ``agent.execution.containers``), which an agent advertises only where it
found a container runtime on a Linux host (:data:`HOST_ONLY_FEATURES`); ``workdir`` (the job
starts in a copy of the submitter's working folder: ``agent.running.workstage``); ``python_env``
(the runner builds the job's Python environment with uv: ``agent.running.pyenvs``)."""
HOST_ONLY_FEATURES: Final[frozenset[str]] = frozenset({"image"})
IMAGE_HOST: Final = "a Linux host with a container runtime"
"""What a job with a container image needs of its node: macOS and Windows cannot give a
container a GPU, and an agent advertises the ``image`` feature only where it found a runtime."""
"""Features this version runs only on a host that has what they need (``image``: a Linux host
with a container runtime): an agent without it advertises :data:`SUPPORTED_FEATURES` less these."""


_SHA256_HEX: Final = re.compile(r"[0-9a-f]{64}")
PythonEnvKind = Literal["lock", "requirements"]
PYTHON_ENV_KINDS: Final[tuple[PythonEnvKind, ...]] = ("lock", "requirements")


@dataclass(frozen=True, slots=True)
class PythonEnv:
    """``lock``: a ``uv.lock`` (its ``pyproject.toml`` beside it); ``requirements``: a
    requirements file. ``file``: its path in the working folder."""

    kind: PythonEnvKind
    file: str

    def __post_init__(self) -> None:
        if self.kind not in PYTHON_ENV_KINDS:
            raise ValueError(f"python_env: {self.kind!r} is not lock or requirements")
        parts = self.file.split("/")
        if not self.file or self.file.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"python_env: {self.file!r} is not a path inside the working folder")


class UnknownFeatures(ValueError):
    """A spec that uses features this version does not know; the message names the version."""


def check_declared(data: Mapping[str, Any]) -> None:
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
        from agent.job.specreader import resources_from_mapping

        return resources_from_mapping(data, human=human)


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
    workdir_digest: str | None = None
    """The digest of the submitter's working folder packed as content (kind ``workdir``:
    ``agent.content.workdir``); the job starts inside its copy, checked against this digest."""
    python_env: PythonEnv | None = None
    """A Python environment built from a file of the working folder (``{lock = "uv.lock"}``
    or ``{requirements = "requirements.txt"}``), cached on each node by the file's hash; the job
    runs with it activated (``agent.running.pyenvs``)."""
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
    """Datasets the job reads, so placement prefers hosts that hold them (counting partial
    copies): ``NAME`` (its newest version in the mesh) or ``NAME@DIGEST`` (one version),
    ``agent.wire.place.parse_dataset_ref``."""
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
        if self.image is not None:
            check_image_ref(self.image)
        if self.workdir_digest is not None and not _SHA256_HEX.fullmatch(self.workdir_digest):
            raise ValueError("workdir_digest: must be a SHA-256 (64 lowercase hex digits)")
        if self.python_env is not None and self.image is not None:
            raise ValueError("python_env: a job in a container brings its Python in its image")
        if self.python_env is not None and self.workdir_digest is None:
            raise ValueError("python_env: names a file of the working folder: submit with one")
        if self.workdir_digest is not None and self.workdir is not None:
            raise ValueError("workdir: a job runs in its packed working folder or in a host path")

    @property
    def is_gang(self) -> bool:
        return self.resources.nodes > 1

    @property
    def is_movable(self) -> bool:
        """Whether a team's guarantee may move it to another node (``agent.policy.moves``):
        one node, whole GPUs, not an inference service, not elastic."""
        r = self.resources
        return (
            not self.is_gang
            and r.gpus_per_node > 0
            and not r.is_share
            and not r.is_elastic
            and self.kind != "inference"
        )

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
        if self.workdir_digest is not None:
            used.append("workdir")
        if self.python_env is not None:
            used.append("python_env")
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
        if self.workdir_digest is not None:  # absent otherwise: the form older agents read
            doc["workdir_digest"] = self.workdir_digest
        if self.python_env is not None:
            doc["python_env"] = {self.python_env.kind: self.python_env.file}
        features = self.features
        if features:
            doc["features"] = list(features)
            doc["spec_version"] = max(FEATURES[f] for f in features)
        return doc

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        """Validate and build from the wire form; missing keys take their defaults."""
        from agent.job.specreader import spec_from_mapping

        return spec_from_mapping(data, human=False, now=None)

    @classmethod
    def from_human(cls, data: Mapping[str, Any], *, now: float | None = None) -> JobSpec:
        """Build from the wire keys with the human forms :meth:`from_toml` accepts."""
        from agent.job.specreader import spec_from_mapping

        return spec_from_mapping(data, human=True, now=now)

    @classmethod
    def from_toml(cls, text: str, *, now: float | None = None) -> JobSpec:
        """Build from a TOML job file.

        The keys are the wire keys. Human forms are accepted too: ``max_runtime_s = "2h"``,
        ``resources.min_mem_per_gpu_bytes = "40GiB"``, and ``deadline`` as epoch seconds, a TOML
        date-time with an offset, or a duration from ``now`` (``deadline = "6h"``).
        """
        from agent.job.specreader import spec_from_toml

        return spec_from_toml(text, now=now)
