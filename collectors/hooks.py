"""Instrumentation installed in each rank before the user's script runs, and what its wrappers
cost.

What a trace alone cannot show (FACTS §1: gloo traces carry no process group and no message
size) is recorded by the modules beside this one:

* :class:`~.comms.P2PRecorder` — every ``send``/``recv``/``isend``/``irecv`` (also those issued
  through ``batch_isend_irecv``, as pipelining does) with peer, group, bytes and issue time; the
  flight recorder does not record point-to-point ops on gloo.
* :func:`~.comms.flight_recorder_entries` — the c10d flight recorder's collectives (group name
  and description, per-group sequence number, sizes, dtypes, creation time).
* :class:`~.pipeline_recorder.PipelineRecorder` — forward/backward of every pipeline stage and
  microbatch (1F1B annotates nothing by itself), as ``record_function`` ranges and as records.
* :class:`~.modules.ModuleRanges` — each module call in the profiled window as a range named
  by its qualified name (FLOPs and time per module).
* :func:`~.shapes.model_shapes`, :class:`~.shapes.BatchRecorder` — the tensor shapes, attention
  heads, pipeline layers and batch that constrain how the model can be split.
* :func:`~.comms.process_groups`, :func:`~.parallelism.detect_parallelism` (over
  :func:`~.live_objects.live_instances`), :func:`~.memory.static_memory`,
  :func:`~.topology.topology`; after the script, :mod:`.calibration`.

Here: :func:`added_cost_us`, what a wrapper adds to one call, and :func:`sync_device`.

Times are epoch nanoseconds (``time.time_ns()``), the clock of the trace's
``baseTimeNanoseconds`` (FACTS §1) and of the flight recorder's ``time_created_ns``.
"""

from __future__ import annotations

import statistics
import time

import torch


def sync_device(device) -> None:
    """Wait for ``device``'s queued work (CUDA); nothing on the CPU."""
    if getattr(device, "type", "cpu") == "cuda":
        torch.cuda.synchronize(device)


def added_cost_us(wrapped, plain, args, calls: int, blocks: int, after_block=None) -> float:
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
