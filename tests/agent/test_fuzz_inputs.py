"""Fuzzing what operators and hosts hand Shoal: job specs (wire form, TOML, the CLI's arguments),
signed submissions and commands, agent configs, hosts and fleet files. Each parser returns a typed
value or raises its own error type (``ValueError`` for a spec, ``SubmissionRefused`` for a
submission, ``EnvelopeError`` for a command, ``UserError`` for a file); never another exception,
never a hang."""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import msgpack
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from agent.bootstrap.hosts import parse_hosts_file, parse_target
from agent.cli import build_parser, submit_cmd
from agent.common.errors import UserError
from agent.daemon.config import AgentConfig, config_from_mapping, load_config
from agent.job.authority import SubmissionRefused, read_submission
from agent.job.jobspec import JobSpec, Resources
from agent.job.units import parse_duration, parse_size
from agent.operator.fleet import load_fleet
from agent.wire.place import dataset_name_problem
from gossip import envelope
from gossip.replay import ReplayGuard
from tests.agent.authority_kit import Kit
from tests.hostile import ANY, FUZZ, FUZZ_FILES, JSON, TEXT, deeply_nested, mutated

FULL_SPEC = JobSpec(
    command=("python", "train.py"),
    env={"A": "1"},
    workdir="/srv/work",
    resources=Resources(gpus_per_node=2, min_mem_per_gpu_bytes=10, backends=("cuda",)),
    kind="training",
    priority=3,
    preemptible=True,
    deadline=10.0,
    max_runtime_s=60.0,
    datasets=("imagenet",),
    labels={"team": "a"},
    affinity={"zone": "a"},
    anti_affinity={"zone": "b"},
    checkpoint_dir="/srv/ckpt",
    checkpoint_signal="SIGUSR1",
    retries=1,
).to_dict()


def _spec_or_value_error(parse: Any, value: Any) -> JobSpec | None:
    try:
        spec: JobSpec = parse(value)
    except ValueError:
        return None
    _check_spec(spec)
    return spec


def _check_spec(spec: JobSpec) -> None:
    """What every spec that parses holds to, whoever wrote it."""
    assert spec.command and all(isinstance(a, str) for a in spec.command)
    for number in (spec.deadline, spec.max_runtime_s):
        assert number is None or math.isfinite(number)
    assert spec.max_runtime_s is None or spec.max_runtime_s > 0
    for text in (*spec.command, *spec.env, *spec.env.values(), spec.workdir, spec.checkpoint_dir):
        if text is not None:
            assert "\x00" not in text
            text.encode("utf-8")  # a lone surrogate cannot reach an argv, a path or msgpack
    for path in (spec.workdir, spec.checkpoint_dir):
        assert path is None or ".." not in (
            *PurePosixPath(path).parts,
            *PureWindowsPath(path).parts,
        )
    assert all(name and "=" not in name for name in spec.env)
    if spec.image is not None:  # a reference, never a runtime's option, transport or a space
        assert not spec.image.startswith("-") and not any(c.isspace() for c in spec.image)
        assert "://" not in spec.image and spec.image.rpartition("/")[2][:1].isalnum()
    for name in spec.datasets:
        assert dataset_name_problem(name) is None
    JobSpec.from_dict(json.loads(json.dumps(spec.to_dict(), allow_nan=False)))


# -- job specs -----------------------------------------------------------------------------------


@FUZZ
@given(value=mutated(FULL_SPEC, JSON) | JSON)
@example(value={**FULL_SPEC, "max_runtime_s": math.nan})
@example(value={**FULL_SPEC, "max_runtime_s": math.inf})
@example(value={**FULL_SPEC, "deadline": math.inf})
@example(value={**FULL_SPEC, "command": ["a\x00b"]})
@example(value={**FULL_SPEC, "env": {"A": "\udcff"}})
@example(value={**FULL_SPEC, "workdir": "../../identity"})
@example(value={**FULL_SPEC, "checkpoint_dir": "/srv/../etc"})
@example(value={**FULL_SPEC, "checkpoint_dir": "C:\\jobs\\..\\agent"})
@example(value={**FULL_SPEC, "env": {"A=B": "1"}})
@example(value={**FULL_SPEC, "datasets": ["../../etc/passwd"]})
@example(value={**FULL_SPEC, "datasets": [""]})
def test_a_spec_in_its_wire_form_parses_or_is_a_value_error(value: Any) -> None:
    _spec_or_value_error(JobSpec.from_dict, value)


@FUZZ
@given(value=mutated(FULL_SPEC, JSON) | JSON)
@example(value={**FULL_SPEC, "max_runtime_s": "9" * 400 + "s"})  # float('9'*400) is infinite
@example(value={**FULL_SPEC, "deadline": "9" * 400 + "h"})
@example(value={**FULL_SPEC, "resources": {"min_mem_per_gpu_bytes": "9" * 5000}})
def test_a_spec_in_its_human_form_parses_or_is_a_value_error(value: Any) -> None:
    _spec_or_value_error(lambda v: JobSpec.from_human(v, now=1000.0), value)


def _toml_text(value: Any) -> str:
    import tomli_w

    try:
        return tomli_w.dumps(value) if isinstance(value, dict) else str(value)
    except (TypeError, ValueError):
        return str(value)


@FUZZ
@given(text=st.text(max_size=200) | mutated(FULL_SPEC, JSON).map(_toml_text))
@example(text=deeply_nested()[2])
@example(text=deeply_nested()[3])
@example(text='command = ["x"]\nmax_runtime_s = nan')
@example(text='command = ["x"]\ndeadline = inf')
def test_a_toml_job_file_parses_or_is_a_value_error(text: str) -> None:
    _spec_or_value_error(lambda t: JobSpec.from_toml(t, now=1000.0), text)


@FUZZ
@given(text=TEXT | st.text(max_size=30))
@example(text="9" * 400 + "s")
@example(text="²")
def test_sizes_and_durations_parse_or_are_a_value_error(text: str) -> None:
    for parse in (parse_size, parse_duration):
        try:
            got = parse(text)
        except ValueError:
            continue
        assert math.isfinite(got) and got >= 0


SUBMIT_FLAGS = st.sampled_from(
    [
        "--gpus",
        "--nodes",
        "--mem",
        "--backend",
        "--kind",
        "--priority",
        "--deadline",
        "--max-runtime",
        "--dataset",
        "--env",
        "--label",
        "--checkpoint-dir",
        "--image",
        "--retries",
    ]
)


@FUZZ
@given(
    flags=st.lists(st.tuples(SUBMIT_FLAGS, TEXT | st.text(max_size=10)), max_size=5),
    command=st.lists(TEXT, max_size=3),
)
@example(flags=[("--max-runtime", "9" * 400 + "s")], command=["x"])
@example(flags=[("--checkpoint-dir", "../../x")], command=["x"])
@example(flags=[("--image", "-v /:/host")], command=["x"])
def test_the_submit_arguments_make_a_spec_or_a_user_error(
    flags: list[tuple[str, str]], command: list[str]
) -> None:
    argv = ["submit"] + [f"{flag}={value}" for flag, value in flags] + ["--", *command]
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:  # argparse's usage error (a bad integer, a kind not among the choices)
        return
    try:
        spec = submit_cmd.spec_from_args(args)
    except (ValueError, UserError):
        return
    _check_spec(spec)


# -- submissions and commands --------------------------------------------------------------------


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Kit:
    return Kit(tmp_path_factory.mktemp("kit"))


@FUZZ
@given(body=mutated({"job_id": "a" * 32, "spec": FULL_SPEC}, JSON) | JSON)
@example(body=deeply_nested(2_000)[0])
@example(body={"job_id": "a" * 32, "spec": {"command": ["x"], "max_runtime_s": math.nan}})
@example(body={"job_id": 5, "spec": {"command": ["x"]}})
def test_a_signed_submission_is_verified_or_refused(kit: Kit, body: Any) -> None:
    """An operator's valid signature over any body: a submission, or SubmissionRefused."""
    raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    sealed = envelope.seal(kit.operator, "submit", raw, time.time())
    try:
        sub = read_submission(sealed, kit.trust(), time.time())
    except SubmissionRefused:
        return
    _check_spec(sub.spec)


_SEALED: dict[str, Any] = {
    "v": 1,
    "op": "o" * 32,
    "cred": b"c",
    "id": "b" * 32,
    "at": 1.0,
    "kind": "drain",
    "body": b"{}",
    "sig": b"s",
}


@FUZZ
@given(value=mutated(_SEALED, ANY) | ANY, raw=st.binary(max_size=200))
def test_a_hostile_envelope_is_an_envelope_error(kit: Kit, value: Any, raw: bytes) -> None:
    try:
        hostile = msgpack.packb(value, use_bin_type=True)
    except (OverflowError, ValueError, TypeError):
        hostile = raw
    trust, guard = kit.trust(), ReplayGuard()
    for data in (hostile, raw):
        with contextlib.suppress(envelope.EnvelopeError):
            envelope.open(data, trust, guard, time.time())


# -- configs, hosts and fleet files --------------------------------------------------------------

CONFIG = {
    "agent": {
        "data_dir": "/var/lib/shoal",
        "listen": "0.0.0.0:7946",
        "join": ["10.0.0.1:7946"],
        "labels": {"a": "b"},
        "probe_interval_s": 1.0,
        "rpc_timeout_s": 5.0,
        "sim_seed": 1,
        "ended_jobs_keep_s": 900.0,
        "ended_jobs_kept": 1000,
        "ended_jobs_disk_keep_s": 86400.0,
    }
}


@FUZZ
@given(value=mutated(CONFIG, JSON) | JSON)
@example(value={"agent": {"probe_interval_s": math.nan}})
@example(value={"agent": {"rpc_timeout_s": -1.0}})
@example(value={"agent": {"telemetry_heartbeat_s": math.inf}})
@example(value={"agent": {"stop_grace_s": 0}})
@example(value={"agent": {"ended_jobs_kept": -1}})
@example(value={"agent": {"ended_jobs_kept": 1.5}})
@example(value={"agent": {"ended_jobs_kept": True}})
@example(value={"agent": {"ended_jobs_keep_s": 60.0, "ended_jobs_disk_keep_s": 59.0}})
def test_an_agent_config_loads_or_is_a_user_error(value: Any) -> None:
    try:
        config = config_from_mapping(value) if isinstance(value, dict) else None
    except UserError:
        return
    if config is None:
        return
    assert isinstance(config, AgentConfig)
    for name in ("probe_interval_s", "telemetry_heartbeat_s", "rpc_timeout_s"):
        got = getattr(config, name)
        assert math.isfinite(got) and got > 0, name
    for name in ("stop_grace_s", "drain_grace_s", "ended_jobs_keep_s", "ended_jobs_disk_keep_s"):
        got = getattr(config, name)
        assert math.isfinite(got) and got >= 0, name
    assert config.ended_jobs_disk_keep_s >= config.ended_jobs_keep_s
    assert type(config.ended_jobs_kept) is int and config.ended_jobs_kept >= 0


@FUZZ_FILES
@given(raw=st.binary(max_size=100) | st.sampled_from([b"\xff\xfe", b'listen = "\xff"']))
@example(raw=deeply_nested(1_000)[2].encode())
def test_a_config_file_of_any_bytes_loads_or_is_a_user_error(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "agent.toml"
    path.write_bytes(raw)
    with contextlib.suppress(UserError):
        load_config(path)


@FUZZ
@given(text=TEXT | st.text(max_size=30))
@example(text="host:²")
@example(text="host:١٢")
@example(text="[::1]:²")
@example(text="user@host name")
def test_a_host_target_parses_or_is_a_user_error(text: str) -> None:
    try:
        spec = parse_target(text)
    except UserError:
        return
    assert 0 < spec.port < 65536
    assert spec.host and not any(ch.isspace() or ch == "\x00" for ch in spec.host)


HOSTS = {"host": [{"address": "root@10.0.0.1:22", "labels": {"a": "b"}, "sim_seed": 1}]}


@FUZZ_FILES
@given(value=mutated(HOSTS, JSON) | JSON, raw=st.binary(max_size=60))
@example(value={"host": [{"address": "h:²"}]}, raw=b"")
@example(value=None, raw=deeply_nested(1_000)[2].encode())
@example(value=None, raw=b"\xff")
def test_a_hosts_or_fleet_file_parses_or_is_a_user_error(
    tmp_path: Path, value: Any, raw: bytes
) -> None:
    text = _toml_text(value) if value is not None else raw.decode("utf-8", "replace")
    with contextlib.suppress(UserError):
        parse_hosts_file(text)
    fleet = tmp_path / "fleet.toml"
    for data in (text.encode("utf-8", "surrogatepass"), raw):
        fleet.write_bytes(data)
        with contextlib.suppress(UserError):
            load_fleet(tmp_path)
