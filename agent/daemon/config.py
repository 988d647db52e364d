"""The agent's configuration: one documented dataclass, read from TOML, overridden by flags.

A config file holds the same names as :class:`AgentConfig`, at the top level or under an
``[agent]`` table; ``labels`` is a table of strings. Unknown keys are refused (a typo must not be
silently ignored). Flags given on the command line win over the file.

Example::

    listen = "0.0.0.0:7946"
    advertise = "10.0.0.12"
    join = ["10.0.0.11:7946"]
    data_dir = "/var/lib/shoal"
    zone = "rack-a"
    datasets = ["imagenet"]
    datasets_dir = "/data/datasets"
    cost_per_hour = 2.5
    job_user = "shoal-job"

    [labels]
    team = "vision"
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from agent.common.errors import UserError
from agent.common.parsing import toml_loads
from agent.job.imageref import image_ref_problem
from agent.wire.place import dataset_name_problem


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Everything one agent needs to run; each field is also a TOML key of the same name."""

    data_dir: Path = Path("shoal-data")
    """Where the agent keeps its SQLite store, job folders and logs."""
    identity_dir: Path | None = None
    """Holds node.key, node.crt and ca.crt; default ``<data_dir>/identity``."""
    listen: str = "127.0.0.1:7946"
    """``HOST:PORT`` to serve gossip and the HTTP API on (mutual TLS). Port 0 picks a free one."""
    advertise: str | None = None
    """The host peers should use to reach us, when it differs from the listen host."""
    join: tuple[str, ...] = ()
    """Seeds: ``HOST:PORT`` of any agents already in the mesh."""
    sim: str | None = None
    """Simulate this host's GPUs with a profile (``demo``, ``h100:2``...) instead of probing."""
    sim_seed: int = 0
    """Seed of the simulated devices (keys and noise); agents sharing a machine need distinct."""
    labels: dict[str, str] = field(default_factory=dict)
    """Free-form ``key = value`` labels gossiped in the inventory (affinity, display)."""
    name: str | None = None
    """How operators see this host in ``shoal nodes`` and the TUI; default its hostname."""
    zone: str | None = None
    """Failure domain or rack; gossiped as the ``zone`` label."""
    datasets: tuple[str, ...] = ()
    """Datasets cached on this host (data gravity); gossiped as the ``datasets`` label and, with
    those under ``datasets_dir``, in the ``place`` record."""
    datasets_dir: Path | None = None
    """A folder whose every entry is a dataset this host holds, measured and gossiped with its
    size; scanned again every ``datasets_rescan_s`` (datasets may come and go)."""
    datasets_rescan_s: float = 60.0
    """How often ``datasets_dir`` is scanned again."""
    content_link_bytes_per_s: float = 0.0
    """The most bytes per second content is fetched at from any one holder (0: no cap)."""
    prefetch: bool = True
    """Whether this node fetches a waiting job's datasets before the job is offered to it, when
    its owner forecasts it runs here (``false``: a metered or shared link; staging at the start
    still happens)."""
    store_budget_bytes: int | None = None
    """What the content store (``<data_dir>/store/``) may keep, in bytes; unset:
    ``store_budget_share`` of its disk. Datasets indexed in place do not count."""
    store_budget_share: float = 0.5
    """The share of the data folder's disk the store may keep when no byte budget is set."""
    store_high: float = 0.90
    """Past this share of its budget the store evicts (least recently used, weighted by uses)..."""
    store_low: float = 0.70
    """...down to this share (pinned versions and those running jobs read are kept)."""
    cost_per_hour: float | None = None
    """What an hour of this host costs; gossiped as the ``cost_per_hour`` label."""
    probe_interval_s: float = 1.0
    """How often the devices are sampled."""
    hints_every_s: float = 60.0
    """How often the bottleneck hints are judged for the jobs running here."""
    hints_window_s: float = 300.0
    """The window they are judged over: a job holding a GPU it barely used for this long is
    told ``idle_allocated`` (shorter: told sooner, on less evidence)."""
    telemetry_heartbeat_s: float = 60.0
    """Publish telemetry at least this often even when nothing changed (in a mesh past 16 agents,
    this times N/16: ``agent.daemon.publisher.quiet_every_s``). Every record costs each peer a
    dozen retransmits, so idle hosts repeat themselves rarely: a live member with an unchanged
    record is still current. The record names the heartbeat it keeps; the CLI and the TUI call
    telemetry stale after one and a half of it."""
    stop_grace_s: float = 10.0
    """Between a job's stop signal and SIGKILL, unless the command names another grace."""
    drain_grace_s: float = 30.0
    """Default grace for ``drain``: running jobs may finish within it, then they are requeued."""
    preempt_min_run_s: float = 600.0
    """A preemptible job runs at least this long (since its attempt started) before a job of
    higher priority may preempt it: owners propose no sooner, and runners refuse sooner."""
    elastic_grow_idle_s: float = 30.0
    """An elastic job (a range of GPUs) below its most is restarted from its checkpoint with
    more once GPUs it could use have been idle on its node this long (and no job waits that could
    use them); it also runs ``preempt_min_run_s`` between resizes."""
    rpc_timeout_s: float = 5.0
    """Timeout of one agent-to-agent call."""
    ended_jobs_keep_s: float = 900.0
    """How long every agent keeps (and lists) a job after it ended; then it is retired
    (``agent.mesh.retiring``): only its owner's store keeps it, and ``GET /v1/jobs/<id>`` on that
    agent still shows it."""
    ended_jobs_kept: int = 1000
    """At most this many ended jobs are kept everywhere (the newest), whatever their age: each
    costs every agent ~16 KB of memory while kept."""
    ended_jobs_disk_keep_s: float = 30 * 86400.0
    """How long this agent's disk keeps an ended job (``agent.storage.purging``): its stored record
    and results, and its folder (logs, checkpoint, what it wrote there). Not less than
    ``ended_jobs_keep_s``."""
    placement: str = "shoal"
    """How this agent places the jobs it owns: ``shoal`` (the Shoal policy) or ``fifo`` (first
    fit in node-id order, the baseline)."""
    objective: str = "performance"
    """What the Shoal policy optimizes for the jobs this agent owns: ``performance`` (speed;
    inference by performance per watt), ``energy`` (every inference job by performance per
    watt), ``cost`` (performance per unit of a node's ``cost_per_hour``) or ``packing`` (as many
    jobs as the fleet holds: room left for the workload's shapes, then the fullest node; speed
    not weighed). Set the same on every agent: each owner places its own jobs."""
    job_user: str | None = None
    """The user jobs run as. Unset: when the agent runs as root, ``shoal-job`` if that user
    exists, else ``nobody``; an agent that is not root cannot switch users and runs jobs as its own
    user (a job can then read the agent's key: it says so in its log). ``""``: the agent's own
    user, even as root. A name: that user (the agent must be root unless it is its own)."""
    container_runtime: str | None = None
    """What runs jobs that name an image: ``podman``, ``docker`` or ``none`` (such jobs are not
    placed here). Unset: podman if the host has it, else docker, else none. Only a Linux host
    runs them; the agent gossips which it has (``shoal nodes`` shows it)."""
    containers_conf: Path | None = None
    """A containers.conf for podman (``CONTAINERS_CONF``), where the host's default does not
    work (see docs/operations/containers.md)."""
    container_root: Path | None = None
    """Podman's storage under this folder (``--root DIR/storage --runroot DIR/run``) instead of
    the host's; the agent's own images then share no state with other podman users."""
    uv: Path | None = None
    """The ``uv`` that builds jobs' Python environments (``agent.running.pyenvs``). Unset: the
    one on the agent's PATH; none there, a job naming an environment is declined here."""
    wheelhouse: Path | None = None
    """A folder of wheels environments are built from, with no index (an air-gapped fleet)."""
    index_url: str | None = None
    """The package index environments are built from (default: uv's own, PyPI)."""
    insecure_registries: tuple[str, ...] = ()
    """Registries (``HOST:PORT``) pulled from over plain HTTP or without checking their
    certificate (``--tls-verify=false``): a local test registry, never one across a network."""

    @property
    def identity_path(self) -> Path:
        return self.identity_dir if self.identity_dir is not None else self.data_dir / "identity"

    def all_labels(self) -> dict[str, str]:
        """The labels as gossiped: the free-form ones plus zone, datasets and cost."""
        out = dict(self.labels)
        if self.zone is not None:
            out["zone"] = self.zone
        if self.datasets:
            out["datasets"] = ",".join(self.datasets)
        if self.cost_per_hour is not None:
            out["cost_per_hour"] = f"{self.cost_per_hour:g}"
        return out


PLACEMENT_NAMES = ("shoal", "fifo")
OBJECTIVE_NAMES = ("performance", "energy", "cost", "packing")
"""The policy's objectives (``agent.policy.config.OBJECTIVES``; named here so the CLI need not
import the policy)."""
CONTAINER_RUNTIMES = ("podman", "docker", "none")
_PATHS = {
    "data_dir",
    "identity_dir",
    "datasets_dir",
    "containers_conf",
    "container_root",
    "uv",
    "wheelhouse",
}
_TUPLES = {"join", "datasets", "insecure_registries"}
_FLOATS = {
    "cost_per_hour",
    "probe_interval_s",
    "telemetry_heartbeat_s",
    "hints_every_s",
    "hints_window_s",
    "stop_grace_s",
    "drain_grace_s",
    "preempt_min_run_s",
    "elastic_grow_idle_s",
    "rpc_timeout_s",
    "datasets_rescan_s",
    "content_link_bytes_per_s",
    "ended_jobs_keep_s",
    "ended_jobs_disk_keep_s",
}
_POSITIVE = {
    "probe_interval_s",
    "telemetry_heartbeat_s",
    "rpc_timeout_s",
    "datasets_rescan_s",
    "hints_every_s",
    "hints_window_s",
}
_COUNTS = {"ended_jobs_kept"}
_BOOLS = {"prefetch"}
_SHARES = {"store_budget_share", "store_high", "store_low"}


def _coerce(name: str, value: Any, where: str) -> Any:
    if name in _PATHS:
        if not isinstance(value, str):
            raise UserError(f"{where}: {name} must be a string path")
        return Path(value).expanduser()
    if name in _TUPLES:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise UserError(f"{where}: {name} must be a list of strings")
        if name == "insecure_registries":
            for registry in value:
                if image_ref_problem(f"{registry}/x") is not None or "/" in registry:
                    raise UserError(f"{where}: insecure_registries: {registry!r} is not HOST:PORT")
        if name == "datasets":
            for dataset in value:
                if (problem := dataset_name_problem(dataset)) is not None:
                    raise UserError(f"{where}: {problem}")
        return tuple(value)
    if name in _FLOATS:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise UserError(f"{where}: {name} must be a finite number")
        if name in _POSITIVE and value <= 0:
            raise UserError(f"{where}: {name} must be more than 0")
        if value < 0:
            raise UserError(f"{where}: {name} must not be negative")
        return float(value)
    if name == "labels":
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise UserError(f"{where}: labels must be a table of strings")
        return dict(value)
    if name in _BOOLS:
        if not isinstance(value, bool):
            raise UserError(f"{where}: {name} must be true or false")
        return value
    if name == "sim_seed":
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{where}: sim_seed must be an integer")
        return value
    if name == "store_budget_bytes":
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise UserError(f"{where}: store_budget_bytes must be a whole number of bytes above 0")
        return value
    if name in _SHARES:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
            raise UserError(f"{where}: {name} must be a number above 0 and at most 1")
        return float(value)
    if name in _COUNTS:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UserError(f"{where}: {name} must be a whole number, 0 or more")
        return value
    if not isinstance(value, str):
        raise UserError(f"{where}: {name} must be a string")
    if name == "placement" and value not in PLACEMENT_NAMES:
        raise UserError(f"{where}: placement must be one of {', '.join(PLACEMENT_NAMES)}")
    if name == "objective" and value not in OBJECTIVE_NAMES:
        raise UserError(f"{where}: objective must be one of {', '.join(OBJECTIVE_NAMES)}")
    if name == "container_runtime" and value not in CONTAINER_RUNTIMES:
        raise UserError(
            f"{where}: container_runtime must be one of {', '.join(CONTAINER_RUNTIMES)},"
            f" not {value!r}"
        )
    return value


def config_from_mapping(doc: dict[str, Any], where: str = "config") -> AgentConfig:
    """An :class:`AgentConfig` from a parsed TOML document (top level or ``[agent]``)."""
    section = doc.get("agent", doc)
    if not isinstance(section, dict):
        raise UserError(f"{where}: [agent] must be a table")
    known = {f.name for f in fields(AgentConfig)}
    values: dict[str, Any] = {}
    for name, value in section.items():
        if name not in known:
            raise UserError(f"{where}: unknown option {name!r}")
        values[name] = _coerce(name, value, where)
    config = AgentConfig(**values)
    if config.store_low >= config.store_high:
        raise UserError(f"{where}: store_low must be less than store_high")
    if config.ended_jobs_disk_keep_s < config.ended_jobs_keep_s:
        raise UserError(
            f"{where}: ended_jobs_disk_keep_s must not be less than ended_jobs_keep_s "
            "(a listed job's log is read from disk)"
        )
    return config


def load_config(path: Path) -> AgentConfig:
    """Read a TOML config file; every problem is one :class:`UserError` line."""
    try:
        doc = toml_loads(path.read_text("utf-8"))
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: not valid TOML: {exc}") from None
    return config_from_mapping(doc, str(path))


def parse_label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise UserError(f"label {text!r} must be KEY=VALUE")
    return key.strip(), value.strip()


def with_overrides(config: AgentConfig, **overrides: Any) -> AgentConfig:
    """``config`` with every override that is not None applied (flags win over the file)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    return replace(config, **given)
