"""Errors that reach the operator as one line, never as a traceback."""

from __future__ import annotations


class UserError(Exception):
    """A mistake the operator can fix: printed as ``shoal: <message>`` with exit status 2."""
