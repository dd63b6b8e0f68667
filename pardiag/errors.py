"""Errors that the CLI turns into one-line messages and exit codes."""

from __future__ import annotations

#: Exit code for bad input (missing, empty or unreadable traces, bad options).
EXIT_BAD_INPUT = 2


class PardiagError(Exception):
    """A user-facing error: printed as one line, no traceback.

    Attributes:
        exit_code: the process exit code the CLI uses (2 for bad input).
    """

    def __init__(self, message: str, exit_code: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class TraceError(PardiagError):
    """A trace file that cannot be read; the message names the file and the problem."""
