import os
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_TRACES = REPO.parent / "shared" / "real_traces"
sys.path.insert(0, str(Path(__file__).resolve().parent))
# Summaries of read-only trace folders (../shared/real_traces) go to a throw-away cache, not to
# the user's ~/.cache/pardiag (subprocesses inherit it).
# Under xdist (make test) the workers share one such cache: a real trace is summarized once, not
# once per worker (summaries are written whole, to a temporary name first).
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID")
if _RUN:
    _shared = Path(tempfile.gettempdir()) / f"pardiag-test-cache-{_RUN}"
    _shared.mkdir(exist_ok=True)
    os.environ.setdefault("PARDIAG_CACHE_DIR", str(_shared))
os.environ.setdefault("PARDIAG_CACHE_DIR", tempfile.mkdtemp(prefix="pardiag-test-cache-"))


@pytest.fixture
def real_traces() -> Path:
    """../shared/real_traces beside the checkout (read by path, never copied)."""
    if not SHARED_TRACES.is_dir():
        if os.environ.get("CI"):  # CI always has shared/ beside the checkout: never skip there
            pytest.fail(f"{SHARED_TRACES} not present in CI")
        pytest.skip(f"{SHARED_TRACES} not present")
    return SHARED_TRACES
