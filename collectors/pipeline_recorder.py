"""Pipeline stages' chunks as records and ``record_function`` ranges (:class:`PipelineRecorder`),
and, after the script, their modules timed at other microbatch sizes and per layer.
"""

from __future__ import annotations

import collections
import functools
import sys
import time
import types
from typing import Any

import torch

from .hooks import added_cost_us, sync_device

#: The module of torch's pipeline stage class, whose chunk methods are recorded.
STAGE_MODULE = "torch.distributed.pipelining.stage"
#: Chunk calls kept (the last ones): a bound on a long run's memory; what a run folder keeps of
#: them is as many (``rank_entry.MAX_PIPELINE_RECORDS``).
MAX_RECORDS = 50_000


class PipelineRecorder:
    """Wraps pipeline stages' ``forward_one_chunk``/``backward_one_chunk``/
    ``backward_weight_one_chunk`` so every schedule reports stage and microbatch, and
    DeepSpeed's pipeline engine's forward and backward instructions
    (:meth:`install_deepspeed`).

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
        #: the last :data:`MAX_RECORDS` chunk calls (a long run keeps its recent steps only)
        self.records: collections.deque[dict] = collections.deque(maxlen=MAX_RECORDS)
        self.layers: dict[tuple[int, int], dict] = {}
        self.recording = False
        self.calls_outside = 0
        self.calls_recorded = 0
        self._step = step_counter
        self._patched: list[tuple[type, str, Any]] = []
        #: DeepSpeed's instruction map entries replaced: (map, instruction class, original)
        self._patched_map: list[tuple[dict, Any, Any]] = []
        self._ds_installed = False
        #: per DeepSpeed engine: calls of each phase since its schedule started
        self._ds_counts: dict[int, dict[str, int]] = {}
        self._hooked: set[int] = set()
        self._handles: list[Any] = []
        self._stages: list = []
        #: whether torch's stages are to be patched (between install and uninstall), and
        #: whether the import hook that patches them is in place (registered once)
        self._wanted = False
        self._hook_registered = False
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
        records, outside, recording = self.records, self.calls_outside, self.recording
        self.records = collections.deque(maxlen=MAX_RECORDS)   # the run's own are kept whole
        self.recording = False
        try:
            return added_cost_us(wrapped, noop, lambda i: (stage, i), calls, blocks,
                                  after_block=self.records.clear)
        finally:
            self._hooked.discard(id(stage))
            self.records, self.calls_outside, self.recording = records, outside, recording

    def _ds_wrapper(self, orig, phase: str):
        """DeepSpeed's ``ForwardPass``/``BackwardPass`` instruction (``orig(engine, buffer_id)``)
        wrapped to record its calls as :meth:`_wrapper` does. The instruction names a buffer,
        not a microbatch: DeepSpeed runs a step's microbatches in order in each phase, so the
        microbatch is the count of the phase's calls since the engine's schedule started
        (:meth:`install_deepspeed` resets it)."""
        rec = self

        @functools.wraps(orig)
        def wrapper(engine, *args, **kwargs):
            counts = rec._ds_counts.setdefault(id(engine), {"F": 0, "B": 0})
            mb = counts[phase]
            counts[phase] = mb + 1
            stage = int(getattr(engine, "stage_id", 0))
            if rec.recording:
                rec.calls_recorded += 1
                t0 = time.time_ns()
                with torch.profiler.record_function(f"pardiag:PP:S{stage}:{phase}{mb}"):
                    out = orig(engine, *args, **kwargs)
            else:
                rec.calls_outside += 1
                t0 = time.time_ns()
                out = orig(engine, *args, **kwargs)
            rec.records.append({"stage": stage, "microbatch": mb, "phase": phase,
                                "start_ns": t0, "end_ns": time.time_ns(),
                                "optimizer_step": rec._step()})
            return out

        return wrapper

    def install_deepspeed(self) -> bool:
        """Record DeepSpeed's pipeline engine (``PipelineEngine``) as torch's stages are, once
        DeepSpeed has been imported (the launcher calls this at each optimizer step until it
        succeeds, so a run whose window starts at its first step misses that step's ranges):
        its ``ForwardPass`` and ``BackwardPass`` instructions (the engine's
        ``_INSTRUCTION_MAP``, which its schedule loop reads) and the schedule loop itself,
        where each step's microbatch count starts. Returns whether it is installed."""
        import sys

        if self._ds_installed:
            return True
        eng_mod = sys.modules.get("deepspeed.runtime.pipe.engine")
        sched = sys.modules.get("deepspeed.runtime.pipe.schedule")
        engine = getattr(eng_mod, "PipelineEngine", None)
        imap = getattr(engine, "_INSTRUCTION_MAP", None)
        if engine is None or sched is None or not isinstance(imap, dict):
            return False
        self._ds_installed = True
        for cls, phase in ((getattr(sched, "ForwardPass", None), "F"),
                           (getattr(sched, "BackwardPass", None), "B")):
            if cls in imap:
                self._patched_map.append((imap, cls, imap[cls]))
                imap[cls] = self._ds_wrapper(imap[cls], phase)
        orig = engine._exec_schedule
        rec = self

        @functools.wraps(orig)
        def exec_schedule(eng, *args, **kwargs):
            rec._ds_counts[id(eng)] = {"F": 0, "B": 0}
            return orig(eng, *args, **kwargs)

        self._patched.append((engine, "_exec_schedule", orig))
        engine._exec_schedule = exec_schedule
        return True

    def install(self) -> bool:
        """Record torch's pipeline stages and DeepSpeed's engine. Torch's stage class is
        patched when the script imports ``torch.distributed.pipelining`` (at once when it
        already has): importing it costs a rank seconds, which a script without a pipeline
        should not pay. Returns True."""
        self.install_deepspeed()
        self._wanted = True
        if not self._hook_registered:
            import wrapt

            self._hook_registered = True
            wrapt.register_post_import_hook(self._patch_stages, STAGE_MODULE)
        elif STAGE_MODULE in sys.modules:
            self._patch_stages(sys.modules[STAGE_MODULE])
        return True

    def _patch_stages(self, module) -> None:
        """Wrap the chunk methods of ``module._PipelineStageBase`` (once per install)."""
        base = getattr(module, "_PipelineStageBase", None)
        if not self._wanted or base is None or any(c is base for c, _, _ in self._patched):
            return

        def wrap(name: str, phase_of):
            orig = getattr(base, name)
            self._patched.append((base, name, orig))
            setattr(base, name, self._wrapper(orig, phase_of))

        def backward_phase(args, kwargs):
            full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
            return "B" if full else "I"

        wrap("forward_one_chunk", lambda a, k: "F")
        wrap("backward_one_chunk", backward_phase)
        if hasattr(base, "backward_weight_one_chunk"):
            wrap("backward_weight_one_chunk", lambda a, k: "W")

    def uninstall(self) -> None:
        self._wanted = False
        for cls, name, orig in self._patched:
            setattr(cls, name, orig)
        self._patched.clear()
        for imap, key, orig in self._patched_map:
            imap[key] = orig
        self._patched_map.clear()
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
        sync_device(device)
        t0 = time.perf_counter_ns()
        out = submod(x)
        out = out[0] if isinstance(out, (tuple, list)) else out
        sync_device(device)
        t1 = time.perf_counter_ns()
        if params or (floating and s > 0):
            out.float().sum().backward()
        sync_device(device)
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
