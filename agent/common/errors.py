"""Errors that reach the operator as one line, never as a traceback."""

from __future__ import annotations


class UserError(Exception):
    """A mistake the operator can fix: printed as ``shoal: <message>`` with exit status 2."""


class ApiError(Exception):
    """A request the agent refuses: answered ``{"error": <message>}`` with ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
