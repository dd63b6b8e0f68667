"""FLOPs and bytes of one rank's operators, counted from the shapes the trace recorded
(``record_shapes``: ``Input Dims``, ``Input type``, ``Concrete Inputs``), with the time each
took (:func:`flop_ops`).

**Which ops.** The ops of :data:`pardiag.analyzer.trace.vocab.FLOP_OPS`, each counted once: an op
is counted only when no counted op runs inside it on its thread (``aten::linear`` holds
``aten::addmm``: the ``addmm`` is counted; a trace that recorded only the ``linear`` counts the
``linear``). The counted ops of a thread are thus disjoint.

**Formulas** (one FLOP per multiply and per add; ``e``: the element size of the op's first input,
from ``Input type``):

* **matmul** — ``mm [M,K]·[K,N]``, ``addmm``, ``linear`` (``x[..., K]``, ``W[N, K]``): ``2·M·K·N``;
  ``bmm``/``baddbmm``/``matmul`` with batch ``b``: ``2·b·M·K·N`` (the bias add not counted, as
  the profiler's own ``with_flops`` does not). Bytes: ``e·(M·K + K·N + M·N)`` per batch.
* **convolution** — forward ``2·N·O·(C/g)·Πk·Πout`` with the output's spatial size from the
  input, stride, padding and dilation (``Concrete Inputs``); ``convolution_backward`` does the
  same count once per gradient its ``output_mask`` asks for (input, weight; the bias gradient is
  a sum, not counted). Bytes: input, weight and output once each.
* **attention** — ``q[B,H,L,E]``, ``k[B,H,S,E]``, ``v[B,H,S,Ev]``: forward ``2·B·H·L·S·(E+Ev)``
  (``Q·Kᵀ`` and ``P·V``), halved when ``is_causal`` (what a causal kernel computes:
  FlashAttention-2, Dao 2023, §4's benchmark convention); backward ``2.5×`` the forward (five
  matmuls against two: the recompute of ``P``, ``dV``, ``dP``, ``dQ``, ``dK``). Bytes: q, k, v
  and the output (and their gradients in the backward) once each.
* **norm** — ``5·numel`` forward (mean, variance, normalise, scale, shift), ``2×`` backward
  (fvcore's count for affine norms). **softmax** — ``5·numel`` forward (max, subtract, exp, sum,
  divide), ``4·numel`` backward. **elementwise** — ``numel`` of the largest input. Bytes: the
  inputs read and an output of the largest input's size written.

An op whose shapes do not fit its formula (missing ``Input Dims``, a rank that does not match)
is counted as ``unknown``: its row has NaN FLOPs, never a guess.

**Time.** ``cpu_us``: the op's own duration on its thread (inclusive; counted ops hold no
counted op). ``device_us``: the GPU kernels it launched (each kernel's runtime call, matched by
``correlation``, lies inside the op on its thread), NaN on a rank without GPU kernels.

**Module** (:func:`attribute_modules`). A forward op belongs to the innermost module range that
holds it on its thread: pardiag's ranges (``pardiag::module::{path} ({class})``, recorded by
``pardiag profile``) or the profiler's own module frames (``nn.Module: Linear_0``, recorded with
``with_stack=True``; their path is the nesting of frames). A backward op runs in the autograd
engine's range around a backward function, outside every module; the innermost range around
it that records a ``Sequence number`` (the engine's, or the function's own) carries the number
of the op that built the function, and the backward op belongs to the module whose range holds
that op (a recomputed forward's too). Forward ops in no module range but inside the
optimizer's ``step()`` range are the module ``(optimizer)`` (:data:`OPTIMIZER_MODULE`). An op
outside every range, or whose backward function links to no counted op (or to ops of different
modules), has no module.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..trace import vocab
from ..trace.classify import name_codes, name_test
from ..trace.traceset import GPU_CATS, RankTrace, isin_mask
from .comm_events import step_of
from .issued_ops import runtime_calls

#: Columns of :func:`flop_ops`.
FLOP_COLUMNS = ("step", "ts", "name", "op_class", "dtype", "flops", "bytes", "cpu_us",
                "device_us", "model", "recomputed", "profiler_flops", "backward", "module",
                "module_class", "backward_function")
#: The ``module`` of the ops inside the optimizer's step (its class is ``module_class``).
OPTIMIZER_MODULE = "(optimizer)"
#: Backward attention over forward: five matmuls against two (FlashAttention-2's count).
ATTENTION_BACKWARD = 2.5


def _shapes(args: dict[str, Any]) -> list[list[int] | None]:
    """``Input Dims`` as a list per input: a shape (list of ints; ``[]`` for a 0-d tensor, told
    from a scalar argument by its ``Input type`` naming a dtype) or None (no tensor)."""
    dims, types = vocab.INPUT_DIMS.get(args), vocab.INPUT_TYPE.get(args)
    if not isinstance(dims, list):
        return []
    types = types if isinstance(types, list) and len(types) == len(dims) else [None] * len(dims)
    out: list[list[int] | None] = []
    for d, t in zip(dims, types):
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            out.append(d)
        elif d == [] and vocab.dtype_bytes(t) is not None:
            out.append([])
        else:
            out.append(None)
    return out


def _concrete(args: dict[str, Any], i: int) -> Any:
    """The ``i``-th ``Concrete Inputs`` value, parsed (``'[2, 2]'`` → ``[2, 2]``, ``'True'`` →
    True), or None."""
    conc = vocab.CONCRETE_INPUTS.get(args)
    if not isinstance(conc, list) or not 0 <= i < len(conc) or conc[i] in ("", None):
        return None
    try:
        return ast.literal_eval(str(conc[i]))
    except (ValueError, SyntaxError):
        return None


def _numel(shape: Sequence[int] | None) -> float:
    return float(math.prod(shape)) if shape is not None else 0.0


def _matmul(name: str, shapes: list[Any]) -> tuple[float, float] | None:
    """(flops, elements moved) of a matmul-class op; None when the shapes do not fit."""
    t = [s for s in shapes if s is not None]
    if name == "aten::linear":
        if len(t) < 2 or len(t[1]) != 2 or t[0][-1] != t[1][1]:
            return None
        rows, (n, k) = _numel(t[0][:-1]), t[1]
        return 2.0 * rows * k * n, rows * k + k * n + rows * n
    if name in ("aten::addmm", "aten::baddbmm"):
        t = t[1:] if len(t) >= 3 else t
    if len(t) < 2:
        return None
    a, b = t[0], t[1]
    if len(a) < 2 or len(b) < 2:
        return None   # matrix-vector products: rare in training, not counted
    if a[-1] != b[-2]:
        return None
    m, k, n = a[-2], a[-1], b[-1]
    batch = float(max(_numel(a[:-2]) or 1.0, _numel(b[:-2]) or 1.0))
    return 2.0 * batch * m * k * n, batch * (m * k + k * n + m * n)


def _conv_out(size: list[int], kernel: list[int], stride: Any, padding: Any,
              dilation: Any) -> list[int] | None:
    """Output spatial size of a (non-transposed) convolution, or None."""
    d = len(kernel)
    try:
        st = list(stride) if isinstance(stride, list) else [int(stride)] * d
        pa = list(padding) if isinstance(padding, list) else [int(padding)] * d
        di = list(dilation) if isinstance(dilation, list) else [int(dilation)] * d
        st, pa, di = ([x[0]] * d if len(x) == 1 else x for x in (st, pa, di))
        return [(size[i] + 2 * pa[i] - di[i] * (kernel[i] - 1) - 1) // st[i] + 1
                for i in range(d)]
    except (TypeError, ValueError, IndexError, ZeroDivisionError):
        return None


def _convolution(name: str, shapes: list[Any], args: dict[str, Any]) -> tuple[float, float] | None:
    """Convolution FLOPs: ``2·N·Πw·Π(output spatial)``, or ``Π(input spatial)`` for a
    transposed one (``torch.utils.flop_counter.conv_flop_count``'s count)."""
    if name == "aten::convolution":
        if len(shapes) < 2 or shapes[0] is None or shapes[1] is None:
            return None
        x, w = shapes[0], shapes[1]
        transposed = _concrete(args, 6)
        if len(x) != len(w) or not isinstance(transposed, bool):
            return None
        if transposed:
            out = _conv_transposed_out(x[2:], w[2:], args)
            if out is None:
                return None
            groups = _concrete(args, 8)
            c_out = w[1] * (groups if isinstance(groups, int) else 1)
            return (2.0 * x[0] * _numel(w) * _numel(x[2:]),
                    _numel(x) + _numel(w) + x[0] * c_out * _numel(out))
        out = _conv_out(x[2:], w[2:], _concrete(args, 3), _concrete(args, 4), _concrete(args, 5))
        if out is None:
            return None
        return 2.0 * x[0] * _numel(w) * _numel(out), _numel(x) + _numel(w) + x[0] * w[0] * _numel(
            out)
    # convolution_backward(grad_output, input, weight, bias_sizes, ..., transposed, ...,
    # output_mask)
    if len(shapes) < 3 or any(s is None for s in shapes[:3]):
        return None
    g, x, w = shapes[0], shapes[1], shapes[2]
    mask = _concrete(args, 10)
    transposed = _concrete(args, 7)
    grads = (sum(bool(m) for m in mask[:2]) if isinstance(mask, list) and len(mask) >= 2
             else None)
    if grads is None or not isinstance(transposed, bool):
        return None
    spatial = x[2:] if transposed else g[2:]
    macs = x[0] * _numel(w) * _numel(spatial)
    return 2.0 * macs * grads, _numel(g) + _numel(x) + _numel(w) + grads * _numel(x)


def _conv_transposed_out(size: list[int], kernel: list[int], args: dict[str, Any]
                         ) -> list[int] | None:
    """Output spatial size of a transposed convolution: ``(in − 1)·stride − 2·padding +
    dilation·(k − 1) + output_padding + 1`` per dimension, or None."""
    d = len(kernel)
    vals = [_concrete(args, i) for i in (3, 4, 5, 7)]   # stride, padding, dilation, out padding
    try:
        st, pa, di, op = ([int(v)] * d if isinstance(v, int) else
                          (list(v) * d if len(v) == 1 else list(v)) for v in vals)
        return [(size[i] - 1) * st[i] - 2 * pa[i] + di[i] * (kernel[i] - 1) + op[i] + 1
                for i in range(d)]
    except (TypeError, ValueError, IndexError):
        return None


def _attention(name: str, shapes: list[Any], args: dict[str, Any]) -> tuple[float, float] | None:
    backward = name.endswith("_backward")
    qkv = shapes[1:4] if backward else shapes[0:3]
    if len(qkv) < 3 or any(s is None or len(s) < 3 for s in qkv):
        return None
    q, k, v = qkv
    if q[-1] != k[-1] or k[-2] != v[-2]:
        return None
    bh = _numel(q[:-2])
    causal = _concrete(args, vocab.CAUSAL_INPUT.get(name, -1))
    if isinstance(causal, int) and not isinstance(causal, bool):
        causal = causal in (1, 2)   # custom_mask_type: 1, 2 are the causal masks
    if not isinstance(causal, bool):
        return None   # causal or not halves the count: unknown, not guessed
    flops = 2.0 * bh * q[-2] * k[-2] * (q[-1] + v[-1]) * (0.5 if causal else 1.0)
    moved = _numel(q) + _numel(k) + _numel(v) + bh * q[-2] * v[-1]
    if backward:
        return flops * ATTENTION_BACKWARD, 2 * moved
    return flops, moved


def op_work(name: str, args: dict[str, Any]) -> tuple[float, float] | None:
    """(FLOPs, bytes) of one op from its recorded shapes (see the module for each formula), or
    None when they do not fit (the op is then counted as unknown).

    Args:
        name: the op's name, a key of :data:`pardiag.analyzer.trace.vocab.FLOP_OPS`.
        args: the event's ``args`` (``Input Dims``, ``Input type``, ``Concrete Inputs``).
    """
    op_class = vocab.FLOP_OPS.get(name)
    shapes = _shapes(args)
    if op_class is None or not any(s is not None for s in shapes):
        return None
    typed = _input_dtype(args)
    if typed is None:
        return None
    size = typed[1]
    if op_class == "matmul":
        got = _matmul(name, shapes)
    elif op_class == "convolution":
        got = _convolution(name, shapes, args)
    elif op_class == "attention":
        got = _attention(name, shapes, args)
    else:
        big = max(_numel(s) for s in shapes if s is not None)
        n_in = sum(_numel(s) for s in shapes if s is not None)
        backward = name.endswith(("_backward", "_backward_data"))
        per = {"norm": 10.0 if backward else 5.0, "softmax": 4.0 if backward else 5.0,
               "elementwise": 1.0}[op_class]
        got = (per * big, n_in + big)
    if got is None:
        return None
    flops, elements = got
    return flops, elements * size


def _input_dtype(args: dict[str, Any]) -> tuple[str, int] | None:
    """(torch's dtype name, element size) of the op's first typed input (``Input type``: a
    dtype name, not ``Scalar`` or a list), None when the trace names none pardiag knows."""
    types = vocab.INPUT_TYPE.get(args)
    for t in types if isinstance(types, list) else ():
        name, size = vocab.dtype_name(t), vocab.dtype_bytes(t)
        if name is not None and size is not None:
            return name, size
    return None


def empty_flop_ops() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(
        dtype=object if c in ("name", "op_class", "dtype", "module", "module_class",
                              "backward_function")
        else bool if c in ("model", "recomputed", "backward") else float) for c in FLOP_COLUMNS})


def flop_ops(trace: RankTrace, steps: pd.DataFrame) -> pd.DataFrame:
    """The counted ops of one rank (see the module): one row each, in time order, with
    :data:`FLOP_COLUMNS` — ``step`` (the ``ProfilerStep`` it starts in, NaN outside every step),
    ``ts`` (µs), ``name``, ``op_class``, ``dtype`` (``float32``, ``bfloat16``, …),
    ``flops`` and ``bytes`` (NaN: unknown), ``cpu_us``, ``device_us`` (µs), ``model`` (its class
    counts towards model FLOPs, :data:`pardiag.analyzer.trace.vocab.MODEL_FLOP_CLASSES`),
    ``recomputed`` (a forward-only op that ran inside the autograd engine's backward with the
    shapes of an op of the step's forward: the evidence of activation recomputation),
    ``profiler_flops`` (the profiler's own count where ``with_flops`` recorded one, else NaN),
    ``backward`` (it ran inside the autograd engine's backward), ``module`` and
    ``module_class`` (the module it ran for, see the module docstring; None: none known),
    ``backward_function`` (a backward op's function, where the trace has module ranges).

    ``steps``: the rank's ``ProfilerStep`` windows (``step``, ``start_us``, ``end_us``)."""
    ev = trace.events
    if ev is None or ev.empty:
        return empty_flop_ops()
    names = ev["name"]
    mask = ((ev["cat"] == "cpu_op") & names.isin(vocab.FLOP_OPS.keys())).to_numpy()
    if not mask.any():
        return empty_flop_ops()
    ops = ev[mask]
    ts = ops["ts"].to_numpy(float)
    end = ts + ops["dur"].to_numpy(float)
    tids = ops["tid"].to_numpy(object)
    paths, classes, backward, functions = attribute_modules(trace, ops)
    # innermost: in time order per thread, an op is dropped when the next one starts inside it
    keep = np.ones(len(ops), dtype=bool)
    order = np.lexsort((-end, ts, pd.factorize(tids)[0]))
    codes = pd.factorize(tids)[0][order]
    nxt_same = np.r_[codes[1:] == codes[:-1], False]
    inside = np.r_[ts[order][1:] < end[order][:-1], False]
    keep[order[nxt_same & inside]] = False
    ops, ts, end, tids = ops[keep], ts[keep], end[keep], tids[keep]
    paths, classes, backward = paths[keep], classes[keep], backward[keep]
    functions = functions[keep]
    rows, keys = [], []
    seen: dict[str, tuple[Any, ...]] = {}   # a step repeats its ops' shapes: each counted once
    for name, args in zip(ops["name"].tolist(), ops["args"].tolist()):
        args = args if isinstance(args, dict) else {}
        key = name + repr(vocab.INPUT_DIMS.get(args))
        full = key + repr(vocab.INPUT_TYPE.get(args)) + repr(vocab.CONCRETE_INPUTS.get(args))
        got = seen.get(full)
        if got is None:
            work = op_work(name, args)
            typed = _input_dtype(args)
            got = seen[full] = (vocab.FLOP_OPS[name], typed[0] if typed else None,
                                work[0] if work else np.nan, work[1] if work else np.nan)
        pf = vocab.OP_FLOPS.get(args)
        rows.append((name, *got, float(pf) if isinstance(pf, (int, float)) else np.nan))
        keys.append(key)
    out = pd.DataFrame(rows, columns=["name", "op_class", "dtype", "flops", "bytes",
                                      "profiler_flops"])
    out.insert(0, "ts", ts)
    out["cpu_us"] = end - ts
    out["device_us"] = _device_us(trace, ts, end, tids)
    out["model"] = out["op_class"].isin(vocab.MODEL_FLOP_CLASSES)
    step = step_of(ts, steps.sort_values("start_us")) if steps is not None else None
    out.insert(0, "step", np.where(step < 0, np.nan, step) if step is not None
               else np.full(len(ts), np.nan))
    out["recomputed"] = _recomputed(out, keys, backward)
    out["backward"], out["module"], out["module_class"] = backward, paths, classes
    out["backward_function"] = functions
    return out[list(FLOP_COLUMNS)].sort_values("ts", kind="stable").reset_index(drop=True)


def _recomputed(ops: pd.DataFrame, keys: list[str], inside: np.ndarray) -> np.ndarray:
    """A recomputed forward op: a forward-only op (:data:`vocab.FORWARD_ONLY_OPS`) that runs
    inside the backward with the name and input shapes of an op that ran in the same step
    outside it (a backward that merely calls ``addmm`` on its gradients is no recomputation)."""
    fwd_only = ops["name"].isin(vocab.FORWARD_ONLY_OPS).to_numpy()
    step = ops["step"].fillna(-1).to_numpy()
    before = {(st, k) for st, k, b in zip(step, keys, inside) if not b}
    return np.array([bool(f and b and (st, k) in before)
                     for f, b, st, k in zip(fwd_only, inside, step, keys)], dtype=bool)


def _engine_ranges(trace: RankTrace) -> np.ndarray:
    """Bool per event: the autograd engine's range around a backward function
    (``autograd::engine::evaluate_function: …``, :data:`vocab.BACKWARD_FUNCTION_RE`)."""
    return name_test(trace, "backward_function", vocab.BACKWARD_FUNCTION_RE.match)


def _inside_backward(trace: RankTrace, ts: np.ndarray, tids: np.ndarray) -> np.ndarray:
    """Whether each time on its thread lies inside an autograd engine backward function
    (:func:`_engine_ranges`)."""
    out = np.zeros(len(ts), dtype=bool)
    ev = trace.events
    bw = ev[_engine_ranges(trace)]
    if bw.empty:
        return out
    for tid, g in bw.groupby("tid", sort=False):
        sel = np.flatnonzero(pd.Series(tids, dtype=object).eq(tid).to_numpy())
        if not len(sel):
            continue
        lo = g["ts"].to_numpy(float)
        hi = lo + g["dur"].to_numpy(float)
        o = np.argsort(lo)
        lo, hi = lo[o], np.maximum.accumulate(hi[o])   # outermost reach so far
        i = np.searchsorted(lo, ts[sel], side="right") - 1
        out[sel] = (i >= 0) & (ts[sel] < hi[np.clip(i, 0, None)])
    return out


def _device_us(trace: RankTrace, ts: np.ndarray, end: np.ndarray, tids: np.ndarray
               ) -> np.ndarray:
    """GPU time (µs) of the kernels, copies and memsets each counted op issued (their runtime
    call, :func:`pardiag.analyzer.per_rank.issued_ops.runtime_calls`, lies inside the op on its
    thread); NaN on a rank without GPU events."""
    ev = trace.events
    gpu = isin_mask(ev["cat"], GPU_CATS)
    if not gpu.any():
        return np.full(len(ts), np.nan)
    dur_by_corr = ev[gpu & (ev["correlation"] >= 0).to_numpy()].groupby("correlation")["dur"].sum()
    rt = runtime_calls(trace)
    rt = rt[rt["correlation"].isin(dur_by_corr.index).to_numpy()]
    out = np.zeros(len(ts))
    op_codes, op_tids = pd.factorize(pd.Series(tids, dtype=object))
    for code, tid in enumerate(op_tids):
        sel = np.flatnonzero(op_codes == code)
        o = sel[np.argsort(ts[sel])]
        calls = rt[rt["tid"] == tid]
        if calls.empty:
            continue
        cts = calls["ts"].to_numpy(float)
        i = np.searchsorted(ts[o], cts, side="right") - 1
        ok = (i >= 0) & (cts < end[o][np.clip(i, 0, None)])
        add = dur_by_corr.reindex(calls["correlation"]).to_numpy(float)
        np.add.at(out, o[i[ok]], add[ok])
    return out


def _innermost(ranges: pd.DataFrame, tids: np.ndarray, ts: np.ndarray, label: str
               ) -> tuple[np.ndarray, np.ndarray]:
    """For each time ``ts`` on its thread ``tids``: the innermost of ``ranges`` (columns
    ``tid``, ``ts``, ``end``, ``label``, optional ``cls`` and ``python``) that holds it — its
    ``label``, a python frame's prefixed by the path of the range around it — and that range's
    ``cls``; None outside every range. Ranges of one thread nest: each range's parent comes
    from one pass over the ranges, and each time climbs from the last range to start before it
    to the first that has not ended."""
    out = np.full(len(ts), None, dtype=object)
    cls_out = np.full(len(ts), None, dtype=object)
    if ranges.empty or not len(ts):
        return out, cls_out
    q_tids = pd.Series(tids, dtype=object)
    for tid, r in ranges.groupby("tid", sort=False):
        sel = np.flatnonzero(q_tids.eq(tid).to_numpy())
        if not len(sel):
            continue
        r = r.sort_values(["ts", "end"], ascending=[True, False], kind="stable")
        r_ts, r_end = r["ts"].to_numpy(float), r["end"].to_numpy(float)
        full = list(r[label])
        r_cls = np.array(r["cls"].tolist() if "cls" in r else [None] * len(r), dtype=object)
        r_py = r["python"].tolist() if "python" in r else [False] * len(r)
        parent = np.full(len(r), -1, dtype=np.int64)
        stack: list[int] = []
        for j in range(len(r)):
            while stack and r_end[stack[-1]] <= r_ts[j]:
                stack.pop()
            if stack:
                parent[j] = stack[-1]
                if r_py[j] and full[stack[-1]] is not None:
                    full[j] = f"{full[stack[-1]]}.{full[j]}"
            stack.append(j)
        q = ts[sel]
        idx = np.searchsorted(r_ts, q, side="right") - 1
        while True:   # at most the ranges' depth
            ended = (idx >= 0) & (r_end[np.clip(idx, 0, None)] <= q)
            if not ended.any():
                break
            idx[ended] = parent[idx[ended]]
        hit = idx >= 0
        labels = np.array(full, dtype=object)
        out[sel[hit]], cls_out[sel[hit]] = labels[idx[hit]], r_cls[idx[hit]]
    return out, cls_out


def _module_ranges(trace: RankTrace) -> pd.DataFrame:
    """The rank's module ranges (see the module docstring): ``tid``, ``ts``, ``end`` (µs),
    ``path``, ``cls``, ``python`` (a profiler frame, whose path is its nesting)."""
    ev = trace.events
    codes, uniques = name_codes(trace)
    parsed: list[tuple[str, str | None, bool] | None] = []
    for u in uniques:
        u = str(u)
        m = vocab.MODULE_RANGE_RE.match(u)
        if m:
            parsed.append((m["path"], m["cls"], False))
            continue
        if vocab.OPTIMIZER_STEP_RE.match(u):
            cls = u.split("#", 1)[1].rsplit(".", 1)[0]
            parsed.append((OPTIMIZER_MODULE, cls or None, False))
            continue
        m = vocab.PYTHON_MODULE_RE.match(u)
        parsed.append((f"{m['cls']}_{m['idx']}", m["cls"], True) if m else None)
    if not any(p is not None for p in parsed):
        return pd.DataFrame(columns=["tid", "ts", "end", "path", "cls", "python"])
    hit_code = np.array([p is not None for p in parsed], dtype=bool)
    cats = ev["cat"].to_numpy(object)
    py_code = np.array([bool(p and p[2]) for p in parsed], dtype=bool)
    rows = np.flatnonzero(hit_code[codes] & np.where(
        py_code[codes], cats == "python_function",
        (cats == "user_annotation") | (cats == "cpu_op")))
    sub = ev.iloc[rows]
    got = [parsed[c] for c in codes[rows]]
    return pd.DataFrame({"tid": sub["tid"].to_numpy(object), "ts": sub["ts"].to_numpy(float),
                         "end": (sub["ts"] + sub["dur"]).to_numpy(float),
                         "path": [g[0] for g in got], "cls": [g[1] for g in got],
                         "python": [g[2] for g in got]})


def attribute_modules(trace: RankTrace, ops: pd.DataFrame
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(module path, module class, inside the backward, backward function) of each of ``ops``
    (rows of the rank's events): see the module docstring. Paths and classes are None where no
    module is known; the backward function (the innermost one around a backward op, by its
    class name: ``AddmmBackward0``, ``AccumulateGrad``) only where the trace has module ranges,
    else None.

    Order: the innermost module range around the op; for an op inside the backward, the module
    its backward function's sequence number links to; for another op, the optimizer's step
    around it (a closure's forward and backward run inside ``optimizer.step``, and are the
    modules')."""
    ts = ops["ts"].to_numpy(float)
    tids = ops["tid"].to_numpy(object)
    inside = _inside_backward(trace, ts, tids)
    ranges = _module_ranges(trace)
    is_opt = (ranges["path"] == OPTIMIZER_MODULE).to_numpy(bool)
    paths, classes = _innermost(ranges[~is_opt], tids, ts, "path")
    fn_names = np.full(len(ts), None, dtype=object)
    if (~is_opt).any():
        functions = _backward_functions(trace)
        fn_names, _ = _innermost(functions, tids, ts, "name")
        fn_names[~inside] = None
        seq_of_fn, _ = _innermost(functions[functions["seq"] >= 0], tids, ts, "seq")
        # ops' sequence numbers → the modules whose ranges hold them (a recomputed forward's
        # too: a reentrant checkpoint's backward links to it); ambiguous numbers link to none
        links: dict[int, set[tuple[Any, Any]]] = {}
        for seq, p, c in zip((vocab.SEQUENCE_NUMBER.get(a) for a in ops["args"].tolist()),
                             paths, classes):
            if p is not None and isinstance(seq, int) and seq >= 0:
                links.setdefault(seq, set()).add((p, c))
        for i in np.flatnonzero(inside & pd.isna(paths)):
            got = links.get(seq_of_fn[i])
            if got is not None and len(got) == 1:
                paths[i], classes[i] = next(iter(got))
    if is_opt.any():
        opt, opt_cls = _innermost(ranges[is_opt], tids, ts, "path")
        take = ~inside & pd.isna(paths) & pd.notna(opt)
        paths[take], classes[take] = opt[take], opt_cls[take]
    return paths, classes, inside, fn_names


def _backward_functions(trace: RankTrace) -> pd.DataFrame:
    """The autograd engine's ranges around backward functions (:data:`vocab.
    BACKWARD_FUNCTION_RE`) and the functions' own ranges (:data:`vocab.BACKWARD_NODE_RE`, CPU
    ops): ``tid``, ``ts``, ``end`` (µs), ``seq`` (their ``Sequence number``, -1 where not
    recorded), ``name`` (the function's class: ``AddmmBackward0``, ``AccumulateGrad``)."""
    ev = trace.events
    hit = ((_engine_ranges(trace) | name_test(trace, "backward_node", vocab.BACKWARD_NODE_RE.match))
           & (ev["cat"] == "cpu_op").to_numpy())
    bw = ev[hit]
    seq = [vocab.SEQUENCE_NUMBER.get(a) for a in bw["args"].tolist()]
    return pd.DataFrame({"tid": bw["tid"].to_numpy(object), "ts": bw["ts"].to_numpy(float),
                         "end": (bw["ts"] + bw["dur"]).to_numpy(float),
                         "name": [vocab.BACKWARD_FUNCTION_RE.sub("", n).rsplit("::", 1)[-1]
                                  for n in bw["name"].astype(str)],
                         "seq": [s if isinstance(s, int) and not isinstance(s, bool) else -1
                                 for s in seq]})
