"""torchrun (``torch.distributed.run``) as ``pardiag profile`` starts it: the same launcher,
without the traceback it prints of itself when a rank fails or the job is interrupted.

torchrun raises ``ChildFailedError`` when a rank fails and ``SignalException`` when it is sent
SIGINT or SIGTERM; uncaught, each prints some 25 lines of the launcher's own stack and a box
that repeats the failed ranks' exit codes. pardiag names the failed ranks itself (from their
metadata) and the ranks print their own tracebacks, so here both end torchrun with exit code
1, as the uncaught exception does, and print nothing.

    python -m pardiag.collectors.torchrun_quiet [torchrun's arguments]
"""

from __future__ import annotations

import sys


def main() -> None:
    """Run torchrun with ``sys.argv[1:]``; exit 1, quietly, when a rank failed or the job was
    stopped by a signal."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main()
    except (ChildFailedError, SignalException):
        sys.exit(1)


if __name__ == "__main__":
    main()
