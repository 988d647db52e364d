"""``shoal submit``: a job from the command line or a TOML file, checked against the mesh first.

A job asks for no GPU unless it says how many (``--gpus N``), or what each GPU must be
(``--mem``, ``--backend`` other than ``cpu``: then one). Before anything is signed the CLI reads
the mesh (:mod:`agent.operator.fit`): a job no node could ever run is refused in one line, exit 2,
nothing submitted (``--anyway`` submits it to wait for such a host); one that fits but finds every
such node busy is submitted and said to wait (and, when jobs submitted preemptible with a lower
priority run there, that it may preempt one of them). The answer says what was asked for. A job
with a deadline is told its predicted end (:mod:`agent.operator.when`, the policy's forecast); one
whose deadline cannot be met is queued with that warning, or refused (exit 2, nothing submitted)
when it says ``--on-late refuse`` (its ``on_late`` label), unless ``--anyway``.

A submission whose answer is lost (the agent went away mid-request) may have been accepted: the
error says so and names the job id; ``--job-id`` sends it again under that id, which its owner
takes as the same job, so a retry never makes a second one.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.cli.ops_cmd import print_json, run_with_client
from agent.cli.tables import hostnames
from agent.common.errors import UserError
from agent.common.parsing import toml_loads
from agent.content.workdir import PENDING_DIGEST, Packed, pack_workdir
from agent.job.jobspec import JobSpec, check_job_id, new_job_id
from agent.job.units import parse_size
from agent.operator.client import AgentUnreachable, ApiClient
from agent.operator.fit import Fit, asks, fit
from agent.operator.terminal import short
from agent.operator.upload import Uploaded, upload_workdir
from agent.operator.when import when
from agent.policy.submit import SubmissionCheck


def spec_from_args(args: argparse.Namespace) -> JobSpec:
    if args.file is not None:
        try:
            text = args.file.read_text()
        except OSError as exc:
            raise UserError(f"--file {args.file}: {exc.strerror or exc}") from None
        if args.command:
            raise UserError("give the command either in --file or after --, not both")
        if getattr(args, "workdir", None) is None:
            return JobSpec.from_toml(text)
        try:
            doc = toml_loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UserError(f"job file is not valid TOML: {exc}") from None
        doc["workdir_digest"] = PENDING_DIGEST  # the folder's, once packed (_packed)
        return JobSpec.from_human(doc)
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UserError("no command to run: shoal submit [options] -- COMMAND [ARGS...]")
    resources: dict[str, Any] = {"nodes": args.nodes}
    if args.gpus is not None:
        resources["gpus_per_node"] = args.gpus
    if args.mem is not None:
        resources["min_mem_per_gpu_bytes"] = args.mem
    if args.gpu_mem is not None:
        resources["share_mem_bytes"] = args.gpu_mem
    if args.backend:
        resources["backends"] = [b.strip() for b in args.backend.split(",") if b.strip()]
    data: dict[str, Any] = {
        "command": command,
        "resources": resources,
        "kind": args.kind,
        "priority": args.priority,
        "preemptible": args.preemptible,
        "datasets": args.dataset,
        "retries": args.retries,
        "env": dict(_pairs(args.env, "--env")),
        "labels": dict(_pairs(args.label, "--label")),
    }
    if args.on_late is not None:
        data["labels"]["on_late"] = args.on_late
    if args.deadline is not None:
        data["deadline"] = args.deadline
    if args.max_runtime is not None:
        data["max_runtime_s"] = args.max_runtime
    if args.checkpoint_dir is not None:
        data["checkpoint_dir"] = args.checkpoint_dir
    if args.image is not None:
        data["image"] = args.image
    python_env = _python_env(args)
    if python_env is not None:
        if getattr(args, "workdir", None) is None:
            raise UserError("--python-lock and --python-requirements name a file of --workdir")
        data["python_env"] = python_env
        data["workdir_digest"] = PENDING_DIGEST  # the folder's, once packed (_packed)
    return JobSpec.from_human(data)


def _python_env(args: argparse.Namespace) -> dict[str, str] | None:
    lock, reqs = getattr(args, "python_lock", None), getattr(args, "python_requirements", None)
    if lock is not None and reqs is not None:
        raise UserError("give --python-lock or --python-requirements, not both")
    if lock is not None:
        return {"lock": lock}
    if reqs is not None:
        return {"requirements": reqs}
    return None


def _pairs(values: Sequence[str], flag: str) -> list[tuple[str, str]]:
    out = []
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise UserError(f"{flag} {value!r}: expected KEY=VALUE")
        out.append((key, val))
    return out


def never_line(spec: JobSpec, where: Fit) -> str:
    """The refusal of a job no node of the mesh could ever run."""
    agents = f"{where.nodes} live agent{'s' * (where.nodes != 1)}"
    has = (
        f"the most any of its {agents} has is {where.best}"
        if where.best
        else f"none of its {agents} has a GPU that fits"
    )
    return (
        f"no node of the mesh could ever run this job: it asks for {asks(spec)}, and {has}; "
        "nothing submitted (--anyway submits it to wait for such a host)"
    )


def wait_line(spec: JobSpec, where: Fit, yielding: int = 0) -> str:
    """What a job that fits but finds no room now waits for; ``yielding``: jobs it may preempt
    there."""
    many = len(where.ever)
    hosts = ", ".join(where.ever[:3]) + (", ..." if many > 3 else "")
    line = (
        f"pending: {'the one node' if many == 1 else f'all {many} nodes'} that could run it "
        f"({hosts}) {'is busy or takes' if many == 1 else 'are busy or take'} no new work now; "
        "it starts when one frees up"
    )
    if yielding:
        line += (
            f", or sooner by preempting {'the' if yielding == 1 else f'one of the {yielding}'} "
            f"preemptible job{'s' * (yielding != 1)} of lower priority running there, once "
            f"{'it has' if yielding == 1 else 'they have'} run the minimum time"
        )
    return line


def yielding(
    spec: JobSpec, where: Fit, jobs: Sequence[dict[str, Any]], names: dict[str, str]
) -> int:
    """Running jobs on the nodes that could run ``spec``, submitted preemptible with a lower
    priority: those its owner may preempt for it (``agent.owning.preempting``)."""
    count = 0
    for job in jobs:
        other = job.get("spec") or {}
        priority = other.get("priority")
        if (
            job.get("state") == "running"
            and other.get("preemptible") is True
            and isinstance(priority, int)
            and priority < spec.priority
            and names.get(str(job.get("runner")), "") in where.ever
        ):
            count += 1
    return count


def _job_id(given: str | None) -> str:
    if given is None:
        return new_job_id()
    try:
        return check_job_id(given.lower())
    except ValueError as exc:
        raise UserError(f"--job-id: {exc}") from None


def lost_answer(exc: AgentUnreachable, job_id: str) -> str:
    """The one line for a submission sent but not answered: it may have been accepted."""
    return (
        f"{exc}; job {job_id} may have been accepted: 'shoal jobs {job_id[:12]}' tells, and "
        f"'shoal submit --job-id {job_id} ...' sends it again without making a second one"
    )


def _packed(args: argparse.Namespace, spec: JobSpec) -> tuple[JobSpec, Packed | None]:
    """The spec with its working folder's digest, and the folder packed (``--workdir``)."""
    top: Path | None = getattr(args, "workdir", None)
    if top is None:
        return spec, None
    try:
        cap = parse_size(str(getattr(args, "workdir_max", "512MiB")))
        packed = pack_workdir(top.resolve(), cap)
        return dataclasses.replace(spec, workdir_digest=packed.manifest.digest), packed
    except ValueError as exc:  # ContentError, a bad size, a spec naming a host workdir too
        raise UserError(str(exc)) from None


def cmd_submit(args: argparse.Namespace) -> int:
    try:
        spec = spec_from_args(args)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    spec, packed = _packed(args, spec)
    job_id = _job_id(args.job_id)
    uploaded: list[Uploaded] = []

    async def call(
        client: ApiClient,
    ) -> tuple[dict[str, Any], Fit, SubmissionCheck | None, dict[str, str], int]:
        nodes, jobs = await client.nodes(), await client.jobs()
        where = fit(spec, nodes, jobs)
        if where.never and not args.anyway:
            raise UserError(never_line(spec, where))
        late = None
        if spec.deadline is not None and not where.never:
            late = when(spec, nodes, jobs, time.time(), job_id)
            if late.refuse and not args.anyway:
                raise UserError(f"{late.line}; nothing submitted (--anyway submits it)")
        names = hostnames(nodes)
        preempts = yielding(spec, where, jobs, names)
        if packed is not None:
            try:
                uploaded.append(await upload_workdir(client, args.workdir.resolve(), packed))
            except (ValueError, OSError) as exc:
                raise UserError(f"--workdir {args.workdir}: {exc}; nothing submitted") from None
        try:
            answer = await client.submit(spec, job_id)
        except AgentUnreachable as exc:
            raise UserError(lost_answer(exc, job_id)) from None
        return answer, where, late, names, preempts

    answer, where, late, names, preempts = run_with_client(args, call)
    if args.json:
        extra: dict[str, Any] = {"asks": asks(spec), "fits_now": bool(where.now)}
        for up in uploaded:
            extra["workdir"] = {
                "digest": up.digest,
                "total_bytes": up.total_bytes,
                "sent_bytes": up.sent_bytes,
                "sent_chunks": up.sent_chunks,
            }
        if late is not None:
            extra["deadline_met"] = late.deadline_met
            extra["forecast"] = late.line
        print_json({**answer, **extra})
        return 0
    copies = answer.get("replicas", "?")
    owner = str(answer.get("owner") or "")
    print(
        f"submitted {answer.get('job_id', job_id)} "
        f"(owner {names.get(owner, short(owner))}, durable on {copies} agent{'s' * (copies != 1)})"
    )
    print(f"asks for {asks(spec)}")
    for up in uploaded:
        print(
            f"working folder {up.digest[:12]}: {up.total_bytes} bytes,"
            f" {up.sent_bytes} sent ({up.total_bytes - up.sent_bytes} held already)"
        )
    if late is not None:
        print(("deadline met: " if late.deadline_met else "") + late.line)
    if where.never:
        print("waits: no node of the mesh could run it yet (submitted with --anyway)")
    elif not where.now:
        print(wait_line(spec, where, preempts))
    return 0
