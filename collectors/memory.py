"""This rank's memory: parameters, gradients and optimizer state (:func:`static_memory`) and the
peak since the last reset (:func:`peak_memory`).
"""

from __future__ import annotations

import torch


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor; the tensor itself otherwise."""
    return t.to_local() if hasattr(t, "to_local") else t


def local_bytes(t) -> int:
    """Bytes of a tensor's local shard (:func:`_local`); 0 for anything else."""
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
                    state += local_bytes(v)
    pbytes = sum(local_bytes(p) for p in params.values())
    gbytes = sum(local_bytes(p.grad) for p in params.values() if p.grad is not None)
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
