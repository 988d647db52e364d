"""Helpers the tests import: fixture locations and the system-test policy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
SYSFS = FIXTURES / "sysfs"


def require_system(condition: bool, why: str) -> None:
    """Skip when a system part is missing; fail instead under ``SHOAL_REQUIRE_SYSTEM_TESTS=1``."""
    if condition:
        return
    if os.environ.get("SHOAL_REQUIRE_SYSTEM_TESTS") == "1":
        pytest.fail(f"required system part missing: {why}")
    pytest.skip(why)
