"""MkDocs hook: the reference pages are rendered from the code at build time, so they cannot drift.

- ``<!-- shoal:cli -->`` in a page becomes every ``shoal`` command's ``--help``, as the command
  prints it (:func:`agent.cli.build_parser`, :data:`agent.cli.COMMANDS`).
- ``<!-- shoal:openapi -->`` becomes the agent's HTTP API, from the OpenAPI document it serves at
  ``GET /v1/openapi.json`` (:func:`agent.daemon.openapi.document`); the document itself is published
  beside the page as ``reference/openapi.json``.
- The TUI's screenshots (``screenshots/*.svg`` at the top of the repository, written by
  ``make screenshots``) are published as ``screenshots/`` of the site.

A marker no page holds fails the build, as does a broken link (``mkdocs build --strict``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parent.parent
HELP_COLUMNS = 100
"""The terminal width the ``--help`` pages are rendered at, whatever the building terminal's."""


@contextlib.contextmanager
def _columns(width: int) -> Iterator[None]:
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def command_help(argv: list[str]) -> str:
    """What ``shoal ARGV --help`` prints, the home folder written as ``~``."""
    from agent.cli import build_parser

    out = io.StringIO()
    with _columns(HELP_COLUMNS), contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        build_parser().parse_args([*argv, "--help"])
    return out.getvalue().replace(str(Path.home()), "~").rstrip()


def cli_reference() -> str:
    from agent.cli import COMMANDS

    parts = ["## `shoal`", "", "```text", command_help([]), "```"]
    for command in COMMANDS:
        lead = command.help[0].upper() + command.help[1:]
        help_text = command_help([command.name])
        parts += ["", f"## `shoal {command.name}`", "", lead, "", "```text", help_text, "```"]
    return "\n".join(parts)


def _type(schema: dict[str, Any]) -> str:
    """One schema as a short phrase: ``string | null``, ``array of [Job](#job)``."""
    if "$ref" in schema:
        name = str(schema["$ref"]).rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "oneOf" in schema:
        return " | ".join(_type(s) for s in schema["oneOf"])
    kind = schema.get("type", "any")
    text = " | ".join(kind) if isinstance(kind, list) else str(kind)
    if kind == "array":
        text = f"array of {_type(schema['items'])}"
    elif isinstance(schema.get("additionalProperties"), dict):
        text = f"map of {_type(schema['additionalProperties'])}"
    if "enum" in schema:
        text += ": " + ", ".join(f"`{v}`" for v in schema["enum"])
    if "pattern" in schema:
        text += f" (`{schema['pattern']}`)"
    if "minimum" in schema:
        text += f", {schema['minimum']} to {schema['maximum']}"
    return text


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _content(content: dict[str, Any]) -> str:
    return "; ".join(f"`{kind}`: {_type(body['schema'])}" for kind, body in content.items())


def _anchor(method: str, path: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", f"{method} {path}".lower()).strip("-")


def _operation(method: str, path: str, op: dict[str, Any], skip: set[str]) -> list[str]:
    heading = f"### `{method.upper()} {path}` {{ #{_anchor(method, path)} }}"
    out = [heading, "", op["summary"] + ".", ""]
    if op.get("parameters"):
        out += ["| parameter | in | required | type | description |", "|---|---|---|---|---|"]
        for p in op["parameters"]:
            required = "yes" if p["required"] else "no"
            cells = [f"`{p['name']}`", p["in"], required, _type(p["schema"])]
            out.append(f"| {' | '.join(cells)} | {_cell(p.get('description', ''))} |")
        out.append("")
    if "requestBody" in op:
        body = op["requestBody"]
        text = f"{body['description']}; " if "description" in body else ""
        out += [f"Body: {text}{_content(body['content'])}.", ""]
    out += ["| status | meaning | content |", "|---|---|---|"]
    for status, answer in op["responses"].items():
        if status not in skip:
            content = _content(answer.get("content", {}))
            out.append(f"| {status} | {_cell(answer['description'])} | {content} |")
    return [*out, ""]


def api_reference() -> str:
    from agent.daemon.openapi import TRANSPORT_REFUSALS, document

    doc = document()
    skip = {str(status) for status in TRANSPORT_REFUSALS}
    out = [doc["info"]["description"], ""]
    for scheme, spec in doc["components"]["securitySchemes"].items():
        out += [f"Authentication: `{scheme}` ({spec['type']}), {spec['description']}.", ""]
    first = next(iter(doc["paths"].values()))
    refusals = next(iter(first.values()))["responses"]
    out += ["Any request may be refused before it reaches its route, as JSON or text:", ""]
    out += [f"- {s}: {refusals[s]['description']}" for s in sorted(skip)]
    out += ["", "| method | route | what it does |", "|---|---|---|"]
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            link = f"[`{path}`](#{_anchor(method, path)})"
            out.append(f"| {method.upper()} | {link} | {_cell(op['summary'])} |")
    out += ["", "## Routes", ""]
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            out += _operation(method, path, op, skip)
    out += ["## Documents", ""]
    for name, schema in doc["components"]["schemas"].items():
        out += [f"### {name}", ""]
        if "description" in schema:
            out += [schema["description"][0].upper() + schema["description"][1:] + ".", ""]
        if schema.get("properties"):
            out += ["| field | type | required | description |", "|---|---|---|---|"]
            for field, sub in schema["properties"].items():
                required = "yes" if field in schema.get("required", ()) else ""
                desc = _cell(sub.get("description", ""))
                out.append(f"| `{field}` | {_cell(_type(sub))} | {required} | {desc} |")
            out.append("")
    return "\n".join(out)


RENDERERS: dict[str, Callable[[], str]] = {
    "<!-- shoal:cli -->": cli_reference,
    "<!-- shoal:openapi -->": api_reference,
}
_rendered: set[str] = set()


def on_files(files: Files, config: MkDocsConfig) -> Files:
    from agent.daemon.openapi import document

    files.append(
        File.generated(config, "reference/openapi.json", content=json.dumps(document(), indent=2))
    )
    for svg in sorted((ROOT / "screenshots").glob("*.svg")):
        path = svg.relative_to(ROOT).as_posix()
        files.append(File(path, str(ROOT), config.site_dir, config.use_directory_urls))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    for marker, render in RENDERERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render())
            _rendered.add(marker)
    return markdown


def on_post_build(config: MkDocsConfig) -> None:
    missing = sorted(set(RENDERERS) - _rendered)
    _rendered.clear()
    if missing:
        raise PluginError(f"no page holds {', '.join(missing)}: the reference was not rendered")
