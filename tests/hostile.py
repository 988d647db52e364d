"""Hostile input for the fuzz tests: arbitrary JSON-like values, and valid documents with one part
changed (the inputs most likely to get past a decoder's first checks).

The property every decoder is held to: it returns a typed value or raises the project's own error
for that input; never another exception, never a hang (hypothesis's deadline catches a slow one).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("SHOAL_FUZZ_EXAMPLES", "40"))
"""Examples per fuzz test (and per parameter): few, to keep the suite fast; the explicit
``@example``s of every finding always run. ``SHOAL_FUZZ_EXAMPLES=5000`` for a long hunt."""
FUZZ = settings(max_examples=EXAMPLES, deadline=5000)
"""Each fuzz test: bounded in count, each example in time (a decoder that hangs fails)."""
FUZZ_EACH = settings(FUZZ, max_examples=max(1, EXAMPLES // 2))
"""For a test run once per decoder or per kind (parametrized): half as many each."""
FUZZ_FILES = settings(FUZZ, suppress_health_check=[HealthCheck.function_scoped_fixture])
"""For a test that writes one file of ``tmp_path`` again at every example."""

NASTY_TEXT = st.sampled_from(
    [
        "",
        "\x00",
        "²",  # str.isdigit() says yes, int() says no
        "١٢",  # Arabic-Indic digits: isdigit and int agree, ASCII does not
        "inf",
        "-inf",
        "nan",
        "1e999",
        "9" * 5000,  # past int()'s digit limit
        "../../etc/passwd",
        "/etc/shadow",
        "\udcff",  # a lone surrogate: not encodable as UTF-8
        "a\nb",
        "0x",
        "-1",
    ]
)
TEXT = st.text(max_size=12) | NASTY_TEXT
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | TEXT
    | st.binary(max_size=12)
)
JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | TEXT

JSON = st.recursive(
    JSON_SCALARS,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(TEXT, kids, max_size=4),
    max_leaves=16,
)
"""Anything ``json.loads`` could hand a decoder (NaN and infinities too: Python reads them)."""
ANY = st.recursive(
    SCALARS,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(TEXT, kids, max_size=4),
    max_leaves=16,
)
"""Anything msgpack could hand a decoder (bytes and large integers too)."""


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _replace(doc: Any, path: tuple[Any, ...], value: Any, delete: bool) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    out: Any = dict(doc) if isinstance(doc, dict) else list(doc)
    if delete and not rest:
        del out[head]
    else:
        out[head] = _replace(doc[head], rest, value, delete)
    return out


def mutated(doc: Any, values: st.SearchStrategy[Any] = ANY) -> st.SearchStrategy[Any]:
    """``doc`` (a JSON-like tree) with one to three of its parts replaced or deleted."""
    paths = _paths(doc)

    @st.composite
    def one(draw: Callable[..., Any]) -> Any:
        out = doc
        for _ in range(draw(st.integers(1, 3))):
            here = _paths(out)
            path = draw(st.sampled_from(here if here else paths))
            delete = bool(path) and draw(st.booleans())
            out = _replace(out, path, draw(values), delete)
        return out

    return one()


def deeply_nested(depth: int = 100_000) -> list[str]:
    """JSON and TOML texts nested ``depth`` deep (a parser that recurses runs out of stack)."""
    return [
        "[" * depth + "]" * depth,
        '{"a":' * depth + "1" + "}" * depth,
        "a = " + "[" * depth + "]" * depth,
        "a = " + "{b = " * depth + "1" + "}" * depth,
    ]
