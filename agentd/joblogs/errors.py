"""What stops ``agentd logs``, asking agents or reading folders."""

from __future__ import annotations


class LogsError(Exception):
    """What stops the command: the message, and the exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code
