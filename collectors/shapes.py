"""What constrains how the model can be split: its tensor-parallel shapes, attention heads and
pipeline layers (:func:`model_shapes`), and the per-rank batch (:class:`BatchRecorder`).
"""

from __future__ import annotations

import torch

from .live_objects import live_instances, loaded
from .parallelism import canonical_dim

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
    DTensor = (loaded("torch.distributed.tensor", "DTensor") or ((),))[0]
    fsdp_types = loaded("torch.distributed.fsdp", "FSDPModule", "FullyShardedDataParallel")
    if roots is None or stages is None:
        classes = (torch.nn.Module,
                   *loaded("torch.distributed.pipelining.stage", "_PipelineStageBase"))
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
        samples: that dim 0 (samples), or None; shape: that tensor's shape; integer: whether
            its dtype is an integer one (token ids); module: the module's class name; calls: the
            module's calls with gradients on.
    """

    def __init__(self) -> None:
        self.samples: int | None = None
        self.shape: list[int] | None = None
        self.integer = False
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
                        self.shape = [int(x) for x in first.shape]
                        self.integer = not (first.is_floating_point() or first.is_complex())
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
