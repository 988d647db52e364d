"""Jobs that name an image run in an OCI container, through podman (or docker), as host jobs do.

The runtime (:class:`ContainerRuntime`) is found once, when the agent starts (:func:`find_runtime`:
the one its config names, else podman, else docker, looked up in the system's folders only). An
attempt with an image is then started by the process executor like any other, through the same
launcher chain (``agent.execution.spawn``: the death signal, the guard, the cgroup), except that
the last program is the runtime's client, ``podman run``, run with the agent's rights, and the job
user is the container's (``--user UID:GID``). :func:`run_argv` builds its whole command line:

- ``--log-driver=passthrough``: the container's stdout and stderr are the client's, the agent's
  pipe, as a host job's are (logs, progress lines; and an agent that dies takes the job along at
  its next write, as it does a host job);
- ``--init``, ``--network=host`` (collective libraries find their peers as on the host),
  ``--security-opt=no-new-privileges``, ``--cap-drop=all``, never ``--privileged``;
- only the attempt's devices (:func:`device_args`): NVIDIA by CDI where the host has the
  toolkit's specs, else its ``/dev/nvidiaN`` with the control nodes and the driver's libraries
  (read-only); AMD ``/dev/kfd`` and the GPU's own render node; Intel its render node;
- the job's folder read-write at its own path (its working directory unless the spec names
  one), its checkpoint folder, and every read-only mount the launch lists (datasets);
- the job's variables through an env file the client reads (:func:`env_file_text`), never through
  the client's own environment (``agent.execution.jobenv``: what the spec carries reaches no
  process with more rights than the job), and no variable's value in an argv;
- ``--name`` from the agent, the job and the attempt (:func:`container_name`) and labels, so a
  restarted agent finds what its previous run left and removes it (:func:`leftovers_argv`);
- every value the spec carries is given as ``--option=value`` (it cannot become an option), the
  image is a checked reference (``agent.job.imageref``) and ends the options: what follows is
  the job's command.

The image is made present before the start (:class:`ImageSource`): :class:`RegistryPull` pulls it
from its registry when it is absent (``--tls-verify=false`` only for a registry the config lists
as insecure); a pre-pulled image, or one moved from a peer through the content store, is another
source behind the same seam.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, Protocol

from agent.execution.jobenv import LAUNCHER_ENV, checked_env
from agent.execution.jobuser import SYSTEM_PATH
from agent.job.imageref import check_image_ref, registry_of
from probers.records import DeviceStatic

RuntimeKind = Literal["podman", "docker"]
RUNTIME_KINDS: Final[tuple[RuntimeKind, ...]] = ("podman", "docker")
NAME_PREFIX: Final = "shoal-"
AGENT_LABEL: Final = "io.shoal.agent"
CDI_DIRS: Final[tuple[Path, ...]] = (Path("/etc/cdi"), Path("/var/run/cdi"))
NVIDIA_CONTROL: Final = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
NVIDIA_LIBRARIES: Final = (
    "libcuda.so*",
    "libnvidia-ml.so*",
    "libnvidia-ptxjitcompiler.so*",
    "libnvidia-nvvm.so*",
    "libcudadebugger.so*",
)
LIBRARY_DIRS: Final = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64")
NVIDIA_PROGRAMS: Final = ("/usr/bin/nvidia-smi",)
PULL_TIMEOUT_S: Final = 600.0
"""A pull that takes longer fails the attempt (an owner waits as long for the start's answer)."""
MAX_RUN_ROOT_CHARS: Final = 50
_FORBIDDEN_IN_PATHS: Final = (":", ",", "\x00", "\n")
_SYSTEM_FOLDERS: Final = ("/proc", "/sys", "/dev")
"""Never mounted from a spec: the host's own devices and kernel interfaces (nor its root)."""


class ContainerError(Exception):
    """A container attempt cannot start (no runtime, the image cannot be pulled...): one line."""


@dataclass(frozen=True, slots=True)
class ContainerRuntime:
    """How this node runs containers."""

    kind: RuntimeKind
    program: str
    """The client's absolute path."""
    conf: Path | None = None
    """podman's ``CONTAINERS_CONF``, where the host's default does not work."""
    root: Path | None = None
    """podman only: its storage under ``root/storage`` and ``root/run`` instead of the host's."""
    insecure_registries: tuple[str, ...] = ()
    """Registries pulled from with ``--tls-verify=false`` (podman) — plain HTTP on loopback."""

    def command(self, *args: str) -> tuple[str, ...]:
        """The client's argv with ``args`` (its global options first)."""
        base: tuple[str, ...] = (self.program,)
        if self.root is not None:
            base += (f"--root={self.root / 'storage'}", f"--runroot={self.run_root}")
        return (*base, *args)

    @property
    def run_root(self) -> Path:
        """``root/run``, or where that is longer than podman takes (50 characters), a folder
        of the system's temporary folder named after it."""
        assert self.root is not None
        run = self.root / "run"
        if len(str(run)) <= MAX_RUN_ROOT_CHARS:
            return run
        digest = hashlib.sha256(str(run).encode()).hexdigest()[:16]
        return Path("/tmp") / f"shoal-podman-{digest}"

    @property
    def env(self) -> dict[str, str]:
        """The client's whole environment: the launchers' (``agent.execution.jobenv``)."""
        env = dict(LAUNCHER_ENV)
        if self.conf is not None:
            env["CONTAINERS_CONF"] = str(self.conf)
        return env


def find_runtime(
    choice: str | None,
    *,
    conf: Path | None = None,
    root: Path | None = None,
    insecure_registries: Sequence[str] = (),
    platform: str = sys.platform,
) -> ContainerRuntime | None:
    """The runtime ``choice`` names (``podman``, ``docker``; ``none``: ``None``), or the first
    of podman and docker this host has (``None``: neither, or not Linux). ``ValueError`` (one
    line) for a named runtime the host lacks or an option it does not take."""
    if choice == "none":
        return None
    if choice is not None and choice not in RUNTIME_KINDS:
        raise ValueError(f"container_runtime must be podman, docker or none, not {choice!r}")
    if not platform.startswith("linux"):
        if choice is not None:
            raise ValueError(f"container_runtime = {choice}: containers run on Linux hosts only")
        return None
    kinds: tuple[RuntimeKind, ...] = RUNTIME_KINDS if choice is None else (choice,)
    for kind in kinds:
        found = shutil.which(kind, path=SYSTEM_PATH)
        if found is None:
            continue
        if kind == "docker" and (root is not None or conf is not None):
            if choice is None:
                continue
            raise ValueError("container_root and containers_conf are podman's: docker has neither")
        return ContainerRuntime(
            kind, os.path.abspath(found), conf, root, tuple(insecure_registries)
        )
    if choice is not None:
        raise ValueError(f"container_runtime = {choice}: no {choice} in {SYSTEM_PATH}")
    return None


# -- one attempt's command line -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Mount:
    """A host folder given to the container at the same path."""

    path: str
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class DeviceView:
    """Where this host's device nodes and CDI specs are (a test gives its own tree)."""

    dev_root: Path = Path("/dev")
    sys_root: Path = Path("/sys")
    cdi_dirs: tuple[Path, ...] = CDI_DIRS
    library_dirs: tuple[str, ...] = LIBRARY_DIRS

    def has_cdi(self) -> bool:
        """Whether the NVIDIA toolkit wrote CDI specs here (``nvidia-ctk cdi generate``)."""
        for folder in self.cdi_dirs:
            for pattern in ("*nvidia*.yaml", "*nvidia*.json"):
                if glob.glob(str(folder / pattern)):
                    return True
        return False


def agent_key(data_dir: Path) -> str:
    """Tells apart the agents of one host (from the data folder, as the cgroup cage does)."""
    return hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]


def container_name(key: str, job_id: str, attempt: int) -> str:
    return f"{NAME_PREFIX}{key}-{job_id}-{attempt}"


def checked_path(path: str, what: str) -> str:
    """``path`` when it can be given to the runtime as a mount, else ``ValueError``."""
    if not os.path.isabs(path):
        raise ValueError(f"{what} {path!r} must be an absolute path in a container job")
    if any(c in path for c in _FORBIDDEN_IN_PATHS):
        raise ValueError(f"{what} {path!r}: a container mount cannot hold ':' or ','")
    normal = os.path.normpath(path)
    for seen in dict.fromkeys((normal, os.path.realpath(normal))):
        if seen == "/" or any(Path(seen).is_relative_to(p) for p in _SYSTEM_FOLDERS):
            raise ValueError(f"{what} {path!r}: a container is not given the host's {seen}")
    return normal


def env_file_text(env: Mapping[str, str]) -> str:
    """The env file the client reads (``NAME=value`` lines); ``ValueError`` (one line) for what
    the format cannot carry (a line break in a value)."""
    lines = []
    for name, value in sorted(checked_env(env).items()):
        if "\n" in value or "\r" in value:
            raise ValueError(f"env: {name}: a container job's value cannot hold a line break")
        lines.append(f"{name}={value}\n")
    return "".join(lines)


def _render_node(d: DeviceStatic, view: DeviceView) -> str | None:
    """The device's ``/dev/dri/renderD*`` (from sysfs by its PCI address), or ``None``."""
    if d.pci_bus_id is not None:
        found = sorted(
            glob.glob(str(view.sys_root / "bus/pci/devices" / d.pci_bus_id / "drm/renderD*"))
        )
        if found:
            return f"dri/{os.path.basename(found[0])}"
    candidate = f"dri/renderD{128 + d.vendor_index}"
    return candidate if (view.dev_root / candidate).exists() else None


def device_args(devices: Sequence[DeviceStatic], view: DeviceView) -> tuple[str, ...]:
    """``--device=...`` and ``--volume=...`` for the attempt's devices only (see the module
    docstring); a node the host lacks is left out (the job's pinning variables still say what it
    was given)."""
    args: list[str] = []
    nodes: list[str] = []
    nvidia = [d for d in devices if d.vendor == "nvidia"]
    if nvidia and view.has_cdi():
        args += [f"--device=nvidia.com/gpu={d.uuid or d.vendor_index}" for d in nvidia]
    elif nvidia:
        nodes += [f"nvidia{d.vendor_index}" for d in nvidia]
        nodes += list(NVIDIA_CONTROL)
        libraries = {
            path
            for folder in view.library_dirs
            for pattern in NVIDIA_LIBRARIES
            for path in glob.glob(os.path.join(folder, pattern))
        }
        libraries.update(p for p in NVIDIA_PROGRAMS if os.path.exists(p))
        args += [f"--volume={p}:{p}:ro" for p in sorted(libraries) if ":" not in p]
    for d in devices:
        if d.vendor == "amd":
            nodes.append("kfd")
        if d.vendor in ("amd", "intel"):
            render = _render_node(d, view)
            if render is not None:
                nodes.append(render)
    for node in dict.fromkeys(nodes):
        host = view.dev_root / node
        if host.exists():
            args.append(f"--device={host}:/dev/{node}")
    return tuple(args)


def run_argv(
    runtime: ContainerRuntime,
    *,
    name: str,
    key: str,
    image: str,
    argv: Sequence[str],
    uid: int,
    gid: int,
    groups: Sequence[int],
    env_file: Path,
    workdir: str,
    mounts: Sequence[Mount],
    devices: Sequence[str],
    stop_signal: str,
) -> tuple[str, ...]:
    """The client's command line that runs one attempt (see the module docstring)."""
    check_image_ref(image)
    args = [
        "run",
        f"--name={name}",
        f"--label={AGENT_LABEL}={key}",
        *(("--log-driver=passthrough",) if runtime.kind == "podman" else ()),
        "--init",
        "--network=host",
        f"--user={uid}:{gid}",
        *(f"--group-add={g}" for g in sorted(set(groups)) if g != gid),
        "--security-opt=no-new-privileges",
        "--cap-drop=all",
        "--pull=never",
        f"--stop-signal={stop_signal}",
        f"--env-file={env_file}",
        f"--workdir={workdir}",
        *(
            f"--volume={checked_path(m.path, 'mount')}:{m.path}:{'ro' if m.read_only else 'rw'}"
            for m in mounts
        ),
        *devices,
        "--rm",
        "--",
        image,
        *argv,
    ]
    return runtime.command(*args)


def signal_argv(runtime: ContainerRuntime, name: str, signal_name: str) -> tuple[str, ...]:
    return runtime.command("kill", f"--signal={signal_name}", name)


def remove_argv(runtime: ContainerRuntime, name: str) -> tuple[str, ...]:
    if runtime.kind == "podman":
        return runtime.command("rm", "--force", "--ignore", "--time=0", name)
    return runtime.command("rm", "--force", name)


def leftovers_argv(runtime: ContainerRuntime, key: str) -> tuple[str, ...]:
    """Lists (one name a line) the containers this agent's earlier runs left."""
    return runtime.command(
        "ps", "--all", f"--filter=label={AGENT_LABEL}={key}", "--format={{.Names}}"
    )


# -- running the client ----------------------------------------------------------------------------


async def call(
    runtime: ContainerRuntime, argv: Sequence[str], timeout_s: float = 60.0
) -> tuple[int, str]:
    """Run one client command with the launchers' environment; its exit code and output."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=runtime.env,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return 124, f"{argv[1] if len(argv) > 1 else argv[0]}: no answer in {timeout_s:g} s"
    return proc.returncode or 0, out.decode("utf-8", errors="replace")


def last_line(output: str) -> str:
    """The client's error, in one line (its last non-empty line, trimmed of its prefix)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    line = lines[-1] if lines else "no output"
    return line.removeprefix("Error: ")[:300]


class ImageSource(Protocol):
    """Makes an image present in the runtime's storage before an attempt starts."""

    async def ensure(self, runtime: ContainerRuntime, image: str, job_id: str = "") -> None:
        """Return once ``image`` is present (for job ``job_id``: what it waits for); raise
        :class:`ContainerError` (one line) if not."""
        ...


class RegistryPull:
    """Pulls an absent image from its registry (the default source)."""

    async def ensure(self, runtime: ContainerRuntime, image: str, job_id: str = "") -> None:
        check_image_ref(image)
        probe = "exists" if runtime.kind == "podman" else "inspect"
        code, _ = await call(runtime, runtime.command("image", probe, image), 60.0)
        if code == 0:
            return
        options = []
        if runtime.kind == "podman":
            options.append("--quiet")
            if registry_of(image) in runtime.insecure_registries:
                options.append("--tls-verify=false")
        code, out = await call(
            runtime, runtime.command("pull", *options, "--", image), PULL_TIMEOUT_S
        )
        if code != 0:
            raise ContainerError(f"cannot pull image {image}: {last_line(out)}")


def remove_leftovers(
    runtime: ContainerRuntime, key: str, private_dir: Path, timeout_s: float = 60.0
) -> list[str]:
    """Remove every container an earlier run of this agent left (its jobs died with it, as a
    host job's do: their owners start them again); the names removed. Asked only where an
    earlier run left an attempt's env file (it is removed when the attempt ends): an agent that
    ended cleanly, or never ran a container, asks the runtime nothing."""
    if not any(private_dir.glob(f"{NAME_PREFIX}*.env")):
        return []
    try:
        listed = subprocess.run(
            leftovers_argv(runtime, key),
            capture_output=True,
            text=True,
            env=runtime.env,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    names = [n.strip() for n in listed.stdout.splitlines() if n.strip().startswith(NAME_PREFIX)]
    for name in names:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                remove_argv(runtime, name),
                capture_output=True,
                env=runtime.env,
                timeout=timeout_s,
                check=False,
            )
    for left in private_dir.glob(f"{NAME_PREFIX}*.env"):
        left.unlink(missing_ok=True)
    return names


def private_file(folder: Path, name: str, text: str) -> Path:
    """Write ``text`` to a new file only the agent may read, in a folder only it may enter."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    path = folder / name
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return path


@dataclass(frozen=True, slots=True)
class ContainerStart:
    """What the executor starts for one container attempt."""

    name: str
    argv: tuple[str, ...]
    """The client's command line (:func:`run_argv`)."""
    env: Mapping[str, str]
    """The client's whole environment (:attr:`ContainerRuntime.env` and the attempt's marker)."""
    env_file: Path


def container_start(
    runtime: ContainerRuntime,
    view: DeviceView,
    *,
    key: str,
    job_id: str,
    attempt: int,
    image: str,
    argv: Sequence[str],
    job_env: Mapping[str, str],
    job_dir: Path,
    workdir: str | None,
    read_only: Sequence[str],
    devices: Sequence[DeviceStatic],
    stop_signal: str,
    uid: int,
    gid: int,
    groups: Sequence[int],
    private_dir: Path,
) -> ContainerStart:
    """Write the attempt's env file (private to the agent) and build its command line.

    ``job_env``: the job's variables as a host job gets them; the host's ``PATH`` is left out
    (the image's applies, unless the spec sets one) and ``HOME`` is the job's folder."""
    name = container_name(key, job_id, attempt)
    if workdir is not None and (not os.path.isabs(workdir) or "\x00" in workdir):
        raise ValueError(f"workdir {workdir!r} must be an absolute path in a container job")
    folder = checked_path(str(job_dir), "the job's folder")
    mounts = [Mount(folder, read_only=False)]
    checkpoint = job_env.get("SHOAL_CHECKPOINT_DIR")
    if checkpoint and not Path(checkpoint).is_relative_to(folder):
        mounts.append(Mount(checked_path(checkpoint, "checkpoint_dir"), read_only=False))
    mounts += [Mount(checked_path(p, "read-only mount")) for p in read_only]
    env_file = private_file(private_dir, f"{name}.env", env_file_text(job_env))
    client_env = {**runtime.env, "SHOAL_JOB_ID": job_id, "SHOAL_ATTEMPT": str(attempt)}
    command = run_argv(
        runtime,
        name=name,
        key=key,
        image=image,
        argv=argv,
        uid=uid,
        gid=gid,
        groups=groups,
        env_file=env_file,
        workdir=workdir or folder,
        mounts=mounts,
        devices=device_args(devices, view),
        stop_signal=stop_signal,
    )
    return ContainerStart(name, command, client_env, env_file)
