"""Instrumentation installed in each rank before the user's script runs.

What a trace alone cannot show (FACTS §1: gloo traces carry no process group and no message
size) is recorded here:

* :class:`P2PRecorder` — every ``send``/``recv``/``isend``/``irecv`` (also those issued through
  ``batch_isend_irecv``, as pipelining does) with peer, group, bytes and issue time; the flight
  recorder does not record point-to-point ops on gloo.
* :func:`flight_recorder_entries` — the c10d flight recorder's collectives (group name and
  description, per-group sequence number, sizes, dtypes, creation time).
* :class:`PipelineRecorder` — forward/backward of every pipeline stage and microbatch (1F1B
  annotates nothing by itself), as ``record_function`` ranges and as records.
* :func:`model_shapes`, :class:`BatchRecorder` — the tensor shapes, attention heads, pipeline
  layers and batch that constrain how the model can be split.
* :func:`process_groups`, :func:`detect_parallelism`, :func:`static_memory`, :func:`topology`.

Times are epoch nanoseconds (``time.time_ns()``), the clock of the trace's
``baseTimeNanoseconds`` (FACTS §1) and of the flight recorder's ``time_created_ns``.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import gc
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import types
import warnings
from typing import Any

import torch
import torch.distributed as dist


def _sync(device) -> None:
    if getattr(device, "type", "cpu") == "cuda":
        torch.cuda.synchronize(device)


def _added_cost_us(wrapped, plain, args, calls: int, blocks: int, after_block=None) -> float:
    """What ``wrapped`` adds to one call of ``plain`` (µs): ``calls`` calls of each with
    ``args(i)``, the difference per call, median over ``blocks`` (``after_block()`` runs after
    each block, e.g. to drop the records the wrapper made)."""
    costs = []
    for _ in range(blocks):
        t0 = time.perf_counter_ns()
        for i in range(calls):
            wrapped(*args(i))
        t1 = time.perf_counter_ns()
        for i in range(calls):
            plain(*args(i))
        t2 = time.perf_counter_ns()
        costs.append(max((t1 - t0) - (t2 - t1), 0) / calls / 1000.0)
        if after_block is not None:
            after_block()
    return statistics.median(costs)


def ddp_calibration(local_grad_bytes: int, rows: int = 8, repeats: int = 15,
                    cap_bytes: int = 2**28, budget_s: float = 4.0, min_repeats: int = 5) -> dict:
    """What DDP adds to a step on CPU for the whole model's gradients, after a pipelined run:
    a stand-in of 1024 × 1024 linear layers (and one narrower) holding the ranks' summed gradient
    bytes (at most ``cap_bytes``, to 4 KiB) runs forward + backward on ``rows`` rows (the
    per-rank batch data parallelism would have: about the model's own matmul work, so the
    all-reduces share the cores as they would) alone and under DDP with its default buckets,
    alternately, ``repeats`` times each after one warm-up call of both; DDP's cost (all-reduces,
    bucket copies, hooks, sharing the cores with the backward) — what data parallelism instead
    of the pipeline would add — is the median of the paired differences (DDP − alone of the
    same repetition, so a drift of the machine cancels), and the samples are kept so that the
    prediction resting on it can carry the interval of that median. The repetitions
    are cut to what fits in ``budget_s`` seconds (the warm-up pair's time, the slowest rank's,
    so every rank runs the same number), never fewer than ``min_repeats``: a large model's
    stand-in took 1.1 s per pair on the 2-core machine, 17 s for 15 pairs after the script,
    and fewer samples only widen the interval. Every rank must
    call it; only on CPU (gloo), and only right after :func:`allreduce_calibration` succeeded
    (all ranks were there).

    Returns:
        ``{"grad_bytes", "rows", "plain_us", "ddp_us", "overhead_us", "plain_samples_us",
        "ddp_samples_us", "overhead_samples_us"}`` (of the stand-in; µs; medians and the
        per-repetition times), or {} without a gloo group of ≥ 2 ranks or on any failure.
    """
    from torch.nn.parallel import DistributedDataParallel

    if (not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2
            or dist.get_backend() != "gloo"):
        return {}
    try:
        total = torch.tensor([float(local_grad_bytes)])
        dist.all_reduce(total)
        target = int(min(float(total.item()), cap_bytes))
        layer = 1024 * 1024 * 4
        n, cols = target // layer, (target % layer) // (1024 * 4)   # the rest: a narrower layer

        def make() -> torch.nn.Module:
            torch.manual_seed(0)
            mods = [torch.nn.Linear(1024, 1024, bias=False) for _ in range(n)]
            if cols:
                mods.append(torch.nn.Linear(1024, cols, bias=False))
            return torch.nn.Sequential(*mods)

        x = torch.randn(max(int(rows), 1), 1024)
        models = {"plain": make(), "ddp": DistributedDataParallel(make())}
        times: dict[str, list[float]] = {"plain": [], "ddp": []}
        it, total = 0, repeats + 1
        while it < total:
            t_pair = time.perf_counter()
            for name, model in models.items():   # alternately: a drift hits both alike
                dist.barrier()
                t0 = time.perf_counter_ns()
                model(x).sum().backward()
                if it:                            # the first call of each warms up
                    times[name].append((time.perf_counter_ns() - t0) / 1000.0)
            if it == 0:   # the slowest rank's warm-up pair sets how many fit in the budget
                pair = torch.tensor([time.perf_counter() - t_pair])
                dist.all_reduce(pair, op=dist.ReduceOp.MAX)
                fit = int(budget_s / max(float(pair.item()), 1e-6))
                total = 1 + max(min(repeats, fit), min(min_repeats, repeats))
            it += 1
        diff = [d - p for p, d in zip(times["plain"], times["ddp"])]
        return {"grad_bytes": n * layer + cols * 1024 * 4, "rows": int(x.shape[0]),
                "plain_us": statistics.median(times["plain"]),
                "ddp_us": statistics.median(times["ddp"]),
                "overhead_us": max(statistics.median(diff), 0.0),
                "plain_samples_us": times["plain"], "ddp_samples_us": times["ddp"],
                "overhead_samples_us": diff}
    except Exception:
        return {}


def allreduce_calibration(sizes=(2**16, 2**20, 2**22, 2**24), repeats: int = 5,
                          timeout_s: float = 20.0) -> list[dict]:
    """All-reduce times of the default process group at a few message sizes, after the script
    has finished: what a run without data-parallel traffic (a pipeline) cannot show, and the
    what-if of more data parallelism needs.

    Every rank must call it (collectives on the default group, float32 on the group's device).
    Each timing follows a 1-element all-reduce that lines the ranks up; the fastest of
    ``repeats`` is kept, and every timing (``samples_us``) for the interval of a prediction
    resting on them. A rank that does not arrive within ``timeout_s`` makes the others give
    up.

    Returns:
        ``[{"bytes": int, "us": float, "samples_us": [float]}]`` (µs), empty when there is no
        group of ≥ 2 ranks or a wait failed or timed out.
    """
    import datetime

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return []
    device = (torch.device("cuda", torch.cuda.current_device())
              if dist.get_backend() == "nccl" else torch.device("cpu"))
    timeout = datetime.timedelta(seconds=timeout_s)
    rows = []
    try:
        for nbytes in sizes:
            t = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
            one = torch.zeros(1, dtype=torch.float32, device=device)
            times = []
            for _ in range(repeats + 1):
                dist.all_reduce(one, async_op=True).wait(timeout)
                _sync(device)
                t0 = time.perf_counter_ns()
                dist.all_reduce(t, async_op=True).wait(timeout)
                _sync(device)
                times.append((time.perf_counter_ns() - t0) / 1000.0)
            rows.append({"bytes": int(nbytes), "us": min(times[1:]),   # the first warms up
                         "samples_us": times[1:]})
    except Exception:   # a rank that never came, or a backend that cannot: no calibration
        return []
    return rows


def _group_name(group) -> str:
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    return dist.distributed_c10d._world.pg_names.get(pg, "")


class P2PRecorder:
    """Wraps ``torch.distributed.{send,recv,isend,irecv}`` to record each call.

    Records (while :attr:`recording`, i.e. inside the profiler's window, the only calls the
    comms sidecar keeps): ``{"op": "send"|"recv", "peer": global rank, "pg_name", "bytes",
    "dtype", "issue_ns", "returned_ns", "seq", "source": "p2p_hook"}`` (``seq``: 1-based count
    of this rank's calls with the same group, op and peer since the script started, so ranks
    pair their sends and receives whatever step the window starts at).

    Outside the window a call costs two clock reads, a counter and a tuple appended to a
    bounded buffer (:attr:`recent`, the last :data:`RECENT` calls, for a hang dump): the
    peer's global rank, group name, bytes and dtype are only worked out while recording or
    when a hang dump asks (:meth:`recent_rows`).

    Attributes:
        calls_outside, calls_recorded: calls seen outside and inside the window.
    """

    _NAMES = ("send", "recv", "isend", "irecv")
    #: calls kept for a hang dump
    RECENT = 50

    def __init__(self) -> None:
        self.records: list[dict] = []
        self.recording = False
        self.recent: collections.deque = collections.deque(maxlen=self.RECENT)
        self.calls_outside = 0
        self.calls_recorded = 0
        self._seq: dict[tuple, int] = {}
        self._originals: dict[str, Any] = {}

    @staticmethod
    def _row(raw: tuple) -> dict:
        """A raw call ``(op, peer, group, group_peer, bytes, dtype, issue_ns, returned_ns,
        seq)`` as a record."""
        op, peer, group, group_peer, nbytes, dtype, t0, t1, seq = raw
        if peer is None and group_peer is not None and group is not None:
            peer = dist.get_global_rank(group, group_peer)
        return {"op": op, "peer": peer, "pg_name": _group_name(group),
                "bytes": nbytes, "dtype": str(dtype).removeprefix("torch."),
                "issue_ns": t0, "returned_ns": t1, "seq": seq, "source": "p2p_hook"}

    def recent_rows(self) -> list[dict]:
        """The last :data:`RECENT` calls as records (for a hang dump; rows that cannot be
        resolved are left out)."""
        out = []
        for raw in list(self.recent):
            try:
                out.append(self._row(raw))
            except Exception:  # a group already destroyed
                continue
        return out

    def self_cost_us(self, calls: int = 2000, blocks: int = 5) -> float:
        """What the wrapper adds to one call outside the window (µs): ``calls`` calls of a
        wrapped no-op less as many of the no-op, median of ``blocks``; measured after the run,
        its counts and buffer taken back."""
        def noop(tensor, dst=None, group=None):
            return None

        wrapped = self._wrap("send", noop)
        t = torch.zeros(1)
        state = (list(self.recent), dict(self._seq), self.calls_outside, self.recording)
        self.recording = False
        try:
            return _added_cost_us(wrapped, noop, lambda i: (t, 1, None), calls, blocks)
        finally:
            recent, seq, self.calls_outside, self.recording = state
            self.recent.clear()
            self.recent.extend(recent)
            self._seq.clear()
            self._seq.update(seq)

    def _wrap(self, name: str, fn):
        op = "send" if "send" in name else "recv"
        rec = self
        seqs = self._seq
        recent = self.recent

        @functools.wraps(fn)
        def wrapper(tensor, *args, **kwargs):
            t0 = time.time_ns()
            out = fn(tensor, *args, **kwargs)
            t1 = time.time_ns()
            peer = args[0] if args else kwargs.get("dst" if op == "send" else "src")
            group = args[1] if len(args) > 1 else kwargs.get("group")
            group_peer = kwargs.get("group_dst" if op == "send" else "group_src")
            key = (op, peer, group_peer, id(group))
            seq = seqs.get(key, 0) + 1
            seqs[key] = seq
            # sizes, not the tensor: the buffer must not keep activations alive
            raw = (op, peer, group, group_peer, tensor.numel() * tensor.element_size(),
                   tensor.dtype, t0, t1, seq)
            recent.append(raw)
            if rec.recording:
                rec.calls_recorded += 1
                rec.records.append(rec._row(raw))
            else:
                rec.calls_outside += 1
            return out

        return wrapper

    def install(self) -> None:
        """Patch ``torch.distributed`` and ``distributed_c10d`` (``P2POp`` checks the latter)."""
        c10d = dist.distributed_c10d
        for name in self._NAMES:
            orig = getattr(c10d, name)
            self._originals[name] = orig
            wrapped = self._wrap(name, orig)
            setattr(c10d, name, wrapped)
            setattr(dist, name, wrapped)

    def uninstall(self) -> None:
        for name, orig in self._originals.items():
            setattr(dist.distributed_c10d, name, orig)
            setattr(dist, name, orig)
        self._originals.clear()


def flight_recorder_entries() -> list[dict]:
    """Entries of the c10d flight recorder (collectives; on gloo no point-to-point ops).

    Returns ``[]`` when the recorder is unavailable or disabled (``TORCH_FR_BUFFER_SIZE=0``).
    """
    try:
        dump = torch._C._distributed_c10d._dump_fr_trace_json()
    except (AttributeError, RuntimeError):
        return []
    entries = json.loads(dump).get("entries", []) if dump else []
    return [{k: v for k, v in e.items() if k != "frames"} for e in entries]


def process_groups() -> list[dict]:
    """Every process group this rank knows: name, description, global ranks, size, backend."""
    if not (dist.is_available() and dist.is_initialized()):
        return []
    out = []
    for pg, name in dist.distributed_c10d._world.pg_names.items():
        try:
            ranks = dist.get_process_group_ranks(pg)
        except (RuntimeError, ValueError):
            ranks = []
        try:
            backend = str(dist.get_backend(pg))
        except (RuntimeError, ValueError):
            backend = None
        out.append({"name": name, "desc": getattr(pg, "group_desc", ""), "ranks": ranks,
                    "size": len(ranks), "backend": backend})
    return out


class PipelineRecorder:
    """Wraps pipeline stages' ``forward_one_chunk``/``backward_one_chunk``/
    ``backward_weight_one_chunk`` so every schedule reports stage and microbatch.

    Records: ``{"stage", "microbatch", "phase": "F"|"B"|"I"|"W", "start_ns", "end_ns",
    "optimizer_step"}`` (B = full backward, I = input-gradient only, W = weight gradient);
    forward records also carry ``"samples"`` (dim 0 of the chunk's output, the microbatch size).
    Records are taken on every step (two clock reads and a dict per chunk): unprofiled steps
    time the schedule as it runs. While :attr:`recording` (the profiler's window) each call
    also runs inside ``record_function("pardiag:PP:S{stage}:{phase}{microbatch}")``; outside it
    no range is opened (``calls_outside`` / ``calls_recorded`` count the calls).

    Layers: after the run, :meth:`size_scaling` times each stage module at other microbatch
    sizes and, at the run's own, each of its direct children (forward hooks attached only
    then); ``layers`` holds per (stage, child index) its name, type, parameter bytes and
    forward time (``fwd_ns``: ``{"after_run": [ns of each call]}``) — what the what-if model
    needs to move layers between stages (:mod:`pardiag.analyzer.predict.whatif`).
    """

    def __init__(self, step_counter) -> None:
        self.records: list[dict] = []
        self.layers: dict[tuple[int, int], dict] = {}
        self.recording = False
        self.calls_outside = 0
        self.calls_recorded = 0
        self._step = step_counter
        self._patched: list[tuple[type, str, Any]] = []
        self._hooked: set[int] = set()
        self._handles: list[Any] = []
        self._stages: list = []
        #: per stage: (shape, dtype, floating) of the first input of its module
        self.inputs: dict[int, tuple] = {}

    def _hook_layers(self, stage) -> None:
        """Note a stage (once) and hook its module to learn its input's shape (the hook removes
        itself after the first call); the per-layer hooks are attached only while
        :meth:`size_scaling` times the module after the run, so training steps carry no
        per-layer overhead."""
        if id(stage) in self._hooked:
            return
        self._hooked.add(id(stage))
        self._stages.append(stage)
        submod = getattr(stage, "submod", None)
        if submod is None:
            return
        s = int(stage.stage_index)

        handle = None

        def record_input(mod, inputs, _s=s):
            first = inputs[0] if inputs else None
            if _s not in self.inputs and isinstance(first, torch.Tensor) and first.dim() > 0:
                self.inputs[_s] = (tuple(first.shape), first.dtype, first.is_floating_point())
            if handle is not None:   # once: a module without hooks takes torch's fast path
                handle.remove()

        handle = submod.register_forward_pre_hook(record_input)
        self._handles.append(handle)

    def _layer_hooks(self, stage, key: str) -> list:
        """Forward pre/post hooks timing each child of ``stage.submod``; times are summed per
        ``key`` in ``layers``. Returns the handles."""
        submod = getattr(stage, "submod", None)
        if submod is None:
            return []
        s = int(stage.stage_index)
        handles = []
        for i, (name, child) in enumerate(submod.named_children()):
            entry = self.layers.setdefault((s, i), {
                "stage": s, "index": i, "name": name, "type": type(child).__name__,
                "params_bytes": int(sum(q.numel() * q.element_size() for q in child.parameters())),
                "fwd_ns": {}})
            starts: list[int] = []

            def pre(mod, inputs, _starts=starts):
                _starts.append(time.perf_counter_ns())

            def post(mod, inputs, output, _starts=starts, _entry=entry):
                if _starts:
                    dt = time.perf_counter_ns() - _starts.pop()
                    _entry["fwd_ns"].setdefault(key, []).append(dt)

            handles.append(child.register_forward_pre_hook(pre))
            handles.append(child.register_forward_hook(post))
        return handles

    def _wrapper(self, orig, phase_of):
        """``orig`` (a stage's chunk method) wrapped to record its calls."""
        rec = self

        @functools.wraps(orig)
        def wrapper(stage, chunk_id, *args, **kwargs):
            phase = phase_of(args, kwargs)
            if phase == "F" and id(stage) not in rec._hooked:
                rec._hook_layers(stage)
            if rec.recording:   # a range only where the profiler records it
                rec.calls_recorded += 1
                t0 = time.time_ns()
                with torch.profiler.record_function(
                        f"pardiag:PP:S{stage.stage_index}:{phase}{chunk_id}"):
                    out = orig(stage, chunk_id, *args, **kwargs)
            else:
                rec.calls_outside += 1
                t0 = time.time_ns()
                out = orig(stage, chunk_id, *args, **kwargs)
            row = {"stage": stage.stage_index, "microbatch": int(chunk_id), "phase": phase,
                   "start_ns": t0, "end_ns": time.time_ns(), "optimizer_step": rec._step()}
            if phase == "F":
                first = out[0] if isinstance(out, (tuple, list)) and out else out
                if isinstance(first, torch.Tensor) and first.dim() > 0:
                    row["samples"] = int(first.shape[0])
            rec.records.append(row)
            return out

        return wrapper

    def self_cost_us(self, calls: int = 2000, blocks: int = 5) -> float:
        """What the wrapper adds to one chunk call outside the window (µs): ``calls`` calls of
        a wrapped no-op less as many of the no-op, median of ``blocks``; measured after the
        run, its records and counts taken back. Forward calls (the longest path)."""
        def noop(stage, chunk_id):
            return None

        stage = types.SimpleNamespace(stage_index=0)
        self._hooked.add(id(stage))
        wrapped = self._wrapper(noop, lambda a, k: "F")
        n_rec, outside, recording = len(self.records), self.calls_outside, self.recording
        self.recording = False
        try:
            return _added_cost_us(wrapped, noop, lambda i: (stage, i), calls, blocks,
                                  after_block=lambda: self.records.__delitem__(
                                      slice(n_rec, None)))
        finally:
            self._hooked.discard(id(stage))
            self.calls_outside, self.recording = outside, recording

    def install(self) -> bool:
        try:
            from torch.distributed.pipelining.stage import _PipelineStageBase
        except ImportError:
            return False

        def wrap(name: str, phase_of):
            orig = getattr(_PipelineStageBase, name)
            self._patched.append((_PipelineStageBase, name, orig))
            setattr(_PipelineStageBase, name, self._wrapper(orig, phase_of))

        def backward_phase(args, kwargs):
            full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
            return "B" if full else "I"

        wrap("forward_one_chunk", lambda a, k: "F")
        wrap("backward_one_chunk", backward_phase)
        if hasattr(_PipelineStageBase, "backward_weight_one_chunk"):
            wrap("backward_weight_one_chunk", lambda a, k: "W")
        return True

    def uninstall(self) -> None:
        for cls, name, orig in self._patched:
            setattr(cls, name, orig)
        self._patched.clear()
        for h in self._handles:
            h.remove()
        self._handles.clear()

    @staticmethod
    def _time_call(submod, s: int, n: int, shape, dtype, floating: bool, device, params
                   ) -> tuple[float, float]:
        """One forward and backward of ``submod`` on a random input of ``n`` rows shaped like
        the stage's own (``shape``): ``(forward µs, backward µs)``."""
        x = (torch.randn((n, *shape[1:]), dtype=dtype, device=device) if floating
             else torch.zeros((n, *shape[1:]), dtype=dtype, device=device))
        if floating and s > 0:
            x.requires_grad_(True)
        _sync(device)
        t0 = time.perf_counter_ns()
        out = submod(x)
        out = out[0] if isinstance(out, (tuple, list)) else out
        _sync(device)
        t1 = time.perf_counter_ns()
        if params or (floating and s > 0):
            out.float().sum().backward()
        _sync(device)
        t2 = time.perf_counter_ns()
        return (t1 - t0) / 1000.0, (t2 - t1) / 1000.0

    def size_scaling(self, factors=(0.25, 0.5, 1.0, 2.0), repeats: int = 7) -> list[dict]:
        """Time each local stage's module forward and backward on random inputs of other
        microbatch sizes (``factor × samples``), after the script has finished: how a chunk's
        time scales with the microbatch size, measured on the user's own module.

        Returns ``[{"stage", "samples", "fwd_us", "bwd_us", "fwd_samples_us",
        "bwd_samples_us"}]`` (µs: medians of ``repeats``, and the timings themselves, for the
        interval of a prediction resting on them); empty when a stage's input is not one
        floating-point tensor or a call fails (an out-of-memory error included). On a GPU only
        sizes up to the run's own are tried. The sizes are timed in turn, one call each per
        round (a first round warms up), so drift on the host falls on every size alike."""
        rows = []
        for stage in self._stages:
            s = int(stage.stage_index)
            submod = getattr(stage, "submod", None)
            if submod is None or s not in self.inputs:
                continue
            shape, dtype, floating = self.inputs[s]
            params = [q for q in submod.parameters() if q.requires_grad]
            try:
                device = next(submod.parameters()).device
            except StopIteration:
                continue
            # on a GPU a larger microbatch than the run's could run out of memory: not tried
            ns = list(dict.fromkeys(max(1, int(round(shape[0] * f))) for f in factors
                                    if f <= 1.0 or device.type == "cpu"))
            own = max(1, int(shape[0]))   # the run's own size (factor 1)
            fwd: dict[int, list[float]] = {n: [] for n in ns}
            bwd: dict[int, list[float]] = {n: [] for n in ns}
            try:
                # round-robin over the sizes, not one size after another: what else the host
                # runs drifts during the timings (the other ranks finish their own and move
                # on), and timed in blocks the drift fell on some sizes and not others (a
                # stage's 2x calls read 8.7 ms first and 15.1 ms later in one block), bending
                # the size curve the microbatch prediction rests on differently in each run
                for it in range(repeats + 1):
                    for n in ns:
                        # at the run's own size, time each layer too (what moving layers
                        # needs), after the warm-up round
                        handles = (self._layer_hooks(stage, "after_run")
                                   if it >= 1 and n == own else [])
                        try:
                            f_us, b_us = self._time_call(submod, s, n, shape, dtype, floating,
                                                         device, params)
                        finally:
                            for h in handles:
                                h.remove()
                        if it >= 1:   # the first round warms up
                            fwd[n].append(f_us)
                            bwd[n].append(b_us)
            except Exception:  # a module that wants other inputs: no measurement
                continue
            for n in ns:
                f_, b_ = fwd[n], bwd[n]
                rows.append({"stage": s, "samples": n, "fwd_us": sorted(f_)[len(f_) // 2],
                             "bwd_us": sorted(b_)[len(b_) // 2],
                             "fwd_samples_us": f_, "bwd_samples_us": b_})
        for q in (q for st in self._stages for q in getattr(st, "submod", torch.nn.Module())
                  .parameters()):
            q.grad = None
        return rows

    def dp_rows(self, world_size: int, microbatches: int | None) -> int:
        """Rows per rank if the global batch (microbatch size × ``microbatches``) were split
        over ``world_size`` data-parallel ranks; 8 when unknown."""
        sizes = [shape[0] for shape, _, _ in self.inputs.values() if shape]
        if not sizes or not microbatches or world_size < 1:
            return 8
        return max(1, int(sizes[0] * microbatches // world_size))

    def grad_bytes(self) -> int:
        """Bytes of this rank's trainable stage parameters (their gradients' size)."""
        return int(sum(q.numel() * q.element_size() for st in self._stages
                       for q in getattr(st, "submod", torch.nn.Module()).parameters()
                       if q.requires_grad))

    def layer_rows(self) -> list[dict]:
        """``layers`` as JSON rows: ``fwd_us`` = ``{key: fastest forward µs of its calls}``.
        A layer's proportion of its stage is what moving layers needs, and a loaded host only
        adds time to a call (preemption), so the fastest call is the least disturbed: under a
        second test suite on the same 2 cores the mean of 7 calls made one of 9 identical blocks
        read 14 ms where its twins read 1.3–5 ms, and even the median made three of them read
        3.6–4.8 ms where the others read 0.7–0.9 (the preemptions fell on the same blocks of
        every call); the stage split that rests on them moved by two blocks."""
        rows = []
        for _, e in sorted(self.layers.items()):
            rows.append({k: e[k] for k in ("stage", "index", "name", "type", "params_bytes")}
                        | {"fwd_us": {str(st): min(ns) / 1000.0
                                      for st, ns in sorted(e["fwd_ns"].items(), key=str)
                                      if ns}})
        return rows


_DIM_ALIASES = {"dp": "dp", "data": "dp", "dp_shard": "dp", "dp_replicate": "dp", "fsdp": "dp",
                "ddp": "dp", "dp_shard_cp": "dp", "hsdp": "dp", "tp": "tp", "tensor": "tp",
                "sp": "tp", "pp": "pp", "pipe": "pp", "pipeline": "pp", "ep": "ep",
                "expert": "ep", "moe": "ep", "cp": "cp", "context": "cp"}


def canonical_dim(name: str | None) -> str | None:
    """Mesh-dimension or group-description name → ``dp``/``tp``/``pp``/``ep``/``cp`` or None."""
    if not name:
        return None
    key = str(name).lower().removeprefix("mesh_")
    return _DIM_ALIASES.get(key)


@dataclasses.dataclass(frozen=True)
class _ParallelClasses:
    """The classes :func:`detect_parallelism` looks for; ``()`` for one whose module the script
    did not import (it has no instance)."""

    ddp: Any
    fsdp1: Any
    fsdp2: Any
    zero: Any
    mesh: Any
    stage: Any
    schedule: Any
    deepspeed: Any = ()

    def interesting(self) -> tuple:
        """The classes that exist, for one :func:`live_instances` pass."""
        return tuple(c for c in (self.ddp, self.fsdp1, self.fsdp2, self.zero, self.mesh,
                                 self.stage, self.schedule, self.deepspeed)
                     if isinstance(c, type))


def _parallel_classes() -> _ParallelClasses:
    """The parallel wrappers, meshes and pipeline classes, among the modules already imported
    (DDP always)."""
    from torch.nn.parallel import DistributedDataParallel

    # only the modules the script imported: this runs in the step after the profiler's window
    def cls(module: str, name: str):
        return (_loaded(module, name) or ((),))[0]   # () when not imported: no instance

    return _ParallelClasses(
        ddp=DistributedDataParallel,
        fsdp1=cls("torch.distributed.fsdp", "FullyShardedDataParallel"),
        fsdp2=cls("torch.distributed.fsdp", "FSDPModule"),
        zero=cls("torch.distributed.optim", "ZeroRedundancyOptimizer"),
        mesh=cls("torch.distributed.device_mesh", "DeviceMesh"),
        stage=cls("torch.distributed.pipelining.stage", "_PipelineStageBase"),
        schedule=cls("torch.distributed.pipelining.schedules", "_PipelineSchedule"),
        deepspeed=cls("deepspeed.runtime.engine", "DeepSpeedEngine"))


@dataclasses.dataclass
class _ParallelScan:
    """What :func:`_scan_parallel` found among the live objects (see
    :func:`detect_parallelism`'s result for the meaning)."""

    wrappers: set[str] = dataclasses.field(default_factory=set)
    group_dims: dict[str, str] = dataclasses.field(default_factory=dict)
    meshes: list[dict] = dataclasses.field(default_factory=list)
    stages: list = dataclasses.field(default_factory=list)
    schedules: list = dataclasses.field(default_factory=list)
    reshard: set[bool] = dataclasses.field(default_factory=set)
    #: FSDP units with parameters; those that reshard after forward
    units: list[int] = dataclasses.field(default_factory=lambda: [0, 0])
    fsdp1_fwd_prefetch: set[bool] = dataclasses.field(default_factory=set)
    seen_mesh: set[tuple] = dataclasses.field(default_factory=set)
    ddp_cap: int | None = None
    ddp_params: list[int] | None = None
    deepspeed: dict | None = None


def _note_ddp(scan: _ParallelScan, obj) -> None:
    """Record a DDP module: its group (dp), bucket cap and parameters' gradient bytes."""
    scan.wrappers.add("ddp")
    scan.group_dims.setdefault(_group_name(obj.process_group), "dp")
    if isinstance(getattr(obj, "bucket_bytes_cap", None), int):
        scan.ddp_cap = obj.bucket_bytes_cap
    scan.ddp_params = [int(p.numel() * p.element_size())
                       for p in reversed(list(obj.module.parameters())) if p.requires_grad]


def _note_fsdp1(scan: _ParallelScan, obj) -> None:
    """Record an FSDP1 module: its group (dp), sharding strategy, unit and forward prefetch."""
    scan.wrappers.add("fsdp1")
    scan.group_dims.setdefault(_group_name(obj.process_group), "dp")
    strategy = getattr(getattr(obj, "sharding_strategy", None), "name", None)
    if strategy in ("FULL_SHARD", "HYBRID_SHARD"):
        scan.reshard.add(True)
    elif strategy in ("SHARD_GRAD_OP", "_HYBRID_SHARD_ZERO2"):
        scan.reshard.add(False)
    scan.units[0] += 1   # the root keeps its parameters for the backward
    scan.units[1] += (strategy in ("FULL_SHARD", "HYBRID_SHARD")
                      and not getattr(obj, "_is_root", False))
    if isinstance(getattr(obj, "forward_prefetch", None), bool):
        scan.fsdp1_fwd_prefetch.add(obj.forward_prefetch)


def _note_fsdp2(scan: _ParallelScan, obj) -> None:
    """Record an FSDP2 module: its shard group (dp), whether it reshards, its unit."""
    scan.wrappers.add("fsdp2")
    pg_group = obj._get_fsdp_state()._fsdp_param_group
    if pg_group is not None:
        info = pg_group.mesh_info
        if hasattr(info, "shard_process_group"):
            scan.group_dims.setdefault(_group_name(info.shard_process_group), "dp")
        # reshard_after_forward=False keeps no post-forward mesh
        scan.reshard.add(pg_group.post_forward_mesh_info is not None)
        scan.units[0] += 1
        scan.units[1] += pg_group.post_forward_mesh_info is not None


def _note_deepspeed(scan: _ParallelScan, engine) -> None:
    """Record a DeepSpeed engine: its ZeRO stage (``zero1``/``zero2``/``zero3``; stage 0 is
    plain data parallel, ``deepspeed``), its data-parallel group (dp) and the ZeRO settings that
    decide its communication and memory (:func:`deepspeed_settings`)."""
    stage = int(engine.zero_optimization_stage() or 0)
    scan.wrappers.add(f"zero{stage}" if stage else "deepspeed")
    group = (getattr(engine.optimizer, "dp_process_group", None)
             or getattr(engine, "seq_data_parallel_group", None)
             or getattr(engine, "data_parallel_group", None))
    if group is not None:
        scan.group_dims.setdefault(_group_name(group), "dp")
    scan.deepspeed = deepspeed_settings(engine, stage)


def deepspeed_settings(engine, stage: int) -> dict:
    """A DeepSpeed engine's ZeRO settings and its static memory by part (this rank's bytes).

    Settings: ``stage``, ``dp_size``, ``reduce_bucket_size`` and ``allgather_bucket_size``
    (elements), ``overlap_comm``, ``contiguous_gradients``, ``reduce_scatter``,
    ``prefetch_bucket_size`` (stage 3), ``gradient_accumulation_steps`` (micro-batches per
    optimizer step: stages 2 and 3 reduce the gradients on each), ``param_dtype``.

    Static memory (``static``: ``params_bytes``, ``grads_bytes``, ``optimizer_state_bytes``,
    ``params``, ``total_bytes``), from what the engine holds (the ZeRO paper, Rajbhandari et al.):
    parameters whole below stage 3, this rank's partition (``ds_tensor``) at stage 3; gradients
    whole at stage 0–1 and a 1/N partition from stage 2; the optimizer's fp32 master partition
    (``single_partition_of_fp32_groups``, ``fp32_partitioned_groups_flat``) plus its state
    (Adam's moments of that partition)."""
    cfg = {}
    for key, fn in (("reduce_bucket_size", "zero_reduce_bucket_size"),
                    ("allgather_bucket_size", "zero_allgather_bucket_size"),
                    ("overlap_comm", "zero_overlap_comm"),
                    ("contiguous_gradients", "zero_contiguous_gradients"),
                    ("reduce_scatter", "zero_reduce_scatter"),
                    ("prefetch_bucket_size", "zero_prefetch_bucket_size"),
                    ("gradient_accumulation_steps", "gradient_accumulation_steps")):
        try:
            v = getattr(engine, fn)()
        except Exception:  # a setting this DeepSpeed version does not have
            continue
        cfg[key] = v if isinstance(v, bool) else int(v) if isinstance(v, (int, float)) else v
    dp = int(getattr(engine, "dp_world_size", 0) or 1)
    params = [p for p in engine.module.parameters() if p.requires_grad]
    local = [getattr(p, "ds_tensor", None) if stage >= 3 else p for p in params]
    pbytes = sum(_nbytes(t) for t in local if isinstance(t, torch.Tensor))
    full = sum(int(getattr(p, "ds_numel", p.numel())) for p in params)
    elem = params[0].element_size() if params else 4
    gbytes = full * elem if stage < 2 else -(-full // dp) * elem
    opt = engine.optimizer
    master = [t for t in (getattr(opt, "single_partition_of_fp32_groups", None)
                          or getattr(opt, "fp32_partitioned_groups_flat", None) or [])
              if isinstance(t, torch.Tensor)]
    inner = getattr(opt, "optimizer", opt)
    state = getattr(inner, "state", {}) if isinstance(inner, torch.optim.Optimizer) else {}
    sbytes = sum(_nbytes(v) for s in state.values() for v in
                 (s.values() if isinstance(s, dict) else ()))
    obytes = sum(_nbytes(t) for t in master) + sbytes
    return {"stage": stage, "dp_size": dp, **cfg,
            "param_dtype": str(params[0].dtype).removeprefix("torch.") if params else None,
            "static": {"params_bytes": pbytes, "grads_bytes": gbytes,
                       "optimizer_state_bytes": obytes, "params": len(params),
                       "total_bytes": pbytes + gbytes + obytes}}


def _note_mesh(scan: _ParallelScan, obj) -> None:
    """Record a device mesh not seen yet: per dimension name its size, every group along it
    (global ranks, from the mesh's rank tensor) and this rank's process group's name.

    Which names are parallel dimensions is decided later, over every mesh at once, by the
    mesh-consistency rule (:func:`pardiag.analyzer.analyses.mesh.mesh_dims`): torchtitan's
    flattened (``dp``, ``dp_shard_cp``) and internal (``WORLD``, ``BATCH``, ``LOSS_MESH``,
    ``EFSDP``) meshes and size-1 dimensions are no dimensions of their own."""
    names = obj.mesh_dim_names or ()
    key = (tuple(names), tuple(obj.mesh.shape), tuple(obj.mesh.flatten().tolist()))
    if key in scan.seen_mesh:
        return
    scan.seen_mesh.add(key)
    dims, groups, members = {}, {}, {}
    for i, n in enumerate(names):
        dims[n] = int(obj.mesh.shape[i])
        along = obj.mesh.movedim(i, -1).reshape(-1, dims[n])
        members[n] = [[int(r) for r in row] for row in along.tolist()]
        try:
            groups[n] = _group_name(obj.get_group(n))
        except (RuntimeError, ValueError, KeyError):
            continue
    scan.meshes.append({"dims": dims, "groups": groups, "members": members})


def _scan_parallel(found: list, c: _ParallelClasses) -> _ParallelScan:
    """Go through the live objects ``found`` (instances of ``c``'s classes) once; returns what
    they say. An object that is gone (a weak reference) is skipped."""
    scan = _ParallelScan()
    for obj in found:
        try:
            if isinstance(obj, c.ddp):
                _note_ddp(scan, obj)
            elif c.fsdp1 and isinstance(obj, c.fsdp1):
                _note_fsdp1(scan, obj)
            elif c.fsdp2 and isinstance(obj, c.fsdp2):
                _note_fsdp2(scan, obj)
            elif isinstance(obj, c.zero):
                scan.wrappers.add("zero1")
                scan.group_dims.setdefault(_group_name(obj.process_group), "dp")
            elif isinstance(obj, c.mesh):
                _note_mesh(scan, obj)
            elif c.stage and isinstance(obj, c.stage):
                scan.stages.append(obj)
            elif c.schedule and isinstance(obj, c.schedule):
                scan.schedules.append(obj)
            elif c.deepspeed and isinstance(obj, c.deepspeed):
                _note_deepspeed(scan, obj)
        except ReferenceError:  # a weakly referenced object that is gone
            continue
    return scan


def _pipeline_of(scan: _ParallelScan) -> dict | None:
    """The pipeline's schedule and stages (None without any); marks the wrapper and the
    stages' groups (pp) in ``scan``."""
    if not (scan.stages or scan.schedules):
        return None
    stages, schedules = scan.stages, scan.schedules
    scan.wrappers.add("pipeline")
    for st in stages:
        scan.group_dims.setdefault(_group_name(st.group), "pp")
    sched = schedules[0] if schedules else None
    return {
        "schedule": type(sched).__name__ if sched else None,
        "microbatches": getattr(sched, "_n_microbatches", None),
        "stages": stages[0].num_stages if stages else None,
        "local_stages": sorted(st.stage_index for st in stages),
        "pp_group_size": stages[0].group_size if stages else None,
    }


def detect_parallelism(objects: list | None = None) -> dict:
    """What the live objects of the script say about its parallel layout.

    Scans the garbage collector's objects once for DDP, FSDP1, FSDP2 modules,
    ZeroRedundancyOptimizer, device meshes, pipeline stages and schedules — or ``objects``, the
    result of one :func:`live_instances` pass over :func:`scan_classes` shared with
    :func:`model_shapes`.

    Returns:
        ``{"wrappers": [...], "meshes": [{"dims": {name: size}, "groups": {name: pg_name},
        "members": {name: [[global ranks of each group along it]]}}],
        "pipeline": {...} | None, "group_dims": {pg_name: dim}, "fsdp_reshard_after_forward":
        bool | None (FSDP2's setting; FSDP1: its sharding strategy, FULL_SHARD / HYBRID_SHARD →
        true, SHARD_GRAD_OP → false), "fsdp1_forward_prefetch": bool | None,
        "fsdp_units": int | None (FSDP modules holding parameters: each gathers them in the
        forward and reduce-scatters their gradients once per step), "fsdp_resharding_units":
        int | None (those of them that reshard after the forward and gather again in the
        backward),
        "ddp_bucket_cap_bytes": int | None, "ddp_param_bytes": [int] | None,
        "deepspeed": dict | None (:func:`deepspeed_settings`)}``
        (``ddp_param_bytes``: gradient bytes of each trainable parameter of the DDP module, last
        registered first — the order DDP's buckets take them in, for the bucket-size what-if).
    """
    c = _parallel_classes()
    interesting = c.interesting()
    found = (live_instances(interesting) if objects is None
             else [o for o in objects if isinstance(o, interesting)])
    scan = _scan_parallel(found, c)
    pipeline = _pipeline_of(scan)
    reshard, units, fsdp1_fwd_prefetch = scan.reshard, scan.units, scan.fsdp1_fwd_prefetch
    return {"wrappers": sorted(scan.wrappers), "meshes": scan.meshes, "pipeline": pipeline,
            "group_dims": scan.group_dims,
            # the root module may keep its parameters; any resharding block means "true"
            "fsdp_reshard_after_forward": any(reshard) if reshard else None,
            "fsdp1_forward_prefetch": all(fsdp1_fwd_prefetch) if fsdp1_fwd_prefetch else None,
            "fsdp_units": units[0] or None, "fsdp_resharding_units": units[1] if units[0] else None,
            "ddp_bucket_cap_bytes": scan.ddp_cap, "ddp_param_bytes": scan.ddp_params,
            "deepspeed": scan.deepspeed}


def _loaded(module: str, *names: str) -> tuple:
    """The classes ``names`` of ``module`` when it is already imported, else ``()``: a class
    whose module nobody imported has no live instance, and importing it only to look (FSDP, the
    distributed optimizers: seconds on a loaded machine) would stall the step it runs in."""
    mod = sys.modules.get(module)
    return tuple(c for c in (getattr(mod, n, None) for n in names) if isinstance(c, type))


def scan_classes() -> tuple:
    """Every class :func:`detect_parallelism` and :func:`model_shapes` look for among the live
    objects (of the modules already imported), for one shared :func:`live_instances` pass."""
    return (torch.nn.Module, *_loaded("torch.nn.parallel", "DistributedDataParallel"),
            *_loaded("torch.distributed.fsdp", "FullyShardedDataParallel", "FSDPModule"),
            *_loaded("torch.distributed.optim", "ZeroRedundancyOptimizer"),
            *_loaded("torch.distributed.device_mesh", "DeviceMesh"),
            *_loaded("torch.distributed.pipelining.stage", "_PipelineStageBase"),
            *_loaded("torch.distributed.pipelining.schedules", "_PipelineSchedule"),
            *_loaded("deepspeed.runtime.engine", "DeepSpeedEngine"))


def live_instances(classes: tuple) -> list:
    """The garbage collector's objects whose type is a subclass of one of ``classes``.

    One pass over ``gc.get_objects()``; the class test is made once per type (``issubclass`` of
    the object's type, cached) instead of an ``isinstance`` per object — 0.17 M objects with
    torch imported, few distinct types. An object whose ``__class__`` pretends to be another
    (a proxy) is judged by its real type. Types whose test raises are left out."""
    if not classes:
        return []
    cache: dict[type, bool] = {}
    out = []
    with warnings.catch_warnings():  # subclass tests on torch's lazy objects warn (reduce_op)
        warnings.simplefilter("ignore")
        for o in gc.get_objects():
            t = type(o)
            hit = cache.get(t)
            if hit is None:
                try:
                    hit = issubclass(t, classes)
                except Exception:  # a type whose subclass test fails
                    hit = False
                cache[t] = hit
            if hit:
                out.append(o)
    return out


#: Attributes an attention module exposes its heads in: torch's ``nn.MultiheadAttention`` and
#: Hugging Face (``num_heads``, ``num_attention_heads``), torchtitan and Megatron-style code
#: (``n_heads``, ``n_head``); KV heads under grouped-query attention likewise.
_HEAD_ATTRS = ("num_attention_heads", "num_heads", "n_heads", "n_head")
_KV_HEAD_ATTRS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads")


def _int_attr(obj, names) -> int | None:
    for n in names:
        v = getattr(obj, n, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _heads_of(module) -> tuple[int, int | None, str] | None:
    """``(heads, kv_heads, source)`` of an attention module, or None: from its attributes
    (:data:`_HEAD_ATTRS`, :data:`_KV_HEAD_ATTRS`), else, for a module whose class name holds
    "Attention", from its ``config``'s attributes or from ``q_proj``/``k_proj`` output
    features over ``head_dim`` (Hugging Face attention modules, which keep no head count)."""
    heads = _int_attr(module, _HEAD_ATTRS)
    if heads is not None:
        return heads, _int_attr(module, _KV_HEAD_ATTRS), "attributes"
    if "attention" not in type(module).__name__.lower():
        return None
    config = getattr(module, "config", None)
    heads = _int_attr(config, ("num_attention_heads", "n_head", "n_heads")) if config else None
    if heads is not None:
        return heads, _int_attr(config, _KV_HEAD_ATTRS), "attributes"
    head_dim = getattr(module, "head_dim", None)
    q, k = getattr(module, "q_proj", None), getattr(module, "k_proj", None)
    wq, wk = getattr(q, "weight", None), getattr(k, "weight", None)
    if isinstance(head_dim, int) and head_dim > 0 and isinstance(wq, torch.Tensor):
        if wq.shape[0] % head_dim == 0:   # a DTensor's shape is the full one
            kv = (wk.shape[0] // head_dim if isinstance(wk, torch.Tensor)
                  and wk.shape[0] % head_dim == 0 else None)
            return wq.shape[0] // head_dim, kv, "projections"
    return None


def _splittable(module) -> int:
    """Layers a pipeline stage's module can be split into: its direct children, a container
    child (``ModuleList``, ``ModuleDict``, ``Sequential``) counted by its items."""
    containers = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential)
    return sum(len(c) if isinstance(c, containers) else 1 for c in module.children())


def _tp_dims(param, fsdp: bool) -> tuple[list[str], list[str | None], list[int]]:
    """``(placements, mesh dim names, tensor dims sharded over the TP mesh dimension)`` of a
    DTensor parameter (see :class:`pardiag.layout.ShardedParam`)."""
    from torch.distributed.tensor import Shard

    names = list(param.device_mesh.mesh_dim_names or [None] * param.device_mesh.ndim)
    placements = list(param.placements)
    dims = []
    for name, pl in zip(names, placements):
        is_tp = (canonical_dim(name) == "tp" if name is not None
                 else len(names) == 1 and not fsdp)
        # _StridedShard (FSDP2 over a TP-sharded dim) subclasses Shard; on a TP dim it is TP's
        if is_tp and isinstance(pl, Shard):
            dims.append(int(pl.dim) % max(param.dim(), 1))
    return [repr(p) for p in placements], names, sorted(set(dims))


def model_shapes(roots=None, stages=None, objects: list | None = None):
    """What constrains how this rank's model can be split, from its live modules.

    * every tensor-parallel DTensor parameter: its full shape, placements and the dimensions
      sharded over the TP mesh dimension (a TP degree must divide each);
    * attention modules' heads and KV heads (:func:`_heads_of`);
    * per local pipeline stage, the layers its module can be split into (:func:`_splittable`).

    Args:
        roots: modules to read (each with its submodules); default: every live ``nn.Module``
            that is no other live module's child (a scan of the garbage collector's objects).
        stages: ``{stage index: stage module}``; default: the live pipeline stages'
            ``submod``.
        objects: the live objects to take those defaults from (one :func:`live_instances`
            pass over :func:`scan_classes`); default: a scan of its own.

    Returns:
        a :class:`pardiag.layout.ModelShapes` (``batch_samples`` unset: see
        :class:`BatchRecorder`). Never raises on odd modules: a module whose attributes cannot
        be read is skipped.
    """
    from pardiag import layout

    # only the modules the script imported (no DTensor without torch.distributed.tensor)
    DTensor = (_loaded("torch.distributed.tensor", "DTensor") or ((),))[0]
    fsdp_types = _loaded("torch.distributed.fsdp", "FSDPModule", "FullyShardedDataParallel")
    if roots is None or stages is None:
        classes = (torch.nn.Module,
                   *_loaded("torch.distributed.pipelining.stage", "_PipelineStageBase"))
        found = (live_instances(classes) if objects is None
                 else [o for o in objects if isinstance(o, classes)])
        modules = [o for o in found if isinstance(o, torch.nn.Module)]
        if roots is None:
            children = {id(c) for m in modules for c in m.children()}
            roots = [m for m in modules if id(m) not in children]
        if stages is None:
            stages = {int(st.stage_index): st.submod for st in found
                      if not isinstance(st, torch.nn.Module)
                      and isinstance(getattr(st, "submod", None), torch.nn.Module)}
    params: list = []
    heads: list = []
    seen: set[int] = set()
    truncated = False
    fsdp = bool(fsdp_types) and any(isinstance(m, fsdp_types) for r in roots
                                    for m in r.modules())
    for root in roots:
        try:
            for name, mod in root.named_modules():
                if id(mod) in seen:
                    continue
                seen.add(id(mod))
                h = _heads_of(mod)
                if h is not None:
                    if len(heads) >= layout.MAX_SHAPES:
                        truncated = True
                        continue
                    heads.append(layout.AttentionHeads(module=name, type=type(mod).__name__,
                                                       heads=h[0], kv_heads=h[1], source=h[2]))
            for name, p in root.named_parameters():
                if id(p) in seen or not (DTensor and isinstance(p, DTensor)):
                    continue
                seen.add(id(p))
                placements, mesh_dims, dims = _tp_dims(p, fsdp)
                if not dims:
                    continue   # FSDP/ZeRO shards constrain nothing (uneven shards are padded)
                if len(params) >= layout.MAX_SHAPES:
                    truncated = True
                    continue
                params.append(layout.ShardedParam(name=name, shape=[int(x) for x in p.shape],
                                                  placements=placements, mesh_dims=mesh_dims,
                                                  tp_dims=dims))
        except Exception:  # a module whose attributes cannot be read: the rest still count
            continue
    stage_layers = {}
    for idx, submod in (stages or {}).items():
        try:
            stage_layers[str(int(idx))] = _splittable(submod)
        except Exception:
            continue
    return layout.ModelShapes(sharded_params=params, attention=heads, stage_layers=stage_layers,
                              truncated=truncated)


def _first_tensor(obj, depth: int = 4) -> torch.Tensor | None:
    """The first tensor of at least one dimension in ``obj``, looking into mappings, lists and
    tuples (in order) down to ``depth`` levels; None if there is none."""
    if isinstance(obj, torch.Tensor):
        return obj if obj.dim() > 0 else None
    if depth <= 0:
        return None
    from collections.abc import Mapping

    items = obj.values() if isinstance(obj, Mapping) else obj if isinstance(
        obj, (list, tuple)) else ()
    for item in items:
        found = _first_tensor(item, depth - 1)
        if found is not None:
            return found
    return None


class BatchRecorder:
    """Records the per-rank batch while installed (the launcher removes it at the first
    optimizer step): dim 0 of the first tensor given to the outermost module call with
    gradients on that has the most parameters (the model, not its loss), and how many times
    that module was called so (more than once: gradient accumulation, or a pipeline's
    microbatches; calls under ``torch.no_grad``, such as an evaluation pass, do not count).
    Global module forward hooks; dim 0 is taken as the batch (a sequence-first input would
    give its length). The first tensor is looked for in the positional arguments, then the
    keyword arguments, and inside dicts, lists and tuples among them (:func:`_first_tensor`):
    Hugging Face models take ``model(**batch)``, Lightning's DDP wrapper ``(batch_dict, idx)``.

    Attributes:
        samples: that dim 0 (samples), or None; module: the module's class name; calls: the
            module's calls with gradients on.
    """

    def __init__(self) -> None:
        self.samples: int | None = None
        self.module: str | None = None
        self.calls = 0
        self._best: tuple[int, int] | None = None   # (id of the module, its parameters)
        self._depth = 0
        self._handles: list = []

    def _pre(self, module, args) -> None:
        self._depth += 1

    def _post(self, module, args, kwargs, output) -> None:
        # decided when the outermost call returns: only the post hook sees keyword arguments
        self._depth = max(self._depth - 1, 0)
        if self._depth == 0 and torch.is_grad_enabled():
            first = _first_tensor((args, kwargs))
            if first is not None:
                if self._best is not None and self._best[0] == id(module):
                    self.calls += 1
                else:
                    n = sum(p.numel() for p in module.parameters())
                    if self._best is None or n > self._best[1]:
                        self._best = (id(module), n)
                        self.samples, self.module = int(first.shape[0]), type(module).__name__
                        self.calls = 1

    def install(self) -> None:
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )
        self._handles = [register_module_forward_pre_hook(self._pre),
                         register_module_forward_hook(self._post, with_kwargs=True)]

    def uninstall(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor; the tensor itself otherwise."""
    return t.to_local() if hasattr(t, "to_local") else t


def _nbytes(t) -> int:
    if not isinstance(t, torch.Tensor):
        return 0
    t = _local(t)
    return t.numel() * t.element_size()


def _state_holders(optimizer) -> list:
    """The optimizers whose ``state`` holds ``optimizer``'s: itself, unless it wraps others —
    ``ZeroRedundancyOptimizer``'s inner shard optimizer (``.optim``), or a container stepping a
    list of them (torchtitan's ``OptimizersContainer``: ``.optimizers``, one per model part)."""
    inner = getattr(optimizer, "optim", None)
    if isinstance(inner, torch.optim.Optimizer):
        return [inner]
    many = getattr(optimizer, "optimizers", None)
    if isinstance(many, (list, tuple)) and many and all(
            isinstance(o, torch.optim.Optimizer) for o in many):
        return list(many)
    return [optimizer]


def static_memory(optimizer) -> dict:
    """Bytes of this rank's parameters, gradients and optimizer state (local shards).

    Parameters are those the optimizer updates (for ``ZeroRedundancyOptimizer`` all parameters,
    since ZeRO-1 keeps them replicated; its state is the inner optimizer's shard; for a container
    of optimizers, torchtitan's ``OptimizersContainer``, the state of those it steps). DTensor
    parameters (FSDP2, TP) count their local shard.

    Returns:
        ``{"params_bytes", "grads_bytes", "optimizer_state_bytes", "params", "total_bytes"}``.
    """
    params = {}
    for g in optimizer.param_groups:
        for p in g["params"]:
            params[id(p)] = p
    state = 0
    seen: set[int] = set()
    for opt in _state_holders(optimizer):
        for s in opt.state.values():
            for v in (s.values() if isinstance(s, dict) else ()):
                if isinstance(v, torch.Tensor) and id(v) not in seen:
                    seen.add(id(v))
                    state += _nbytes(v)
    pbytes = sum(_nbytes(p) for p in params.values())
    gbytes = sum(_nbytes(p.grad) for p in params.values() if p.grad is not None)
    return {"params_bytes": pbytes, "grads_bytes": gbytes, "optimizer_state_bytes": state,
            "params": len(params), "total_bytes": pbytes + gbytes + state}


def peak_memory(device_is_cuda: bool) -> dict:
    """Peak memory since the last reset: CUDA allocator stats, or the process's peak RSS."""
    import resource

    out = {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if device_is_cuda:
        out["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
        out["peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved())
    return out


def topology(local_rank: int) -> dict:
    """Host, CPU count and, on GPU hosts, device, NCCL version and ``nvidia-smi topo -m``."""
    out: dict[str, Any] = {"host": socket.gethostname(), "cpu_count": os.cpu_count()}
    if torch.cuda.is_available():
        try:
            out["nccl_version"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except (AttributeError, RuntimeError, TypeError):
            out["nccl_version"] = None
        if local_rank == 0 and shutil.which("nvidia-smi"):
            try:
                out["nvidia_smi_topo"] = subprocess.run(
                    ["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                    timeout=20).stdout
            except (OSError, subprocess.TimeoutExpired):
                out["nvidia_smi_topo"] = None
    return out
