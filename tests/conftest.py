"""Fixtures shared by every test module."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import FIXTURES, SYSFS


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture
def sysfs_root() -> Path:
    return SYSFS
