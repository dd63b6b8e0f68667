"""Progress of loading many ranks, on standard error.

On a terminal: a rich progress bar (cleared when done). Not on a terminal (a log file, CI):
nothing for small runs, and for runs of :data:`PLAIN_MIN_FILES` files or more one plain line per
quarter (``pardiag: loading traces: 16/64``) — never cursor movement or colour codes.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

#: Files from which a non-terminal standard error gets plain progress lines.
PLAIN_MIN_FILES = 32


@contextlib.contextmanager
def progress_reporter(label: str, stream=None) -> Iterator[Callable[[int, int], None]]:
    """Context manager giving ``update(done, total)`` that shows progress on ``stream``
    (default ``sys.stderr``) as described in the module docstring."""
    stream = stream or sys.stderr
    tty = bool(getattr(stream, "isatty", lambda: False)())
    if tty:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn(), console=Console(file=stream), transient=True,
                       auto_refresh=False)  # no refresh thread: safe with worker processes
        task = None

        def update(done: int, total: int) -> None:
            nonlocal task
            if task is None:
                if total < 2:
                    return
                bar.start()
                task = bar.add_task(label, total=total)
            bar.update(task, completed=done, total=total)
            bar.refresh()

        try:
            yield update
        finally:
            if task is not None:
                bar.stop()
        return

    shown: set[int] = set()

    def plain(done: int, total: int) -> None:
        if total < PLAIN_MIN_FILES:
            return
        quarter = 4 * done // total
        if quarter > 0 and quarter not in shown:
            shown.add(quarter)
            print(f"pardiag: {label}: {done}/{total}", file=stream, flush=True)

    yield plain
