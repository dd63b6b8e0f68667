"""Holistic Trace Analysis where it is right: per-rank GPU analyses pardiag does not do itself
(``pardiag report --hta``, opt-in).

* **Idle time breakdown** (HTA ``TraceAnalysis.get_idle_time_breakdown``): per rank and GPU
  stream, the gaps between consecutive kernels (kernels, memcpy, memset) split into *host wait*
  (the kernel's launch came after the previous kernel ended: the CPU did not enqueue fast
  enough), *kernel wait* (a gap under ``consecutive_kernel_delay`` µs: launch overhead of
  back-to-back small kernels) and *other* (the rest, e.g. waiting on an event of another
  stream).
* **CUDA kernel launch statistics** (HTA ``get_cuda_kernel_launch_stats``): per launch
  (``cudaLaunchKernel``, ``cudaLaunchKernelExC``, ``cudaMemcpyAsync``, ``cudaMemsetAsync``) the
  CPU runtime call's duration, the GPU event's duration and the launch delay (GPU start minus
  the runtime call's end, clipped at 0), summarized per rank.

HTA's own window applies: it keeps the CPU events that start before the last ``ProfilerStep`` and
the GPU events they launched, and rounds times down to whole µs. HTA reads one file per rank (a rank
of several profiling windows or of a merged file is left out, said in one line), knows CUDA launch
names only (HIP traces give no launch statistics), and fails on traces without GPU kernels (FACTS
§1; those ranks are not given to HTA, one line says so): each failure is caught and said in one line
(ranks with the same failure share it). HTA does not use ``--comm-kernel``: custom communication
kernels are kernels to it like any other, which is right for both analyses (a stream busy with a
communication kernel is not idle). HTA is imported here, lazily; it needs no torch.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from pathlib import Path

import pandas as pd

from ..per_rank.summary import summary_of
from ..trace.classify import device_kind
from ..trace.traceset import TraceSet
from .peers import ranks_text

#: Columns of :attr:`HtaExtras.idle`.
IDLE_COLUMNS = {
    "rank": "global rank",
    "stream": "GPU stream (Kineto's tid of the stream)",
    "category": "host_wait, kernel_wait or other",
    "idle_us": "idle time of that category on the stream (µs, HTA's whole-µs times)",
    "idle_pct": "share of the stream's idle time (%)",
}
#: Columns of :attr:`HtaExtras.launches` (one row per rank).
LAUNCH_COLUMNS = {
    "rank": "global rank",
    "launches": "launches HTA matched to a GPU event (kernels, memcpy, memset)",
    "cpu_us_median": "median duration of the CPU runtime call (µs)",
    "gpu_us_median": "median duration of the GPU event (µs)",
    "launch_delay_us_median": "median launch delay: GPU start − end of the runtime call, ≥ 0 (µs)",
    "launch_delay_us_p95": "95th percentile of the launch delay (µs)",
    "launch_delay_us_max": "longest launch delay (µs)",
    "runtime_outliers": "runtime calls longer than runtime_cutoff_us",
    "delay_outliers": "launches delayed more than launch_delay_cutoff_us",
    "gpu_shorter": "launches whose GPU event is shorter than its CPU runtime call (the CPU "
                   "cannot keep such a kernel stream busy)",
}


@dataclasses.dataclass(frozen=True)
class HtaExtras:
    """Result of :func:`compute_hta_extras`.

    Attributes:
        idle: per rank, stream and category (:data:`IDLE_COLUMNS`).
        launches: per rank (:data:`LAUNCH_COLUMNS`); ranks without launches are absent.
        messages: one line per HTA failure or limit (ranks with the same one share a line).
        hta_version: the version of Holistic Trace Analysis used (the ``traceinsight``
            distribution, or the older ``HolisticTraceAnalysis``), None when it is not
            installed.
        runtime_cutoff_us: runtime calls longer than this are outliers (HTA's default 50).
        launch_delay_cutoff_us: launch delays longer than this are outliers (HTA's default 100).
        consecutive_kernel_delay_us: gaps shorter than this are kernel wait (HTA's default 30).
        idle_by_rank: per rank, :attr:`idle` summed over its streams (:func:`idle_by_rank`).
    """

    idle: pd.DataFrame
    launches: pd.DataFrame
    messages: tuple[str, ...]
    hta_version: str | None
    runtime_cutoff_us: float = 50
    launch_delay_cutoff_us: float = 100
    consecutive_kernel_delay_us: float = 30
    idle_by_rank: pd.DataFrame = dataclasses.field(
        default_factory=lambda: pd.DataFrame(columns=list(IDLE_BY_RANK_COLUMNS)))


#: Columns of :func:`idle_by_rank` (:attr:`HtaExtras.idle_by_rank`).
IDLE_BY_RANK_COLUMNS: tuple[str, ...] = ("rank", "host_wait_us", "kernel_wait_us", "other_us")


def idle_by_rank(idle: pd.DataFrame) -> pd.DataFrame:
    """Each rank's idle time per HTA category, summed over its streams (µs; 0 for a category
    HTA did not report on the rank).

    Args:
        idle: :attr:`HtaExtras.idle`.

    Returns:
        :data:`IDLE_BY_RANK_COLUMNS`: ``rank``, ``host_wait_us``, ``kernel_wait_us``,
        ``other_us``, by rank.
    """
    if idle.empty:
        return pd.DataFrame(columns=list(IDLE_BY_RANK_COLUMNS))
    cats = ("host_wait", "kernel_wait", "other")
    sums = (idle.pivot_table(index="rank", columns="category", values="idle_us",
                             aggfunc="sum", fill_value=0.0)
            .reindex(columns=list(cats), fill_value=0.0))
    return pd.DataFrame({"rank": sums.index.to_numpy(),
                         **{f"{c}_us": sums[c].to_numpy(dtype=float) for c in cats}},
                        columns=list(IDLE_BY_RANK_COLUMNS))


def _empty(columns: dict) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="float64") for c in columns})


def _one_line(exc: BaseException) -> str:
    text = re.sub(r"\s+", " ", str(exc)).strip()
    return f"{type(exc).__name__}: {text[:160]}" if text else type(exc).__name__


#: Distributions that install HTA's ``hta`` package: the maintained release, then its former
#: name.
HTA_DISTRIBUTIONS = ("traceinsight", "HolisticTraceAnalysis")


def _hta_version() -> str | None:
    """The installed HTA's version, from the first of :data:`HTA_DISTRIBUTIONS` installed; None
    for a source checkout of HTA (no distribution metadata)."""
    from importlib.metadata import PackageNotFoundError, version

    for name in HTA_DISTRIBUTIONS:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def _summarize_launches(rank: int, df: pd.DataFrame, runtime_cutoff: float,
                        delay_cutoff: float) -> dict:
    delay = df["launch_delay"].astype(float)
    return {"rank": rank, "launches": len(df),
            "cpu_us_median": float(df["cpu_duration"].median()),
            "gpu_us_median": float(df["gpu_duration"].median()),
            "launch_delay_us_median": float(delay.median()),
            "launch_delay_us_p95": float(delay.quantile(0.95)),
            "launch_delay_us_max": float(delay.max()),
            "runtime_outliers": int((df["cpu_duration"] > runtime_cutoff).sum()),
            "delay_outliers": int((delay > delay_cutoff).sum()),
            "gpu_shorter": int((df["gpu_duration"] < df["cpu_duration"]).sum())}


def compute_hta_extras(traces: TraceSet, comm_patterns=(), *, runtime_cutoff_us: float = 50,
                       launch_delay_cutoff_us: float = 100,
                       consecutive_kernel_delay_us: float = 30) -> HtaExtras:
    """HTA's idle time breakdown and CUDA kernel launch statistics on each rank's trace.

    Never raises for what HTA cannot do: HTA missing, a trace it cannot load, an analysis that
    fails (CPU traces) or finds nothing each become one line of :attr:`HtaExtras.messages`.
    ``comm_patterns`` (``--comm-kernel``) only adds a line that HTA does not use them.
    """
    kw = dict(runtime_cutoff_us=runtime_cutoff_us, launch_delay_cutoff_us=launch_delay_cutoff_us,
              consecutive_kernel_delay_us=consecutive_kernel_delay_us)
    try:
        from hta.trace_analysis import TraceAnalysis
    except Exception as exc:  # not installed, or broken: say so, report the rest
        return HtaExtras(_empty(IDLE_COLUMNS), _empty(LAUNCH_COLUMNS), (
            f"HTA analyses skipped: Holistic Trace Analysis is not importable ({_one_line(exc)}); "
            f"pip install traceinsight",), None, **kw)
    hta_version = _hta_version()
    files, messages = _hta_files(traces)
    if comm_patterns:
        messages.append("HTA does not use --comm-kernel: custom communication kernels are "
                        "kernels like any other to it (right for both analyses: a stream busy "
                        "communicating is not idle)")
    idle_rows: list[pd.DataFrame] = []
    launch_rows: list[dict] = []
    if files:
        hta_log = logging.getLogger("hta")
        level = hta_log.level
        hta_log.setLevel(logging.CRITICAL)   # HTA logs every file it parses
        try:
            idle_rows, launch_rows, run_messages = _run_hta(
                TraceAnalysis, traces, files, runtime_cutoff_us, launch_delay_cutoff_us,
                consecutive_kernel_delay_us)
            messages.extend(run_messages)
        finally:
            hta_log.setLevel(level)
    launches = pd.DataFrame(launch_rows, columns=list(LAUNCH_COLUMNS)) if launch_rows else \
        _empty(LAUNCH_COLUMNS)
    idle = _idle_table(idle_rows)
    return HtaExtras(idle, launches, tuple(messages), hta_version, **kw,
                     idle_by_rank=idle_by_rank(idle))


def _hta_files(traces: TraceSet) -> tuple[dict[int, str], list[str]]:
    """The ranks HTA can read: one trace file per rank (not several profiling windows, not a
    merged file shared with other ranks) with GPU kernels.

    Returns:
        (``{rank: resolved path of its trace file}``, one message per kind of rank left out).
    """
    messages: list[str] = []
    files: dict[int, str] = {}
    several: list[int] = []
    for rank, t in traces.ranks.items():
        paths = t.files or (t.path,)
        if len(paths) > 1:
            several.append(rank)
            continue
        files[rank] = str(Path(t.path).resolve())
    # a merged multi-rank file holds several ranks: HTA would take it for one
    shared = {f for f in files.values() if list(files.values()).count(f) > 1}
    for rank in [r for r, f in files.items() if f in shared]:
        several.append(rank)
        del files[rank]
    cpu = sorted(r for r in files if _no_kernels(traces.ranks[r]))
    for r in cpu:
        del files[r]
    if cpu:
        messages.append(f"HTA analyses skipped on {ranks_text(cpu)}: no GPU kernels in the "
                        f"trace (a CPU trace); HTA's idle time breakdown and launch statistics "
                        f"need them (HTA 0.5's idle time breakdown fails on such a trace: "
                        f"ValueError: No objects to concatenate)")
    if several:
        messages.append(f"HTA analyses skipped for {ranks_text(several)}: HTA reads one trace "
                        f"file per rank (these have several profiling windows or share a "
                        f"merged file)")
    return files, messages


def _run_hta(trace_analysis, traces: TraceSet, files: dict[int, str], runtime_cutoff_us: float,
             launch_delay_cutoff_us: float, consecutive_kernel_delay_us: float
             ) -> tuple[list[pd.DataFrame], list[dict], list[str]]:
    """Load ``files`` (``{rank: path}``) into HTA's ``TraceAnalysis`` (``trace_analysis``, the
    class) and run both analyses on each rank; cutoffs and delay in µs.

    Returns:
        (HTA's idle time breakdown per rank, ``rank`` added; the launch summaries per rank, rows
        of :data:`LAUNCH_COLUMNS`; one message per failure, ranks with the same one sharing it).
    """
    idle_rows: list[pd.DataFrame] = []
    launch_rows: list[dict] = []
    messages: list[str] = []
    try:
        ta = trace_analysis(trace_files=dict(files), trace_dir="/")
    except Exception as exc:
        messages.append(f"HTA could not load the traces ({_one_line(exc)}); no HTA "
                        f"analyses")
        ta = None
    failed: dict[str, list[int]] = {}
    for rank in sorted(files) if ta is not None else ():
        try:
            idle, _ = ta.get_idle_time_breakdown(
                ranks=[rank], visualize=False,
                consecutive_kernel_delay=consecutive_kernel_delay_us)
            idle_rows.append(idle.assign(rank=rank))
        except Exception as exc:
            failed.setdefault(f"idle time breakdown failed ({_one_line(exc)})",
                              []).append(rank)
        try:
            stats = ta.get_cuda_kernel_launch_stats(
                ranks=[rank], runtime_cutoff=runtime_cutoff_us,
                launch_delay_cutoff=launch_delay_cutoff_us, visualize=False)[rank]
            if len(stats):
                launch_rows.append(_summarize_launches(
                    rank, stats, runtime_cutoff_us, launch_delay_cutoff_us))
            else:
                failed.setdefault("kernel launch statistics: no CUDA launch "
                                  "(cudaLaunchKernel, cudaMemcpyAsync, …) matched to a "
                                  "GPU event", []).append(rank)
        except Exception as exc:
            failed.setdefault(f"kernel launch statistics failed ({_one_line(exc)})",
                              []).append(rank)
    rocm = {r for r, t in traces.ranks.items() if device_kind(t) == "rocm"}
    for what, ranks in failed.items():
        why = ("; HTA knows CUDA launch names only (a ROCm trace)"
               if set(ranks) <= rocm and what.startswith("kernel launch") else "")
        messages.append(f"HTA {what} on {ranks_text(ranks)}{why}")
    return idle_rows, launch_rows, messages


def _idle_table(idle_rows: list[pd.DataFrame]) -> pd.DataFrame:
    """:attr:`HtaExtras.idle` from HTA's idle time breakdowns (:func:`_run_hta`): µs, and the
    share recomputed from the times (HTA rounds it to 2 digits)."""
    idle = (pd.concat(idle_rows, ignore_index=True) if idle_rows else None)
    if idle is None or not len(idle):
        return _empty(IDLE_COLUMNS)
    idle = pd.DataFrame({"rank": idle["rank"].astype(int),
                         "stream": idle["stream"].astype(int),
                         "category": idle["idle_category"].astype(str),
                         "idle_us": idle["idle_time"].astype(float),
                         "idle_pct": 100.0 * idle["idle_time_ratio"].astype(float)})
    # HTA rounds the ratio to 2 digits: recompute it from the times
    tot = idle.groupby(["rank", "stream"])["idle_us"].transform("sum")
    idle["idle_pct"] = (100.0 * idle["idle_us"] / tot).where(tot > 0, math.nan)
    return idle


def _no_kernels(trace) -> bool:
    """True when the rank has no GPU kernels."""
    return not summary_of(trace).has_gpu


def _records(df: pd.DataFrame) -> list[dict]:
    """Rows as JSON-safe dicts (NaN → None, numpy scalars → Python)."""
    out = []
    for row in df.to_dict("records"):
        clean = {}
        for k, v in row.items():
            v = v.item() if hasattr(v, "item") else v
            clean[k] = None if isinstance(v, float) and not math.isfinite(v) else v
        out.append(clean)
    return out


def hta_json(r: HtaExtras) -> dict:
    """The ``hta`` key of the JSON summary (``report --hta``)."""
    return {"hta": {"version": r.hta_version, "messages": list(r.messages),
                    "runtime_cutoff_us": r.runtime_cutoff_us,
                    "launch_delay_cutoff_us": r.launch_delay_cutoff_us,
                    "consecutive_kernel_delay_us": r.consecutive_kernel_delay_us,
                    "idle": _records(r.idle), "launches": _records(r.launches)}}
