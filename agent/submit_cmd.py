"""``shoal submit``: a job from the command line or a TOML file, checked against the mesh first.

A job asks for no GPU unless it says how many (``--gpus N``), or what each GPU must be
(``--mem``, ``--backend`` other than ``cpu``: then one). Before anything is signed the CLI reads
the mesh (:mod:`agent.fit`): a job no node could ever run is refused in one line, exit 2, nothing
submitted (``--anyway`` submits it to wait for such a host); one that fits but finds every such
node busy is submitted and said to wait. The answer says what was asked for. A job with a
deadline is told its predicted end (:mod:`agent.when`, the policy's forecast); one whose deadline
cannot be met is queued with that warning, or refused (exit 2, nothing submitted) when it says
``--on-late refuse`` (its ``on_late`` label), unless ``--anyway``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

from agent.client import ApiClient
from agent.errors import UserError
from agent.fit import Fit, asks, fit
from agent.jobspec import JobSpec, new_job_id
from agent.ops_cmd import print_json, run_with_client
from agent.policy.submit import SubmissionCheck
from agent.tables import hostnames, short
from agent.when import when


def spec_from_args(args: argparse.Namespace) -> JobSpec:
    if args.file is not None:
        try:
            text = args.file.read_text()
        except OSError as exc:
            raise UserError(f"--file {args.file}: {exc.strerror or exc}") from None
        if args.command:
            raise UserError("give the command either in --file or after --, not both")
        return JobSpec.from_toml(text)
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
    return JobSpec.from_human(data)


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


def wait_line(spec: JobSpec, where: Fit) -> str:
    """What a job that fits but finds no room now waits for."""
    many = len(where.ever)
    hosts = ", ".join(where.ever[:3]) + (", ..." if many > 3 else "")
    return (
        f"pending: {'the one node' if many == 1 else f'all {many} nodes'} that could run it "
        f"({hosts}) {'is busy or takes' if many == 1 else 'are busy or take'} no new work now; "
        "it starts when one frees up"
    )


def cmd_submit(args: argparse.Namespace) -> int:
    try:
        spec = spec_from_args(args)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    job_id = new_job_id()

    async def call(
        client: ApiClient,
    ) -> tuple[dict[str, Any], Fit, SubmissionCheck | None, dict[str, str]]:
        nodes, jobs = await client.nodes(), await client.jobs()
        where = fit(spec, nodes, jobs)
        if where.never and not args.anyway:
            raise UserError(never_line(spec, where))
        late = None
        if spec.deadline is not None and not where.never:
            late = when(spec, nodes, jobs, time.time(), job_id)
            if late.refuse and not args.anyway:
                raise UserError(f"{late.line}; nothing submitted (--anyway submits it)")
        return await client.submit(spec, job_id), where, late, hostnames(nodes)

    answer, where, late, names = run_with_client(args, call)
    if args.json:
        extra: dict[str, Any] = {"asks": asks(spec), "fits_now": bool(where.now)}
        if late is not None:
            extra["deadline_met"] = late.deadline_met
            extra["forecast"] = late.line
        print_json({**answer, **extra})
        return 0
    copies = answer.get("replicas", "?")
    owner = str(answer.get("owner") or "")
    print(
        f"submitted {answer.get('job_id', job_id)} "
        f"(owner {names.get(owner, short(owner))}, durable on {copies} agents)"
    )
    print(f"asks for {asks(spec)}")
    if late is not None:
        print(("deadline met: " if late.deadline_met else "") + late.line)
    if where.never:
        print("waits: no node of the mesh could run it yet (submitted with --anyway)")
    elif not where.now:
        print(wait_line(spec, where))
    return 0
