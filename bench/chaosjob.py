"""The job ``python -m bench.chaos`` submits: a short checkpointing loop that reports to a ledger.

Run by the agents as ``python /path/to/chaosjob.py LEDGER STEPS STEP_S`` (a file, so that it needs
nothing but the standard library in the job's clean environment). Each step sleeps ``STEP_S``,
then writes the step number to ``$SHOAL_CHECKPOINT_DIR/step`` (a new file renamed over the old,
so a copy taken at any moment holds a whole number) and says ``SHOAL_PROGRESS``. With
``SHOAL_RESUME=1`` it starts after the step its checkpoint holds.

Every process (one per member node of a gang, told apart by ``RANK``) appends JSON lines to the
ledger (``O_APPEND``, one ``write`` each, so lines of concurrent processes never interleave):
``start`` (with the step it resumed from, its pid, its working folder, which names the agent
that ran it), ``step`` after each checkpoint, and ``end`` (``done``, or ``signal`` when stopped
by SIGTERM/SIGINT). A process killed with SIGKILL writes no ``end``; the benchmark watches the
pids for that.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def main() -> int:
    ledger, steps, step_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    job, attempt = os.environ["SHOAL_JOB_ID"], int(os.environ["SHOAL_ATTEMPT"])
    rank = int(os.environ.get("RANK", "0"))  # a gang runs one process per member node
    folder = os.environ["SHOAL_CHECKPOINT_DIR"]
    path = os.path.join(folder, "step")
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)

    def line(kind: str, **fields: object) -> None:
        doc = {"job": job, "attempt": attempt, "rank": rank, "pid": os.getpid(), "kind": kind}
        doc["t"] = time.time()
        os.write(fd, (json.dumps({**doc, **fields}) + "\n").encode())

    resumed_from: int | None = None
    if os.environ.get("SHOAL_RESUME") == "1":
        try:
            with open(path) as f:
                resumed_from = int(f.read().strip())
        except (OSError, ValueError):
            resumed_from = -1  # told to resume, but no whole checkpoint there
    world = int(os.environ.get("WORLD_SIZE", "1"))
    line("start", resumed_from=resumed_from, cwd=os.getcwd(), steps=steps, world=world)

    def stopped(signum: int, _frame: object) -> None:
        line("end", how="signal", signal=signum)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stopped)
    signal.signal(signal.SIGINT, stopped)
    step = max(0, resumed_from or 0)
    while step < steps:
        time.sleep(step_s)
        step += 1
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(step))
        os.replace(tmp, path)
        line("step", step=step)
        print("SHOAL_PROGRESS", step / steps, flush=True)
    line("end", how="done", step=step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
