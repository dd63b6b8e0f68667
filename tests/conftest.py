import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from .paths import REPO, SHARED_TRACES

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


def pytest_collection_modifyitems(session, config, items):
    """Test files that start training jobs first, most such tests first (``make test`` hands
    whole files to two workers in this order): the long files then run while the short ones
    fill the gaps, instead of one long file running alone at the end."""
    e2e: dict[str, int] = {}
    for item in items:
        e2e[item.nodeid.split("::")[0]] = (e2e.get(item.nodeid.split("::")[0], 0)
                                           + (item.get_closest_marker("e2e") is not None))
    first = {f: i for i, f in enumerate(dict.fromkeys(it.nodeid.split("::")[0] for it in items))}
    items.sort(key=lambda it: (-e2e[it.nodeid.split("::")[0]], first[it.nodeid.split("::")[0]]))


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


# -- the e2e marker, enforced ---------------------------------------------------------------------
#: What starts a training job: the launchers and the per-rank entry, or pardiag's own commands
#: that start one.
_LAUNCHERS = ("torch.distributed.run", "torchrun", "pardiag.collectors.rank_entry", "srun",
              "mpirun")
_current = {"e2e": True, "test": ""}   # outside a test (collection, session fixtures): no check


def _command_words(args) -> list[str]:
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    return " ".join(os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a)
                    for a in argv).split()


def _launches_job(words: list[str]) -> bool:
    if any(w.endswith(_LAUNCHERS) or os.path.basename(w) in _LAUNCHERS for w in words):
        return True
    return any(a == "pardiag" and b in ("profile", "wrap") for a, b in zip(words, words[1:]))


_popen_init = subprocess.Popen.__init__


def _guarded_popen_init(self, args, *a, **kw):
    if not _current["e2e"]:
        words = _command_words(args)
        if _launches_job(words):
            raise RuntimeError(f"{_current['test']} starts a training job "
                               f"({' '.join(words)[:200]}): mark it @pytest.mark.e2e")
    _popen_init(self, args, *a, **kw)


subprocess.Popen.__init__ = _guarded_popen_init


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    # module fixtures are set up inside the first test that needs them: they count as its job
    _current.update(e2e=item.get_closest_marker("e2e") is not None, test=item.nodeid)
    yield
