"""``shoal submit``: a job from the command line or a TOML file."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from agent.errors import UserError
from agent.jobspec import JobSpec, new_job_id
from agent.ops_cmd import print_json, run_with_client
from agent.tables import short


def _spec_from_args(args: argparse.Namespace) -> JobSpec:
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
    resources: dict[str, Any] = {"gpus_per_node": args.gpus, "nodes": args.nodes}
    if args.mem is not None:
        resources["min_mem_per_gpu_bytes"] = args.mem
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


def cmd_submit(args: argparse.Namespace) -> int:
    try:
        spec = _spec_from_args(args)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    job_id = new_job_id()
    answer = run_with_client(args, lambda c: c.submit(spec, job_id))
    if args.json:
        print_json(answer)
    else:
        copies = answer.get("replicas", "?")
        print(
            f"submitted {answer.get('job_id', job_id)} "
            f"(owner {short(answer.get('owner'))}, durable on {copies} agents)"
        )
    return 0
