"""Container image references: what a job spec's ``image`` may be, and the registry it names.

A reference is checked at submission against the grammar of the OCI distribution reference
(``[domain[:port]/]path[:tag][@algorithm:hex]``, lowercase path components, a name of at most 255
characters). What passes can only be read as an image by a container runtime: it never starts
with ``-`` (it could not become one of the runtime's options), holds no space, quote or control
character, and names no transport (``docker-archive:``, ``oci:``...), which would read a file of
the host's with the agent's rights.
"""

from __future__ import annotations

import re
from typing import Final

_COMPONENT: Final = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_PART: Final = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN: Final = rf"{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]{{1,5}})?"
_TAG: Final = r"[\w][\w.-]{0,127}"
_DIGEST: Final = r"[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[0-9a-fA-F]{32,}"
_REFERENCE: Final = re.compile(
    rf"(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?"
)
MAX_NAME_CHARS: Final = 255
DEFAULT_REGISTRY: Final = "docker.io"


def image_ref_problem(ref: str) -> str | None:
    """Why ``ref`` is not an image reference a job may name (one line), or ``None``."""
    if not ref:
        return "image: must not be empty"
    shown = ref if len(ref) <= 80 else ref[:77] + "..."
    if ref.startswith("-"):
        return f"image: {shown!r} starts with '-' (it would read as an option)"
    match = _REFERENCE.fullmatch(ref)
    if match is None:
        return (
            f"image: {shown!r} is not an image reference "
            "([registry[:port]/]name[:tag][@digest], the name in lowercase)"
        )
    domain = match.group("domain")
    name = f"{domain}/{match.group('path')}" if domain else match.group("path")
    if len(name) > MAX_NAME_CHARS:
        return f"image: its name is longer than {MAX_NAME_CHARS} characters"
    return None


def check_image_ref(ref: str) -> str:
    """``ref`` when it is a valid image reference, else ``ValueError`` (one line)."""
    problem = image_ref_problem(ref)
    if problem is not None:
        raise ValueError(problem)
    return ref


def registry_of(ref: str) -> str:
    """The registry a (valid) reference pulls from: its first component when that looks like a
    host (a ``.``, a ``:port`` or ``localhost``), else Docker Hub, as podman and docker read it."""
    first, sep, _ = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return DEFAULT_REGISTRY
