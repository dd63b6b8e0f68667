"""What a pipelined run cannot show, timed after the script: the default group's all-reduce at
a few message sizes and what DDP adds to a step (CPU, gloo).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from .hooks import sync_device


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
                sync_device(device)
                t0 = time.perf_counter_ns()
                dist.all_reduce(t, async_op=True).wait(timeout)
                sync_device(device)
                times.append((time.perf_counter_ns() - t0) / 1000.0)
            rows.append({"bytes": int(nbytes), "us": min(times[1:]),   # the first warms up
                         "samples_us": times[1:]})
    except Exception:   # a rank that never came, or a backend that cannot: no calibration
        return []
    return rows
