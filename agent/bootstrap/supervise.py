"""A small supervisor for hosts with neither systemd nor launchd::

    python -m agent.bootstrap.supervise --pidfile FILE -- COMMAND...

Detaches into its own session, records its pid, runs COMMAND and restarts it when it fails
(back-off from 1 s doubling to 30 s; reset after a minute of healthy running). A command that
exits 0 meant to stop (an agent that left, or learned it is revoked): the supervisor ends too,
as systemd's ``Restart=on-failure`` and launchd's ``KeepAlive.SuccessfulExit = false`` do.
SIGTERM or SIGINT stops the command (SIGTERM, then SIGKILL after the grace) and the supervisor,
removing the pidfile.
A second supervisor on the same pidfile refuses to start while the first is alive.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from agent.common.quiet import quiet_third_party_warnings

BACKOFF_MIN_S = 1.0
BACKOFF_MAX_S = 30.0
HEALTHY_AFTER_S = 60.0
TICK_S = 0.2


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_pid(pidfile: Path) -> int | None:
    try:
        text = pidfile.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


class Supervisor:
    def __init__(self, command: Sequence[str], pidfile: Path, grace_s: float) -> None:
        self.command = list(command)
        self.pidfile = pidfile
        self.grace_s = grace_s
        self.stopping = False
        self.child: subprocess.Popen[bytes] | None = None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)

    def _claim_pidfile(self) -> bool:
        other = read_pid(self.pidfile)
        if other is not None and other != os.getpid() and pid_alive(other):
            print(f"supervise: already running as pid {other}", file=sys.stderr)
            return False
        tmp = self.pidfile.with_name(self.pidfile.name + ".tmp")
        tmp.write_text(f"{os.getpid()}\n")
        tmp.replace(self.pidfile)
        return True

    def _stop_child(self) -> None:
        child = self.child
        if child is None or child.poll() is not None:
            return
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=self.grace_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(timeout=10)

    def run(self) -> int:
        if not self._claim_pidfile():
            return 1
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        backoff = BACKOFF_MIN_S
        try:
            while not self.stopping:
                started = time.monotonic()
                self.child = subprocess.Popen(self.command, stdin=subprocess.DEVNULL)
                while self.child.poll() is None and not self.stopping:
                    time.sleep(TICK_S)
                if self.stopping:
                    break
                ran_s = time.monotonic() - started
                code = self.child.returncode
                if code == 0:
                    print("supervise: agent exited with status 0; not restarting", file=sys.stderr)
                    break
                backoff = BACKOFF_MIN_S if ran_s > HEALTHY_AFTER_S else backoff
                print(
                    f"supervise: agent exited with status {code} after {ran_s:.0f} s; "
                    f"restarting in {backoff:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
                deadline = time.monotonic() + backoff
                while time.monotonic() < deadline and not self.stopping:
                    time.sleep(TICK_S)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
        finally:
            self._stop_child()
            if read_pid(self.pidfile) == os.getpid():
                with contextlib.suppress(OSError):
                    self.pidfile.unlink()
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    quiet_third_party_warnings()
    parser = argparse.ArgumentParser(prog="python -m agent.bootstrap.supervise")
    parser.add_argument("--pidfile", type=Path, required=True)
    parser.add_argument("--grace", type=float, default=30.0, help="seconds before SIGKILL")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to supervise")
    with contextlib.suppress(OSError):
        os.setsid()
    return Supervisor(command, args.pidfile, args.grace).run()


if __name__ == "__main__":
    sys.exit(main())
