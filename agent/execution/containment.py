"""Every process a job starts stays the job's and dies with it: cgroup, subreaper or process group.

The executor opens one *cage* (:func:`open_cage`) and asks it, for each attempt, how to start the
job (:meth:`Cage.launcher`, :meth:`Cage.cgroup_procs`), to kill everything the attempt started
(:meth:`Cage.kill`, after the process group got its signal) and to forget the attempt. Which cage:

``cgroup`` (Linux, cgroup v2, where the agent may create cgroups below its own): every attempt
gets ``<the agent's cgroup>/shoal-<agent key>/job-<job id>-<attempt>``; the agent key (from the
data folder) tells apart agents sharing a host, and a restarted agent kills what its previous run
left in its own folder. The job's first process moves itself in (it writes ``0`` to the new
``cgroup.procs``, still as the agent's user, before setpriv drops privileges and execs the job),
so everything it ever forks is born inside. Killing writes ``cgroup.kill`` (Linux 5.14+; before
that, every pid in ``cgroup.procs`` is killed until none is left), waits for the cgroup to be
empty and removes it.

``subreaper`` (Linux, where no cgroup can be made: cgroup v1 only, no delegation): the agent is a
child subreaper (``PR_SET_CHILD_SUBREAPER``), so a process whose parent dies (a ``setsid`` or
double-forked daemon, ``nohup ... &``) is reparented to the agent instead of init. Killing walks
``/proc`` in rounds until a round finds nothing: the processes below the job's leader, and every
adopted orphan (a child of the agent in another session than the agent's, not a job leader) that
cannot belong to another running job, with all its descendants. An orphan belongs to the job
named by the ``SHOAL_JOB_ID``/``SHOAL_ATTEMPT`` it inherited (``/proc/<pid>/environ``); one that
scrubbed its environment belongs to every job that ran when it was born (its start time), and is
killed when the last of those stops. Kills go through a pidfd checked against the process's start
time, so a reused pid is never hit. The agent reaps the orphans it adopts, never its own other
children (those share its session; the agent must start none in another session but its jobs).
A round costs one walk of ``/proc`` in a worker thread: 0.8 ms for 87 processes on the 2-core build
machine (~9 us a process, ~15 ms when it is busy), paid when a job stops or ends, never while it
runs; the reaper's check every 0.5 s is one ``waitid`` call.

``group`` (macOS, Windows, a Linux where neither works): the job's process group only.

What each cannot catch:

- none of them: processes the job has something else start (``systemd-run``, ``at``, cron, ssh to
  localhost, a container daemon); they are not its descendants.
- cgroup: nothing the job forks. But a job running as the agent's own user owns its cgroup's
  parent and can move itself out: only a separate job user makes the cgroup binding.
- subreaper: while several jobs overlap, an orphan that scrubbed its environment lives until the
  last of them ends; if the agent itself is killed (-9), the orphans it adopted pass to init and
  outlive it (the leader dies with the agent: ``PR_SET_PDEATHSIG``); a job as the agent's own user
  can forge another job's marker (and so only get its own processes killed with that job).
- group: anything that leaves the process group (``setsid``, ``setpgid``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import signal
import sys
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, Protocol

log = logging.getLogger("shoal.containment")

CageMode = Literal["cgroup", "subreaper", "group"]
ContainmentChoice = Literal["auto", "cgroup", "subreaper", "group"]
"""``auto``: a cgroup where one can be made, else the subreaper on Linux, else the group."""

CGROUP_ENTER: Final = 'echo 0 >"$0" || { echo "shoal: cannot enter $0" >&2; exit 125; }; exec "$@"'
"""The ``sh -c`` script that moves the job's first process into its cgroup, then execs the rest."""

_LINUX: Final = sys.platform.startswith("linux")
_PR_SET_CHILD_SUBREAPER: Final = 36
_EMPTY_WAIT_S: Final = 5.0
_MAX_ROUNDS: Final = 50
_LIVES_KEPT: Final = 1024
_REAP_EVERY_S: Final = 0.5


def attempt_key(job_id: str, attempt: int) -> str:
    """How a cage names one attempt (and what the job's marker variables spell)."""
    return f"{job_id}-{attempt}"


class Cage(Protocol):
    """What the executor needs from a containment mechanism (see the module docstring)."""

    @property
    def mode(self) -> CageMode: ...

    def cgroup_procs(self, key: str) -> Path | None:
        """The ``cgroup.procs`` the attempt's first process must move into, if any."""
        ...

    def enter(self, key: str) -> None:
        """Before the start: make what the attempt needs (raises ``OSError`` when it cannot)."""
        ...

    def started(self, key: str, pid: int) -> None:
        """The attempt's leader runs as ``pid``."""
        ...

    async def kill(self, key: str) -> None:
        """SIGKILL every process the attempt started and wait until they are gone."""
        ...

    def leave(self, key: str) -> None:
        """The attempt is over (after :meth:`kill`): release what :meth:`enter` made."""
        ...

    def close(self) -> None:
        """No attempt runs any more: release everything."""
        ...


def agent_key(data_dir: Path) -> str:
    """12 hex digits naming this agent among those sharing a host (from its data folder)."""
    return hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]


def open_cage(choice: ContainmentChoice, data_dir: Path) -> Cage:
    """The cage ``choice`` asks for; ``auto`` takes the first that works of cgroup, subreaper,
    group. Raises ``ValueError`` when a forced choice is not available here."""
    if choice in ("auto", "cgroup"):
        root = _cgroup_root(agent_key(data_dir)) if _LINUX else None
        if root is not None:
            return CgroupCage(root)
        if choice == "cgroup":
            raise ValueError("no cgroup v2 folder this agent may create cgroups in")
    if choice in ("auto", "subreaper") and _LINUX:
        if _set_subreaper(True):
            return SubreaperCage()
        if choice == "subreaper":
            raise ValueError("prctl(PR_SET_CHILD_SUBREAPER) failed")
    if choice == "subreaper":
        raise ValueError("a child subreaper needs Linux")
    return GroupCage()


# -- process group only --------------------------------------------------------------------------


class GroupCage:
    """Nothing beyond the process group the executor signals itself."""

    mode: Final[CageMode] = "group"

    def cgroup_procs(self, key: str) -> Path | None:
        return None

    def enter(self, key: str) -> None:
        pass

    def started(self, key: str, pid: int) -> None:
        pass

    async def kill(self, key: str) -> None:
        pass

    def leave(self, key: str) -> None:
        pass

    def close(self) -> None:
        pass


# -- cgroup v2 -----------------------------------------------------------------------------------


class CgroupCage:
    """One cgroup per attempt under ``root`` (``<the agent's cgroup>/shoal-<agent key>``)."""

    mode: Final[CageMode] = "cgroup"

    def __init__(self, root: Path) -> None:
        self.root = root
        self._active: set[str] = set()
        """Attempts entered and not yet left; ``root`` is removed whenever none is."""

    def _dir(self, key: str) -> Path:
        return self.root / f"job-{key}"

    def cgroup_procs(self, key: str) -> Path | None:
        return self._dir(key) / "cgroup.procs"

    def enter(self, key: str) -> None:
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.root)
        path = self._dir(key)
        if path.exists():  # left by an attempt whose removal failed
            _kill_cgroup_now(path)
            _remove_cgroup(path)
        os.mkdir(path)
        self._active.add(key)

    def started(self, key: str, pid: int) -> None:
        pass

    async def kill(self, key: str) -> None:
        path = self._dir(key)
        if not path.exists():
            return
        deadline = time.monotonic() + _EMPTY_WAIT_S
        while True:
            _kill_cgroup_now(path)
            if not _populated(path):
                return
            if time.monotonic() > deadline:
                log.warning("%s still holds processes %.0f s after SIGKILL", path, _EMPTY_WAIT_S)
                return
            await asyncio.sleep(0.01)

    def leave(self, key: str) -> None:
        _remove_cgroup(self._dir(key))
        self._active.discard(key)
        if not self._active:
            self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.rmdir(self.root)


def _cgroup_root(key: str) -> Path | None:
    """``<the agent's cgroup>/shoal-<key>``, made and emptied, or ``None`` where that fails."""
    own = _own_cgroup()
    if own is None or not os.access(own / "cgroup.procs", os.W_OK):
        return None
    root = own / f"shoal-{key}"
    try:
        os.mkdir(root)
    except FileExistsError:
        pass
    except OSError:
        return None
    if not (root / "cgroup.procs").exists():
        return None
    for left in root.glob("job-*"):  # what a previous run of this agent left
        log.info("killing what a previous run left in %s", left)
        _kill_cgroup_now(left)
        _remove_cgroup(left)
    with contextlib.suppress(OSError):
        os.rmdir(root)  # made again by the first attempt
    return root


def _own_cgroup() -> Path | None:
    """This process's cgroup v2 folder, from /proc/self/cgroup and /proc/self/mountinfo."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    own = next((line[3:] for line in lines if line.startswith("0::")), None)
    if own is None or "/.." in own or not own.startswith("/"):
        return None
    for line in mounts:
        head, sep, tail = line.partition(" - ")
        if not sep or not tail.startswith("cgroup2 "):
            continue
        fields = head.split()
        mount_root, mount_point = _unescape(fields[3]), _unescape(fields[4])
        if own == mount_root or own.startswith(mount_root.rstrip("/") + "/"):
            rel = own[len(mount_root.rstrip("/")) :].lstrip("/")
            return Path(mount_point) / rel
    return None


def _unescape(text: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (``\\040``)."""
    if "\\" not in text:
        return text
    return text.encode().decode("unicode_escape")


def _kill_cgroup_now(path: Path) -> None:
    """SIGKILL everything in the cgroup: ``cgroup.kill``, else each pid it lists (repeatedly)."""
    try:
        (path / "cgroup.kill").write_text("1")
        return
    except FileNotFoundError:
        if not path.exists():
            return
    except OSError as exc:
        log.debug("cgroup.kill of %s failed (%s); killing its pids", path, exc)
    for _ in range(_MAX_ROUNDS):
        pids = _cgroup_pids(path)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _cgroup_pids(path: Path) -> list[int]:
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _populated(path: Path) -> bool:
    try:
        for line in (path / "cgroup.events").read_text().splitlines():
            if line.startswith("populated "):
                return line.split()[1] != "0"
    except OSError:
        return False
    return bool(_cgroup_pids(path))


def _remove_cgroup(path: Path) -> None:
    for _ in range(20):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:  # EBUSY until the last process is gone
            time.sleep(0.005)
    log.warning("cannot remove %s: it still holds processes", path)


# -- child subreaper -----------------------------------------------------------------------------

_subreaper_users = 0


def _set_subreaper(on: bool) -> bool:
    """Make this process a child subreaper (or stop being one once no cage needs it)."""
    global _subreaper_users
    if on and _subreaper_users:
        _subreaper_users += 1
        return True
    if not on:
        _subreaper_users = max(0, _subreaper_users - 1)
        if _subreaper_users:
            return True
    import ctypes  # here: ~0.5 MB an agent in a cgroup never needs

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    if prctl(_PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0) != 0:
        return False
    if on:
        _subreaper_users = 1
    return True


@dataclass(frozen=True, slots=True)
class _Proc:
    """What one ``/proc/<pid>/stat`` says."""

    pid: int
    ppid: int
    sid: int
    start_ticks: int
    """Since boot, in clock ticks."""
    zombie: bool


@dataclass(slots=True)
class _Life:
    """When one attempt ran, in boot-clock ticks (the unit of /proc's start times)."""

    start_ticks: int
    end_ticks: int | None = None
    leader: int | None = None


class SubreaperCage:
    """The agent adopts every orphan of its jobs; see the module docstring."""

    mode: Final[CageMode] = "subreaper"

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._sid = os.getsid(0)
        self._lives: OrderedDict[str, _Life] = OrderedDict()
        self._reaper: asyncio.Task[None] | None = None
        self._closed = False

    def cgroup_procs(self, key: str) -> Path | None:
        return None

    def enter(self, key: str) -> None:
        self._lives[key] = _Life(_now_ticks())
        self._lives.move_to_end(key)
        while len(self._lives) > _LIVES_KEPT:
            oldest = next(iter(self._lives))
            if self._lives[oldest].end_ticks is None:
                break
            del self._lives[oldest]

    def started(self, key: str, pid: int) -> None:
        life = self._lives.get(key)
        if life is not None:
            life.leader = pid
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap_forever())

    async def kill(self, key: str) -> None:
        for _ in range(_MAX_ROUNDS):
            lives = {k: _Life(v.start_ticks, v.end_ticks, v.leader) for k, v in self._lives.items()}
            if await asyncio.to_thread(self._kill_round, key, lives) == 0:
                break
            await asyncio.sleep(0.005)
        else:
            log.warning("job %s still forks after %d rounds of SIGKILL", key, _MAX_ROUNDS)
        self.reap()

    def leave(self, key: str) -> None:
        life = self._lives.get(key)
        if life is not None:
            life.end_ticks = _now_ticks()
            life.leader = None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
        self.reap()
        _set_subreaper(False)

    # rounds

    def _leaders(self) -> set[int]:
        return {life.leader for life in self._lives.values() if life.leader is not None}

    def _kill_round(self, key: str, lives: dict[str, _Life]) -> int:
        """SIGKILL what is left of attempt ``key`` (runs in a thread, on a copy of the lives);
        the number of live processes signalled."""
        procs = _snapshot()
        children: dict[int, list[int]] = {}
        for proc in procs.values():
            children.setdefault(proc.ppid, []).append(proc.pid)
        targets: list[_Proc] = []
        life = lives.get(key)
        if life is not None and life.leader in procs and procs[life.leader].ppid == self._pid:
            targets.extend(_subtree(life.leader, procs, children))
        leaders = {life.leader for life in lives.values() if life.leader is not None}
        for pid in children.get(self._pid, ()):
            orphan = procs[pid]
            if pid in leaders or orphan.sid == self._sid:
                continue  # a job's leader, or one of the agent's own helpers
            if _doomed(orphan, key, lives):
                targets.extend(_subtree(pid, procs, children))
        killed = 0
        for proc in targets:
            if not proc.zombie and _kill_exactly(proc):
                killed += 1
        return killed

    # reaping

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(_REAP_EVERY_S)
            self.reap()

    def reap(self) -> int:
        """Reap the adopted orphans that died; never a job leader (asyncio waits for those) nor
        a child of the agent's own (its session: whoever started it waits for it)."""
        reaped = 0
        leaders = self._leaders()
        while reaped < 10_000:
            try:
                found = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                break
            if found is None:
                break
            pid = found.si_pid
            if pid in leaders:
                break
            proc = _stat(pid)
            if proc is None or proc.sid == self._sid:
                break
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                break
            reaped += 1
        return reaped


def _doomed(orphan: _Proc, ending: str, lives: dict[str, _Life]) -> bool:
    """Whether an adopted orphan cannot belong to a job that still runs (other than ``ending``,
    whose processes are being killed)."""
    marker = _marker(orphan.pid)
    if marker is not None:
        life = lives.get(marker)
        return marker == ending or life is None or life.end_ticks is not None
    for other, life in lives.items():
        if (
            other != ending
            and life.end_ticks is None
            and life.start_ticks - 1 <= orphan.start_ticks
        ):
            return False  # born while that job ran: it may be that job's
    return True


def _now_ticks() -> int:
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def _stat(pid: int) -> _Proc | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return _Proc(
            pid=pid,
            ppid=int(fields[1]),
            sid=int(fields[3]),
            start_ticks=int(fields[19]),
            zombie=fields[0] in (b"Z", b"X"),
        )
    except (IndexError, ValueError):
        return None


def _snapshot() -> dict[int, _Proc]:
    procs: dict[int, _Proc] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            proc = _stat(int(name))
            if proc is not None:
                procs[proc.pid] = proc
    return procs


def _subtree(root: int, procs: dict[int, _Proc], children: dict[int, list[int]]) -> Iterator[_Proc]:
    stack = [root]
    seen: set[int] = set()
    while stack:
        pid = stack.pop()
        if pid in seen or pid not in procs:
            continue
        seen.add(pid)
        yield procs[pid]
        stack.extend(children.get(pid, ()))


def _marker(pid: int) -> str | None:
    """The attempt named by the process's inherited ``SHOAL_JOB_ID``/``SHOAL_ATTEMPT``."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read(1 << 20)
    except OSError:
        return None
    job_id = attempt = None
    for item in environ.split(b"\0"):
        if item.startswith(b"SHOAL_JOB_ID="):
            job_id = item[13:].decode(errors="replace")
        elif item.startswith(b"SHOAL_ATTEMPT="):
            attempt = item[14:].decode(errors="replace")
    if job_id is None or attempt is None:
        return None
    return f"{job_id}-{attempt}"


def _kill_exactly(proc: _Proc) -> bool:
    """SIGKILL ``proc`` and no other process that took its pid since (pidfd + start time)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        return False
    except OSError:  # no pidfds (Linux < 5.3): the start time check still narrows the race
        again = _stat(proc.pid)
        if again is None or again.start_ticks != proc.start_ticks:
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, signal.SIGKILL)
            return True
        return False
    try:
        again = _stat(proc.pid)
        if again is None or again.start_ticks != proc.start_ticks:
            return False
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        os.close(fd)
