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


def _unlinked_modules() -> list[str]:
    """The package's modules in the checkout that the editable install cannot import (it links
    each file: a module added since ``make setup`` is not linked yet)."""
    import importlib.util

    roots = {"pardiag": "pardiag", "analyzer": "pardiag.analyzer",
             "collectors": "pardiag.collectors"}
    out = []
    for folder, package in roots.items():
        for f in sorted((REPO / folder).rglob("*.py")):
            parts = f.relative_to(REPO / folder).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            try:
                found = importlib.util.find_spec(name) is not None
            except ImportError:
                found = False
            if not found:
                out.append(str(f.relative_to(REPO)))
    return out


def pytest_sessionstart(session):
    missing = _unlinked_modules()
    if missing:
        pytest.exit(f"the editable install does not hold {', '.join(missing[:3])}"
                    f"{' ...' if len(missing) > 3 else ''}: run `make setup` to link new files",
                    returncode=4)


@pytest.fixture
def real_traces() -> Path:
    """../shared/real_traces beside the checkout (read by path, never copied)."""
    if not SHARED_TRACES.is_dir():
        if os.environ.get("CI"):  # CI always has shared/ beside the checkout: never skip there
            pytest.fail(f"{SHARED_TRACES} not present in CI")
        pytest.skip(f"{SHARED_TRACES} not present")
    return SHARED_TRACES
