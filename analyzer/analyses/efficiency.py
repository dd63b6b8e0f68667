"""How far each rank is from its device's peak: model FLOPs, achieved TFLOP/s, MFU and HFU per
rank and step, and achieved rate and arithmetic intensity per op class (a roofline)
(:func:`compute_efficiency`).

From each rank's counted ops (:func:`pardiag.analyzer.per_rank.flops.flop_ops`: FLOPs and bytes
from the recorded shapes) and its ``ProfilerStep`` windows:

* **model FLOPs** of a step: the FLOPs of its matmul, convolution and attention ops
  (:data:`pardiag.analyzer.trace.vocab.MODEL_FLOP_CLASSES`; PaLM, Chowdhery et al. 2022,
  appendix B, counts these); **executed FLOPs**: of every counted op (norms, softmax and
  elementwise ops too).
* **MFU** = model FLOPs / (step time × peak) and **HFU** = executed FLOPs / (step time × peak)
  (%), per step; per rank the median over its steps with their min and max. Where the trace shows
  activation recomputation (a forward-only op inside the autograd engine's backward), the model
  FLOPs cannot be told from the recomputed ones: model FLOPs and MFU are unknown (None) and HFU
  stands.
* **peak**: ``--peak-tflops`` when given; else the device's dense datasheet peak for the dtype
  that carries most of the rank's model FLOPs (:mod:`.peaks`); else, on a CPU, the peak the rank
  measured when ``pardiag profile`` started it (its metadata's ``peak_flops``). Otherwise
  unknown: achieved TFLOP/s are still given, MFU is not.
* **tokens/s** per rank: ``tokens_per_step`` (``--tokens-per-step``, the tokens each rank
  processes per step) / the step time; without it, from ``pardiag profile``'s record of the
  rank's model input (:func:`recorded_tokens`): integer token ids of shape ``[batch, sequence]``
  × the model's calls per optimizer step. Any other input (floating point, another rank of
  dimensions) leaves tokens/s unknown.
* **per module**: the same sums per module, each counted op in the module it ran for (forward
  ops in the innermost module range around them, backward ops in the module of the forward op
  that built their backward function: :func:`pardiag.analyzer.per_rank.flops.attribute_modules`),
  forward and backward FLOPs apart, and each module's share of the counted ops' time; and
  inclusive FLOPs and time, the module's with every module under it (by name). Ops of no known
  module are one row with ``module`` None.
* **per op class**: FLOPs, bytes and time summed over ranks and steps (time on the device for
  GPU ranks, on the host thread for CPU ranks), achieved TFLOP/s = FLOPs / time, GB/s = bytes /
  time, arithmetic intensity = FLOPs / byte (Williams, Waterman and Patterson, Roofline, CACM
  2009), each beside the peak and the memory bandwidth.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ..per_rank.flops import FLOP_COLUMNS, OPTIMIZER_MODULE, empty_flop_ops
from ..per_rank.summary import summary_of
from ..trace import vocab
from ..trace.classify import device_kind
from ..trace.traceset import RankTrace, TraceSet, stack_by_rank
from .peaks import device_peak

#: Columns of :attr:`EfficiencyResult.per_step`.
STEP_COLUMNS = ("rank", "step", "step_us", "model_flops", "executed_flops", "unknown_ops",
                "achieved_tflops", "mfu_pct", "hfu_pct", "tokens_per_s")
#: Columns of :attr:`EfficiencyResult.per_rank`.
RANK_COLUMNS = ("rank", "device", "dtype", "peak_tflops", "peak_source", "bandwidth_gbps",
                "steps", "model_tflop_per_step", "executed_tflop_per_step", "achieved_tflops",
                "mfu_pct", "mfu_pct_min", "mfu_pct_max", "hfu_pct", "tokens_per_s",
                "recomputed_ops", "unknown_ops")
#: Columns of :attr:`EfficiencyResult.per_class`.
CLASS_COLUMNS = ("op_class", "dtype", "ops", "flops", "bytes", "time_us", "time_basis",
                 "achieved_tflops", "achieved_gbps", "intensity", "peak_tflops",
                 "bandwidth_gbps")
#: Columns of :attr:`EfficiencyResult.per_module`.
MODULE_COLUMNS = ("module", "module_class", "ranks", "ops", "forward_flops", "backward_flops",
                  "recomputed_flops", "flops", "bytes", "time_us", "time_basis", "time_pct",
                  "achieved_tflops", "achieved_gbps", "intensity", "unknown_ops",
                  "inclusive_flops", "inclusive_time_us")
#: What the CPU peak measured at the rank's start is said to be.
MEASURED_SOURCE = "measured when the rank started (float32 matmul)"


@dataclasses.dataclass(frozen=True)
class EfficiencyResult:
    """Result of :func:`compute_efficiency`.

    Attributes:
        ops: every counted op of every rank: ``rank`` and
            :data:`pardiag.analyzer.per_rank.flops.FLOP_COLUMNS` (FLOPs, bytes, µs).
        per_step: one row per rank and step: :data:`STEP_COLUMNS` (``step_us`` µs, FLOPs,
            TFLOP/s = 10¹² FLOP/s, % of peak; NaN where unknown).
        per_rank: one row per rank with counted ops: :data:`RANK_COLUMNS` (medians over its
            steps; ``mfu_pct_min``/``max`` their spread; ``peak_source`` says where the peak
            comes from, None with the peak unknown).
        per_class: one row per op class and dtype over all ranks: :data:`CLASS_COLUMNS`
            (``time_basis``: ``device`` or ``cpu``).
        per_module: one row per module (and time basis) over all ranks' steps:
            :data:`MODULE_COLUMNS` (``ranks``: how many ranks ran it; ``time_pct``: % of the
            counted ops' time of its basis; sorted by time); empty where the traces record no
            module ranges.
        mfu_pct: the run's MFU: all ranks' model FLOPs over the sum of each rank's step time ×
            its peak (%); None where any rank's is unknown.
        notes: why a number is unknown, and what the counts leave out.
    """

    ops: pd.DataFrame
    per_step: pd.DataFrame
    per_rank: pd.DataFrame
    per_class: pd.DataFrame
    per_module: pd.DataFrame
    mfu_pct: float | None
    notes: tuple[str, ...]

    def totals(self) -> tuple[float, float] | None:
        """(the ranks' model FLOPs per step summed, their peaks summed in FLOP/s): what the
        run's MFU at a step time ``T`` is, ``flops / (T × peak)``; None where any rank's model
        FLOPs or peak are unknown."""
        pr = self.per_rank
        if (pr.empty or pr["model_tflop_per_step"].isna().any()
                or pr["peak_tflops"].isna().any()):
            return None
        return (float(pr["model_tflop_per_step"].sum()) * 1e12,
                float(pr["peak_tflops"].sum()) * 1e12)

    def peak_text(self) -> str:
        """Whose peak MFU is against: ``"the H200 SXM's bfloat16 peak"``, ``"the measured CPU
        float32 peak"``, ``"the given peak (--peak-tflops 500)"``; ``""`` without a peak."""
        pr = self.per_rank.dropna(subset=["peak_tflops"])
        if pr.empty:
            return ""
        if (pr["peak_source"] == "--peak-tflops").all():
            return f"the given peak (--peak-tflops {float(pr['peak_tflops'].iloc[0]):g})"
        names = sorted({f"the measured CPU {t}" if d == "cpu" else f"the {d}'s {t}"
                        for d, t in zip(pr["device"], pr["dtype"])})
        return ", ".join(names) + " peak"


def _device_name(trace: RankTrace, meta) -> str | None:
    """The rank's device name: ``deviceProperties`` when every entry names the same device,
    else the rank's metadata."""
    props = vocab.DEVICE_PROPERTIES.get(trace.metadata)
    names = {str(vocab.DEVICE_NAME.get(p, "")) for p in props if isinstance(p, dict)} if (
        isinstance(props, list)) else set()
    names.discard("")
    if len(names) == 1:
        return names.pop()
    return getattr(meta, "device_name", None)


#: A rank's own measured CPU peak this far below its host's best is said in a note.
LOW_PEAK_RATIO = 0.8


def _host_peaks(metas: dict) -> dict[tuple[str, str], float]:
    """The best peak (FLOP/s) any rank measured per ``(host, dtype)`` (``metas``: every rank's
    metadata; ranks whose host is not named left out), read once for the whole run."""
    best: dict[tuple[str, str], float] = {}
    for m in metas.values():
        if not getattr(m, "host", None):
            continue
        for dtype, v in (getattr(m, "peak_flops", None) or {}).items():
            key = (str(m.host), str(dtype))
            if isinstance(v, (int, float)) and v > best.get(key, 0.0):
                best[key] = float(v)
    return best


def _peak(trace: RankTrace, meta, dtype: str | None, override: float | None,
          notes: list[str], host_best: dict | None = None
          ) -> tuple[float | None, str | None, float | None, str]:
    """(peak TFLOP/s, its source, bandwidth GB/s, device label) of one rank; where it is
    unknown, ``notes`` says why. A CPU rank's peak is the best any rank of its host measured
    (``host_best``: :func:`_host_peaks`): the ranks measure theirs at once after their scripts,
    and one that shared a core then measured a fraction of what the core does."""
    kind = device_kind(trace)
    r = trace.rank
    if kind == "cpu":
        label = "cpu"
        measured = getattr(meta, "peak_flops", None) or {}
        if override is not None:
            return override, "--peak-tflops", None, label
        if dtype is None:
            return None, None, None, label   # no model FLOPs: said by the caller
        if measured.get(dtype):
            own = float(measured[dtype])
            best = max(own, (host_best or {}).get((getattr(meta, "host", None), dtype), 0.0))
            if own < LOW_PEAK_RATIO * best:
                notes.append(f"rank {r} measured {own / 1e12:.3g} TFLOP/s ({dtype}), under the "
                             f"{best / 1e12:.3g} another rank of its host measured (it shared a "
                             f"core then): its MFU is against the host's")
            return best / 1e12, MEASURED_SOURCE, None, label
        why = ("its trace was not recorded by pardiag profile, which measures one" if meta is None
               else f"the rank measured only {', '.join(sorted(measured))} when it started"
               if measured else "its metadata holds no measured peak (recorded by a pardiag "
                                "that measured none)")
        notes.append(f"rank {r}: no {dtype} peak for its CPU: {why}; give --peak-tflops")
        return None, None, None, label
    name = _device_name(trace, meta)
    peak = device_peak(name)
    label = peak.label if peak is not None else (name or kind)
    bw = peak.bandwidth_gbps if peak is not None else None
    if override is not None:
        return override, "--peak-tflops", bw, label
    if dtype is None:
        return None, None, bw, label
    if peak is None:
        notes.append(f"rank {r}: " + (f"no peak known for device {name!r}" if name else
                                      "the trace names no device (no deviceProperties)")
                     + ": give --peak-tflops")
        return None, None, None, label
    value = peak.of(dtype)
    if value is None:
        notes.append(f"rank {r}: {peak.label} has no {dtype} peak in the table: give "
                     f"--peak-tflops")
        return None, None, bw, label
    if dtype == "float32" and "tf32" in peak.tflops:
        notes.append(f"rank {r}: float32 matmuls on {peak.label} are measured against its "
                     f"float32 peak ({peak.tflops['float32']:g} TFLOP/s); where TF32 is allowed "
                     f"they run against {peak.tflops['tf32']:g} (the trace does not say which)")
    return value, f"{peak.label} {dtype}: {peak.source}", bw, label


def _finished(traces: TraceSet, steps: pd.DataFrame) -> pd.DataFrame:
    """``steps`` (every rank's, a ``rank`` column) without the steps a failed or hung rank did
    not finish (:meth:`~pardiag.analyzer.trace.TraceSet.unfinished_mask`): the breakdown and
    the step time leave them out, and so do FLOPs and MFU."""
    if steps.empty:
        return steps
    return steps[~traces.unfinished_mask(steps["rank"].to_numpy(), steps["step"].to_numpy())]


def _steps_table(ops: pd.DataFrame, steps: pd.DataFrame, peak: dict, recomputed: dict,
                 tokens: dict) -> pd.DataFrame:
    """Every rank's per-step rows (:data:`STEP_COLUMNS`), in the order of ``steps``' ranks
    and, within a rank, by step: ``ops`` and ``steps`` hold every rank's (a ``rank`` column),
    ``peak``, ``recomputed`` and ``tokens`` are per rank (a falsy peak or token count:
    unknown). A step's model FLOPs are unknown (NaN) when one of its model-class ops is, or
    with recomputation; its executed FLOPs when any of its ops is. One pass over all ranks'
    ops (a bincount per sum), not a table per rank: 16,384 ranks' tables took minutes."""
    st = steps.sort_values(["rank", "step"], kind="stable")
    order = pd.unique(steps["rank"])
    st = st.set_index("rank").loc[order].reset_index()   # the ranks in their given order
    step_us = (st["end_us"] - st["start_us"]).to_numpy(float)
    n = len(st)
    # each op's row in ``st`` (-1: a step its rank's step table does not hold)
    rows = pd.MultiIndex.from_arrays([st["rank"].to_numpy(np.int64),
                                      st["step"].to_numpy(float)])
    pos = rows.get_indexer(pd.MultiIndex.from_arrays([ops["rank"].to_numpy(np.int64),
                                                      ops["step"].to_numpy(float)]))
    keep = pos >= 0
    pos = pos[keep]
    flops = ops["flops"].to_numpy(float)[keep]
    is_model = ops["model"].to_numpy(bool)[keep]
    nan = np.isnan(flops)
    known = np.where(nan, 0.0, flops)
    model = np.bincount(pos[is_model], weights=known[is_model], minlength=n).astype(float)
    model[np.bincount(pos[is_model & nan], minlength=n) > 0] = np.nan
    unknown = np.bincount(pos[nan], minlength=n)
    executed = np.bincount(pos, weights=known, minlength=n).astype(float)
    executed[unknown > 0] = np.nan
    ranks = st["rank"]
    model[ranks.map(recomputed).fillna(False).to_numpy(bool)] = np.nan
    out = pd.DataFrame({"rank": ranks.to_numpy(), "step": st["step"].to_numpy(),
                        "step_us": step_us, "model_flops": model, "executed_flops": executed,
                        "unknown_ops": unknown.astype(int)})
    sec = out["step_us"] / 1e6
    out["achieved_tflops"] = out["model_flops"] / sec / 1e12
    per_peak = ranks.map({r: (v if v else np.nan) for r, v in peak.items()}).astype(float)
    denom = sec * per_peak.to_numpy(float) * 1e12
    out["mfu_pct"] = 100.0 * out["model_flops"] / denom
    out["hfu_pct"] = 100.0 * out["executed_flops"] / denom
    per_tokens = ranks.map({r: (v if v else np.nan) for r, v in tokens.items()}).astype(float)
    out["tokens_per_s"] = per_tokens.to_numpy(float) / sec
    return out[list(STEP_COLUMNS)]


def _rank_stats(per: pd.DataFrame) -> pd.DataFrame:
    """Per rank (index), the medians over its steps of ``per``'s columns and the spread of its
    MFU, each unknown (NaN) when one of its steps' is, and the highest MFU or HFU it reached
    (``top``, -1 without any)."""
    g = per.groupby("rank", sort=False)
    cols = ["model_flops", "executed_flops", "achieved_tflops", "mfu_pct", "hfu_pct",
            "tokens_per_s"]
    any_nan = per[cols].isna().groupby(per["rank"], sort=False).any()
    med = g[cols].median().mask(any_nan)   # unknown in a step: unknown
    out = med.assign(
        steps=g.size(), mfu_min=g["mfu_pct"].min().mask(any_nan["mfu_pct"]),
        mfu_max=g["mfu_pct"].max().mask(any_nan["mfu_pct"]),
        top=np.fmax(np.fmax(g["mfu_pct"].max().to_numpy(float),
                            g["hfu_pct"].max().to_numpy(float)), -1.0))
    return out


def recorded_tokens(meta) -> tuple[float, str] | None:
    """Tokens per optimizer step of a rank from its metadata's model input
    (:class:`pardiag.layout.ModelShapes`), and how they were counted (``"1024 (8 × 128 token
    ids × 1 call(s))"``): the elements of an integer input of two dimensions (token ids,
    ``[batch, sequence]``) × the model's calls per optimizer step; None for any other input,
    or none recorded."""
    shapes = getattr(meta, "shapes", None)
    if shapes is None or not shapes.batch_integer or not shapes.batch_calls:
        return None
    shape = shapes.batch_shape or []
    if len(shape) != 2 or min(shape) <= 0:
        return None
    tokens = shape[0] * shape[1] * shapes.batch_calls
    return float(tokens), (f"{tokens} ({shape[0]} × {shape[1]} token ids × "
                           f"{shapes.batch_calls} call(s))")


def compute_efficiency(traces: TraceSet, peak_tflops: float | None = None,
                       tokens_per_step: float | None = None) -> EfficiencyResult:
    """FLOPs, MFU and the roofline of every rank (see the module docstring).

    Args:
        traces: the run.
        peak_tflops: a peak (dense TFLOP/s) for every rank, over the table and the measured
            one (``report --peak-tflops``).
        tokens_per_step: tokens each rank processes per step (``report --tokens-per-step``).
    """
    notes: list[str] = []
    recorded: list[str] = []   # tokens per step from the ranks' recorded inputs
    have = []   # (rank, trace, its ops as stored: columns, a table built only when read)
    for rank, trace in traces.ranks.items():
        held = summary_of(trace).stored("flop_ops")
        if held is not None and len(held):
            have.append((rank, trace, held))
    ops_all = _all_ops(have)
    by_rank = ops_all.groupby("rank", sort=False)
    known_any = ops_all["flops"].notna().groupby(ops_all["rank"], sort=False).any()
    n_recomputed = by_rank["recomputed"].sum()
    n_unknown = ops_all["flops"].isna().groupby(ops_all["rank"], sort=False).sum()
    dtypes, host_best = _main_dtypes(ops_all), _host_peaks(traces.rank_meta)
    info, step_frames, top_at = [], [], {}
    peak_of, tokens_of, recomputed_of = {}, {}, {}
    for rank, trace, held in have:
        if not known_any[rank]:
            notes.append(f"rank {rank}: none of its {len(held)} matmul, convolution, "
                         f"attention or other counted ops has shapes that fit its formula "
                         f"(recorded without record_shapes?): its FLOPs are unknown")
            continue
        dtype = dtypes.get(rank)
        meta = traces.rank_meta.get(rank)
        peak, source, bw, label = _peak(trace, meta, dtype, peak_tflops, notes, host_best)
        n_re = int(n_recomputed[rank])
        if n_re:
            notes.append(f"rank {rank}: {n_re} forward op(s) ran inside the backward "
                         f"(activation recomputation): its model FLOPs cannot be told from the "
                         f"recomputed ones, so MFU is unknown; HFU counts both")
        steps = summary_of(trace).stored("steps")
        if steps is None or not len(steps):
            notes.append(f"rank {rank}: no ProfilerStep windows: FLOPs per op only, no MFU")
            continue
        tokens = tokens_per_step
        counted = recorded_tokens(meta) if tokens is None else None
        if counted is not None:
            tokens = counted[0]
            recorded.append(f"rank {rank}: {counted[1]}")
        step_frames.append((rank, steps))
        peak_of[rank], tokens_of[rank], recomputed_of[rank] = peak, tokens, n_re > 0
        info.append((rank, label, dtype, peak, source, bw, n_re))
        top_at[rank] = len(notes)   # where its note of a peak too low goes
    if step_frames:
        steps_all = _finished(traces, stack_by_rank(step_frames))
        per_step = _steps_table(ops_all[ops_all["rank"].isin(peak_of)], steps_all, peak_of,
                                recomputed_of, tokens_of)
    else:
        per_step = pd.DataFrame(columns=list(STEP_COLUMNS))
    stats = _rank_stats(per_step) if step_frames else pd.DataFrame()
    rank_rows, too_high = [], []
    for rank, label, dtype, peak, source, bw, n_re in info:
        x = stats.loc[rank]
        rank_rows.append({
            "rank": rank, "device": label, "dtype": dtype, "peak_tflops": peak,
            "peak_source": source, "bandwidth_gbps": bw, "steps": int(x["steps"]),
            "model_tflop_per_step": float(x["model_flops"]) / 1e12,
            "executed_tflop_per_step": float(x["executed_flops"]) / 1e12,
            "achieved_tflops": float(x["achieved_tflops"]), "mfu_pct": float(x["mfu_pct"]),
            "mfu_pct_min": float(x["mfu_min"]), "mfu_pct_max": float(x["mfu_max"]),
            "hfu_pct": float(x["hfu_pct"]), "tokens_per_s": float(x["tokens_per_s"]),
            "recomputed_ops": n_re, "unknown_ops": int(n_unknown[rank])})
        if float(x["top"]) > 100.0:
            too_high.append((top_at[rank], f"rank {rank}: {float(x['top']):.0f}% of the peak "
                             f"({peak:g} TFLOP/s, {source}): no device runs above its peak, so "
                             f"the peak is too low for this rank (or its FLOPs are miscounted)"))
    for at, line in reversed(too_high):   # each after its rank's other notes
        notes.insert(at, line)
    if recorded:
        notes.append("tokens per step from the model's recorded input (integer token ids "
                     "[batch, sequence] × its calls per optimizer step; --tokens-per-step "
                     "overrides): " + "; ".join(recorded[:4])
                     + (f"; and {len(recorded) - 4} more" if len(recorded) > 4 else ""))
    per_rank = pd.DataFrame(rank_rows, columns=list(RANK_COLUMNS))
    # ops of the ranks whose ops fit no formula at all are said per rank above
    shaped = ops_all[ops_all["rank"].isin(per_rank["rank"])]
    unknown = int(shaped["flops"].isna().sum())
    if unknown:
        names = shaped.loc[shaped["flops"].isna(), "name"].value_counts()
        notes.append(f"{unknown} op(s) without shapes that fit their formula are not counted "
                     f"(" + ", ".join(f"{n} ×{c}" for n, c in names.head(4).items()) + "): "
                     "their FLOPs are unknown, and so are the model FLOPs and MFU of the steps "
                     "that hold a matmul, convolution or attention among them")
    per_module = _per_module(ops_all, traces, notes)
    return EfficiencyResult(ops=ops_all, per_step=per_step, per_rank=per_rank,
                            per_class=_per_class(ops_all, traces, per_rank),
                            per_module=per_module,
                            mfu_pct=_run_mfu(per_step, per_rank), notes=tuple(notes))


def _all_ops(have: list) -> pd.DataFrame:
    """Every rank's counted ops in one table: ``rank`` and :data:`FLOP_COLUMNS`, the ranks
    of ``have`` (``(rank, trace, its ops as stored)``) in order (:func:`stack_by_rank`: the
    ranks' column lists joined and built once)."""
    out = stack_by_rank((r, held) for r, _, held in have)
    if out is None:
        return empty_flop_ops().assign(rank=pd.Series(dtype=np.int64))[["rank", *FLOP_COLUMNS]]
    return out[["rank", *FLOP_COLUMNS]]


def _main_dtypes(ops: pd.DataFrame) -> dict:
    """Per rank, the dtype that carries most of its model FLOPs (the first in name order on a
    tie), for the ranks with model FLOPs known."""
    model = ops[ops["model"].to_numpy(bool) & ops["flops"].notna().to_numpy()]
    if model.empty:
        return {}
    by = model.groupby(["rank", "dtype"])["flops"].sum().reset_index()
    best = by.loc[by.groupby("rank", sort=False)["flops"].idxmax()]
    return {r: str(d) for r, d in zip(best["rank"], best["dtype"])}


def _run_mfu(per_step: pd.DataFrame, per_rank: pd.DataFrame) -> float | None:
    """All ranks' model FLOPs over Σ step time × peak (%); None where any is unknown."""
    if per_rank.empty or per_rank["peak_tflops"].isna().any() or per_step["model_flops"].isna(
            ).any():
        return None
    peak = per_step["rank"].map(per_rank.set_index("rank")["peak_tflops"]) * 1e12
    cap = float((per_step["step_us"] / 1e6 * peak).sum())
    return 100.0 * float(per_step["model_flops"].sum()) / cap if cap > 0 else None


def _timed(ops: pd.DataFrame, traces: TraceSet) -> pd.DataFrame:
    """``ops`` with ``time_us`` (device time on GPU ranks, host time on CPU ranks) and
    ``time_basis``."""
    gpu = {r: device_kind(t) != "cpu" for r, t in traces.ranks.items()}
    on_gpu = ops["rank"].map(gpu).fillna(False).astype(bool)
    return ops.assign(time_us=np.where(on_gpu, ops["device_us"], ops["cpu_us"]),
                      time_basis=np.where(on_gpu, "device", "cpu"))


_NO_RANGES = ("the traces hold no module ranges (no nn.Module ran in the profiled steps, or "
              "they were recorded without them: pardiag profile records them, torch's "
              "profiler with with_stack=True has its own)")


def _per_module(ops: pd.DataFrame, traces: TraceSet, notes: list[str]) -> pd.DataFrame:
    """Rows of :data:`MODULE_COLUMNS`: per module over all ranks' steps (see the module
    docstring); ``notes`` gains what is left without a module."""
    ops = ops[ops["step"].notna()]
    if ops.empty or not ops["module"].notna().any():
        if len(ops):
            notes.append(_NO_RANGES + ": no breakdown per module")
        return pd.DataFrame(columns=list(MODULE_COLUMNS))
    t = _timed(ops, traces)
    t = t.assign(fwd=t["flops"].where(~t["backward"].astype(bool)),
                 bwd=t["flops"].where(t["backward"].astype(bool)),
                 rec=t["flops"].where(t["recomputed"].astype(bool)),
                 unknown=t["flops"].isna())
    out = (t.groupby(["module", "module_class", "time_basis"], as_index=False, sort=False,
                     dropna=False)
           .agg(ranks=("rank", "nunique"), ops=("flops", "size"),
                forward_flops=("fwd", "sum"), backward_flops=("bwd", "sum"),
                recomputed_flops=("rec", "sum"), flops=("flops", "sum"),
                bytes=("bytes", "sum"), time_us=("time_us", "sum"),
                unknown_ops=("unknown", "sum")))
    total = out.groupby("time_basis")["time_us"].transform("sum")
    out["time_pct"] = 100.0 * out["time_us"] / total.where(total > 0)
    sec = out["time_us"] / 1e6
    known = out["flops"].where(out["unknown_ops"] == 0)   # a sum with unknown ops is no rate
    out["achieved_tflops"] = known / sec.where(sec > 0) / 1e12
    out["achieved_gbps"] = out["bytes"].where(out["unknown_ops"] == 0) / sec.where(sec > 0) / 1e9
    out["intensity"] = known / out["bytes"].where(out["bytes"] > 0)
    for col in ("module", "module_class"):   # NaN keys of the ops of no module: None
        out[col] = out[col].astype(object).where(out[col].notna(), None)
    out["unknown_ops"] = out["unknown_ops"].astype(int)
    out["inclusive_flops"], out["inclusive_time_us"] = _inclusive(out)
    if not (out["module"].notna() & (out["module"] != OPTIMIZER_MODULE)).any():
        notes.append(_NO_RANGES + ": only the optimizer's step is told apart from the rest")
    else:
        notes.extend(_no_module_notes(t, out))
    return out.sort_values("time_us", ascending=False, kind="stable")[
        list(MODULE_COLUMNS)].reset_index(drop=True)


def _inclusive(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per row of the module table: the FLOPs and time (µs) of the module and every module whose
    name it prefixes (``GPT.blocks.0`` holds ``GPT.blocks.0.attn``), of its time basis; its own
    for the optimizer's row and the row of no module. Names sorted, a module's descendants are
    the names from ``name + "."`` to ``name + "/"`` ("/" follows "." in ASCII)."""
    flops = rows["flops"].to_numpy(float).copy()
    time_us = rows["time_us"].to_numpy(float).copy()
    for _, g in rows.groupby("time_basis", sort=False):
        named = g[g["module"].notna() & (g["module"] != OPTIMIZER_MODULE)]
        order = named["module"].astype(str).to_numpy()
        srt = np.argsort(order, kind="stable")
        names = order[srt]
        f = named["flops"].to_numpy(float)[srt]
        t = named["time_us"].to_numpy(float)[srt]
        cf, ct = np.r_[0.0, np.cumsum(f)], np.r_[0.0, np.cumsum(t)]
        lo = np.searchsorted(names, np.char.add(names.astype(str), "."), side="left")
        hi = np.searchsorted(names, np.char.add(names.astype(str), "/"), side="left")
        pos = rows.index.get_indexer(named.index[srt])
        flops[pos] = f + cf[hi] - cf[lo]
        time_us[pos] = t + ct[hi] - ct[lo]
    return flops, time_us


def _no_module_notes(ops: pd.DataFrame, rows: pd.DataFrame) -> list[str]:
    """What the ops of no known module are, with the evidence: forward ops outside every
    module range and the optimizer's step; backward ops by the backward functions they ran in
    (whose sequence number links to no counted forward op of one module)."""
    none = ops[ops["module"].isna()]
    if none.empty:
        return []
    share = float(rows.loc[rows["module"].isna(), "time_pct"].max())
    out = [f"{len(none)} counted op(s) ran for no known module ({share:.1f}% of the counted "
           f"ops' time)"]
    fwd = none[~none["backward"].astype(bool)]
    if len(fwd):
        out.append(f"{len(fwd)} forward op(s) outside every module range and the optimizer's "
                   f"step (a loss computed in the script, a function outside any module)")
    bwd = none[none["backward"].astype(bool)]
    if len(bwd):
        fns = bwd["backward_function"].fillna("no backward function").value_counts()
        out.append(f"{len(bwd)} backward op(s) in backward functions that link to no counted "
                   f"forward op of one module (" + ", ".join(
                       f"{n} ×{c}" for n, c in fns.head(4).items())
                   + (f", {len(fns) - 4} more" if len(fns) > 4 else "") + "; a compiled "
                   "module's backward, DDP's gradient hooks inside AccumulateGrad)")
    return ["; ".join(out)]


def _per_class(ops: pd.DataFrame, traces: TraceSet, per_rank: pd.DataFrame) -> pd.DataFrame:
    """Rows of :data:`CLASS_COLUMNS`: per op class and dtype over all ranks."""
    known = ops[ops["flops"].notna() & ops["step"].notna()]
    if known.empty:
        return pd.DataFrame(columns=list(CLASS_COLUMNS))
    known = _timed(known, traces)
    known = known.assign(dtype=known["dtype"].fillna("unknown"))
    out = (known.groupby(["op_class", "dtype", "time_basis"], as_index=False)
           .agg(ops=("flops", "size"), flops=("flops", "sum"), bytes=("bytes", "sum"),
                time_us=("time_us", "sum")))
    sec = out["time_us"] / 1e6
    out["achieved_tflops"] = out["flops"] / sec.where(sec > 0) / 1e12
    out["achieved_gbps"] = out["bytes"] / sec.where(sec > 0) / 1e9
    out["intensity"] = out["flops"] / out["bytes"].where(out["bytes"] > 0)
    ref = per_rank.dropna(subset=["peak_tflops"])
    out["peak_tflops"] = float(ref["peak_tflops"].median()) if len(ref) else np.nan
    bw = per_rank["bandwidth_gbps"].dropna()
    out["bandwidth_gbps"] = float(bw.median()) if len(bw) else np.nan
    return out.sort_values("flops", ascending=False)[list(CLASS_COLUMNS)].reset_index(drop=True)
