"""Compare two runs: what changed in the setup, in the time, in the operators, and whether a
change the first run's report recommended did what it predicted.

Both runs are read as their typed JSON summaries (:class:`.schema.ReportDocument`: what a run
folder's report computes, :func:`registry.report_document`, or a summary written earlier by
``pardiag report --json``, decoded with :func:`.schema.decode_report`), so a comparison needs no
trace once the summaries exist. A is the reference, B the candidate; every delta is B − A. A
summary of an older pardiag lacks some keys: its typed document holds their defaults, and the
comparison falls back (module :mod:`.schema`).

What is compared, and how:

* **Setup** (:func:`setup_rows`): the fields of :class:`pardiag.analyzer.analyses.runsetup.RunSetup`
  (script and arguments, world size, degrees, pipeline schedule and microbatches, bucket sizes,
  FSDP settings, versions, hosts, ``NCCL_*``/``TORCH_*`` environment); each is ``same``,
  ``changed`` or unknown in a run (traces recorded without pardiag state little, and say so).
* **Step time** (:class:`StepDelta`): each run's step time is the one its recommendations compare
  with (the report's ``step``: unprofiled steps when pardiag recorded them, else the profiled
  ones), median and quartiles over its steps. The difference **clears the noise** when the
  middle halves of their steps do not overlap (B's first quartile above A's third, or B's third
  below A's first) and it is larger than the noise between identical runs
  (:data:`.reading.BETWEEN_RUNS_FLOOR_PCT`: identical runs of one setup differed by up to
  that much while each run's own steps agreed); with fewer than two steps in a run the noise is
  unknown.
* **Time per profiled step** (:attr:`Comparison.breakdown`, :attr:`Comparison.ranks`): compute
  only, overlapped, exposed communication split into waiting and transfer, memory copies (a
  GPU's, where either run has some) and idle, the mean over a rank's profiled steps (HTA's
  overlap, Lumos' breakdown). A rank's waiting is the wait it
  suffered in matched collectives (TensorBoard's synchronization time) per profiled step, counted
  as exposed first (a rank waiting for its peers has nothing to overlap) and at most its exposed
  communication; the rest of the exposed communication is transfer. Ranks are compared rank by
  rank when the two layouts match (same world size, degrees and stages), else by role: a
  pipeline stage, or all ranks together (means over the ranks of the role).
* Overlap per parallel dimension, pipeline bubbles per stage, stragglers and arrival skew per
  collective type, imbalance per dimension, memory per rank or role (static and peak), time per
  collective type per rank and profiled step, busbw per dimension (or group) and collective.
* **Operators that moved** (:attr:`Comparison.operators`): the GPU kernels and CPU operators whose
  time per rank and profiled step changed most (:mod:`pardiag.analyzer.analyses.operators`; Holistic
  Trace Analysis' TraceDiff idea, on pardiag's own summaries).
* **Closing the loop** (:attr:`Comparison.checks`): each change A's report evaluated (recommended
  or not) whose ``params`` B's setup equals is ``applied``: its predicted step time and peak
  memory are shown beside B's measured ones, with the error 100 · (predicted − measured) /
  measured.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from ..analyses.runsetup import SETUP_LABELS
from .checks import RecommendationCheck, check_recommendations
from .reading import (
    BETWEEN_RUNS_ALPHA,
    BETWEEN_RUNS_FLOOR_PCT,
    MIN_RUNS_PER_SIDE,
    StepDelta,
    StepStats,
    host_probe_ms,
    num,
    pct_change,
    rank_table,
    runs_test,
    set_step_stats,
    setup_of,
    step_delta,
    step_stats,
    straggler_of,
    within_noise,
)
from .schema import OperatorsSection, ReportDocument, SetupSection, decode_report

#: Version of the comparison JSON (``pardiag compare --json``).
COMPARE_SCHEMA_VERSION = 1
#: Operators listed as "moved" (the most change in time per rank and step first).
TOP_OPERATORS = 30
#: Labels of the time breakdown parts, in order (µs per profiled step, mean over ranks).
PARTS = {"compute_only_us": "compute only", "overlap_us": "overlapped",
         "exposed_transfer_us": "exposed comm: transfer",
         "exposed_wait_us": "exposed comm: waiting", "memory_only_us": "memory copies",
         "idle_us": "idle"}
#: Values compared per rank or role (µs per profiled step; bytes).
RANK_VALUES = ("span_us", "compute_only_us", "overlap_us", "exposed_comm_us", "exposed_wait_us",
               "exposed_transfer_us", "memory_only_us", "idle_us", "wait_caused_us",
               "static_bytes", "peak_bytes", "peak_allocated_bytes", "peak_rss_bytes")


# ---------------------------------------------------------------------------- result types


@dataclasses.dataclass(frozen=True)
class Stragglers:
    """Each run's straggler as its report's verdict names it (:func:`straggler_of`).

    Attributes:
        a: A's straggler (a global rank), None when A's verdict names none.
        b: B's straggler, None when B's verdict names none.
    """

    a: int | None
    b: int | None


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Result of :func:`compare_summaries` (every delta is B − A; µs, bytes, GB/s, %).

    Attributes:
        a_source, b_source: what was compared (paths as given).
        warnings: what makes the runs less comparable (different scripts or world sizes,
            step times on different bases, summaries without some data), one line each.
        by: ``"rank"`` (layouts match: rank by rank) or ``"role"`` (pipeline stage, else all
            ranks together).
        setup: one row per setup field: ``field``, ``label``, ``a``, ``b``, ``status``
            (``same``, ``changed``, ``not used in A``/``not used in B`` (the field applies to
            one run only: a pipeline's schedule against a run without a pipeline),
            ``unknown in A``, ``unknown in B``, ``unknown``),
            ``detail`` (the changed script arguments, flag by flag).
        step: :class:`StepDelta`.
        breakdown: per part of the step (``span_us`` first, then :data:`PARTS`): ``part``,
            ``label``, ``a_us``, ``b_us``, ``delta_us``, ``delta_pct`` (per profiled step,
            mean over ranks; for repeated runs the median of that over a side's runs),
            ``within_noise`` (one run per side: the part moved by at most the step's noise
            between runs, :attr:`StepDelta.noise_us`, as a share of A's span per profiled step
            where the step is measured on other steps, :func:`row_noise_us`; repeated runs: the
            runs' values of the
            part do not differ by the between-runs test; None when unknown), ``p_value``
            (that test's p; NaN for one run per side).
        ranks: one row per rank or role (``key``): ``a_<v>``, ``b_<v>`` for each of
            :data:`RANK_VALUES` (µs per profiled step; bytes) and ``a_ranks``/``b_ranks``.
        dims: per parallel dimension: ``dim``, ``a_overlap_pct``, ``b_overlap_pct``,
            ``a_exposed_us``, ``b_exposed_us`` (per rank and profiled step).
        bubbles: per pipeline stage (``stage``): ``a_/b_bubble_pct``, ``a_/b_ideal_pct``,
            ``a_/b_bubble_us`` (per step: bubble % of the window), ``a_/b_basis``.
        stragglers: each run's straggler as its verdict names it (:class:`Stragglers`).
        skew: per collective type: ``op``, ``a_/b_count``, ``a_/b_arrival_skew_us`` (median),
            ``a_/b_max_skew_us``.
        imbalance: per dimension: ``dim``, ``a_/b_imbalance`` (max/mean of compute per step),
            ``a_/b_cost_us`` (max − mean per step).
        collectives: per collective type: ``collective``, ``a_/b_count``, ``a_/b_time_us``,
            ``a_/b_exposed_us`` (per rank and profiled step).
        bandwidth: per dimension (or group) and collective: ``group``, ``op``, ``a_/b_count``
            (complete matched instances), ``a_/b_transfer_us`` and ``a_/b_busbw_gbps`` (medians
            over them).
        operators: the :data:`TOP_OPERATORS` operators whose time moved most: ``kind``,
            ``name``, ``a_us``, ``b_us`` (per rank and profiled step), ``delta_us``,
            ``delta_pct`` (None for an operator new in B), ``a_count``, ``b_count`` (per rank
            and profiled step).
        operators_note: why operators are missing or what they rest on.
        checks: every change A's report evaluated, checked against B
            (:class:`RecommendationCheck`); applied first, recommended before not.
        a_document, b_document: the two typed summaries compared
            (:class:`.schema.ReportDocument`; None in a Comparison built by hand).
    """

    a_source: str
    b_source: str
    warnings: tuple[str, ...]
    by: str
    setup: pd.DataFrame
    step: StepDelta
    breakdown: pd.DataFrame
    ranks: pd.DataFrame
    dims: pd.DataFrame
    bubbles: pd.DataFrame
    stragglers: Stragglers
    skew: pd.DataFrame
    imbalance: pd.DataFrame
    collectives: pd.DataFrame
    bandwidth: pd.DataFrame
    operators: pd.DataFrame
    operators_note: str
    checks: tuple[RecommendationCheck, ...]
    a_document: ReportDocument | None = dataclasses.field(default=None, repr=False,
                                                          compare=False)
    b_document: ReportDocument | None = dataclasses.field(default=None, repr=False,
                                                          compare=False)

    @property
    def applied(self) -> tuple[RecommendationCheck, ...]:
        """The checks whose change B made (``status == "applied"``)."""
        return tuple(c for c in self.checks if c.status == "applied")


@dataclasses.dataclass(frozen=True)
class GateResult:
    """Outcome of the ``--fail-if-slower PCT`` regression gate (:func:`gate`).

    Attributes:
        failed: True when B is slower than A by more than the limit and beyond the runs' noise
            (or the step times cannot be compared).
        line: the reason, one line.
    """

    failed: bool
    line: str


# ---------------------------------------------------------------------------- reading a summary


# ---------------------------------------------------------------------------- comparing


def _merge(fa: pd.DataFrame, fb: pd.DataFrame, key: str | list[str],
           values: list[str]) -> pd.DataFrame:
    """Outer join of two per-key tables: ``key`` then ``a_<v>``, ``b_<v>`` for each value."""
    keys = [key] if isinstance(key, str) else key
    a = fa[keys + values].rename(columns={v: f"a_{v}" for v in values})
    b = fb[keys + values].rename(columns={v: f"b_{v}" for v in values})
    out = a.merge(b, on=keys, how="outer", sort=False)
    order = [f"{p}_{v}" for v in values for p in ("a", "b")]
    return out[keys + order].reset_index(drop=True)


def _layouts_match(sa: SetupSection, sb: SetupSection, ra: pd.DataFrame,
                   rb: pd.DataFrame) -> bool:
    return (sorted(ra["rank"]) == sorted(rb["rank"])
            and (sa.dims or {}) == (sb.dims or {})
            and sa.pipeline_stages == sb.pipeline_stages
            and sa.stages_per_rank == sb.stages_per_rank)


def _per_key(ranks: pd.DataFrame, by: str) -> pd.DataFrame:
    """Per rank (``key`` = ``rank r``) or per role (means over its ranks) and, by role, a last
    row ``all ranks`` (the mean over every rank) so that runs of different roles (a pipeline
    and data parallelism) still meet; with ``ranks`` (how many ranks each row is over)."""
    if ranks.empty:
        return pd.DataFrame(columns=["key", "ranks", *RANK_VALUES])
    if by == "rank":
        return ranks.assign(key=[f"rank {r}" for r in ranks["rank"]], ranks=1)[
            ["key", "ranks", *RANK_VALUES]]
    g = ranks.groupby("role", sort=True)
    out = g[list(RANK_VALUES)].mean().reset_index().rename(columns={"role": "key"})
    out["ranks"] = g.size().to_numpy()
    if "all ranks" not in set(out["key"]):
        everyone = ranks[list(RANK_VALUES)].mean().to_dict()
        out = pd.concat([out, pd.DataFrame([{"key": "all ranks", "ranks": len(ranks),
                                             **everyone}])], ignore_index=True)
    return out[["key", "ranks", *RANK_VALUES]]


def _args_map(args: Iterable[Any] | None) -> dict[str, str]:
    """``["--a", "1", "--flag", "pos"]`` → ``{"--a": "1", "--flag": "", "arg 1": "pos"}``."""
    out: dict[str, str] = {}
    i, pos = 0, 0
    args = [str(a) for a in args or []]
    while i < len(args):
        a = args[i]
        if a.startswith("-"):
            name, eq, val = a.partition("=")
            if eq:
                out[name] = val
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                out[name] = args[i + 1]
                i += 1
            else:
                out[name] = ""
        else:
            pos += 1
            out[f"arg {pos}"] = a
        i += 1
    return out


def args_changes(a_args: Iterable[Any] | None, b_args: Iterable[Any] | None) -> list[str]:
    """The script arguments that differ, one ``"--flag: a → b"`` each (``(not set)`` where a
    run lacks the flag; a flag without a value shows ``set``)."""
    ma, mb = _args_map(a_args), _args_map(b_args)
    out = []
    for k in list(ma) + [k for k in mb if k not in ma]:
        va, vb = ma.get(k), mb.get(k)
        if va != vb:
            def show(v: str | None) -> str:
                return "(not set)" if v is None else (v if v != "" else "set")
            out.append(f"{k}: {show(va)} → {show(vb)}")
    return out


def setup_rows(sa: SetupSection, sb: SetupSection) -> pd.DataFrame:
    """One row per setup field (see :attr:`Comparison.setup`); ``env`` is split into one row
    per variable (``env.NAME``). Fields that apply to neither run (no pipeline, no FSDP) are
    left out."""
    ua, ub = set(sa.unknown or ()), set(sb.unknown or ())
    rows = []

    def add(field: str, label: str, va: Any, vb: Any, ka: bool, kb: bool) -> None:
        if va is None and vb is None and not (ka or kb):
            return
        if va is None and vb is None:
            status = "unknown"
        elif va is None:   # unknown, or the field does not apply to A (no pipeline, say)
            status = "unknown in A" if ka else "not used in A"
        elif vb is None:
            status = "unknown in B" if kb else "not used in B"
        else:
            status = "same" if va == vb else "changed"
        detail = ""
        if field == "script_args" and status == "changed":
            detail = "; ".join(args_changes(va, vb))
        rows.append({"field": field, "label": label, "a": va, "b": vb, "status": status,
                     "detail": detail})

    for field, label in SETUP_LABELS.items():
        if field == "env":
            ea, eb = sa.env, sb.env
            if ea is None or eb is None:
                add("env", label, ea, eb, "env" in ua, "env" in ub)
                continue
            for name in sorted(set(ea) | set(eb)):
                add(f"env.{name}", name, ea.get(name, "(not set)"), eb.get(name, "(not set)"),
                    False, False)
            if not ea and not eb:
                add("env", label, "(none set)", "(none set)", False, False)
            continue
        add(field, label, getattr(sa, field), getattr(sb, field), field in ua, field in ub)
    return pd.DataFrame(rows, columns=["field", "label", "a", "b", "status", "detail"])


def _steps_per_rank(doc: ReportDocument) -> float:
    """Mean profiled steps per rank (at least 1)."""
    n = [len(r.steps) for r in doc.ranks]
    return max(float(np.mean(n)) if n else 1.0, 1.0)


def _dims(doc: ReportDocument) -> pd.DataFrame:
    per = _steps_per_rank(doc)
    rows = [{"dim": str(r.dim), "overlap_pct": num(r.overlap_pct),
             "exposed_us": num(r.exposed_us) / per}
            for r in doc.overlap_per_dimension.summary]
    return pd.DataFrame(rows, columns=["dim", "overlap_pct", "exposed_us"])


def _bubbles(doc: ReportDocument) -> pd.DataFrame:
    rows = []
    for r in doc.pipeline.summary if doc.pipeline else []:
        pct, win = num(r.bubble_pct), num(r.window_us)
        rows.append({"stage": str(r.stages), "bubble_pct": pct,
                     "ideal_pct": num(r.ideal_pct), "bubble_us": pct / 100.0 * win,
                     "basis": r.basis})
    df = pd.DataFrame(rows, columns=["stage", "bubble_pct", "ideal_pct", "bubble_us", "basis"])
    return df.groupby("stage", as_index=False, sort=True).agg(
        bubble_pct=("bubble_pct", "mean"), ideal_pct=("ideal_pct", "mean"),
        bubble_us=("bubble_us", "mean"), basis=("basis", "first")) if len(df) else df


def _skew(doc: ReportDocument) -> pd.DataFrame:
    rows = [{"op": str(r.op), "count": num(r.count), "arrival_skew_us": num(r.arrival_skew_us),
             "max_skew_us": num(r.max_skew_us)} for r in (doc.sync.skew if doc.sync else [])]
    return pd.DataFrame(rows, columns=["op", "count", "arrival_skew_us", "max_skew_us"])


def _imbalance(doc: ReportDocument) -> pd.DataFrame:
    rows = [{"dim": str(r.dim), "imbalance": num(r.imbalance), "cost_us": num(r.cost_us)}
            for r in doc.imbalance.summary]
    df = pd.DataFrame(rows, columns=["dim", "imbalance", "cost_us"])
    return df.groupby("dim", as_index=False, sort=True).agg(
        imbalance=("imbalance", "max"), cost_us=("cost_us", "max")) if len(df) else df


def _collectives(doc: ReportDocument) -> pd.DataFrame:
    steps = sum(max(len(r.steps), 1) for r in doc.ranks) or 1
    rows = [{"collective": str(r.collective), "count": num(r.count) / steps,
             "time_us": num(r.time_us) / steps, "exposed_us": num(r.exposed_us) / steps}
            for r in doc.collectives]
    return pd.DataFrame(rows, columns=["collective", "count", "time_us", "exposed_us"])


def _bandwidth(doc: ReportDocument) -> pd.DataFrame:
    """Per (dimension or group, collective) over the complete matched instances: ``count``
    (instances), median
    ``transfer_us`` (an instance's transfer: its shortest duration over the ranks) and median
    ``busbw_gbps`` (instances with a message size)."""
    dim_of = {str(g.pg): g.dim for g in doc.layout.groups}
    rows = []
    for r in doc.sync.instances if doc.sync else []:
        if r.complete is False:
            continue
        dim = dim_of.get(str(r.pg))
        rows.append({"group": str(dim) if dim else str(r.group or r.pg),
                     "op": str(r.op), "transfer_us": num(r.transfer_us),
                     "busbw_gbps": num(r.busbw_gbps)})
    df = pd.DataFrame(rows, columns=["group", "op", "transfer_us", "busbw_gbps"])
    if df.empty:
        return pd.DataFrame(columns=["group", "op", "count", "transfer_us", "busbw_gbps"])
    return df.groupby(["group", "op"], as_index=False, sort=True).agg(
        count=("op", "size"), transfer_us=("transfer_us", "median"),
        busbw_gbps=("busbw_gbps", "median"))


def _operators(sa: ReportDocument, sb: ReportDocument) -> tuple[pd.DataFrame, str]:
    cols = ["kind", "name", "a_us", "b_us", "delta_us", "delta_pct", "a_count", "b_count"]
    oa, ob = sa.operators, sb.operators
    missing = [x for x, o in (("A", oa), ("B", ob)) if o is None]
    if oa is None or ob is None:
        return pd.DataFrame(columns=cols), (
            f"no operator times in {' and '.join(missing)} (a summary written before pardiag "
            "kept them: report the run folder again)")

    def frame(o: OperatorsSection) -> pd.DataFrame:
        steps = max(int(o.rank_steps or 1), 1)
        rows = [{"kind": str(r.kind), "name": str(r.name), "us": num(r.time_us) / steps,
                 "count": num(r.count) / steps} for r in o.rows]
        return pd.DataFrame(rows, columns=["kind", "name", "us", "count"])

    fa, fb = frame(oa), frame(ob)
    m = fa.merge(fb, on=["kind", "name"], how="outer", suffixes=("_a", "_b"))
    m = m.rename(columns={"us_a": "a_us", "us_b": "b_us", "count_a": "a_count",
                          "count_b": "b_count"})
    m[["a_us", "b_us", "a_count", "b_count"]] = m[["a_us", "b_us", "a_count",
                                                   "b_count"]].fillna(0.0)
    m["delta_us"] = m["b_us"] - m["a_us"]
    m["delta_pct"] = [pct_change(a, b) if a > 0 else None for a, b in zip(m["a_us"], m["b_us"])]
    m = m.assign(_abs=m["delta_us"].abs()).sort_values(
        ["_abs", "kind", "name"], ascending=[False, True, True], kind="stable")
    note = ("time per rank and profiled step of each GPU kernel and CPU operator name (CPU "
            "operators nest: each name's time includes the operators it calls)")
    cut = [x for x, o in (("A", oa), ("B", ob)) if int(o.total or 0) > len(o.rows)]
    if cut:
        note += (f"; {' and '.join(cut)} listed only the names with the most time, so a name "
                 "below them counts as 0 there")
    return m[cols].head(TOP_OPERATORS).reset_index(drop=True), note


#: Host probes (:func:`.reading.host_probe_ms`) further apart than this (%) are reported: the
#: probe of one quiet host repeats within a few %.
HOST_PROBE_DIFF_PCT = 10.0


def host_probe_difference(a_runs: Iterable[ReportDocument],
                          b_runs: Iterable[ReportDocument]) -> str | None:
    """When the two sides' hosts ran the host probe (:func:`.reading.host_probe_ms`, the mean
    over each side's runs) more than :data:`HOST_PROBE_DIFF_PCT` % apart, what the probe says in
    words (``"the host probe (…) took 8.2 ms for A and 12.3 ms for B: B's host was 50%
    slower"``): a slower host moves the whole step time, whatever the change. None otherwise,
    or without probes on either side."""
    pa = [x for x in map(host_probe_ms, a_runs) if x is not None]
    pb = [x for x in map(host_probe_ms, b_runs) if x is not None]
    if not pa or not pb:
        return None
    ma, mb = float(np.mean(pa)), float(np.mean(pb))
    if abs(pct_change(ma, mb)) <= HOST_PROBE_DIFF_PCT:
        return None
    side, pct = ("B's", pct_change(ma, mb)) if mb > ma else ("A's", pct_change(mb, ma))
    return (f"the host probe (a fixed single-core workload timed before and after each run) "
            f"took {ma:.1f} ms for A and {mb:.1f} ms for B: {side} host was {pct:.0f}% slower")


def _slower_host(a_runs: Iterable[ReportDocument], b_runs: Iterable[ReportDocument]
                 ) -> str | None:
    """``"A"`` or ``"B"``: the side whose host ran the host probe slower (the mean over its
    runs), None without probes on both sides."""
    pa = [x for x in map(host_probe_ms, a_runs) if x is not None]
    pb = [x for x in map(host_probe_ms, b_runs) if x is not None]
    if not pa or not pb:
        return None
    return "B" if float(np.mean(pb)) > float(np.mean(pa)) else "A"


#: Each side's own report warnings a comparison repeats (the rest counted).
SIDE_WARNINGS = 5


def _warnings(sa_sum: ReportDocument, sb_sum: ReportDocument, sa: SetupSection,
              sb: SetupSection, step: StepDelta, by: str, probe: str | None = None
              ) -> list[str]:
    out = [f"{probe}, which moves the whole step time whatever the change"] if probe else []
    for x, s in (("A", sa_sum), ("B", sb_sum)):   # each side's own: skipped files, lost ranks
        own = list(s.warnings)
        out += [f"{x}: {w}" for w in own[:SIDE_WARNINGS]]
        if len(own) > SIDE_WARNINGS:
            out.append(f"{x}: {len(own) - SIDE_WARNINGS} more warning(s): its own report "
                       f"lists them")
    for x, s in (("A", sa_sum), ("B", sb_sum)):
        v = s.schema_version
        if v < 3:
            out.append(f"{x} is a summary of schema {v} (an older pardiag): it has no setup "
                       "beyond run.json, no operator times and no step samples")
    if sa.script and sb.script and sa.script != sb.script:
        out.append(f"A and B ran different scripts ({sa.script} and {sb.script}): they may "
                   "be different models; what both measured is compared")
    wa, wb = sa.world_size, sb.world_size
    if wa and wb and wa != wb:
        out.append(f"world sizes differ ({wa} and {wb}): ranks are compared by role (pipeline "
                   "stage, else all ranks together), and totals per rank")
    elif by == "role":
        out.append("the layouts differ: ranks are compared by role (pipeline stage, else all "
                   "ranks together)")
    da = {r.domain for r in sa_sum.ranks}
    db = {r.domain for r in sb_sum.ranks}
    if da and db and da != db:
        out.append(f"A's timeline is {'/'.join(sorted(map(str, da)))} and B's "
                   f"{'/'.join(sorted(map(str, db)))}: GPU kernels and CPU events are measured "
                   "differently")
    if step.a is not None and step.b is not None and step.a.basis != step.b.basis:
        out.append(f"A's step time is measured on {step.a.basis_text} and B's on "
                   f"{step.b.basis_text}: the difference mixes the two")
    return out


def _contended(step: StepDelta, sa: SetupSection, sb: SetupSection, repeated: bool
               ) -> StepDelta:
    """One run per side whose ranks contended for cores (``setup.contention``): the noise
    between identical runs (:data:`.reading.BETWEEN_RUNS_FLOOR_PCT`) was measured on ranks
    pinned to their own cores, and does not bound theirs, so the noise is unknown. Repeated
    runs measure their own noise and are left as they are."""
    sides = [x for x, s in (("A", sa), ("B", sb)) if s.contention not in (None, "none")]
    if repeated or not sides or step.beyond_noise is None:
        return step
    return dataclasses.replace(step, beyond_noise=None, noise_us=float("nan"), noise=(
        f"noise unknown: {' and '.join(sides)} ran with ranks contending for cores, and the "
        f"±{BETWEEN_RUNS_FLOOR_PCT:g}% by which identical runs differed was measured on ranks "
        "pinned to their own cores; pin the ranks (pardiag profile --pin-cpu) or repeat each "
        f"side {MIN_RUNS_PER_SIDE} times or more (pardiag profile --repeat {MIN_RUNS_PER_SIDE})"))


def row_noise_us(step: StepDelta, span_a_us: float) -> float:
    """The noise between runs of a row per profiled step (µs; NaN unknown): the step's
    (:attr:`StepDelta.noise_us`) where the step time is the profiled steps' own; where it is
    measured on other steps (the unprofiled ones, a pipeline's periods), the same share of A's
    span per profiled step ``span_a_us`` — a noise in µs of one quantity does not bound another
    three times its size."""
    n = step.noise_us
    if (math.isnan(n) or step.a is None or step.a.basis == "profiled"
            or not (span_a_us > 0) or not (step.a.median_us > 0)):
        return n
    return n * span_a_us / step.a.median_us


def _part_means(table: pd.DataFrame, part: str) -> float:
    return float(table[part].mean()) if len(table) else float("nan")


def _breakdown(ra: pd.DataFrame, rb: pd.DataFrame, step: StepDelta,
               runs: tuple[tuple[ReportDocument, ...], tuple[ReportDocument, ...]]
               ) -> pd.DataFrame:
    """:attr:`Comparison.breakdown`. One run per side: each part's mean over ranks, judged
    against the step's noise between runs (:func:`.reading.within_noise`). Repeated runs on
    either side: each part is the median over the side's runs of that mean, and it is within
    the noise unless the runs' values differ by the same test as the step
    (:func:`.reading.runs_test`; None when the run counts cannot reach its level), so that a
    part is judged on its own spread between runs, not on one run's steps."""
    repeated = len(runs[0]) > 1 or len(runs[1]) > 1
    tables = ([[rank_table(d) for d in side] if len(side) > 1 else [t]
               for side, t in zip(runs, (ra, rb))] if repeated else [[ra], [rb]])
    rows = []
    noise = dataclasses.replace(step, noise_us=row_noise_us(step, _part_means(ra, "span_us")))
    for p in ["span_us", *PARTS]:
        xa = [_part_means(t, p) for t in tables[0]]
        xb = [_part_means(t, p) for t in tables[1]]
        va, vb = (float(np.nanmedian(x)) if not all(map(math.isnan, x)) else float("nan")
                  for x in (xa, xb))
        if p == "memory_only_us" and not (va > 0 or vb > 0):
            continue   # a device's copies: no row where neither run has any (CPU runs)
        if repeated:
            pv, decidable = runs_test(xa, xb)
            within = (None if not decidable or math.isnan(pv)
                      else bool(pv >= BETWEEN_RUNS_ALPHA))
        else:
            pv, within = float("nan"), within_noise(vb - va, noise)
        rows.append({"part": p, "label": "step span" if p == "span_us" else PARTS[p],
                     "a_us": va, "b_us": vb, "delta_us": vb - va, "delta_pct": pct_change(va, vb),
                     "within_noise": within, "p_value": pv})
    return pd.DataFrame(rows, columns=["part", "label", "a_us", "b_us", "delta_us",
                                       "delta_pct", "within_noise", "p_value"])


def compare_summaries(a: ReportDocument | dict[str, Any], b: ReportDocument | dict[str, Any], *,
                      a_source: str = "A", b_source: str = "B",
                      a_runs: Iterable[ReportDocument] = (),
                      b_runs: Iterable[ReportDocument] = ()) -> Comparison:
    """Compare two runs' summaries (A the reference, B the candidate): typed
    (:class:`.schema.ReportDocument`, :attr:`pardiag.Report.document`) or as the JSON dicts
    ``pardiag report --json`` writes (decoded here). Runs that are not comparable (different
    scripts, world sizes) are compared where they can be, with :attr:`Comparison.warnings`.

    ``a_runs``/``b_runs``: every run of a side that was repeated (``pardiag profile --repeat
    N``; ``a``/``b`` is then one of them, the one compared in detail): the step time is then
    the set's (:func:`.reading.set_step_stats`) and its noise the spread between the runs.

    Raises:
        ValueError: a dict is not a pardiag report summary (not an object, no ``ranks`` list,
            a value of the wrong type); the one-line message names it (``A``, ``B``).
    """
    a, b = (x if isinstance(x, ReportDocument) else decode_report(x, name)
            for x, name in ((a, "A"), (b, "B")))
    sa, sb = setup_of(a), setup_of(b)
    setup = setup_rows(sa, sb)
    runs = (tuple(a_runs), tuple(b_runs))
    step = step_delta(set_step_stats(list(runs[0])) if len(runs[0]) > 1 else step_stats(a),
                      set_step_stats(list(runs[1])) if len(runs[1]) > 1 else step_stats(b))
    probe = host_probe_difference(runs[0] or (a,), runs[1] or (b,))
    if probe and step.beyond_noise:
        # the host moved too: a slower host explains a slower run, never a faster one
        if _slower_host(runs[0] or (a,), runs[1] or (b,)) == ("B" if step.delta_pct > 0
                                                               else "A"):
            step = dataclasses.replace(step, beyond_noise=None, noise=(
                f"{step.noise}, but not judged: {probe}, so the difference may be the host's; "
                "repeat the runs on a quieter host"))
        else:
            faster = "B" if step.delta_pct < 0 else "A"
            step = dataclasses.replace(step, noise=(
                f"{step.noise}; {probe}: {faster} was faster on the slower host, so the "
                f"difference is, if anything, larger than measured"))
    step = _contended(step, sa, sb, repeated=len(runs[0]) > 1 or len(runs[1]) > 1)
    ra, rb = rank_table(a), rank_table(b)
    by = "rank" if _layouts_match(sa, sb, ra, rb) else "role"
    ranks = _merge(_per_key(ra, by), _per_key(rb, by), "key", ["ranks", *RANK_VALUES])
    breakdown = _breakdown(ra, rb, step, runs)
    ops, ops_note = _operators(a, b)
    return Comparison(
        a_source=a_source, b_source=b_source,
        warnings=tuple(_warnings(a, b, sa, sb, step, by, probe)), by=by, setup=setup, step=step,
        breakdown=breakdown, ranks=ranks,
        dims=_merge(_dims(a), _dims(b), "dim", ["overlap_pct", "exposed_us"]),
        bubbles=_merge(_bubbles(a), _bubbles(b), "stage",
                       ["bubble_pct", "ideal_pct", "bubble_us", "basis"]),
        stragglers=Stragglers(straggler_of(a), straggler_of(b)),
        skew=_merge(_skew(a), _skew(b), "op", ["count", "arrival_skew_us", "max_skew_us"]),
        imbalance=_merge(_imbalance(a), _imbalance(b), "dim", ["imbalance", "cost_us"]),
        collectives=_merge(_collectives(a), _collectives(b), "collective",
                           ["count", "time_us", "exposed_us"]),
        bandwidth=_merge(_bandwidth(a), _bandwidth(b), ["group", "op"],
                         ["count", "transfer_us", "busbw_gbps"]),
        operators=ops, operators_note=ops_note,
        checks=check_recommendations(a, b, sb, setup, step), a_document=a, b_document=b)


# ---------------------------------------------------------------------------- the gate


def gate(c: Comparison, pct: float) -> GateResult:
    """The ``--fail-if-slower PCT`` check: fail when B's step time is slower than A's by more
    than ``pct`` % and the difference is beyond the runs' noise (:attr:`StepDelta.beyond_noise`;
    with the noise unknown, the limit alone decides); also fail when a step time is missing.
    The line says why, with both medians and the basis."""
    s = c.step
    if s.a is None or s.b is None:
        return GateResult(True, f"cannot check --fail-if-slower {pct:g}%: {s.noise}")
    how = (f"{abs(s.delta_pct):.1f}% {'slower' if s.delta_pct > 0 else 'faster'} than"
           if s.delta_pct != 0 else "as long as")
    head = (f"B's step is {how} A's ({s.b.median_us / 1e3:.2f} vs {s.a.median_us / 1e3:.2f} "
            f"ms, median of {s.b.basis_text})")
    if s.delta_pct <= pct:
        return GateResult(False, f"{head}: within --fail-if-slower {pct:g}%")
    if s.beyond_noise is False:
        return GateResult(False, f"{head}: over --fail-if-slower {pct:g}% but {s.noise}")
    if s.beyond_noise is None:
        return GateResult(True, f"{head}: over --fail-if-slower {pct:g}%; the difference could "
                                f"not be weighed against the noise between runs, so the limit "
                                f"alone decides ({s.noise})")
    return GateResult(True, f"{head}: over --fail-if-slower {pct:g}%, {s.noise}")


# ---------------------------------------------------------------------------- JSON


def _clean(v: Any) -> Any:
    if hasattr(v, "item") and not isinstance(v, (list, dict, str)):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [{c: _clean(v) for c, v in zip(df.columns, row)}
            for row in df.itertuples(index=False)]


def comparison_json(c: Comparison, gate_result: GateResult | None = None) -> dict[str, Any]:
    """The comparison as plain JSON values (``pardiag compare --json``; NaN as null)::

        {"schema_version", "a", "b", "warnings", "by", "setup": [...], "step": {"a", "b",
         "delta_us", "delta_pct", "beyond_noise", "noise", "p_value", "noise_us"},
         "breakdown", "ranks", "dims",
         "bubbles", "stragglers", "skew", "imbalance", "collectives", "bandwidth",
         "operators", "operators_note", "recommendation_checks": [...], "gate"}
    """
    def stats(s: StepStats | None) -> dict[str, Any] | None:
        return None if s is None else {k: _clean(v) if not isinstance(v, tuple) else list(v)
                                       for k, v in dataclasses.asdict(s).items()}

    return {
        "schema_version": COMPARE_SCHEMA_VERSION, "a": c.a_source, "b": c.b_source,
        "warnings": list(c.warnings), "by": c.by, "setup": _records(c.setup),
        "step": {"a": stats(c.step.a), "b": stats(c.step.b), "delta_us": _clean(c.step.delta_us),
                 "delta_pct": _clean(c.step.delta_pct), "beyond_noise": c.step.beyond_noise,
                 "noise": c.step.noise, "p_value": _clean(c.step.p_value),
                 "noise_us": _clean(c.step.noise_us)},
        "breakdown": _records(c.breakdown), "ranks": _records(c.ranks),
        "dims": _records(c.dims), "bubbles": _records(c.bubbles),
        "stragglers": dataclasses.asdict(c.stragglers),
        "skew": _records(c.skew), "imbalance": _records(c.imbalance),
        "collectives": _records(c.collectives), "bandwidth": _records(c.bandwidth),
        "operators": _records(c.operators), "operators_note": c.operators_note,
        "recommendation_checks": [{k: _clean(v) if not isinstance(v, (dict, tuple)) else
                                   (list(v) if isinstance(v, tuple) else v)
                                   for k, v in dataclasses.asdict(x).items()}
                                  for x in c.checks],
        "gate": None if gate_result is None else dataclasses.asdict(gate_result),
    }
