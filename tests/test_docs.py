"""The docs state what the code does.

The command-line and HTTP API references are rendered from the code by the site's hook
(``docs/hooks.py``); the site builds with every link and anchor checked; and the bounds the
security and architecture pages give are the code's own constants, read off the pages.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from agent.cli import COMMANDS, build_parser
from agent.daemon.openapi import PATHS, SCHEMAS, document
from agent.execution.logfiles import MAX_TAIL_BYTES, MAX_TAIL_LINES
from agent.owning.gang import PREPARE_TTL_S
from agent.wire.codec import MAX_RECORD_BYTES
from gossip.admission import ConnectionLimits
from gossip.budgets import CpuBudget, RateLimit
from gossip.replay import DEFAULT_WINDOW_S
from gossip.streamparts import StreamLimits
from tests.support import DOCS, documented

ROOT = DOCS.parent


def load_hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("shoal_docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def section(markdown: str, heading: str) -> str:
    """The text under ``heading`` (a ``## `` line) up to the next ``## `` heading."""
    start = markdown.index(f"\n{heading}\n")
    end = markdown.find("\n## ", start + 1)
    return markdown[start : end if end >= 0 else len(markdown)]


def subcommand_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_the_cli_reference_gives_every_option_of_every_command() -> None:
    reference = load_hooks().cli_reference()
    parsers = subcommand_parsers()
    assert set(parsers) == {c.name for c in COMMANDS}
    for command in COMMANDS:
        text = section(reference, f"## `shoal {command.name}`")
        assert f"usage: shoal {command.name}" in text
        for action in parsers[command.name]._actions:
            for option in action.option_strings:
                assert option in text, (command.name, option)
    assert str(Path.home()) not in reference, "the builder's home folder is written as ~"


def test_the_api_reference_gives_every_route_and_document() -> None:
    reference = load_hooks().api_reference()
    for path, operations in PATHS.items():
        for method, operation in operations.items():
            heading = f"### `{method.upper()} {path}`"
            assert heading in reference, heading
            assert operation["summary"] in reference
    for name, schema in SCHEMAS.items():
        text = reference[reference.index(f"\n### {name}\n") :]
        for field in schema.get("properties", {}):
            assert f"| `{field}` |" in text, (name, field)


@pytest.mark.slow
def test_the_site_builds_strictly_with_the_references_rendered(tmp_path: Path) -> None:
    site = tmp_path / "site"
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-4000:]
    assert json.loads((site / "reference" / "openapi.json").read_text()) == json.loads(
        json.dumps(document())
    )
    cli = (site / "reference" / "cli.html").read_text()
    assert "<!-- shoal:cli -->" not in cli
    assert all(f"usage: shoal {c.name}" in cli for c in COMMANDS)
    api = (site / "reference" / "api.html").read_text()
    assert "<!-- shoal:openapi -->" not in api and 'id="get-v1-jobs-job-id-logs"' in api
    assert (site / "screenshots" / "live-01-topology.svg").is_file()
    assert not (site / "hooks.py").exists()


def number(text: str) -> float:
    return float(text.replace(",", ""))


@pytest.mark.parametrize(
    ("page", "pattern", "code"),
    [
        ("security/transport.md", r"outside a ±(\d+) s clock-skew", DEFAULT_WINDOW_S),
        ("security/transport.md", r"A log request gets at most ([\d,]+) lines", MAX_TAIL_LINES),
        ("security/transport.md", r"\(400\s+beyond\) and (\d+) MiB", MAX_TAIL_BYTES / 2**20),
        (
            "security/transport.md",
            r"A connection has (\d+) s from\s+accept",
            ConnectionLimits().handshake_timeout_s,
        ),
        (
            "security/transport.md",
            r"at most\s+(\d+) unfinished connections",
            ConnectionLimits().max_unfinished,
        ),
        (
            "security/transport.md",
            r"\((\d+) per source address\)",
            ConnectionLimits().max_unfinished_per_source,
        ),
        ("security/transport.md", r"holds at most (\d+) streams", StreamLimits().max_streams),
        ("security/threat-model.md", r"token bucket \((\d+)/s", RateLimit().rate_per_s),
        ("security/threat-model.md", r"bursts of (\d+)\)", RateLimit().burst),
        ("security/threat-model.md", r"the hold running out \((\d+) s\)", PREPARE_TTL_S),
        ("scheduling/safety.md", r"to hold its devices for (\d+) s", PREPARE_TTL_S),
        ("architecture/records.md", r"each is at most (\d+) KiB", MAX_RECORD_BYTES / 1024),
    ],
)
def test_a_documented_bound_is_the_codes(page: str, pattern: str, code: float) -> None:
    assert number(documented(page, pattern)) == code


def test_the_documented_cpu_budget_is_the_codes() -> None:
    text = documented("security/threat-model.md", r"past its budget \(([^)]*)\)")
    assert text == "a tenth of a core, half a second at once"
    assert (CpuBudget().share, CpuBudget().burst_s) == (0.1, 0.5)
