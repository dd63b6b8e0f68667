"""What-if model: predict the step time of a changed pipeline from the run's own measurements.

The model replays a pipeline schedule with measured costs (a discrete-event simulation, in the
spirit of Lumos, Liang et al. 2025, and of the analytical model of Narayanan et al., SC'21):

* **Schedule order** per pipeline rank (:func:`schedule_order`): GPipe (all forwards, then all
  backwards), 1F1B (``min(m, S − s)`` warm-up forwards on stage *s* of *S*, then one backward
  and one forward alternately, then the remaining backwards, as
  ``torch.distributed.pipelining.Schedule1F1B`` runs it) and Interleaved 1F1B (``v`` stages per
  rank placed in a loop, stage ``k·p + r`` on rank *r*; warm-up ``(v − 1)·m_r + 2·(p − 1 − r)``
  forwards with ``m_r = m / ⌈m / p⌉`` microbatches per round, as in Megatron-LM and
  ``ScheduleInterleaved1F1B``).
* **Execution** (:func:`simulate`): each rank runs its actions in order, one at a time. A
  forward of stage *s* waits for the forward of stage *s − 1* on the same microbatch, a backward
  for the backward of stage *s + 1* (the last stage's for its own forward); a dependency on
  another rank adds one hop latency (point-to-point transfer). The step's pipeline window is the
  last action's end.
* **Costs**: forward and backward time per stage and microbatch, measured on unprofiled steps;
  when the microbatch size changes from *n* to *n'* a chunk's time becomes
  ``t · (f + (1 − f) · n'/n)`` with *f* its fixed share (per-microbatch work that does not depend
  on the samples: weight-gradient accumulation, dispatch; measured from the trace's operators,
  :func:`chunk_cost_split`). The hop latency is calibrated so that the measured schedule
  replays to the measured window; time outside the window (optimizer, data) stays as measured.
* **Stage boundaries**: :func:`best_partition` finds the contiguous split of per-layer costs
  into *k* stages that minimizes the slowest stage (the classic linear-partition dynamic
  program).
* **Communication**: :func:`fit_alpha_beta` (Hockney's ``α + β·bytes``), :func:`ddp_buckets`
  (DDP's bucket assignment) and :func:`bucketed_allreduce_tail` (the all-reduces that end after
  the backward).

All times are µs.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Sequence

import numpy as np

from ..trace import vocab
from ..trace.classify import normalize_schedule

#: message sizes within this fraction of each other are one size in :func:`fit_alpha_beta`
SIZE_CLUSTER = 0.1

#: One action of a pipeline rank: (stage, phase "F"/"B"/"I"/"W", microbatch).
Action = tuple[int, str, int]


def schedule_order(schedule: str, p: int, m: int, v: int = 1) -> dict[int, list[Action]]:
    """Per pipeline rank, the order in which it runs forward and backward chunks.

    Args:
        schedule: ``"gpipe"``, ``"1f1b"`` or ``"interleaved"`` (case-insensitive; torch class
            names such as ``"ScheduleGPipe"`` are accepted).
        p: pipeline ranks; m: microbatches; v: stages per rank (interleaved only, ≥ 1).

    Returns:
        ``{rank: [(stage, phase, microbatch), ...]}``, stages numbered ``0 … p·v − 1`` with stage
        ``k·p + r`` on rank *r*.

    Raises:
        ValueError: unknown schedule, p or m < 1, or interleaved with m not a multiple of its
            rounds (as torch requires).
    """
    kind = normalize_schedule(schedule)
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"pipeline needs p, m, v ≥ 1 (got p={p}, m={m}, v={v})")
    orders: dict[int, list[Action]] = {}
    if kind == "gpipe":
        for r in range(p):
            orders[r] = [(r, "F", i) for i in range(m)] + [(r, "B", i) for i in range(m)]
        return orders
    if kind == "1f1b":
        for r in range(p):
            warm = min(m, p - r)
            seq: list[Action] = [(r, "F", i) for i in range(warm)]
            f, b = warm, 0
            while b < m:
                seq.append((r, "B", b))
                b += 1
                if f < m:
                    seq.append((r, "F", f))
                    f += 1
            orders[r] = seq
        return orders
    rounds = max(1, m // p)
    if m % rounds:
        raise ValueError(f"interleaved 1F1B needs microbatches ({m}) to be a multiple of its "
                         f"rounds ({rounds})")
    per_round = m // rounds
    return {r: _interleaved_order(r, p, m, v, per_round) for r in range(p)}


def _interleaved_order(r: int, p: int, m: int, v: int, per_round: int) -> list[Action]:
    """Rank *r*'s actions under Interleaved1F1B (torch's ScheduleInterleaved1F1B): warm-up
    forwards, then one forward and one backward alternately, then the remaining backwards; each
    forward (backward) takes the next microbatch of the stage its position selects."""
    warm = min((v - 1) * per_round + 2 * (p - 1 - r), m * v)
    total = m * v
    fwd_mb: dict[int, int] = {}
    bwd_mb: dict[int, int] = {}

    def fwd(op: int) -> Action:
        s = ((op // per_round) % v) * p + r
        fwd_mb[s] = fwd_mb.get(s, -1) + 1
        return (s, "F", fwd_mb[s])

    def bwd(op: int) -> Action:
        s = (v - 1 - ((op - warm) // per_round) % v) * p + r
        bwd_mb[s] = bwd_mb.get(s, -1) + 1
        return (s, "B", bwd_mb[s])

    seq = [fwd(op) for op in range(warm)]
    for op in range(warm, total):
        seq.append(fwd(op))
        seq.append(bwd(op))
    seq.extend(bwd(op) for op in range(total, total + warm))
    return seq


@dataclasses.dataclass(frozen=True)
class SimResult:
    """Result of :func:`simulate`.

    Attributes:
        window_us: the pipeline window: from the first action's start to the last one's end.
        busy_us: ``{rank: Σ action durations}``.
        bubble_pct: ``{rank: 100 · (window − busy) / window}``.
        actions: ``[(rank, stage, phase, microbatch, start_us, end_us)]`` in start order.
    """

    window_us: float
    busy_us: dict[int, float]
    bubble_pct: dict[int, float]
    actions: list[tuple[int, int, str, int, float, float]]


def simulate(orders: dict[int, list[Action]], fwd_us: Sequence[float], bwd_us: Sequence[float],
             hop_us: float = 0.0, ready_us: dict[int, float] | None = None,
             input_share: Sequence[float] | None = None) -> SimResult:
    """Replay a pipeline schedule with per-stage costs (see the module docstring).

    Actions are ``F`` (forward), ``B`` (the whole backward) and, for schedules that split the
    backward (zero-bubble, DualPipeV), ``I`` (the input gradient, which the stage before waits
    for) and ``W`` (the weight gradient, after its own ``I``). A backward of stage *s* waits for
    the backward (``B`` or ``I``) of stage *s + 1* that the orders hold, and for its own
    forward.

    Args:
        orders: from :func:`schedule_order`, or a run's own order.
        fwd_us, bwd_us: per stage (index = stage), the time of one microbatch's forward and
            whole backward (µs).
        hop_us: latency added to every dependency between two ranks (µs).
        ready_us: per rank, the earliest start of its first action (µs; default 0). The window
            is measured from the earliest of them.
        input_share: per stage, the share of its backward that ``I`` takes (``W`` the rest);
            needed only when the orders hold ``I``/``W`` actions.

    Raises:
        ValueError: the orders deadlock (an action waits for one that never runs), name a
            stage without a cost, or hold ``I``/``W`` without ``input_share``.
    """
    n_stages = len(fwd_us)
    rank_of = {a[0]: r for r, seq in orders.items() for a in seq}
    held = {a for seq in orders.values() for a in seq}
    done: dict[tuple[int, str, int], float] = {}
    pos = {r: 0 for r in orders}
    free = {r: float((ready_us or {}).get(r, 0.0)) for r in orders}
    origin = min(free.values()) if free else 0.0
    busy = {r: 0.0 for r in orders}
    acts = []
    remaining = sum(len(s) for s in orders.values())

    def deps(s: int, ph: str, mb: int) -> list[tuple[int, str, int]]:
        if ph == "F":
            return [(s - 1, "F", mb)] if s > 0 else []
        if ph == "W":
            return [(s, "I", mb)]
        if s == n_stages - 1:
            return [(s, "F", mb)]
        nxt = (s + 1, "B", mb) if (s + 1, "B", mb) in held else (s + 1, "I", mb)
        return [nxt, (s, "F", mb)]

    def cost(s: int, ph: str) -> float:
        if ph == "F":
            return float(fwd_us[s])
        if ph == "B":
            return float(bwd_us[s])
        if input_share is None:
            raise ValueError("the orders split the backward (I/W) but no input share is given")
        share = float(input_share[s])
        return float(bwd_us[s]) * (share if ph == "I" else 1.0 - share)

    while remaining:
        progressed = False
        for r, seq in orders.items():
            while pos[r] < len(seq):
                s, ph, mb = seq[pos[r]]
                if s >= n_stages:
                    raise ValueError(f"stage {s} has no measured cost ({n_stages} stages)")
                need = deps(s, ph, mb)
                if any(d not in done for d in need):
                    break
                ready = max((done[d] + (hop_us if rank_of.get(d[0]) != r else 0.0)
                             for d in need), default=0.0)
                start = max(free[r], ready)
                dur = cost(s, ph)
                end = start + dur
                done[(s, ph, mb)] = end
                free[r] = end
                busy[r] += dur
                acts.append((r, s, ph, mb, start, end))
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ValueError("pipeline schedule deadlocks: an action waits for one that never runs")
    # the window runs from the first action's start, as the measured one does: a rank ready
    # early whose first action waits on another rank has not started the step
    first = min((a[4] for a in acts), default=origin)
    window = (max(free.values()) - first) if free else 0.0
    acts.sort(key=lambda a: (a[4], a[0]))
    return SimResult(window, busy,
                     {r: (100.0 * (window - b) / window if window > 0 else 0.0)
                      for r, b in busy.items()}, acts)


def simulate_period(orders: dict[int, list[Action]], fwd_us: Sequence[float],
                    bwd_us: Sequence[float], hop_us: float, tail_us: dict[int, float],
                    steps: int = 6, input_share: Sequence[float] | None = None
                    ) -> tuple[float, SimResult]:
    """Steady-state step time of a pipeline whose ranks spend ``tail_us[r]`` after their last
    action of a step (optimizer step, data, zero-grad) before their first action of the next.

    Chains ``steps`` replays: rank *r* starts step *k + 1* no earlier than its last action of
    step *k* plus its tail. A rank with a long tail (more parameters to update) delays its
    neighbours' next step, which a single-step replay misses.

    ``input_share``: as :func:`simulate` takes it.

    Returns:
        (period µs = mean start-to-start over the last ``steps − 2`` steps, the last step's
        :class:`SimResult`).
    """
    ready = {r: 0.0 for r in orders}
    starts: list[float] = []
    for _ in range(max(steps, 3)):
        res = simulate(orders, fwd_us, bwd_us, hop_us, ready, input_share)
        starts.append(min(a[4] for a in res.actions))
        last = {r: max((a[5] for a in res.actions if a[0] == r), default=ready[r]) for r in orders}
        ready = {r: last[r] + float(tail_us.get(r, 0.0)) for r in orders}
    period = (starts[-1] - starts[1]) / (len(starts) - 2)
    return period, res


def interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear ``y(x)`` through the points (``xs`` increasing, ≥ 2 points), continued
    linearly beyond the ends (never below 1% of the nearest measured value)."""
    if x <= xs[0]:
        i = 0
    elif x >= xs[-1]:
        i = len(xs) - 2
    else:
        i = max(j for j in range(len(xs) - 1) if xs[j] <= x)
    x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
    y = y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 != x0 else y0
    return max(y, 0.01 * (y0 if x <= x0 else y1))


def affine(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """The least-squares line ``y = a + b·x`` through the points (≥ 2 distinct ``xs``),
    evaluated at ``x``, never below 1% of the smallest measured ``y``. A module's time per
    microbatch is taken as affine in its rows (a fixed cost per call plus a cost per row); the
    line through every timed size evens out the noise of single timings, which
    :func:`interpolate` passes on (two timings of one size differed by 25% on CPU).

    Raises:
        ValueError: fewer than two distinct ``xs``."""
    if len(set(xs)) < 2:
        raise ValueError("an affine fit needs two distinct sizes")
    slope, icpt = statistics.linear_regression([float(v) for v in xs], [float(v) for v in ys])
    return max(icpt + slope * x, 0.01 * min(ys))


def scaled_chunk_us(t_us: float, fixed_share: float, n: float, n_new: float) -> float:
    """Time of a chunk at microbatch size ``n_new`` when it takes ``t_us`` at ``n``:
    ``t · (f + (1 − f) · n_new / n)``, *f* = ``fixed_share`` in [0, 1]."""
    f = min(max(fixed_share, 0.0), 1.0)
    return t_us * (f + (1.0 - f) * n_new / n)


def calibrate_hop(orders: dict[int, list[Action]], fwd_us: Sequence[float],
                  bwd_us: Sequence[float], measured_period_us: float,
                  tail_us: dict[int, float], input_share: Sequence[float] | None = None
                  ) -> float:
    """The hop latency (µs, ≥ 0) for which :func:`simulate_period` replays to the measured step
    time (bisection; the period grows monotonically with the hop). 0 when even a zero hop
    replays to a longer step than measured."""
    def period(h: float) -> float:
        return simulate_period(orders, fwd_us, bwd_us, h, tail_us,
                               input_share=input_share)[0]

    if period(0.0) >= measured_period_us:
        return 0.0
    lo, hi = 0.0, max(measured_period_us, 1.0)
    for _ in range(40):
        mid = (lo + hi) / 2
        if period(mid) < measured_period_us:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def best_partition(costs: Sequence[float], k: int) -> list[int]:
    """Contiguous split of ``costs`` (per layer, in order) into ``k`` non-empty parts that
    minimizes the largest part's sum (linear-partition dynamic program, O(k·L²)).

    Returns:
        Layers per part, e.g. ``[4, 4]``; ties go to the split with the earliest boundaries.

    Raises:
        ValueError: fewer layers than parts, or k < 1.
    """
    n = len(costs)
    if k < 1 or n < k:
        raise ValueError(f"cannot split {n} layers into {k} stages")
    pre = [0.0]
    for c in costs:
        pre.append(pre[-1] + float(c))
    INF = math.inf
    # best[j][i]: minimal max part over the first i layers in j parts; cut[j][i] last boundary
    best = [[INF] * (n + 1) for _ in range(k + 1)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for j in range(1, k + 1):
        for i in range(j, n - (k - j) + 1):
            for c in range(j - 1, i):
                v = max(best[j - 1][c], pre[i] - pre[c])
                if v < best[j][i] - 1e-9:
                    best[j][i], cut[j][i] = v, c
    sizes = []
    i = n
    for j in range(k, 0, -1):
        c = cut[j][i]
        sizes.append(i - c)
        i = c
    return sizes[::-1]


def boundaries_text(sizes: Iterable[int]) -> str:
    """``[4, 4]`` → ``"[0–3 | 4–7]"`` (layer index ranges per stage)."""
    parts, lo = [], 0
    for s in sizes:
        parts.append(f"{lo}–{lo + s - 1}" if s > 1 else f"{lo}")
        lo += s
    return "[" + " | ".join(parts) + "]"


_MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul"}


def op_work(name: str, dims, n: int) -> tuple[float, float, float, float] | None:
    """Work of one operator from its ``Input Dims``: ``(bytes, flops, bytes ∝ n, flops ∝ n)``,
    the last two being the parts that grow with the microbatch size ``n`` (float32 bytes).

    A matmul ``[M, K] × [K, N]`` (the last two 2-D inputs) moves ``4(MK + KN + MN)`` bytes and
    does ``2MKN`` flops; a term grows with ``n`` when one of its dimensions is ``n`` — so a
    weight gradient (``K = n``) has its flops but not its weight-shaped output grow. Another
    operator moves twice its inputs' bytes (read and write); inputs whose first dimension is
    ``n`` grow. None without shapes."""
    if not isinstance(dims, list):
        return None
    shaped = [d for d in dims if isinstance(d, list) and d
              and all(isinstance(x, int) for x in d)]
    if not shaped:
        return None
    if name in _MATMUL_OPS:
        mats = [d[-2:] for d in shaped if len(d) >= 2]
        if len(mats) >= 2 and mats[-2][1] == mats[-1][0]:
            (m_, k_), (_, n_) = mats[-2], mats[-1]
            terms = ((m_, k_), (k_, n_), (m_, n_))
            by = 4.0 * sum(a * b for a, b in terms)
            by_n = 4.0 * sum(a * b for a, b in terms if n in (a, b))
            fl = 2.0 * m_ * k_ * n_
            return by, fl, by_n, (fl if n in (m_, k_, n_) else 0.0)
    numel = [float(math.prod(d)) for d in shaped]
    by = 8.0 * sum(numel)
    by_n = 8.0 * sum(x for d, x in zip(shaped, numel) if d[0] == n)
    return by, 0.0, by_n, 0.0


def _nnls3(rows: list[tuple[float, float, float]], y: list[float]) -> tuple[float, float, float]:
    """Non-negative least squares for three coefficients, by trying every active set."""
    import itertools

    import numpy as np

    A = np.asarray(rows, dtype=float)
    b = np.asarray(y, dtype=float)
    scale = np.maximum(np.abs(A).max(axis=0), 1e-30)
    As = A / scale
    best, best_res = np.zeros(3), float(np.sum(b ** 2))
    for k in (1, 2, 3):
        for cols in itertools.combinations(range(3), k):
            x, *_ = np.linalg.lstsq(As[:, cols], b, rcond=None)
            if (x < 0).any():
                continue
            res = float(np.sum((As[:, cols] @ x - b) ** 2))
            if res < best_res:
                best, best_res = np.zeros(3), res
                best[list(cols)] = x
    fit = best / scale
    return float(fit[0]), float(fit[1]), float(fit[2])


def chunk_cost_split(raw_events: list, samples: dict[int, int]) -> list[dict]:
    """Fixed share of each pipeline stage's forward and backward chunks, from the operators the
    profiler recorded inside pardiag's ``pardiag:PP:S{stage}:{phase}{mb}`` ranges.

    Every operator's self time (its duration minus its children's) is modelled as
    ``c + a·bytes + b·flops`` (an additive roofline, in the spirit of Lumos' operator
    models), with ``a``, ``b``, ``c`` ≥ 0 fitted over all shaped operators of the trace's chunks
    (least squares). The share of an operator's time that grows with the microbatch size is
    ``(a·bytes∝n + b·flops∝n) / (c + a·bytes + b·flops)`` (:func:`op_work`); the rest of the
    chunk — operators without shapes, autograd and Python time — is fixed. A weight gradient
    is thus mostly fixed when it is bound by writing its weight-shaped result and mostly
    per-sample when its flops dominate. Needs the trace's ``Input Dims`` (``record_shapes``).

    Args:
        raw_events: the trace's ``traceEvents``.
        samples: ``{stage: microbatch size}`` (rows of the stage's forward output).

    Returns:
        ``[{"stage", "phase", "chunks", "chunk_us" (median), "fixed_share" (median),
        "fit": [c µs, a µs/byte, b µs/flop]}]``; empty when the trace has no chunk ranges.
    """
    import bisect
    import re

    chunk_re = re.compile(r"^pardiag:PP:S(\d+):([FBIW])(\d+)$")
    by_tid: dict = {}
    chunks = []
    for e in raw_events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        ts, dur = e.get("ts"), e.get("dur")
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            continue
        name = str(e.get("name", ""))
        if e.get("cat") == "user_annotation" and (mt := chunk_re.match(name)):
            chunks.append((int(mt.group(1)), mt.group(2), e.get("tid"), float(ts), float(dur)))
        elif e.get("cat") == "cpu_op":
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            by_tid.setdefault(e.get("tid"), []).append(
                (float(ts), -float(dur), name, vocab.INPUT_DIMS.get(args)))
    if not chunks:
        return []
    for ops in by_tid.values():
        ops.sort()
    starts = {tid: [o[0] for o in ops] for tid, ops in by_tid.items()}
    per_chunk = []   # (stage, phase, dur, [(self µs, work)])
    rows, ys = [], []
    for stage, phase, tid, ts, dur in chunks:
        n = samples.get(stage)
        ops = by_tid.get(tid, [])
        if not n or not ops or dur <= 0:
            continue
        lo = bisect.bisect_left(starts[tid], ts)
        hi = bisect.bisect_right(starts[tid], ts + dur)
        inside = [o for o in ops[lo:hi] if o[0] - o[1] <= ts + dur + 1e-3]
        self_t = [-o[1] for o in inside]
        stack: list[int] = []
        for i, o in enumerate(inside):
            while stack and inside[stack[-1]][0] - inside[stack[-1]][1] <= o[0]:
                stack.pop()
            if stack:
                self_t[stack[-1]] -= -o[1]
            stack.append(i)
        work = []
        for t, o in zip(self_t, inside):
            w = op_work(o[2], o[3], n)
            if w is not None and t > 0:
                work.append((t, w))
                rows.append((1.0, w[0], w[1]))
                ys.append(t)
        per_chunk.append((stage, phase, dur, work))
    if not per_chunk:
        return []
    c, a, b = _nnls3(rows, ys) if rows else (0.0, 0.0, 0.0)
    acc: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for stage, phase, dur, work in per_chunk:
        scaled = 0.0
        for t, (by, fl, by_n, fl_n) in work:
            model = c + a * by + b * fl
            if model > 0:
                scaled += t * (a * by_n + b * fl_n) / model
        acc.setdefault((stage, phase), []).append((dur, min(scaled / dur, 1.0)))
    return [{"stage": s, "phase": ph, "chunks": len(v),
             "chunk_us": statistics.median(d for d, _ in v),
             "fixed_share": 1.0 - statistics.median(f for _, f in v), "fit": [c, a, b]}
            for (s, ph), v in sorted(acc.items())]


def fit_alpha_beta(sizes_bytes: Sequence[float], times_us: Sequence[float]) -> tuple[float, float]:
    """Latency α (µs) and inverse bandwidth β (µs per byte) of ``t = α + β·S`` (Hockney model)
    through the fastest transfer of each message size, by least squares over the sizes (α ≥ 0, β >
    0; where the line would need α < 0, the least-squares line through the origin). Sizes within
    :data:`SIZE_CLUSTER` of each other count as one size (DDP's buckets differ by a few bytes; their
    scatter would otherwise read as a steep slope). With a single size, α = 0 and β = t/S.

    Raises:
        ValueError: no transfer with a positive size and time.
    """
    pts, cid = _size_clusters(sizes_bytes, times_us)
    best: dict[int, tuple[float, float]] = {}
    for k, (s, t) in zip(cid, pts):
        if k not in best or t < best[k][1]:
            best[k] = (s, t)
    alpha, beta = _hockney_lines(np.array([[b[0] for b in best.values()]]),
                                 np.array([[b[1] for b in best.values()]]))[0]
    return float(alpha), float(beta)


def _size_clusters(sizes_bytes: Sequence[float], times_us: Sequence[float]
                   ) -> tuple[list[tuple[float, float]], list[int]]:
    """The transfers with a positive size and time as ``(bytes, µs)`` sorted by size, and each
    one's size cluster (0, 1, …): a size more than :data:`SIZE_CLUSTER` above its cluster's
    first starts the next.

    Raises:
        ValueError: no transfer with a positive size and time."""
    pts = sorted((float(s), float(t)) for s, t in zip(sizes_bytes, times_us)
                 if s and t and s > 0 and t > 0 and math.isfinite(s) and math.isfinite(t))
    if not pts:
        raise ValueError("no transfer with a positive size and time")
    cid, k, first = [], -1, 0.0
    for s, _ in pts:
        if k < 0 or s > first * (1 + SIZE_CLUSTER):
            k, first = k + 1, s
        cid.append(k)
    return pts, cid


def alpha_beta_resamples(sizes_bytes: Sequence[float], times_us: Sequence[float],
                         resamples: int = 1000, seed: int = 0) -> np.ndarray:
    """Bootstrap of :func:`fit_alpha_beta`: the transfers resampled with replacement
    ``resamples`` times (Efron & Tibshirani 1993), each resample fitted through the fastest
    transfer of each size (the sizes clustered once, as :func:`fit_alpha_beta` does; a
    cluster's size is its mean). How far α and β move when other transfers had been the
    fastest: a fit through few sizes, or sizes whose fastest transfer is one lucky call, moves
    far. Deterministic (``seed``).

    Returns:
        array of shape ``(resamples, 2)``: α (µs), β (µs per byte) per resample.

    Raises:
        ValueError: no transfer with a positive size and time."""
    pts, cid = _size_clusters(sizes_bytes, times_us)
    k = cid[-1]
    cid_a = np.asarray(cid)
    t_a = np.asarray([t for _, t in pts])
    size = np.bincount(cid_a, weights=[s for s, _ in pts]) / np.bincount(cid_a)
    rng = np.random.default_rng(seed)
    # every resample at once (the same draws, in the same order, as one resample at a time):
    # the fastest transfer of each size per resample, then each resample's line
    idx = rng.integers(0, len(pts), (resamples, len(pts)))
    mins = np.full((resamples, k + 1), np.inf)
    np.minimum.at(mins, (np.arange(resamples)[:, None], cid_a[idx]), t_a[idx])
    return _hockney_lines(np.broadcast_to(size, mins.shape), mins)


def _hockney_lines(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """α, β of the least-squares line through each row's points, ``x`` sizes (bytes), ``y``
    times (µs; rows × sizes, an infinite ``y`` is a size the row does not have), with α ≥ 0 and
    β > 0 as :func:`fit_alpha_beta` states: where the line would need α < 0 or β ≤ 0, or a row
    has one point, the least-squares line through the origin. Array of shape (rows, 2)."""
    have = np.isfinite(y)
    n = have.sum(axis=1)
    xs, ys = np.where(have, x, 0.0), np.where(have, y, 0.0)
    mx, my = xs.sum(axis=1) / n, ys.sum(axis=1) / n
    dx = np.where(have, x - mx[:, None], 0.0)
    var = (dx ** 2).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        beta = np.where(var > 0, (dx * np.where(have, y - my[:, None], 0.0)).sum(axis=1) / var,
                        0.0)
        alpha = my - beta * mx
        origin = (xs * ys).sum(axis=1) / (xs * xs).sum(axis=1)   # through the origin
    fallback = (beta <= 0) | (alpha < 0) | (n == 1)
    return np.stack([np.where(fallback, 0.0, alpha), np.where(fallback, origin, beta)], axis=1)


#: torch DDP's default bucket_cap_mb (bytes), and its first bucket's cap with that default
#: (torch's ``_DEFAULT_FIRST_BUCKET_BYTES``).
DDP_DEFAULT_CAP = 25 * 2**20
DDP_FIRST_BUCKET = 2**20


def ddp_buckets(param_bytes: Sequence[float], cap_bytes: float,
                first_cap_bytes: float | None = None) -> list[float]:
    """Bucket sizes (bytes) DDP forms from gradients of ``param_bytes`` (in the order they
    become ready): a bucket closes as soon as it holds ≥ its cap, so a parameter is never split
    and a bucket can exceed the cap (torch's ``_compute_bucket_assignment_by_size``). The first
    bucket's cap is ``first_cap_bytes`` (torch uses 1 MiB only when ``bucket_cap_mb`` is left at
    its default), the others ``cap_bytes``."""
    out: list[float] = []
    cur = 0.0
    for b in param_bytes:
        cur += float(b)
        limit = first_cap_bytes if (not out and first_cap_bytes) else cap_bytes
        if cur >= limit:
            out.append(cur)
            cur = 0.0
    if cur > 0:
        out.append(cur)
    return out


def ddp_cap_candidates(cap_bytes: float, total_bytes: float,
                       default_cap_bytes: float = DDP_DEFAULT_CAP) -> list[int]:
    """The DDP bucket sizes (bytes) the bucket-size what-if evaluates for a run with buckets of
    ``cap_bytes`` and ``total_bytes`` of gradients per step: a quarter, half, twice and four
    times the current size, torch's default, and splits of the gradients in 2, 4 and 8;
    rounded to 64 KiB, at least 64 KiB, the current size left out."""
    options = {cap_bytes / 4, cap_bytes / 2, cap_bytes * 2, cap_bytes * 4, default_cap_bytes,
               total_bytes / 2, total_bytes / 4, total_bytes / 8}
    out = sorted({int(round(x / 2**16)) * 2**16 for x in options if x > 0})
    return [c for c in out if c >= 2**16 and abs(c - cap_bytes) >= 1]


def equal_buckets(total_bytes: float, cap_bytes: float) -> list[float]:
    """``total_bytes`` split into buckets of ``cap_bytes``, the last one with what remains."""
    n, rest = divmod(float(total_bytes), float(cap_bytes))
    return [float(cap_bytes)] * int(n) + ([rest] if rest > 1e-9 else [])


def bucketed_allreduce_tail(ready: Sequence[tuple[float, float]],
                            buckets: float | Sequence[float], alpha_us: float,
                            beta_us_per_byte: float) -> float:
    """Time from the last gradient's readiness to the end of the last bucket's all-reduce (µs),
    when gradients become ready along ``ready`` and are reduced in buckets.

    Args:
        ready: ``[(time µs, cumulative gradient bytes ready)]``, increasing; the last point is
            the end of the backward pass (all bytes ready).
        buckets: the bucket sizes in launch order (bytes, e.g. :func:`ddp_buckets`; scaled to
            the curve's total), or one cap: equal buckets of that size, the last one with what
            remains. A bucket launches when its gradients are ready, after the previous one
            ends, and takes ``α + β·bytes`` (DDP's reducer; Li et al., VLDB 2020).
    """
    total = ready[-1][1]
    if total <= 0:
        return 0.0
    times = [t for t, _ in ready]
    cum = [b for _, b in ready]
    if isinstance(buckets, (int, float)):
        sizes = equal_buckets(total, buckets)
    else:
        given = sum(buckets)
        sizes = [b * total / given for b in buckets] if given > 0 else [total]

    def when(b: float) -> float:
        for i in range(1, len(cum)):
            if cum[i] >= b - 1e-9:
                lo_t, hi_t, lo_b, hi_b = times[i - 1], times[i], cum[i - 1], cum[i]
                return lo_t + (hi_t - lo_t) * ((b - lo_b) / (hi_b - lo_b) if hi_b > lo_b else 1.0)
        return times[-1]

    free = -math.inf
    launched = 0.0
    for size in sizes:
        launched += size
        start = max(when(min(launched, total)), free)
        free = start + alpha_us + beta_us_per_byte * size
    return max(free - times[-1], 0.0)
