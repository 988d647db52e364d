"""A job's environment reaches only processes that already run as the job user.

A job starts through a chain of launcher processes that keep the agent's rights (root, when jobs
run as another user) until the last of them switches to the job user (``agent.execution.spawn``:
setpriv, which arms the death signal, the shell that checks the agent still lives, the shell that
moves the process into its cgroup, setpriv again, which switches). Were the job's variables theirs,
every variable a loader or an interpreter reads would act with the agent's rights: ``LD_PRELOAD``,
``LD_LIBRARY_PATH`` or ``LD_AUDIT`` load the job's code into them, ``LD_DEBUG_OUTPUT`` has them
write where the job says, ``GCONV_PATH``, ``LOCPATH``, ``PYTHON*``, ``BASH_ENV``, ``ENV`` and a
``PATH`` naming a folder the job can write each do the same for some program. So, the rule every
launcher follows:

- every process that runs with more rights than the job gets :data:`LAUNCHER_ENV` and nothing
  else, and every program it runs is named by its absolute path;
- the job's variables are set only by a process that already is the job user. Where that process
  is a shell (:func:`after_switch`), they travel through the chain under carrier names no program
  reads (``SHOAL_ENV_0``, ``SHOAL_ENV_1``, ...; the values never appear in an argv, which every
  local user may read), and a ``/bin/sh``, run as the job user, exports each under its own name,
  drops the carriers and the launcher's variables, and execs the job;
- a launcher with no such shell hands them over another way that runs nothing with them first:
  the ``preexec_fn`` launch sets them at the very ``execve`` that runs the job, after the switch;
  a container runtime (which runs with the agent's rights and starts the job's process itself)
  is itself started with :data:`LAUNCHER_ENV` and gets :func:`checked_env` through its own channel
  (an env file), never its environment.

A job's variable names are POSIX shell names (``[A-Za-z_][A-Za-z0-9_]*``,
:func:`agent.job.envnames.env_name_problem`, which the job spec applies): what a shell can export
and a container runtime can take.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from agent.execution.jobuser import SYSTEM_PATH
from agent.job.envnames import env_name_problem

LAUNCHER_ENV: Final[Mapping[str, str]] = {"PATH": SYSTEM_PATH}
"""The whole environment of every launcher process that runs with more rights than the job."""

CARRIER_PREFIX: Final = "SHOAL_ENV_"
"""Names that carry the job's variables through the launcher chain (``SHOAL_*`` is Shoal's: a
spec cannot set them)."""

SHELL: Final = "/bin/sh"


def checked_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` as a job may have it, or ``ValueError`` (one line) for a name or value that no
    launcher can hand over (a name of another shape, a NUL in a value)."""
    for name, value in env.items():
        problem = env_name_problem(name)
        if problem is not None:
            raise ValueError(problem)
        if "\x00" in value:
            raise ValueError(f"env: {name}: a NUL character is not allowed")
    return dict(env)


@dataclass(frozen=True, slots=True)
class Handover:
    """How a launcher chain hands the job's variables to the job (see the module docstring)."""

    argv: tuple[str, ...]
    """Put right after the switch to the job user, before the job's own argv: the shell that
    sets the variables and execs the rest."""
    env: Mapping[str, str]
    """The environment of the whole chain: :data:`LAUNCHER_ENV` and the carriers."""


def after_switch(env: Mapping[str, str]) -> Handover:
    """The :class:`Handover` of ``env`` (raises ``ValueError`` as :func:`checked_env`)."""
    job = checked_env(env)
    if any(name.startswith(CARRIER_PREFIX) for name in job):
        raise ValueError(f"env: names starting with {CARRIER_PREFIX} are Shoal's")
    chain = dict(LAUNCHER_ENV)
    steps = []
    for i, (name, value) in enumerate(sorted(job.items())):
        carrier = f"{CARRIER_PREFIX}{i}"
        chain[carrier] = value
        # ``command``: a variable the shell refuses (dash's OPTIND, bash's UID) fails the start
        # with a line saying which, instead of ending the shell with the shell's word alone.
        steps.append(
            f'command export {name}="${carrier}" || '
            f'{{ echo "shoal: the job\'s env cannot set {name}" >&2; exit 125; }}'
        )
    dropped = [c for c in chain if c not in job]
    if dropped:
        steps.append(f"unset {' '.join(dropped)}")
    steps.append('exec "$@"')
    return Handover(argv=(SHELL, "-c", "\n".join(steps), "sh"), env=chain)
