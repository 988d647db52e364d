"""TOML and JSON from outside the process (files, request bodies, signed command bodies), read so
that every problem is the format's own decode error.

The standard parsers recurse: a document nested a few hundred (TOML) or thousand (JSON) levels
deep raises ``RecursionError``, which no caller expects. Here it is the format's decode error, as
for any other broken document; both are ``ValueError``.
"""

from __future__ import annotations

import json
import tomllib
from typing import Any


def toml_loads(text: str) -> dict[str, Any]:
    """``tomllib.loads``; too deep a nesting is a ``TOMLDecodeError`` too."""
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise tomllib.TOMLDecodeError("nested too deeply") from None


def json_loads(data: str | bytes) -> Any:
    """``json.loads``; too deep a nesting is a ``ValueError`` too (bytes that are not UTF-8 are
    already one: ``UnicodeDecodeError``)."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
