"""The container runtime's command lines, without running it: devices, hardening, detection."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from agent.execution.containers import (
    ContainerRuntime,
    DeviceView,
    Mount,
    device_args,
    env_file_text,
    find_runtime,
    run_argv,
)
from probers.records import DeviceStatic

UUID = "GPU-11111111-2222-3333-4444-555555555555"
NV = DeviceStatic(
    key=UUID, vendor="nvidia", backend="cuda", name="H100", source="t", vendor_index=1, uuid=UUID
)
INTEL = DeviceStatic(
    key="drm:card2",
    vendor="intel",
    backend="xpu",
    name="Arc A770",
    source="t",
    vendor_index=0,
    pci_bus_id="0000:03:00.0",
)
PODMAN = ContainerRuntime("podman", "/usr/bin/podman")


def test_nvidia_goes_by_cdi_where_the_toolkit_wrote_its_specs(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        (dev / name).touch()
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libcuda.so.1").touch()
    (lib / "libc.so.6").touch()
    plain = DeviceView(dev_root=dev, cdi_dirs=(tmp_path / "cdi",), library_dirs=(str(lib),))
    args = device_args([NV], plain)
    assert f"--device={dev / 'nvidia1'}:/dev/nvidia1" in args
    assert f"--device={dev / 'nvidiactl'}:/dev/nvidiactl" in args
    assert not any("nvidia0" in a for a in args)
    assert f"--volume={lib / 'libcuda.so.1'}:{lib / 'libcuda.so.1'}:ro" in args
    assert not any("libc.so" in a for a in args)
    (tmp_path / "cdi").mkdir()
    (tmp_path / "cdi" / "nvidia.yaml").write_text("cdiVersion: 0.5.0\n")
    assert device_args([NV], plain) == (f"--device=nvidia.com/gpu={UUID}",)


def test_intel_gets_its_own_render_node_from_sysfs(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    (dev / "dri").mkdir(parents=True)
    for node in ("renderD128", "renderD129"):
        (dev / "dri" / node).touch()
    drm = tmp_path / "sys/bus/pci/devices/0000:03:00.0/drm"
    (drm / "renderD129").mkdir(parents=True)
    (drm / "card2").mkdir()
    view = DeviceView(dev_root=dev, sys_root=tmp_path / "sys", cdi_dirs=(), library_dirs=())
    assert device_args([INTEL], view) == (f"--device={dev / 'dri/renderD129'}:/dev/dri/renderD129",)


def test_the_run_line_is_hardened_and_the_image_ends_the_options(tmp_path: Path) -> None:
    argv = run_argv(
        PODMAN,
        name="shoal-k-j-1",
        key="k",
        image="127.0.0.1:5000/x:1",
        argv=("--privileged", "-v", "/:/host"),
        uid=65534,
        gid=65534,
        groups=(65534, 44),
        env_file=tmp_path / "env",
        workdir="/work",
        mounts=(Mount("/data/set"), Mount("/jobs/j", read_only=False)),
        devices=(),
        stop_signal="SIGUSR1",
    )
    options, command = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    assert command == ("127.0.0.1:5000/x:1", "--privileged", "-v", "/:/host")
    for must in (
        "--user=65534:65534",
        "--group-add=44",
        "--security-opt=no-new-privileges",
        "--cap-drop=all",
        "--init",
        "--network=host",
        "--pull=never",
        "--stop-signal=SIGUSR1",
        "--volume=/data/set:/data/set:ro",
        "--volume=/jobs/j:/jobs/j:rw",
        "--log-driver=passthrough",
    ):
        assert must in options, must
    assert "--privileged" not in options
    # Every option the caller's values fill is one word: --name=..., never a separate value.
    assert all(a.startswith("--") or a == "run" or a == PODMAN.program for a in options)


def test_an_env_file_carries_values_verbatim_and_refuses_a_line_break() -> None:
    assert env_file_text({"B": " spaced = 'q' ", "A": "$HOME"}) == "A=$HOME\nB= spaced = 'q' \n"
    with pytest.raises(ValueError, match="line break"):
        env_file_text({"A": "x\rY=1"})
    with pytest.raises(ValueError):
        env_file_text({"LD PRELOAD": "x"})


def test_runtime_detection_and_its_refusals(tmp_path: Path) -> None:
    assert find_runtime("none") is None
    assert find_runtime(None, platform="darwin") is None
    with pytest.raises(ValueError, match="Linux hosts only"):
        find_runtime("podman", platform="win32")
    with pytest.raises(ValueError, match="must be podman, docker or none"):
        find_runtime("lxc")
    found = find_runtime(None, platform="linux")
    if shutil.which("podman", path="/usr/sbin:/usr/bin:/sbin:/bin"):
        assert found is not None and found.kind == "podman" and os.path.isabs(found.program)
    if not shutil.which(
        "docker", path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    ):
        with pytest.raises(ValueError, match="no docker in"):
            find_runtime("docker", platform="linux")
    long_root = ContainerRuntime("podman", "/usr/bin/podman", root=tmp_path / ("x" * 60))
    assert len(str(long_root.run_root)) <= 50  # podman refuses a longer run root
