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


#: Exit code of a command stopped by Ctrl-C (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 130
#: A process stopped by SIGTERM exits with this code (128 + 15): torchrun stops the ranks still
#: running this way after one fails.
SIGTERM_EXIT_CODE = 143
#: How a run its user stopped ended, by its launcher's exit code: Ctrl-C, or SIGTERM to
#: ``pardiag profile`` (``timeout``, a batch system's cancel), which stops the job as Ctrl-C does.
STOPPED_BY = {EXIT_INTERRUPTED: "Ctrl-C", SIGTERM_EXIT_CODE: "SIGTERM"}


class Interrupted(PardiagError):
    """The user interrupted a command (Ctrl-C, or SIGTERM to ``pardiag profile``) after it had
    stopped its work cleanly; the message says what was kept. Printed as
    ``pardiag: interrupted: ...``, exit code 130 (143 for SIGTERM)."""

    def __init__(self, message: str, exit_code: int = EXIT_INTERRUPTED) -> None:
        super().__init__(message, exit_code)


def env_seconds(name: str, default: float) -> float:
    """A duration in seconds from the environment variable ``name`` (``default`` when unset or
    empty).

    Raises:
        PardiagError: the value is not a positive number (one line naming the variable).
    """
    import math
    import os

    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise PardiagError(f"{name}={raw!r}: not a positive number of seconds")
    return value
