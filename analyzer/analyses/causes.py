"""Why a rank is slow or idle: where its step goes on the host, why its device idles, what a
straggler does longer than its peers, and whether the run is input-bound.

**Host time** per rank and ``ProfilerStep`` (:data:`HOST_PARTS`). The step's CPU window is cut
into exclusive parts, each instant going to the first part in this order that holds it (events
of every host thread but the communication workers, :func:`classify.comm_threads`):

1. ``data_loading_us``: the DataLoader iterator (``enumerate(DataLoader)#...__next__``);
2. ``sync_us``: blocked in a device synchronization: ``cuda*Synchronize``, ``.item()``
   (``aten::_local_scalar_dense``), ``cudaMemcpy``;
3. ``comm_us``: inside a communication call (``c10d::*``, ``nccl:*``, ...) or a wait for one
   (``c10d::wait``, functional collectives' ``wait_tensor``, ``aten::wait``: tensor
   parallelism waits there for its all-reduces), or in none of the parts below while a transfer
   is in flight (a worker thread's, an async send's: DDP on gloo waits for its buckets'
   all-reduces at the end of the backward outside any operator), and the waits no op marks
   (:func:`pardiag.analyzer.analyses.breakdown.unmarked_waits`: FSDP's on gloo);
4. ``launch_us``: other CUDA/HIP runtime and driver calls (kernel launches, async copies);
5. ``optimizer_us``: inside an event whose name holds ``optimizer`` (``Optimizer.step#Adam.step``,
   ``Optimizer.zero_grad#...``);
6. ``backward_us``: inside an event whose name holds ``backward`` (autograd's
   ``evaluate_function: ...Backward0``, on any host thread: the autograd engine's device threads
   run a GPU backward while the main thread waits);
7. ``forward_us``: inside any other CPU operator (the forward pass, the loss, and whatever else
   runs operators outside backward and optimizer); inside an annotation naming ``forward`` but
   outside any operator is the next part (a ``time.sleep`` in a module's forward);
8. ``other_us``: the rest — time outside any operator (Python, a ``time.sleep``, waiting for the
   OS: host contention).

The parts sum to the step's span (``span_us``).

**DTensor's host work** per rank and step (``dtensor_us``, beside the parts, overlapping them):
the host time, outside the optimizer, inside DTensor's redistributions (``Redistribute``,
``RedistributeBackward``, ``NestedRedistribute``, with the collectives and waits they hold) and
its wrapping of local tensors (``_FromTorchTensor``, ``_ToTorchTensor``), plus its dispatch of
operators on DTensors: an operator holding a ``PythonSubclass`` event (torch's tensor-subclass
dispatch), less the local operators that event runs. With tensor (or sequence) parallelism on
DTensor the activations are DTensors, so this is TP's own host work; FSDP2 alone computes on
plain tensors and dispatches on DTensors only in the optimizer, which is left out.

**FSDP2's host work** per rank and step (``fsdp_us``, beside the parts): the host time inside
FSDP2's hooks (events named ``FSDP::...``: gathering and copying parameters in, resharding,
reducing gradients, with the waits for their collectives).

**Device time** per rank and step (GPU traces; NaN on CPU traces), over the same CPU step
window (:data:`DEVICE_PARTS`): ``dev_compute_us`` (compute kernels), ``dev_memory_us``
(memcpy/memset not under compute), ``wait_comm_us`` (communication kernels alone, plus idle
time while the host sat in a communication call), and the idle time with no kernel at all,
each idle interval classified by the kernel that ends it (its launch, by ``correlation``):
launched after the device fell idle — nothing was queued — it waited for the host, split by what
the host did meanwhile into ``wait_sync_us`` (in a synchronization) and ``wait_host_us`` (anything
else: launching, computing on the CPU, Python: launch- or CPU-bound); launched before — work was
queued but did not run (a cross-stream dependency) — ``wait_other_us``. An idle interval that no
kernel ends within the window counts as waiting for the host. HTA's idle time breakdown
(``get_idle_time_breakdown``: host wait, kernel wait, other, per stream) uses the same
queued-or-not test per stream; here the device is idle only when no stream runs a kernel.

**Cross-rank** (:func:`excess_table`): per rank and part, its median over steps and how much it
exceeds the median of the other ranks in the same step (median over steps, µs).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from ..per_rank.causes import CAUSE_COLUMNS, DEVICE_PARTS, HOST_PARTS
from ..per_rank.summary import summary_of
from ..trace.traceset import stack_by_rank
from .peers import median_of_others

#: What each part is, in words (terminal, HTML, straggler evidence).
PART_LABELS = {
    "data_loading_us": "data loading", "sync_us": "synchronization", "comm_us": "communication "
    "calls and waits", "launch_us": "kernel launches", "optimizer_us": "optimizer", "backward_us":
    "backward", "forward_us": "forward and other operators", "other_us": "outside any operator",
    "dev_compute_us": "device computing", "dev_memory_us": "device copying",
    "wait_comm_us": "device waiting for communication", "wait_sync_us": "device idle during a "
    "host synchronization", "wait_host_us": "device idle waiting for the host",
    "wait_other_us": "device idle with work queued",
}


#: Columns of :func:`excess_table`.
EXCESS_COLUMNS = ("rank", "part", "rank_us", "peers_us", "excess_us")


def excess_table(per_step: pd.DataFrame) -> pd.DataFrame:
    """Per rank and part (:data:`HOST_PARTS`, :data:`DEVICE_PARTS` where known): ``rank_us``
    (its median over steps), ``peers_us`` (median over steps of the other ranks' median in
    that step) and ``excess_us`` (median over steps of its value less the other ranks' median
    in the same step). Steps that not every rank has are left out; empty with fewer than two
    ranks."""
    if per_step is None or per_step.empty or per_step["rank"].nunique() < 2:
        return pd.DataFrame(columns=list(EXCESS_COLUMNS))
    cols: dict[str, list] = {c: [] for c in EXCESS_COLUMNS}
    parts = [*HOST_PARTS, *DEVICE_PARTS]
    # one pivot for every part (steps × (part, rank)), then each part's table in numpy
    wide = per_step.pivot_table(index="step", columns="rank", values=parts, aggfunc="sum",
                                dropna=False)
    for part in parts:
        if part not in wide.columns.get_level_values(0):
            continue
        t = wide[part].dropna()
        if t.empty:
            continue
        x = t.to_numpy(dtype=float)
        peers = median_of_others(x)   # steps × ranks
        mine, theirs, excess = (np.median(a, axis=0) for a in (x, peers, x - peers))
        cols["rank"] += [int(r) for r in t.columns]
        cols["part"] += [part] * len(t.columns)
        for c, v in (("rank_us", mine), ("peers_us", theirs), ("excess_us", excess)):
            cols[c] += v.tolist()
    if not cols["rank"]:
        return pd.DataFrame(columns=list(EXCESS_COLUMNS))
    return pd.DataFrame(cols, columns=list(EXCESS_COLUMNS))


#: Data loading is a significant share of the step from this share of its span (%).
INPUT_BOUND_PCT = 10.0
#: A GPU run is host-bound when its devices compute under this share of the step (%) …
HOST_BOUND_BUSY_PCT = 30.0
#: … and idle waiting for the host (nothing queued, or during a host synchronization) at
#: least as long as they compute.


@dataclasses.dataclass(frozen=True)
class CausesResult:
    """Result of :func:`compute_causes`.

    Attributes:
        per_step: per rank and step: ``rank`` and :data:`CAUSE_COLUMNS` (µs).
        per_rank: per rank, the median over its steps of each part and of ``dtensor_us`` and
            ``fsdp_us`` (µs), and
            ``data_loading_pct`` / ``dev_compute_pct`` / ``wait_host_pct``: the median over steps
            of the part's share of the step (%; device shares NaN on CPU).
        excess: :func:`excess_table`.
        input_bound: None, or ``{"ranks": [...], "share_pct": {rank: %}, "data_loading_us":
            {rank: µs}, "step_us", "predicted_step_us", "all_ranks": bool}`` when data loading
            takes ≥ :data:`INPUT_BOUND_PCT` % of the step on some rank (median over steps).
            ``predicted_step_us`` = ``step_us`` (the run's median step, slowest rank per step)
            less the median over steps of the largest data loading of any rank in the step: a
            first-order estimate that puts the slowest loader on the step's critical path.
        host_bound: None, or ``{"busy_pct", "wait_host_pct", "ranks"}`` (medians over GPU ranks,
            %) when the devices compute under :data:`HOST_BOUND_BUSY_PCT` % of the step and
            idle waiting for the host at least as long.
    """

    per_step: pd.DataFrame
    per_rank: pd.DataFrame
    excess: pd.DataFrame
    input_bound: dict | None = None
    host_bound: dict | None = None

    def excess_of(self, rank: int) -> dict[str, float]:
        """``{part: excess µs}`` of one rank (empty when unknown)."""
        e = self.excess[self.excess["rank"] == rank]
        return dict(zip(e["part"], e["excess_us"].astype(float)))


def _per_rank(per_step: pd.DataFrame) -> pd.DataFrame:
    cols = [*HOST_PARTS, *DEVICE_PARTS, "dtensor_us", "fsdp_us"]
    out_cols = ["rank", "steps", "span_us", *cols, "data_loading_pct", "dev_compute_pct",
                "wait_host_pct"]
    if per_step.empty:
        return pd.DataFrame(columns=out_cols)
    d = per_step.copy()
    span = d["span_us"].where(d["span_us"] > 0)
    d["data_loading_pct"] = 100.0 * d["data_loading_us"] / span
    d["dev_compute_pct"] = 100.0 * (d["dev_compute_us"] + d["dev_memory_us"]) / span
    d["wait_host_pct"] = 100.0 * (d["wait_host_us"] + d["wait_sync_us"]) / span
    g = d.groupby("rank", sort=True)
    out = g[["span_us", *cols, "data_loading_pct", "dev_compute_pct", "wait_host_pct"]].median()
    out.insert(0, "steps", g.size())
    return out.reset_index()[out_cols]


def compute_causes(traces, run_step_us: float = float("nan")) -> CausesResult:
    """Host and device parts of every rank's steps, the cross-rank excess, and the input-bound
    and host-bound findings (see :class:`CausesResult`).

    Args:
        traces: the run (:class:`pardiag.analyzer.trace.traceset.TraceSet`).
        run_step_us: the run's median step (µs; per step the slowest rank's span), for the
            input-bound prediction.
    """
    cols = ["rank", *CAUSE_COLUMNS]
    per_step = stack_by_rank((rank, summary_of(trace).stored("causes"))
                             for rank, trace in traces.ranks.items())
    per_step = per_step[cols] if per_step is not None else pd.DataFrame(columns=cols)
    # a step a rank failed or hung in is not one of its steps (TimeBreakdown.unfinished)
    per_step = per_step[~traces.unfinished_mask(per_step["rank"], per_step["step"])]
    per_rank = _per_rank(per_step)
    excess = excess_table(per_step)
    input_bound = host_bound = None
    if len(per_rank):
        heavy = per_rank[per_rank["data_loading_pct"] >= INPUT_BOUND_PCT]
        if len(heavy):
            worst = per_step.groupby("step")["data_loading_us"].max().median()
            input_bound = {
                "ranks": [int(r) for r in heavy["rank"]],
                "share_pct": {int(r): float(p) for r, p in
                              zip(per_rank["rank"], per_rank["data_loading_pct"])},
                "data_loading_us": {int(r): float(p) for r, p in
                                    zip(per_rank["rank"], per_rank["data_loading_us"])},
                "all_ranks": len(heavy) == len(per_rank),
                "step_us": float(run_step_us),
                "predicted_step_us": float(max(run_step_us - worst, 0.0))
                if not math.isnan(run_step_us) else float("nan")}
        gpu = per_rank[per_rank["dev_compute_pct"].notna()]
        if len(gpu):
            busy = float(gpu["dev_compute_pct"].median())
            wait = float(gpu["wait_host_pct"].median())
            if busy < HOST_BOUND_BUSY_PCT and wait >= busy:
                host_bound = {"busy_pct": busy, "wait_host_pct": wait,
                              "ranks": [int(r) for r in gpu["rank"]]}
    return CausesResult(per_step, per_rank, excess, input_bound, host_bound)


#: What each host part means as a straggler's cause, and what to do about it.
CAUSE_ADVICE = {
    "data_loading_us": ("its data loading", "its input pipeline: more DataLoader workers "
                        "(num_workers), pin_memory=True, prefetching (prefetch_factor)"),
    "other_us": ("outside any operator (Python, sleeps, host contention)",
                 "what it does outside any operator: Python work, sleeps, other processes on "
                 "its cores (host contention)"),
    "forward_us": ("its forward operators", "why its operators run slower: host contention or "
                   "a slower device"),
    "backward_us": ("its backward", "why its operators run slower: host contention or a "
                    "slower device"),
    "optimizer_us": ("its optimizer step", "why its optimizer runs slower: host contention or "
                     "a slower device"),
    "launch_us": ("its kernel launches", "host contention on its CPU (launches run slower)"),
    "sync_us": ("its synchronizations", "a slower device (it waits longer for its own GPU)"),
    "dev_compute_us": ("its device computing", "a slower device (clocks, thermals, a "
                       "different GPU)"),
}


@dataclasses.dataclass(frozen=True)
class StragglerCause:
    """Why a straggler is slow (:func:`straggler_cause`).

    Attributes:
        rank: the straggler.
        start_late_us: how late it enters the step (median, clocks aligned; µs), from
            :func:`pardiag.analyzer.analyses.imbalance.skew_origin`; NaN unknown.
        delay_us, top_collective, top_delay_us: its arrival delay per step, and the collective
            holding most of it (skew_origin).
        where: ``"step entry"`` (it enters late by at least half its arrival delay: the delay
            lies before the step) or ``"in the step"``.
        part: the host or device part it spends longest on beyond its peers (a key of
            :data:`CAUSE_ADVICE`), or None when no part exceeds its peers by
            :data:`CAUSE_MIN_SHARE` of its lag (the larger of ``start_late_us`` and
            ``top_delay_us``; without them, of its summed positive excess). Parts that add time
            outside operators (data loading, outside any operator, launches, synchronization,
            device computing) come before the operators' host time, which follows the host's
            load; a host idle outside any operator about as long as its device computes
            longer (:data:`DEVICE_OVER_IDLE_HOST`) waited for that device: device computing.
        excess_us: that part's excess over the peers (µs per step, median).
        parts: every part's excess (µs; :func:`excess_table`).
    """

    rank: int
    start_late_us: float
    delay_us: float
    top_collective: str | None
    top_delay_us: float
    where: str
    part: str | None
    excess_us: float
    parts: dict

    def sentence(self) -> str:
        """``"rank 7 enters each step 7.5 ms late; its data loading takes 7.2 ms longer than
        its peers'"``."""
        bits = []
        if self.where == "step entry":
            bits.append(f"rank {self.rank} enters each step {self.start_late_us / 1e3:.1f} ms "
                        "late")
        elif self.top_collective:
            bits.append(f"rank {self.rank} arrives {self.top_delay_us / 1e3:.1f} ms late at "
                        f"{self.top_collective}")
        if self.part is not None:
            what = CAUSE_ADVICE[self.part][0]
            verb = "is" if self.part == "other_us" else "takes"
            bits.append(f"{what} {verb} {self.excess_us / 1e3:.1f} ms longer than its peers'"
                        if self.part != "other_us" else
                        f"it spends {self.excess_us / 1e3:.1f} ms more than its peers {what}")
        elif self.where == "step entry":
            bits.append("nothing inside its step takes longer: the delay lies before the step "
                        "(data loading before the step began, the previous step's tail)")
        return "; ".join(bits) if bits else f"rank {self.rank}: cause not found"

    def advice(self) -> str:
        """What to look at, one phrase."""
        if self.part is not None:
            return CAUSE_ADVICE[self.part][1]
        if self.where == "step entry":
            return ("what it does before each step: data loading, the previous step's tail "
                    "(logging, checkpointing, evaluation)")
        return "what delays it: host load, data loading, a slower device or link"


#: A part names a straggler's cause when its excess is at least this share of the straggler's
#: lag (:class:`StragglerCause`).
CAUSE_MIN_SHARE = 0.3
#: A device computing at least this share of its host's extra idle time longer than its peers'
#: is the cause of that idle time (:func:`straggler_cause`).
DEVICE_OVER_IDLE_HOST = 0.9
#: Parts that are operators' time (on the host or the device).
_OPERATOR_PARTS = {"forward_us", "backward_us", "optimizer_us"}
#: Parts that are waiting for the others (a straggler waits less), never a cause.
_WAITING = {"comm_us", "wait_comm_us", "wait_other_us", "wait_host_us", "wait_sync_us",
            "dev_memory_us"}


def straggler_cause(causes: CausesResult | None, skew: pd.DataFrame | None,
                    rank: int) -> StragglerCause:
    """Decompose rank ``rank``'s extra time over its peers: where in the step it arises (``skew``:
    :func:`pardiag.analyzer.analyses.imbalance.skew_origin`) and which part it spends longer on
    (``causes.excess``; on GPU ranks the device's computing, on every rank the host parts but
    those that are waiting for the others: communication, device waits)."""
    row = None
    if skew is not None and len(skew):
        m = skew[skew["rank"] == rank]
        row = m.iloc[0] if len(m) else None
    late = float(row["start_late_us"]) if row is not None else float("nan")
    delay = float(row["delay_us"]) if row is not None else float("nan")
    top = row["top_collective"] if row is not None else None
    top_us = float(row["top_delay_us"]) if row is not None else 0.0
    where = ("step entry" if not math.isnan(late) and late > 0
             and (not delay > 0 or late >= 0.5 * delay) else "in the step")
    parts = causes.excess_of(rank) if causes is not None else {}
    cand = {p: v for p, v in parts.items() if p in CAUSE_ADVICE and not math.isnan(v) and v > 0}
    lag = max(x for x in (late, top_us, 0.0) if not math.isnan(x))
    need = CAUSE_MIN_SHARE * (lag if lag > 0 else sum(cand.values()))
    cand = {p: v for p, v in cand.items() if v >= need and v > 0}
    part, ex = None, 0.0
    # time added outside operators first: op times follow the host's load (a planted 30 ms
    # data delay on a loaded 2-core machine came with forward ops 113 vs 49 ms on its peer)
    added = {p: v for p, v in cand.items() if p not in _OPERATOR_PARTS}
    pick = added or cand
    if pick:
        part = max(pick, key=lambda p: pick[p])
        # a host that idles outside any operator as long as its device computes longer waits
        # for that device: the device's work is the cause (a host slowed by itself leaves its
        # device idle, waiting for the host, and computing no longer)
        dev = pick.get("dev_compute_us", 0.0)
        if part == "other_us" and dev >= DEVICE_OVER_IDLE_HOST * pick["other_us"]:
            part = "dev_compute_us"
        ex = float(pick[part])
    return StragglerCause(rank=int(rank), start_late_us=late, delay_us=delay,
                          top_collective=top if isinstance(top, str) else None,
                          top_delay_us=top_us, where=where, part=part, excess_us=ex,
                          parts=parts)
