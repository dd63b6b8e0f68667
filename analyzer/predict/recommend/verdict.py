"""The report's one-sentence verdict: the step time with its spread, and the largest losses."""

from __future__ import annotations

import math
import re

import pandas as pd

from pardiag.layout import STILL_RUNNING, STOPPED_BY_LAUNCHER

from ...analyses.breakdown import OUTLIER_STEP_FACTOR, comparable_totals
from ...analyses.pipeline import summarize_bubbles
from ...analyses.stragglers import late_together
from ...trace.traceset import TraceSet
from .context import RuleContext, ms, run_step_row
from .findings import identify_straggler


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
    made = max(n for n in steps if n is not None)   # all ints (checked above)
    return (f"The profiler recorded no training step: the script made {made} optimizer "
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
    if joined := ctx.breakdown.joined_text():
        text += f"; {joined}"
    if run["outlier_steps"]:
        text += (f"; step(s) {run['outlier_steps']} over {OUTLIER_STEP_FACTOR:g}× the median "
                 f"left out")
    return text


def exposed_split(ctx: RuleContext) -> tuple[float, float, float, float, float] | None:
    """Exposed communication split into waiting and transfer, summed over ranks (µs):
    ``(exposed, waiting, transfer, unknown, head)``. A rank's waiting is its ``waiting_us``
    (:attr:`pardiag.analyzer.analyses.sync.SyncResult.stragglers`: the union of its waits for a
    peer to arrive at its complete collectives and transfers — in a pipeline, the bubble), at
    most its exposed time; its transfer is the rest. A rank that no complete instance holds (its
    peers' traces are absent, or nothing was matched) has a split nobody can tell: its exposed
    time is ``unknown``. ``head`` is the part of ``waiting`` at a profiling window's head
    (``head_waiting_us``: profiler start-up, no evidence of a slow peer). ``pardiag compare``
    splits each rank the same way. None without exposed communication. Ranks without device
    activity beside ranks with it are left out (:func:`comparable_totals`)."""
    tot = comparable_totals(ctx.breakdown.totals)
    if not len(tot) or not (tot["exposed_comm_us"].sum() > 0):
        return None
    exposed = tot.set_index("rank")["exposed_comm_us"].astype(float)
    st = (ctx.sync.stragglers.set_index("rank")
          if ctx.sync is not None and len(ctx.sync.stragglers) else pd.DataFrame())
    waiting = transfer = unknown = head = 0.0
    for r, e in exposed.items():
        matched = float(st.loc[r, "waiting_us"]) if r in st.index else float("nan")
        if math.isnan(matched):  # no complete instance holds the rank
            unknown += float(e)
            continue
        w = min(matched, float(e))
        waiting += w
        transfer += float(e) - w
        at_head = float(st.loc[r, "head_waiting_us"]) if "head_waiting_us" in st else 0.0
        head += min(at_head, w) if at_head > 0 else 0.0
    return float(exposed.sum()), waiting, transfer, unknown, head


def bubble_text(ctx: RuleContext) -> str | None:
    """``"pipeline bubble 71% of the window, measured (the what-if replay, with the measured
    stage costs and transfers, gives 30% and accounts for 27.1 of the 55.0 ms step)"``: the
    bubble measured from the schedule records
    (:func:`pardiag.analyzer.analyses.pipeline.summarize_bubbles`, mean over ranks) — or, where
    the traces mark no microbatch, estimated and said so — with the replay's beside it and how
    much of the measured step the replay explains."""
    pipe = ctx.pipeline
    measured = None
    estimated = pipe is not None and len(pipe.bubbles) and (
        pipe.bubbles["method"] == "estimate").all()
    if pipe is not None and len(pipe.bubbles):
        summ = summarize_bubbles(pipe.bubbles)
        if len(summ) and summ["bubble_pct"].notna().any():
            measured = float(summ["bubble_pct"].mean())
    model = ctx.model
    replay = None
    if model is not None:
        replay = model.bubble_pct(model.predict()[1])
    if measured is None and replay is None:
        return None
    if measured is None:
        return f"pipeline bubble {replay:.1f}% of the window (replayed; not measured)"
    text = (f"pipeline bubble {measured:.1f}% of the window, estimated as idle and exposed "
            f"point-to-point time (no per-microbatch marks)" if estimated else
            f"pipeline bubble {measured:.1f}% of the window, measured")
    if model is not None and replay is not None:   # (a replay is the model's)
        text += (f" (the what-if replay, with the measured stage costs and transfers, gives "
                 f"{replay:.1f}% and {model.fit_text()})")
    return text


def without_data_loading(ib: dict, step_us: float | None) -> tuple[float, float]:
    """``(the step without data loading, the step it is said against)`` (µs) of the causes'
    ``input_bound`` finding, against ``step_us`` (the verdict's step) where given: less the
    same µs of data loading, not the same share — a DataLoader's time (Python, a sleep, I/O) is
    not slowed by the profiler as the profiled steps' operators are. Else against the
    profiled step the finding was measured on. NaN where the finding predicts nothing."""
    pred, base = float(ib["predicted_step_us"]), float(ib["step_us"])
    if math.isnan(pred) or step_us is None or math.isnan(step_us) or not base > 0:
        return pred, base
    return max(step_us - (base - pred), 0.0), step_us


def causes_text(ctx: RuleContext, step_us: float | None = None) -> list[str]:
    """The host-bound and input-bound lines of the verdict
    (:class:`pardiag.analyzer.analyses.causes.CausesResult`): ``"host-bound: the GPU computes 6.9%
    of the step and idles waiting for the host 55.5%"``, ``"input-bound: data loading takes 32% of
    the step on rank 1 (7.2 ms); without it the step would take about 15.1 ms"``. The step
    without data loading is stated against ``step_us`` (the verdict's step,
    :func:`without_data_loading`): one sentence never mixes the profiled and the unprofiled
    step."""
    c = ctx.causes
    out: list[str] = []
    if c is None:
        return out
    hb = c.host_bound
    if hb is not None:
        out.append(f"host-bound: the GPU computes {hb['busy_pct']:.1f}% of the step and idles "
                   f"waiting for the host {hb['wait_host_pct']:.1f}% (median over ranks)")
    ib = c.input_bound
    if ib is not None:
        ranks = ib["ranks"]
        share = max(ib["share_pct"][r] for r in ranks)
        who = ("every rank" if ib["all_ranks"] else
               f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks)))
        restated = (step_us is not None and not math.isnan(step_us)
                    and abs(step_us - ib["step_us"]) > 1e-6 * max(step_us, 1.0))
        text = (f"input-bound: data loading takes up to {share:.0f}% of the step on {who} "
                f"({max(ib['data_loading_us'][r] for r in ranks) / 1e3:.1f} ms"
                + (" per profiled step" if restated else "") + ")")
        pred, _ = without_data_loading(ib, step_us)
        if not math.isnan(pred):
            text += f"; without it the step would take about {ms(pred)}"
        out.append(text)
    return out


#: A C++ source location in an error (``[/path/pair.cc:553] ``): where torch raised it.
_SOURCE_AT = re.compile(r"\[[^\]\s]*\.(?:cc|cpp|cu|h|hpp|py):\d+\]\s*")


def _consequence(msg: str) -> str:
    """A later rank's error, which the first failure caused, shortened for the verdict to its
    first sentence without torch's C++ source location (the warnings keep it whole):
    ``"RuntimeError: Connection closed by peer [127.0.0.1]:38040"``."""
    short = _SOURCE_AT.sub("", msg).split(". ")[0].rstrip(".")
    return short if len(short) <= 120 else short[:119] + "…"


def failure_text(ctx: RuleContext) -> str | None:
    """What went wrong in a ``pardiag profile`` run, for the verdict to lead with: the hang
    (the collective it was stuck in, from the hang files), the ranks that failed or did not
    finish, the exit code; None for a run that ended well or traces from elsewhere."""
    run = ctx.traces.run_info
    if run is None:
        return None
    if run.hang and run.hang[0].startswith(STILL_RUNNING):
        return (f"The run was stopped by --timeout after {run.timed_out_after_s or 0:g} s: "
                f"{run.hang[0]}; the steps it finished are analysed")
    if run.hang:
        more = f" (and {len(run.hang) - 1} more)" if len(run.hang) > 1 else ""
        return f"The run hung and was stopped: {run.hang[0]}{more}"
    failures = ctx.traces.failures()
    stopped = bool(failures) and all(msg.startswith(STOPPED_BY_LAUNCHER) for _, msg in failures)
    by = run.stopped_by_user
    if (stopped and run.missing_ranks and by is None and run.timed_out_after_s is None
            and run.stalled_after_s is None):
        # a rank that ended without a word (SIGKILL, the out-of-memory killer) and the ranks
        # torchrun then stopped: the silent one ended first
        return (f"The run failed: rank(s) {run.missing_ranks} ended without a word (killed: "
                f"SIGKILL, or out of memory?); then the launcher stopped rank(s) "
                f"{', '.join(str(r) for r, _ in sorted(failures))} (SIGTERM)")
    if by is not None and stopped:
        # Ctrl-C or SIGTERM: the launcher stopped every rank; nothing failed
        return (f"The run was interrupted ({by}, exit code {run.exit_code}): rank(s) "
                f"{', '.join(str(r) for r, _ in sorted(failures))} were stopped by the launcher; "
                f"the steps they finished are analysed")
    parts = [f"rank {r} failed{' first' if i == 0 and len(failures) > 1 else ''}: "
             f"{msg if i == 0 else _consequence(msg)}"
             for i, (r, msg) in enumerate(failures)][:3]
    if run.missing_ranks:
        parts.append(f"rank(s) {run.missing_ranks} did not finish")
    if parts:
        return "The run failed: " + "; ".join(parts)
    if run.exit_code:
        return f"The run exited with code {run.exit_code}"
    return None


#: A pipeline whose stages' work per microbatch differs by this factor or more is called uneven
#: in the verdict.
STAGE_IMBALANCE = 1.25


def stage_text(ctx: RuleContext, changes=()) -> str | None:
    """The per-stage imbalance the pipeline's chunks measure, for the verdict: ``"stage 1's
    forward+backward per microbatch is 5.0× stage 0's (8.99 vs 1.78 ms): moving the stage
    boundaries saves 17.4% (tier 1)"`` — what it costs, from the evaluated stage-boundary change
    in ``changes`` (recommended or not, with its reason), or why nothing is offered. When that
    change ranks below tier 1, the tier-1 change(s) are named as coming first, so the verdict
    never promotes a change the recommendations rank lower. None for a pipeline whose stages
    are even within :data:`STAGE_IMBALANCE`, or no pipeline model."""
    model = ctx.model
    if model is None or len(model.fwd_us) < 2:
        return None
    work = [f + b for f, b in zip(model.fwd_us, model.bwd_us)]
    hi, lo = max(range(len(work)), key=work.__getitem__), min(range(len(work)),
                                                              key=work.__getitem__)
    if work[lo] <= 0 or work[hi] / work[lo] < STAGE_IMBALANCE:
        return None
    text = (f"stage {hi}'s forward+backward per microbatch is {work[hi] / work[lo]:.1f}× stage "
            f"{lo}'s ({work[hi] / 1000:.2f} vs {work[lo] / 1000:.2f} ms)")
    move = next((c for c in changes if c.kind == "rebalance_stages"), None)
    if move is not None and move.tier:
        text += f": moving the stage boundaries saves {move.gain_pct:.1f}% (tier {move.tier})"
        first = [c for c in changes if c.tier == 1]
        if move.tier > 1 and first:
            best = max(first, key=lambda c: c.gain_pct)
            more = f" and {len(first) - 1} more" if len(first) > 1 else ""
            text += (f", after the tier-1 change {best.change!r} ({best.gain_pct:.1f}%"
                     f"{more})")
        return text
    if move is not None:
        return text + f", but moving the stage boundaries is not recommended: {move.reason}"
    if model.layer_costs() is None:
        return text + " (no per-layer times were recorded to move between stages)"
    return text + ", and no contiguous split of the layers is more even"


_FIND = object()


def verdict(ctx: RuleContext, step_us: float, profiled: bool = False, changes=(),
            straggler=_FIND) -> str:
    """``"Step 12.3 ms (…spread…): exposed communication …; pipeline bubble …; rank N is a
    straggler: …"``.

    Exposed communication is split into waiting for a peer and transfer
    (:func:`exposed_split`) so that the waiting a pipeline's bubble also counts is said once.
    A rank is named only when it meets the straggler criteria
    (:func:`pardiag.analyzer.predict.recommend.findings.identify_straggler`); imbalanced MoE
    routing only from :data:`pardiag.analyzer.analyses.routing.IMBALANCE_MIN`
    (:meth:`pardiag.analyzer.analyses.routing.RoutingResult.describe`).

    Args:
        step_us: the step time the recommendations compare with (µs; NaN: "No complete step").
        profiled: the step was measured on the profiled steps (their spread is quoted).
        changes: every change evaluated, recommended ones with their tier (what a stage
            imbalance costs, :func:`stage_text`).
        straggler: the :func:`identify_straggler` finding (or None) when the caller has it;
            by default it is found here."""
    tot = comparable_totals(ctx.breakdown.totals)
    parts = []
    if len(tot) and tot["span_us"].sum() > 0:
        span = tot["span_us"].sum()
        idle = 100.0 * tot["idle_us"].sum() / span
        # a GPU's copies alone are neither idle nor computing: said where they show at 0.1%
        copies = 100.0 * tot["memory_only_us"].sum() / span
        copied = (f" (memory copies alone another {copies:.1f}%)"
                  if round(copies, 1) > 0 else "")
        split = exposed_split(ctx)
        if split is None:
            parts.append(f"exposed communication 0.0% and idle {idle:.1f}%{copied} of the "
                         f"ranks' time")
        else:
            exp, wait, xfer, unknown, head = (100.0 * x / span for x in split)
            peer = "a peer stage (the bubble)" if ctx.is_pipeline else "other ranks"
            if unknown >= exp:
                how = ("waiting vs transfer unknown: no collective of these ranks was matched "
                       "with all its members")
            else:
                how = f"{wait:.1f}% waiting for {peer}"
                # what the straggler analysis leaves out, said here too (in a pipeline the
                # waiting is the bubble, there at the head as in every step)
                if round(head, 1) > 0 and not ctx.is_pipeline:
                    share = "all" if round(head, 1) >= round(wait, 1) else f"{head:.1f}%"
                    how += (f", {share} of it at the head of a profiling window, where a "
                            f"profiler that opened later cannot be told from a slow rank;")
                else:
                    how += ","
                how += f" {xfer:.1f}% transfer"
                if unknown > 0:
                    how += (f"; {unknown:.1f}% on ranks whose peers are absent, split "
                            f"unknown")
            parts.append(f"exposed communication {exp:.1f}% of the ranks' time ({how}) and idle "
                         f"{idle:.1f}%{copied}")
    bubble = bubble_text(ctx)
    if bubble:
        parts.append(bubble)
    stages = stage_text(ctx, changes)
    if stages:
        parts.append(stages)
    found = identify_straggler(ctx) if straggler is _FIND else straggler
    if found is not None:
        claim = found.describe() + (f" — {found.cause.sentence()}" if found.cause is not None
                                    else "")
        if ctx.contention:  # the claim and what can make it wrong, in one sentence
            claim += (f", but {ctx.contention}, and how the OS shares the cores can make a "
                      f"rank late by itself")
        parts.append(claim)
    elif group := group_text(ctx):
        parts.append(group)
    routing = ctx.routing.describe() if ctx.routing is not None else None
    if routing:
        parts.append(routing)
    parts += causes_text(ctx, step_us)
    mfu = mfu_text(ctx, step_us)
    if mfu:
        parts.append(mfu)
    spread = ""
    if profiled:  # measured on the profiled steps: their spread, " (while profiled; IQR ...)"
        spread = spread_text(ctx)
        spread = (" (while profiled; " + spread[2:] if spread.startswith(" (")
                  else " (while profiled)" + spread)
    base = ctx.step if ctx.model is not None else ctx.clean
    if not profiled and base is not None and base.outliers:  # profiled: the spread says so
        n = len(base.outliers)
        spread += (f" ({n} step period(s) over {OUTLIER_STEP_FACTOR:g}× the median left out: "
                   f"{', '.join(ms(v) for v in base.outliers[:3])}"
                   f"{', ...' if n > 3 else ''})")
    head = f"Step {ms(step_us)}{spread}" if not math.isnan(step_us) else "No complete step"
    cut = ctx.breakdown.unfinished_text()
    if cut:   # a failed or hung rank's last step: its time is not the step's
        head += f" ({cut})"
    text = head + (": " + "; ".join(parts) if parts else "") + "."
    failed = failure_text(ctx)
    if failed:  # what went wrong first: the numbers after it are of what the run recorded
        text = f"{failed.rstrip('.')}. What was recorded: {text}"
    if ctx.contention and found is None:
        text += " " + ctx.contention[0].upper() + ctx.contention[1:] + "."
    return text + devices_text(ctx)


def mfu_text(ctx: RuleContext, step_us: float) -> str:
    """``"MFU 38.2% of the H100 SXM's bfloat16 peak at this step (36.9–39.0% in the 3 profiled
    steps)"``: the run's model FLOPs per step over ``step_us`` × the ranks' peaks
    (:meth:`pardiag.analyzer.analyses.efficiency.EfficiencyResult.totals`), and the spread of
    the profiled steps' own (each step's FLOPs over its slowest rank's span; the outlier steps
    the step time leaves out, left out); ``""`` when it is unknown."""
    eff = ctx.efficiency
    tot = eff.totals() if eff is not None else None
    if eff is None or tot is None or not step_us > 0:
        return ""
    flops, peak = tot
    # the run's MFU in each profiled step: its ranks' FLOPs over its slowest rank's span
    st = eff.per_step
    n = len(eff.per_rank)
    g = st.groupby("step").agg(flops=("model_flops", "sum"), us=("step_us", "max"),
                               ranks=("rank", "nunique"))
    g = g[g["ranks"] == n]
    # over the steps the step time is taken over: an outlier step (one that writes a trace,
    # an evaluation) is left out of both
    row = run_step_row(ctx.breakdown)
    out = set(row["outlier_steps"]) if row else set()
    g = g[~g.index.isin(out)]
    per = 100.0 * g["flops"] / (g["us"] / 1e6 * peak)
    spread = (f" ({_pct(per.min())}–{_pct(per.max())}% in the {len(per)} profiled steps"
              + (", the outlier step(s) left out" if out else "") + ")"
              if len(per) > 1 else "")
    return f"MFU {_pct(100.0 * flops / (step_us / 1e6 * peak))}% of {eff.peak_text()} at this " \
           f"step{spread}"


def _pct(v: float) -> str:
    """A percentage with one decimal, or two significant digits below 0.1."""
    return f"{v:.1f}" if abs(v) >= 0.1 else f"{v:.2g}"


def group_text(ctx: RuleContext) -> str | None:
    """``"ranks 2, 3 arrive last together ..."`` where two or more ranks cause the waiting
    alike (:func:`pardiag.analyzer.analyses.stragglers.late_together`), else None."""
    group = late_together(ctx.sync.stragglers) if ctx.sync is not None else []
    if not group:
        return None
    return (f"ranks {', '.join(map(str, group))} arrive last together at most collectives and "
            f"cause the waiting alike: a group slower than the rest (a slower host, more work), "
            f"not one straggler")


def devices_text(ctx: RuleContext) -> str:
    """``" Rank 0 drives 2 devices: ..."``: the shares above are the union of several devices'
    timelines (:attr:`pardiag.analyzer.analyses.breakdown.TimeBreakdown.devices`), and each
    device's own idle share; ``""`` when every rank drives one."""
    d = ctx.breakdown.devices
    out = ""
    for rank, g in (d.groupby("rank", sort=True) if d is not None and len(d) else ()):
        lo, hi = float(g["idle_pct"].min()), float(g["idle_pct"].max())
        idle = f"{lo:.0f}%" if round(lo) == round(hi) else f"{lo:.0f}–{hi:.0f}%"
        out += (f" Rank {int(rank)} drives {len(g)} devices: the shares above are their union, "
                f"while each device alone is idle {idle} of the time (devices[]).")
    return out
