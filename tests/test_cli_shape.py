"""The ``shoal`` command line itself: lazy subcommands, ``--json`` offered only where it means
something, and a closed pipe ends a command quietly. Every check runs the real command."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.cli import BY_NAME, build_parser
from tests.shoal_cli import SHOAL, into_closed_pipe, one_line_error, shoal

HEAVY = ("aiohttp", "cryptography", "rich", "textual", "asyncssh")

LOADED_AFTER = """
import sys
from agent.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
heavy = {HEAVY!r}
print(sorted(m for m in sys.modules if m.split(".")[0] in heavy))
"""

JSON_COMMANDS = frozenset(
    {
        "probe",
        "user",
        "team",
        "usage",
        "submit",
        "jobs",
        "nodes",
        "events",
        "logs",
        "history",
        "cancel",
        "migrate",
        "cordon",
        "drain",
        "undrain",
        "revoke",
        "enroll",
        "certify",
        "demo",
        "data",
        "cache",
    }
)
"""The commands that print something a script reads; every other one refuses ``--json``."""


def _heavy_modules_after(*argv: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", LOADED_AFTER.format(HEAVY=HEAVY), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1].replace("'", '"'))
    return loaded


def test_shoal_help_loads_no_heavy_module() -> None:
    assert _heavy_modules_after("--help") == []


@pytest.mark.parametrize("command", sorted(BY_NAME))
def test_every_subcommand_help_loads_no_heavy_module(command: str) -> None:
    assert _heavy_modules_after(command, "--help") == []


@pytest.mark.parametrize(
    "argv",
    [
        ("logs",),  # JOB missing
        ("migrate", "abc", "--nowhere"),
        ("nodes", "--grace", "3"),
        ("nosuchcommand",),
    ],
)
def test_an_argument_error_loads_no_heavy_module_and_is_one_line(argv: tuple[str, ...]) -> None:
    assert _heavy_modules_after(*argv) == []
    one_line_error(shoal(*argv))


def test_the_console_script_answers_help() -> None:
    script = Path(sys.executable).parent / "shoal"
    if not script.exists():
        pytest.skip(f"no console script beside {sys.executable} (not an installed venv)")
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "events" in done.stdout and "enroll" in done.stdout


def _offers_json(parser: argparse.ArgumentParser) -> bool:
    """``--json`` is an option of ``parser``, or of every subcommand it has (``shoal data``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return all(_offers_json(p) for p in action.choices.values())
    return any("--json" in action.option_strings for action in parser._actions)


def test_json_is_offered_exactly_where_it_means_something() -> None:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "subcommand")
    offers = {
        name
        for name, sub in subparsers.choices.items()  # type: ignore[attr-defined]
        if _offers_json(sub)
    }
    assert offers == JSON_COMMANDS


@pytest.mark.parametrize("command", sorted(set(BY_NAME) - JSON_COMMANDS))
def test_commands_without_json_refuse_it_in_one_line(command: str) -> None:
    line = one_line_error(shoal(command, "--json"))
    assert "--json" in line


def test_demo_json_with_the_plain_table_view_is_refused() -> None:
    assert "--plain" in one_line_error(shoal("demo", "--plain", "--json"))


@pytest.mark.parametrize(
    "argv",
    [
        ("--help",),
        ("jobs", "--help"),
        ("probe", "--sim", "dgx-h100"),  # a rich table
        ("probe", "--sim", "dgx-h100", "--json"),
    ],
)
def test_a_closed_pipe_ends_quietly_with_status_0(argv: tuple[str, ...]) -> None:
    done = into_closed_pipe(*argv)
    assert done.returncode == 0
    assert done.stderr == ""


def test_a_table_piped_is_80_columns_at_most() -> None:
    done = subprocess.run(
        [*SHOAL, "probe", "--sim", "dgx-h100"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert max(len(line) for line in done.stdout.splitlines()) <= 80


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (("jobz",), "shoal: error: invalid choice: 'jobz' is not a command; did you mean 'jobs'?"),
        (("xyzzy",), "invalid choice: 'xyzzy' is not a command (see 'shoal --help')"),
        (("demo", "--policy", "shaol"), "(choose from 'fifo', 'shoal'); did you mean 'shoal'?"),
        (("data", "list"), "did you mean 'ls'?"),
        (("submit", "--name", "x", "--", "true"), "shoal submit: error: unrecognized arguments"),
        (("nodes", "--grace", "3"), "arguments: --grace 3 (see 'shoal nodes --help')"),
        (("data", "ls", "--bogus"), "shoal data ls: error: unrecognized arguments: --bogus"),
    ],
)
def test_a_mistyped_command_names_the_nearest_and_an_unknown_option_its_subcommand(
    argv: tuple[str, ...], said: str
) -> None:
    """A typo gets the nearest command or choice, not the whole list; an unknown option is said
    by the subcommand it was given to, pointing at that subcommand's help."""
    assert said in one_line_error(shoal(*argv))
