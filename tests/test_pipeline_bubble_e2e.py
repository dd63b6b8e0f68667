"""A balanced pipeline's measured bubble against the ideal (p - 1)/(m + p - 1), on real
profiled CPU/gloo runs (its own file: its two runs are the suite's longest, and `make test`
spreads test files over two workers)."""

import subprocess
import sys

import pytest

from pardiag.analyzer.report.registry import build_report
from pardiag.analyzer.trace import load_traces

from .paths import REPO

#: Every test here starts a training job.
pytestmark = pytest.mark.e2e


def _report(out):
    return build_report(load_traces(out))


@pytest.mark.parametrize("schedule,microbatches,layers", [("gpipe", 4, 6), ("1f1b", 8, 12)])
def test_balanced_pipeline_bubble_is_near_the_ideal(tmp_path, schedule, microbatches, layers):
    """Balanced stages, compute-heavy chunks, ranks pinned to their own core: the measured
    bubble (median over the unprofiled steps) is near (p-1)/(m+p-1).

    On the idle 2-core machine it measured from within 5 points of the ideal to +7.6 points
    (16.1% for an ideal of 11.1%). Host contention only adds bubble (a rank slowed by another
    process makes its neighbour wait): with a second test suite on the same 2 cores it measured
    +6.8 to +9.8 points. So the bubble must not fall below the ideal by more than 5 points and not
    exceed it by more than 12; a second run is taken only when the first misses that band, and
    both values are shown when both miss it."""
    from pardiag.analyzer.analyses.pipeline import summarize_bubbles

    ideal = 100.0 / (microbatches + 1)
    measured = []
    for attempt in range(2):
        out = tmp_path / f"pp{attempt}"
        res = subprocess.run(
            [sys.executable, "-m", "pardiag", "profile", str(REPO / "examples" / "train_pp.py"),
             "--nproc-per-node", "2", "--out", str(out), "--active", "2", "--", "--steps", "10",
             "--width", "1024", "--layers", str(layers), "--batch", "128", "--schedule", schedule,
             "--microbatches", str(microbatches), "--pin-cpu"],
            capture_output=True, text=True, timeout=300, cwd=REPO)
        assert res.returncode == 0, res.stderr[-3000:]
        bub = _report(out).results["pipeline"].bubbles
        assert bub["ideal_pct"].iloc[0] == pytest.approx(ideal)
        summary = summarize_bubbles(bub)
        assert (summary["basis"] == "unprofiled").all() and (summary["steps"] >= 5).all()
        measured.append(bub[bub["clean"]]["bubble_pct"].median())
        if -5.0 <= measured[-1] - ideal <= 12.0:
            break
    assert -5.0 <= min(measured) - ideal and min(measured) - ideal <= 12.0, (measured, ideal)
