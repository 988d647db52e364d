"""The operator's changes to the mesh, as the TUI keeps track of them.

The app's own actions (cordon, drain, submit, ...) and the add-host screen's runs of
``shoal bootstrap`` both go through one :class:`Operations`: while one runs its label shows in
the header; when it ends its outcome is kept and announced. It tells the app by message
(:class:`~tui.messages.OperationsChanged`, :class:`~tui.messages.OperationDone`), so neither the
screens nor this module need the app itself.

Adding hosts runs here too, with the command's own code: the form's words are checked as
``shoal bootstrap`` checks them (:meth:`Operations.plan_hosts`), then every host is set up
(:meth:`Operations.add_hosts`) in a task that outlives the screen that asked for it, so that a
closed screen's hosts still undo what the run did there. The screen is told each host's steps and
the end of the run by message (:class:`~tui.messages.HostStep`,
:class:`~tui.messages.HostsAdded`), and only renders them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from textual.message_pump import MessagePump

from agent.bootstrap.display import failure_lines
from agent.bootstrap.hostrun import HostResult
from agent.cli.bootstrap_cmd import BootstrapPlan, plan_bootstrap
from tui.messages import HostsAdded, HostStep, OperationDone, OperationsChanged
from tui.model import MeshSnapshot

STOPPED = "stopped; each host undid what this run had done there"


class Operations:
    """What runs now, every outcome, and whether this TUI may add hosts.

    ``app``: where the messages go. ``readonly`` and ``identity_dir`` are the app's: adding a
    host signs the new node's certificate with the cluster CA, so it needs the CA's key in
    ``identity_dir``; ``--readonly`` turns it off.
    """

    def __init__(
        self, app: MessagePump, *, readonly: bool = False, identity_dir: Path | None = None
    ) -> None:
        self._app = app
        self._readonly = readonly
        self._identity_dir = identity_dir
        self._add_host_refusal: str | None = None
        self._add_host_checked = False
        self.in_flight: dict[str, str] = {}
        """Token -> the label of each operation running now, oldest first."""
        self.outcomes: list[OperationDone] = []
        """Every finished operation, oldest first."""
        self._runs: set[asyncio.Task[list[HostResult] | None]] = set()
        """Runs of bootstrap still going, held so that none is garbage-collected mid-way."""

    @contextlib.contextmanager
    def running(self, token: str, label: str) -> Iterator[None]:
        """Show ``label`` in the header while the block runs."""
        self.in_flight[token] = label
        self._changed()
        try:
            yield
        finally:
            self.in_flight.pop(token, None)
            self._changed()

    def _changed(self) -> None:
        self._app.post_message(OperationsChanged(tuple(self.in_flight.values())))

    def finish(self, outcome: OperationDone) -> None:
        """Keep and announce an operation's outcome (the app reads the mesh again at once)."""
        self.outcomes.append(outcome)
        self._app.post_message(outcome)

    def add_host_refusal(self) -> str | None:
        """Why this TUI cannot add hosts (one line), or None when it can.

        Checked once, then remembered.
        """
        if self._readonly:
            return "read-only: adding hosts is off (start the TUI without --readonly)"
        if not self._add_host_checked:
            self._add_host_checked = True
            self._add_host_refusal = _cluster_refusal(self._identity_dir)
        return self._add_host_refusal

    async def plan_hosts(self, args: argparse.Namespace) -> BootstrapPlan:
        """Check ``shoal bootstrap``'s words as the command does (the CA, the wheelhouse), off
        the event loop; UserError, BootstrapError or OSError say what is wrong."""
        return await asyncio.to_thread(plan_bootstrap, args)

    def add_hosts(
        self, plan: BootstrapPlan, screen: MessagePump
    ) -> asyncio.Task[list[HostResult] | None]:
        """Set up every host of ``plan``, telling ``screen`` each step and the end.

        The run is a task of its own, to be cancelled at most once: then each host undoes what
        this run did there, and the outcome (:data:`STOPPED`) is announced when that is done.
        """
        hosts = plan.hosts
        label = f"add {hosts[0]}" if len(hosts) == 1 else f"add {len(hosts)} hosts"
        run = asyncio.create_task(self._add_hosts(plan, label, screen), name=f"shoal {label}")
        self._runs.add(run)
        run.add_done_callback(self._runs.discard)
        return run

    async def _add_hosts(
        self, plan: BootstrapPlan, label: str, screen: MessagePump
    ) -> list[HostResult] | None:
        with self.running(f"bootstrap:{id(screen)}", label):
            try:
                results = await plan.run(PostingReporter(screen))
            except asyncio.CancelledError:
                self.finish(OperationDone("bootstrap", label, False, STOPPED))
                raise
            except Exception as exc:  # a bug must not take the TUI down: report it in one line
                why = f"{type(exc).__name__}: {exc}"
                screen.post_message(HostsAdded([], why))
                self.finish(OperationDone("bootstrap", label, False, why))
                return None
        screen.post_message(HostsAdded(results))
        ok = all(r.ok for r in results)
        if ok:
            detail = "; ".join(f"{r.host} {r.action}" for r in results)
        else:
            detail = "; ".join(result_line(r) for r in results if not r.ok)
        self.finish(OperationDone("bootstrap", label, ok, detail))
        return results


class PostingReporter:
    """A :class:`~agent.bootstrap.hostrun.Reporter` that posts each step to the screen.

    The run happens on the app's event loop, so posting is safe; once the screen is gone the
    messages are dropped.
    """

    def __init__(self, screen: MessagePump) -> None:
        self._screen = screen

    def step(self, host: str, text: str) -> None:
        self._screen.post_message(HostStep(host, text))


def result_line(result: HostResult) -> str:
    """One line per host: the command's own failure line, or what was done and where it runs."""
    if not result.ok:
        return failure_lines([result])[0]
    parts = [f"{result.host}: {result.action} ({result.message})", *result.notes]
    if result.node_id:
        parts.append(f"node {result.node_id[:12]}")
    if result.gpus:
        parts.append(result.gpus)
    return "; ".join(parts)


def _cluster_refusal(directory: Path | None) -> str | None:
    """None when ``directory`` holds a cluster whose CA can sign node certificates."""
    if directory is None:
        return (
            "adding hosts needs the cluster CA: start the TUI with --identity DIR "
            "(the folder of shoal init) on a real mesh"
        )
    from gossip.identity import IdentityError, load_cluster

    try:
        load_cluster(directory)
    except IdentityError as exc:
        return (
            f"adding hosts needs the cluster CA, and {directory} holds none that works ({exc}); "
            "run the TUI with the --identity of shoal init"
        )
    return None


def summary(answer: Mapping[str, Any], snapshot: MeshSnapshot) -> str:
    """One line from the agent's answer: the new state, and where for a job."""
    for key in ("state", "drain", "status"):
        if answer.get(key) is not None:
            runner = answer.get("runner")
            where = f" on {snapshot.hostname(str(runner))}" if runner else ""
            return f"{answer[key]}{where}"
    return "accepted"
