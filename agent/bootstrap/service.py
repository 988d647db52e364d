"""Keeping the agent running: a systemd unit (system, or user with linger), a launchd job on
macOS, or the supervised background process (:mod:`agent.bootstrap.supervise`) where neither
exists. Unit and plist are generated as text here and tested as text.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from agent.bootstrap.layout import RemoteLayout
from agent.bootstrap.probe import HostFacts

if TYPE_CHECKING:
    from agent.bootstrap.ssh import Remote

ServiceKind = Literal["systemd-system", "systemd-user", "launchd", "process"]
SERVICE_KINDS: tuple[ServiceKind, ...] = ("systemd-system", "systemd-user", "launchd", "process")

UNIT_NAME = "shoal-agent.service"
LAUNCHD_LABEL = "org.shoal.agent"
STOP_WAIT_S = 30
_USER_RUNTIME = 'XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/run/user/$(id -u)}"'


def agent_argv(layout: RemoteLayout) -> list[str]:
    """`shoal agent --config FILE`, run as a module of the venv (no PATH or script shebang)."""
    return [layout.python, "-m", "agent.cli", "agent", "--config", layout.config]


def service_kind(text: str) -> ServiceKind | None:
    """The kind named ``text`` (as recorded in install.toml), or None."""
    return next((k for k in SERVICE_KINDS if k == text), None)


def choose_kind(facts: HostFacts, requested: str = "auto") -> ServiceKind:
    """``auto``: launchd on macOS, systemd when it runs (a user unit needs loginctl for linger),
    else the supervised process."""
    if requested != "auto":
        for kind in SERVICE_KINDS:
            if kind == requested:
                return kind
        raise ValueError(f"unknown service kind {requested!r}")
    if facts.os == "Darwin" and facts.launchd:
        return "launchd"
    if facts.systemd:
        if facts.is_root:
            return "systemd-system"
        if facts.loginctl:
            return "systemd-user"
    return "process"


def systemd_unit(layout: RemoteLayout, user_unit: bool) -> str:
    """The unit text. Jobs run in their own process groups, so only the agent gets SIGTERM first
    (``KillMode=mixed``); bootstrap drains the node before it restarts the unit. The agent makes
    a cgroup per job below its own (``Delegate=yes``: systemd leaves that subtree to it)."""
    exec_start = shlex.join(agent_argv(layout))
    wanted_by = "default.target" if user_unit else "multi-user.target"
    return (
        "[Unit]\n"
        "Description=Shoal agent\n"
        "Documentation=https://github.com/shoal/shoal\n"
        "After=network-online.target\n"
        "Wants=network-online.target\n"
        "\n"
        "[Service]\n"
        "Type=simple\n"
        f"ExecStart={exec_start}\n"
        f"WorkingDirectory={layout.base}\n"
        "Environment=PYTHONUNBUFFERED=1\n"
        "Restart=on-failure\n"
        "RestartSec=2\n"
        "KillMode=mixed\n"
        "Delegate=yes\n"
        "TimeoutStopSec=60\n"
        "\n"
        "[Install]\n"
        f"WantedBy={wanted_by}\n"
    )


def launchd_plist(layout: RemoteLayout) -> bytes:
    import plistlib  # here, not above: every `shoal agent` reads SERVICE_KINDS for its parser

    doc = {
        "Label": LAUNCHD_LABEL,
        "ProgramArguments": agent_argv(layout),
        "WorkingDirectory": layout.base,
        "EnvironmentVariables": {"PYTHONUNBUFFERED": "1"},
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        "ThrottleInterval": 5,
        "StandardOutPath": layout.log,
        "StandardErrorPath": layout.log,
    }
    return plistlib.dumps(doc)


@dataclass(frozen=True, slots=True)
class Service:
    """Install, start, stop, query and remove the agent's service of one kind on one host."""

    kind: ServiceKind
    layout: RemoteLayout
    facts: HostFacts

    @property
    def unit_path(self) -> str | None:
        home = self.facts.home.rstrip("/")
        if self.kind == "systemd-system":
            return f"/etc/systemd/system/{UNIT_NAME}"
        if self.kind == "systemd-user":
            return f"{home}/.config/systemd/user/{UNIT_NAME}"
        if self.kind == "launchd":
            if self.facts.is_root:
                return f"/Library/LaunchDaemons/{LAUNCHD_LABEL}.plist"
            return f"{home}/Library/LaunchAgents/{LAUNCHD_LABEL}.plist"
        return None

    def unit_text(self) -> bytes | None:
        if self.kind in ("systemd-system", "systemd-user"):
            return systemd_unit(self.layout, self.kind == "systemd-user").encode()
        if self.kind == "launchd":
            return launchd_plist(self.layout)
        return None

    def _systemctl(self) -> str:
        return f"{_USER_RUNTIME} systemctl --user" if self.kind == "systemd-user" else "systemctl"

    def _launchd_domain(self) -> str:
        if self.facts.is_root:
            return "system"
        return "$(launchctl print gui/$(id -u) >/dev/null 2>&1 && echo gui || echo user)/$(id -u)"

    def start_script(self) -> str:
        """(Re)start the service so it runs the current venv and config."""
        q = shlex.quote
        if self.kind in ("systemd-system", "systemd-user"):
            sc = self._systemctl()
            linger = ""
            if self.kind == "systemd-user":
                linger = f"loginctl enable-linger {q(self.facts.user)} && "
            return (
                f"{linger}{sc} daemon-reload && {sc} enable {UNIT_NAME} && {sc} restart {UNIT_NAME}"
            )
        if self.kind == "launchd":
            domain = self._launchd_domain()
            plist = q(self.unit_path or "")
            return (
                f'd="{domain}"; launchctl bootout "$d/{LAUNCHD_LABEL}" 2>/dev/null; '
                f'launchctl bootstrap "$d" {plist} && launchctl kickstart -k "$d/{LAUNCHD_LABEL}"'
            )
        return self.stop_script() + "; " + self._spawn_script()

    def _spawn_script(self) -> str:
        q = shlex.quote
        lay = self.layout
        supervisor = [lay.python, "-m", "agent.bootstrap.supervise", "--pidfile", lay.pidfile]
        argv = shlex.join([*supervisor, "--", *agent_argv(lay)])
        return (
            f"cd {q(lay.base)} && PYTHONUNBUFFERED=1 nohup {argv} >>{q(lay.log)} 2>&1 </dev/null &"
            f" i=0; while [ $i -lt 50 ] && ! [ -s {q(lay.pidfile)} ]; do sleep 0.1; i=$((i+1));"
            f" done; [ -s {q(lay.pidfile)} ] || {{ echo 'the supervisor did not start; see "
            f"{lay.log}' >&2; exit 1; }}"
        )

    def stop_script(self) -> str:
        """Stop the agent (no error when it is not running)."""
        q = shlex.quote
        if self.kind in ("systemd-system", "systemd-user"):
            return f"{self._systemctl()} stop {UNIT_NAME} 2>/dev/null || true"
        if self.kind == "launchd":
            return (
                f'd="{self._launchd_domain()}"; launchctl bootout "$d/{LAUNCHD_LABEL}" '
                "2>/dev/null || true"
            )
        pf = q(self.layout.pidfile)
        return (
            f'if [ -s {pf} ]; then p=$(cat {pf}); kill -TERM "$p" 2>/dev/null; i=0;'
            f' while [ $i -lt {STOP_WAIT_S * 10} ] && kill -0 "$p" 2>/dev/null;'
            f" do sleep 0.1; i=$((i+1)); done;"
            f' kill -0 "$p" 2>/dev/null && kill -KILL -- -"$p" 2>/dev/null; rm -f {pf}; fi;'
            " true"
        )

    def running_script(self) -> str:
        """Exit status 0 when the agent's service is up."""
        if self.kind in ("systemd-system", "systemd-user"):
            return f"{self._systemctl()} is-active --quiet {UNIT_NAME}"
        if self.kind == "launchd":
            return f'launchctl print "{self._launchd_domain()}/{LAUNCHD_LABEL}" >/dev/null 2>&1'
        pf = shlex.quote(self.layout.pidfile)
        return f'[ -s {pf} ] && kill -0 "$(cat {pf})" 2>/dev/null'

    def log_tail_script(self, lines: int = 20) -> str:
        """Print the agent log's last lines (the journal for a systemd unit)."""
        if self.kind in ("systemd-system", "systemd-user"):
            scope = " --user" if self.kind == "systemd-user" else ""
            runtime = f"{_USER_RUNTIME} " if self.kind == "systemd-user" else ""
            return (
                f"{runtime}journalctl{scope} -u {UNIT_NAME} -n {lines} --no-pager -o cat "
                "2>/dev/null; true"
            )
        return f"tail -n {lines} {shlex.quote(self.layout.log)} 2>/dev/null; true"

    @property
    def persistent(self) -> bool:
        """Whether the service manager starts the agent again after a reboot."""
        return self.kind != "process"

    def remove_script(self) -> str:
        """Stop, disable and delete the unit (the supervised process only needs stopping)."""
        path = self.unit_path
        if path is None:
            return self.stop_script()
        q = shlex.quote
        if self.kind in ("systemd-system", "systemd-user"):
            sc = self._systemctl()
            return (
                f"{sc} disable --now {UNIT_NAME} 2>/dev/null; rm -f {q(path)}; "
                f"{sc} daemon-reload 2>/dev/null; true"
            )
        return f"{self.stop_script()}; rm -f {q(path)}"

    async def install(self, remote: Remote) -> bool:
        """Write the unit file when it differs; True when it changed."""
        path, text = self.unit_path, self.unit_text()
        if path is None or text is None:
            return False
        if await remote.read_file(path) == text:
            return False
        await remote.run(f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0])}")
        await remote.write_file(path, text)
        return True

    async def is_running(self, remote: Remote) -> bool:
        return (await remote.run(self.running_script(), check=False)).exit_status == 0

    async def start(self, remote: Remote) -> None:
        await remote.run(self.start_script(), timeout_s=120)

    async def stop(self, remote: Remote) -> None:
        await remote.run(self.stop_script(), check=False, timeout_s=STOP_WAIT_S + 30)

    async def remove(self, remote: Remote) -> None:
        await remote.run(self.remove_script(), check=False, timeout_s=STOP_WAIT_S + 30)
