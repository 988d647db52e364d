"""Helpers the tests import: fixture locations and the system-test policy."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
SYSFS = FIXTURES / "sysfs"
DOCS = Path(__file__).parents[1] / "docs"


def documented(page: str, pattern: str) -> str:
    """What ``pattern``'s one group reads on the docs page ``page`` (under ``docs/``): the bound
    the docs state, for a test to hold the code to. Every match on the page must agree."""
    found: set[str] = set(re.findall(pattern, (DOCS / page).read_text()))
    assert len(found) == 1, f"docs/{page}: {pattern!r} matches {sorted(found) or 'nothing'}"
    return found.pop()


def require_system(condition: bool, why: str) -> None:
    """Skip when a system part is missing; fail instead under ``SHOAL_REQUIRE_SYSTEM_TESTS=1``."""
    if condition:
        return
    if os.environ.get("SHOAL_REQUIRE_SYSTEM_TESTS") == "1":
        pytest.fail(f"required system part missing: {why}")
    pytest.skip(why)
