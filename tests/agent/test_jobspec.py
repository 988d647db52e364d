"""Job specs: the size and duration parsers, the TOML job file and the validated wire form."""

from __future__ import annotations

import datetime as dt

import pytest

from agent.job.jobspec import (
    JobSpec,
    Resources,
    UnknownFeatures,
    check_job_id,
    new_job_id,
)
from agent.job.units import parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("40GiB", 42_949_672_960),
        ("40 GiB", 42_949_672_960),
        ("512MiB", 536_870_912),
        ("80GB", 80_000_000_000),
        ("1.5G", 1_610_612_736),
        ("2ti", 2_199_023_255_552),
        ("16Gi", 17_179_869_184),
        ("1024", 1024),
        ("7B", 7),
        ("1.3KiB", 1331),  # 1331.2 rounded down
        (".5k", 512),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "-1GiB", "40 GiBs", "1.2.3G", "4 0G", "1e9"])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="size") as info:
        parse_size(text)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2h", 7200.0),
        ("90m", 5400.0),
        ("1h30m", 5400.0),
        ("1h 30m", 5400.0),
        ("45s", 45.0),
        ("1.5d", 129_600.0),
        ("500ms", 0.5),
        ("1w", 604_800.0),
        ("3600", 3600.0),
        ("2.5", 2.5),
    ],
)
def test_parse_duration(text: str, expected: float) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "h", "2x", "-5s", "1h30", "soon", "5 s s"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="duration") as info:
        parse_duration(text)
    assert "\n" not in str(info.value)


JOB_FILE = """
command = ["python", "train.py", "--epochs", "3"]
env = { WANDB_MODE = "offline" }
workdir = "/srv/train"
kind = "training"
priority = 5
preemptible = true
deadline = "6h"
max_runtime_s = "2h30m"
datasets = ["imagenet"]
labels = { team = "vision" }
affinity = { zone = "eu-1" }
anti_affinity = { spot = "true" }
checkpoint_dir = "/srv/ckpt"
checkpoint_signal = "usr1"
retries = 2

[resources]
gpus_per_node = 8
nodes = 2
min_mem_per_gpu_bytes = "40GiB"
backends = ["cuda", "rocm"]
min_compute_capability = "8.0"
interconnect = "nvlink"
"""


def test_from_toml_reads_every_field_and_the_human_forms() -> None:
    spec = JobSpec.from_toml(JOB_FILE, now=1_700_000_000.0)
    assert spec.command == ("python", "train.py", "--epochs", "3")
    assert dict(spec.env) == {"WANDB_MODE": "offline"}
    assert spec.workdir == "/srv/train"
    assert spec.image is None
    assert spec.kind == "training"
    assert spec.priority == 5
    assert spec.preemptible is True
    assert spec.deadline == 1_700_000_000.0 + 6 * 3600
    assert spec.max_runtime_s == 9000.0
    assert spec.datasets == ("imagenet",)
    assert dict(spec.labels) == {"team": "vision"}
    assert dict(spec.affinity) == {"zone": "eu-1"}
    assert dict(spec.anti_affinity) == {"spot": "true"}
    assert spec.checkpoint_dir == "/srv/ckpt"
    assert spec.checkpoint_signal == "SIGUSR1"
    assert spec.retries == 2
    assert spec.is_gang
    assert spec.resources == Resources(
        gpus_per_node=8,
        nodes=2,
        min_mem_per_gpu_bytes=42_949_672_960,
        backends=("cuda", "rocm"),
        min_compute_capability="8.0",
        archs=(),
        interconnect="nvlink",
    )


def test_minimal_toml_takes_the_defaults() -> None:
    spec = JobSpec.from_toml('command = ["sleep", "1"]')
    assert spec == JobSpec(command=("sleep", "1"))
    assert spec.kind == "batch"
    assert spec.resources.gpus_per_node == 0  # no GPU unless the job asks for one
    assert spec.resources.nodes == 1
    assert not spec.is_gang
    assert spec.checkpoint_signal == "SIGTERM"


def test_a_job_that_says_what_each_gpu_must_be_asks_for_one() -> None:
    for extra in ('min_mem_per_gpu_bytes = "40GiB"', 'backends = ["cuda"]', 'archs = ["hopper"]'):
        spec = JobSpec.from_toml(f'command = ["x"]\n[resources]\n{extra}')
        assert spec.resources.gpus_per_node == 1, extra
    cpu = JobSpec.from_toml('command = ["x"]\n[resources]\nbackends = ["cpu"]')
    assert cpu.resources.gpus_per_node == 0
    two = JobSpec.from_toml('command = ["x"]\n[resources]\ngpus_per_node = 2\nbackends = ["rocm"]')
    assert two.resources.gpus_per_node == 2


def test_toml_deadline_as_offset_datetime() -> None:
    spec = JobSpec.from_toml('command = ["x"]\ndeadline = 2025-01-31T18:00:00Z')
    expected = dt.datetime(2025, 1, 31, 18, 0, tzinfo=dt.UTC).timestamp()
    assert spec.deadline == expected == 1_738_346_400.0


def test_toml_deadline_without_offset_is_refused() -> None:
    with pytest.raises(ValueError, match="deadline: a date-time needs a UTC offset"):
        JobSpec.from_toml('command = ["x"]\ndeadline = 2025-01-31T18:00:00')


def test_toml_syntax_error_is_one_line() -> None:
    with pytest.raises(ValueError, match="not valid TOML") as info:
        JobSpec.from_toml("command = [")
    assert "\n" not in str(info.value)


def test_wire_form_round_trips_and_is_stable() -> None:
    spec = JobSpec.from_toml(JOB_FILE, now=1_700_000_000.0)
    wire = spec.to_dict()
    assert list(wire) == [
        "command",
        "env",
        "workdir",
        "image",
        "resources",
        "kind",
        "priority",
        "preemptible",
        "deadline",
        "max_runtime_s",
        "datasets",
        "labels",
        "affinity",
        "anti_affinity",
        "checkpoint_dir",
        "checkpoint_signal",
        "retries",
        "features",
        "spec_version",
    ]
    assert wire["features"] == list(spec.features) and wire["spec_version"] == 2
    assert wire["resources"]["min_mem_per_gpu_bytes"] == 42_949_672_960
    assert wire["deadline"] == 1_700_021_600.0
    assert JobSpec.from_dict(wire) == spec
    assert JobSpec.from_dict(wire).to_dict() == wire


def test_wire_form_refuses_human_forms() -> None:
    wire = JobSpec(command=("x",)).to_dict()
    wire["max_runtime_s"] = "2h"
    with pytest.raises(ValueError, match="max_runtime_s: expected a number, got str"):
        JobSpec.from_dict(wire)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"colour": "blue"}, "unknown key 'colour'"),
        ({"resources": {"gpus": 2}}, "unknown key 'resources.gpus'"),
        ({"priority": "5"}, "priority: expected an integer, got str"),
        ({"priority": 5.0}, "priority: expected an integer, got float"),
        ({"retries": -1}, "retries: must not be negative"),
        ({"resources": {"gpus_per_node": True}}, "resources.gpus_per_node: expected an integer"),
        ({"resources": {"gpus_per_node": -2}}, "resources.gpus_per_node: must not be negative"),
        ({"resources": {"nodes": 0}}, "resources.nodes: must not be less than 1"),
        (
            {"resources": {"min_mem_per_gpu_bytes": -1}},
            "resources.min_mem_per_gpu_bytes: must not be negative",
        ),
        ({"resources": {"backends": ["opencl"]}}, "resources.backends: 'opencl' is not one of"),
        ({"resources": {"interconnect": "infiniband"}}, "resources.interconnect: 'infiniband'"),
        ({"resources": {"min_compute_capability": "ampere"}}, "expected MAJOR.MINOR"),
        ({"resources": []}, "resources: must be a table"),
        ({"kind": "serving"}, "kind: 'serving' is not one of training, inference, batch"),
        ({"command": []}, "command: must be a non-empty list of strings"),
        ({"command": "python train.py"}, "command: expected a list of strings"),
        ({"command": ["python", 3]}, "command: expected a list of strings"),
        ({"env": {"A": 1}}, "env: expected a table of strings"),
        ({"preemptible": "yes"}, "preemptible: expected true or false, got str"),
        ({"deadline": -5}, "deadline: must not be negative"),
        ({"max_runtime_s": 0}, "max_runtime_s: must be positive"),
        ({"checkpoint_signal": "SIGKILL"}, "checkpoint_signal: SIGKILL is not one of"),
    ],
)
def test_from_dict_refuses_bad_input_naming_the_field(
    change: dict[str, object], message: str
) -> None:
    wire = {"command": ["python", "train.py"], **change}
    with pytest.raises(ValueError) as info:
        JobSpec.from_dict(wire)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_spec_is_frozen() -> None:
    spec = JobSpec(command=("x",))
    with pytest.raises(AttributeError):
        spec.priority = 3  # type: ignore[misc]


def test_job_ids() -> None:
    a, b = new_job_id(), new_job_id()
    assert a != b
    assert len(a) == 32
    assert check_job_id(a) == a
    for bad in ["", "../../etc", a.upper(), a[:-1], a + "0"]:
        with pytest.raises(ValueError, match="32 lowercase hex"):
            check_job_id(bad)


@pytest.mark.parametrize(
    "name",
    [
        "CUDA_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
        "ZE_AFFINITY_MASK",
        "ONEAPI_DEVICE_SELECTOR",
        "CUDA_DEVICE_ORDER",
        "SHOAL_JOB_ID",
        "SHOAL_ANYTHING",
        "cuda_visible_devices",  # the same variable on Windows
    ],
)
def test_a_spec_may_not_set_what_shoal_sets(name: str) -> None:
    """The GPU pinning is Shoal's: a job cannot ask for other devices through its env."""
    for parse in (JobSpec.from_dict, JobSpec.from_human):
        with pytest.raises(ValueError) as info:
            parse({"command": ["x"], "env": {"OK": "1", name: "0"}})
        assert str(info.value) == f"env {name} is set by Shoal"
    with pytest.raises(ValueError, match=f"^env {name} is set by Shoal$"):
        JobSpec.from_toml(f'command = ["x"]\n[env]\n{name} = "all"\n')


def test_a_spec_may_set_other_variables() -> None:
    spec = JobSpec.from_dict({"command": ["x"], "env": {"NCCL_DEBUG": "INFO", "RANK0": "x"}})
    assert spec.env == {"NCCL_DEBUG": "INFO", "RANK0": "x"}


# -- shares of a GPU -------------------------------------------------------------------------


def test_a_share_of_a_gpu_by_fraction_or_by_memory() -> None:
    half = Resources(gpus_per_node=1, share_fraction=0.5)
    assert JobSpec.from_toml('command = ["x"]\n[resources]\ngpus = 0.5\n').resources == half
    assert (
        JobSpec.from_toml('command = ["x"]\n[resources]\ngpus_per_node = 0.5\n').resources == half
    )
    assert (
        JobSpec.from_human({"command": ["x"], "resources": {"gpus_per_node": 0.5}}).resources
        == half
    )
    by_mem = JobSpec.from_toml('command = ["x"]\n[resources]\nshare_mem_bytes = "10GiB"\n')
    assert by_mem.resources == Resources(gpus_per_node=1, share_mem_bytes=10 * 1024**3)
    assert (
        JobSpec.from_toml('command = ["x"]\n[resources]\ngpus = 2\n').resources.gpus_per_node == 2
    )
    spec = JobSpec(command=("x",), resources=half)
    wire = spec.to_dict()
    assert wire["features"] == ["share"] and wire["spec_version"] == 3
    assert JobSpec.from_dict(wire) == spec
    assert "share_fraction" not in JobSpec(command=("x",)).to_dict()["resources"]


@pytest.mark.parametrize(
    ("resources", "error"),
    [
        ({"gpus_per_node": 0.5, "share_mem_bytes": "1GiB"}, "not both"),
        ({"share_fraction": 0.5, "gpus_per_node": 2}, "a share is of one GPU"),
        ({"share_fraction": 0.5, "nodes": 2}, "runs on one node"),
        ({"gpus_per_node": 1.5}, "neither a whole number of GPUs nor a share"),
        ({"share_fraction": 1.0}, "between 0 and 1"),
        ({"share_mem_bytes": 0}, "must be positive"),
        ({"gpus": 1, "gpus_per_node": 1}, "gpus or gpus_per_node"),
    ],
)
def test_a_share_that_makes_no_sense_is_refused(resources: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        JobSpec.from_human({"command": ["x"], "resources": resources})


@pytest.mark.parametrize(
    ("resources", "feature"),
    [
        (Resources(gpus_per_node=1, share_fraction=0.5), "share"),
        (Resources(gpus_per_node=2, gpus_max_per_node=4), "elastic"),
    ],
)
def test_an_agent_of_spec_version_2_refuses_a_version_3_feature_naming_the_version(
    monkeypatch: pytest.MonkeyPatch, resources: Resources, feature: str
) -> None:
    import agent.job.jobspec as jobspec

    wire = JobSpec(command=("x",), resources=resources).to_dict()
    version_2 = {k: v for k, v in jobspec.FEATURES.items() if v <= 2}
    monkeypatch.setattr(jobspec, "FEATURES", version_2)
    monkeypatch.setattr(jobspec, "SPEC_VERSION", 2)
    with pytest.raises(
        UnknownFeatures,
        match=rf"needs job-spec version 3 \(feature {feature}\); this agent reads version 2",
    ):
        JobSpec.from_dict(wire)


# -- elastic jobs --------------------------------------------------------------------------------


def test_an_elastic_job_asks_for_a_range_of_gpus() -> None:
    ranged = Resources(gpus_per_node=2, gpus_max_per_node=8)
    assert JobSpec.from_toml('command = ["x"]\n[resources]\ngpus = "2-8"\n').resources == ranged
    assert (
        JobSpec.from_human({"command": ["x"], "resources": {"gpus_per_node": " 2 - 8 "}}).resources
        == ranged
    )
    assert JobSpec.from_toml('command = ["x"]\n[resources]\ngpus = "4"\n').resources == Resources(
        gpus_per_node=4
    )
    spec = JobSpec(command=("x",), resources=ranged)
    wire = spec.to_dict()
    assert wire["features"] == ["elastic"] and wire["spec_version"] == 3
    assert wire["resources"]["gpus_max_per_node"] == 8
    assert JobSpec.from_dict(wire) == spec
    assert "gpus_max_per_node" not in JobSpec(command=("x",)).to_dict()["resources"]
    assert ranged.gpus_text() == "2-8" and Resources(gpus_per_node=3).gpus_text() == "3"


@pytest.mark.parametrize(
    ("resources", "error"),
    [
        ({"gpus": "2-8", "nodes": 2}, "an elastic job .* runs on one node"),
        ({"gpus": "4-2"}, "2 is not more than gpus_per_node 4"),
        ({"gpus": "2-2"}, "is not more than gpus_per_node 2"),
        ({"gpus": "0-4"}, "an elastic job needs at least 1 GPU"),
        ({"gpus": "1-4", "share_fraction": 0.5}, "whole GPUs, not a share of one"),
        ({"gpus_per_node": 1, "gpus_max_per_node": 2, "share_mem_bytes": "1GiB"}, "not a share"),
        ({"gpus": "two-eight"}, "neither a number of GPUs nor a range"),
        ({"gpus": "2-8", "gpus_max_per_node": 8}, "a range in gpus and gpus_max_per_node"),
    ],
)
def test_a_range_that_cannot_be_run_is_refused(resources: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        JobSpec.from_human({"command": ["x"], "resources": resources})


@pytest.mark.parametrize(
    ("ref", "why"),
    [
        ("--privileged", "starts with '-'"),
        ("Busybox", "not an image reference"),
        ("docker-archive:/etc/shadow", "not an image reference"),
        ("bb latest", "not an image reference"),
        ("bb:", "not an image reference"),
        ("a/" + "b" * 260, "longer than 255"),
    ],
)
def test_a_malformed_image_is_refused_in_one_line(ref: str, why: str) -> None:
    with pytest.raises(ValueError, match=why) as info:
        JobSpec.from_human({"command": ["true"], "image": ref})
    assert "\n" not in str(info.value) and str(info.value).startswith("image: ")


def test_image_references_as_registries_write_them() -> None:
    from agent.job.imageref import registry_of

    for ref, registry in [
        ("busybox", "docker.io"),
        ("library/busybox:1.36", "docker.io"),
        ("127.0.0.1:5000/shoal/bb:1", "127.0.0.1:5000"),
        ("localhost/bb", "localhost"),
        ("nvcr.io/nvidia/pytorch:24.01-py3@sha256:" + "a" * 64, "nvcr.io"),
    ]:
        assert JobSpec.from_human({"command": ["true"], "image": ref}).image == ref
        assert registry_of(ref) == registry
