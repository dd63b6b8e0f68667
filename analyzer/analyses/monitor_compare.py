"""Two monitored runs side by side (``pardiag compare A B`` of two ``profile --monitor``
folders): the step time of every step of each, the difference with its noise, and each run's
findings.

A run's step time is the median over its ranks of each step's wall time, from step
:data:`WARMUP_STEPS` on (the first steps build caches and buckets). The difference is
median(B) / median(A) − 1; its noise is a moving-block bootstrap (Künsch, 1989) of each run's
step series in blocks of :data:`BLOCK` steps (consecutive steps are not independent: a slow
period lasts), :data:`RESAMPLES` times with a fixed seed: the 2.5th and 97.5th percentiles of
the resampled differences bound it. B is slower or faster only when that interval excludes 0;
else the difference is inside the noise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .monitor_run import mark_open
from .monitored import WARMUP_STEPS, MonitorData, findings

BLOCK = 50
RESAMPLES = 1000


def step_series(data: MonitorData) -> np.ndarray:
    """The run's step time per step (µs; median over ranks), from :data:`WARMUP_STEPS` on."""
    per = data.steps.groupby("step")["dur_us"].median()
    return per[per.index >= WARMUP_STEPS].to_numpy(dtype=float)


def _block_medians(x: np.ndarray, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` medians of moving-block resamples of ``x`` (its own length)."""
    b = min(BLOCK, max(1, len(x) // 4))
    starts = np.arange(len(x) - b + 1)
    k = int(np.ceil(len(x) / b))
    picks = rng.choice(starts, size=(n, k))
    idx = (picks[:, :, None] + np.arange(b)[None, None, :]).reshape(n, -1)[:, :len(x)]
    return np.median(x[idx], axis=1)


def compare_monitored(a: MonitorData, b: MonitorData, seed: int = 0,
                      run_dirs: tuple[Path | None, Path | None] = (None, None)) -> dict:
    """``{"a": {...}, "b": {...}, "step_delta_pct", "step_delta_ci_pct": [low, high],
    "verdict": "slower" | "faster" | "inside the noise"}``; each side: ``steps``,
    ``step_ms`` (median), ``p10_ms``, ``p90_ms`` and its ``findings`` (a straggler late to the
    last recorded step of a run that did not end well, or whose folder ``run_dirs`` does not
    give, marked ``until_last_step`` as the run's own report marks it).

    Raises:
        ValueError: a run with fewer than :data:`WARMUP_STEPS` + 2 steps.
    """
    xa, xb = step_series(a), step_series(b)
    for name, x in (("A", xa), ("B", xb)):
        if len(x) < 2:
            raise ValueError(f"run {name} has too few steps after the first {WARMUP_STEPS}")
    rng = np.random.default_rng(seed)
    ratio = _block_medians(xb, rng, RESAMPLES) / _block_medians(xa, rng, RESAMPLES) - 1.0
    low, high = (float(v) * 100 for v in np.percentile(ratio, [2.5, 97.5]))
    delta = (float(np.median(xb)) / float(np.median(xa)) - 1.0) * 100

    def side(d: MonitorData, x: np.ndarray, run_dir: Path | None) -> dict:
        found = findings(d)
        mark_open(found, int(d.steps["step"].max()) if len(d.steps) else None, run_dir)
        return {"steps": int(len(x)) + WARMUP_STEPS, "step_ms": round(float(np.median(x)) / 1e3, 3),
                "p10_ms": round(float(np.percentile(x, 10)) / 1e3, 3),
                "p90_ms": round(float(np.percentile(x, 90)) / 1e3, 3),
                "findings": found}

    verdict = ("slower" if low > 0 else "faster" if high < 0 else "inside the noise")
    return {"a": side(a, xa, run_dirs[0]), "b": side(b, xb, run_dirs[1]),
            "step_delta_pct": round(delta, 2),
            "step_delta_ci_pct": [round(low, 2), round(high, 2)], "verdict": verdict}


def gate(cmp: dict, pct: float) -> bool:
    """Whether B fails ``--fail-if-slower pct``: slower than A by more than ``pct`` % and
    beyond the noise (the interval's low end above 0)."""
    return cmp["step_delta_pct"] > pct and cmp["step_delta_ci_pct"][0] > 0
