"""The report's one-sentence verdict: the step time with its spread, and the largest losses."""

from __future__ import annotations

import statistics

from pardiag.analyzer.breakdown import OUTLIER_STEP_FACTOR
from pardiag.analyzer.recommend.context import RuleContext, ms, run_step_row
from pardiag.analyzer.traceset import TraceSet


def steps_unrecorded(traces: TraceSet) -> str:
    """A sentence when ``pardiag profile``'s metadata shows that no rank recorded a training
    step (the script made no more optimizer steps than ``--wait + --warmup``), else ""."""
    sch = traces.run_info.schedule if traces.run_info else None
    if sch is None:
        return ""
    skip = sch.wait + sch.warmup
    steps = [m.optimizer_steps for m in traces.rank_meta.values()]
    if not steps or not all(isinstance(n, int) and n <= skip for n in steps):
        return ""
    return (f"The profiler recorded no training step: the script made {max(steps)} optimizer "
            f"step(s) and recording starts after --wait + --warmup = {skip}; the traces show "
            "only the script's end, so nothing is measured or recommended (profile more steps).")


def spread_text(ctx: RuleContext) -> str:
    """``" (IQR a–b, range c–d ms over n steps)"`` of the profiled steps, a one-step caveat,
    and the outlier steps left out."""
    run = run_step_row(ctx.breakdown)
    if run is None or not run["steps"]:
        return ""
    n = int(run["steps"])
    if n == 1:
        text = " (1 step recorded: a one-off cannot be told from a persistent cause)"
    else:
        text = (f" (IQR {run['q1_us'] / 1e3:.1f}–{run['q3_us'] / 1e3:.1f}, range "
                f"{run['min_us'] / 1e3:.1f}–{run['max_us'] / 1e3:.1f} ms over {n} steps)")
    if run["outlier_steps"]:
        text += (f"; step(s) {run['outlier_steps']} over {OUTLIER_STEP_FACTOR:g}× the median "
                 f"left out")
    return text


def verdict(ctx: RuleContext, step_us: float, profiled: bool = False) -> str:
    """``"Step 12.3 ms (…spread…): exposed communication …; pipeline bubble …; …"``.

    Args:
        step_us: the step time the recommendations compare with (µs; NaN: "No complete step").
        profiled: the step was measured on the profiled steps (their spread is quoted)."""
    tot = ctx.breakdown.totals
    parts = []
    if len(tot) and tot["span_us"].sum() > 0:
        exp = 100.0 * tot["exposed_comm_us"].sum() / tot["span_us"].sum()
        idle = 100.0 * tot["idle_us"].sum() / tot["span_us"].sum()
        parts.append(f"exposed communication {exp:.1f}% and idle {idle:.1f}% of the ranks' time")
    if ctx.model is not None:
        b = ctx.model.predict()[1].bubble_pct
        parts.append(f"pipeline bubble {statistics.fmean(b.values()):.1f}% of the window")
    if ctx.sync is not None and ctx.sync.straggler is not None:
        parts.append(f"rank {ctx.sync.straggler} causes the most waiting")
    spread = ""
    if profiled:  # measured on the profiled steps: their spread, " (while profiled; IQR ...)"
        spread = spread_text(ctx)
        spread = (" (while profiled; " + spread[2:] if spread.startswith(" (")
                  else " (while profiled)" + spread)
    head = f"Step {ms(step_us)}{spread}" if step_us == step_us else "No complete step"
    return head + (": " + "; ".join(parts) if parts else "") + "."
