"""Time the docs' "A first fleet" (``docs/operations/first-fleet.md``) on this machine, from a
fresh clone to the job's output::

    sudo .venv/bin/python -m tests.bootstrap.time_first_fleet [--repo DIR] [--json]

Three hosts and an operator's machine in network namespaces (:mod:`tests.bootstrap.lab`). The
clone and ``make install`` run on this machine as it is (they need the package index, which the
lab's namespaces cannot reach), with a fresh ``HOME`` (so pip's cache is empty); every ``shoal``
command runs on the operator's machine with that clone's ``.venv/bin`` on ``PATH``. Prints each
step's seconds and the total.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from tests.bootstrap.lab import SshLab

PROJECT = Path(__file__).resolve().parents[2]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bootstrap.time_first_fleet")
    parser.add_argument("--repo", default=str(PROJECT), help="what to clone (default: this one)")
    parser.add_argument("--json", action="store_true", help="the timings as one JSON object")
    args = parser.parse_args(argv)
    steps: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="shoal-first-fleet-") as tmp:
        lab = SshLab(Path(tmp) / "lab").open()
        try:
            clone = Path(tmp) / "shoal"
            env = lab.env()
            env["PATH"] = f"{clone / '.venv' / 'bin'}:{os.environ['PATH']}"

            def step(title: str, argv: list[str], *, on_operator: bool = True) -> str:
                command = lab.operator(argv) if on_operator else argv
                started = time.monotonic()
                done = subprocess.run(
                    command, capture_output=True, text=True, env=env, check=False, timeout=600
                )
                took = time.monotonic() - started
                steps.append((title, took))
                if not args.json:
                    print(f"{took:6.1f} s  $ {title}", flush=True)
                if done.returncode != 0:
                    raise SystemExit(f"{title} failed:\n{done.stdout}\n{done.stderr}")
                return done.stdout

            hosts = [lab.target(i) for i in range(lab.hosts)]
            step(
                f"git clone {args.repo} shoal",
                ["git", "clone", "-q", args.repo, str(clone)],
                on_operator=False,
            )
            step("make install", ["make", "-C", str(clone), "-s", "install"], on_operator=False)
            step("shoal init --name lab", ["shoal", "init", "--name", "lab"])
            step(
                f"shoal bootstrap --accept-new {' '.join(hosts)}",
                ["shoal", "bootstrap", "--accept-new", *hosts],
            )
            hello = "echo hello from $(hostname)"
            out = step(
                f"shoal submit -- sh -c {shlex.quote(hello)}",
                ["shoal", "submit", "--", "sh", "-c", hello],
            )
            found = re.search(r"^submitted ([0-9a-f]{32}) ", out, re.M)
            assert found is not None, out
            out = step(
                f"shoal logs -f {found.group(1)[:8]}", ["shoal", "logs", "-f", found.group(1)[:8]]
            )
            assert "hello from gpu" in out, out
        finally:
            lab.close()
    total = sum(s for _, s in steps)
    if args.json:
        print(json.dumps({"steps": dict(steps), "total_s": round(total, 1)}, indent=2))
    else:
        print(f"{total:6.1f} s  in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
