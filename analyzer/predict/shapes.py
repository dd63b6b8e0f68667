"""What the model's shapes and batch allow, and what a change does to the optimizer.

A candidate parallel layout must be buildable: a tensor-parallel degree must divide every
dimension it shards and the attention heads (the KV heads under grouped-query attention:
Megatron-LM requires ``num_attention_heads % tp == 0`` and ``num_query_groups % tp == 0``); a
pipeline cannot have more stages than layers to put in them (interleaved: stages per rank ×
ranks); the batch must split into whole samples per rank and per microbatch. Each ``check_*``
function returns the reason a candidate fails, one sentence (``"tp=4 does not divide 6
attention heads (attn)"``), or None when it passes or cannot be checked; :func:`unchecked_tp`
says when the shapes are unknown (traces from elsewhere).

:func:`optimizer_effects` states what a change does to the global batch, the per-rank batch,
the microbatch size and the optimizer steps per sample: a change of the global batch moves
the optimization itself (learning rate and warm-up need retuning: Goyal et al., 2017, "Accurate,
Large Minibatch SGD", linear scaling rule with gradual warm-up).

Pure functions over :class:`pardiag.layout.ModelShapes` (recorded per rank by
``pardiag.collectors.shapes.model_shapes``, read from ``traces.rank_meta``); no torch.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

from pardiag.layout import AttentionHeads, ModelShapes, ShardedParam

from ..trace.traceset import TraceSet

#: At most this many failures are named in one reason (the rest are counted).
MAX_REASONS = 3


@dataclasses.dataclass(frozen=True)
class Constraints:
    """The shapes of a run's model, merged over its ranks.

    Attributes:
        recorded: True when pardiag recorded the shapes (``pardiag profile``); False for
            traces from elsewhere, whose candidates are not checked against them.
        sharded: tensor-parallel parameters (one per name and shape).
        attention: attention modules with their heads (one per module name and head counts:
            stages on different ranks may reuse a name).
        layers: layers the pipeline's stage modules can be split into (summed over stages
            0…S−1), None when not a pipeline or a stage was not recorded.
        batch_samples: dim 0 of the input of rank 0's top-level module (samples), or None.
        batch_calls: that module's calls with gradients on before the first optimizer step.
        truncated: a rank recorded only the first ``MAX_SHAPES`` parameters or modules.
    """

    recorded: bool = False
    sharded: tuple[ShardedParam, ...] = ()
    attention: tuple[AttentionHeads, ...] = ()
    layers: int | None = None
    batch_samples: int | None = None
    batch_calls: int | None = None
    truncated: bool = False


def constraints_of(per_rank: dict[int, ModelShapes]) -> Constraints:
    """Merge the ranks' recorded shapes (``{rank: ModelShapes}``) into one :class:`Constraints`:
    parameters and attention modules once per name and shape, pipeline layers summed over the stages
    (each stage counted once, from whichever rank holds it), the batch of the lowest rank that
    saw one."""
    if not per_rank:
        return Constraints()
    sharded: dict[tuple, ShardedParam] = {}
    heads: dict[tuple, AttentionHeads] = {}
    stages: dict[int, int] = {}
    batch = calls = None
    for rank in sorted(per_rank):
        s = per_rank[rank]
        for p in s.sharded_params:
            sharded.setdefault((p.name, tuple(p.shape), tuple(p.tp_dims)), p)
        for a in s.attention:
            heads.setdefault((a.module, a.heads, a.kv_heads), a)
        for idx, n in s.stage_layers.items():
            if str(idx).isdigit():
                stages.setdefault(int(idx), int(n))
        if batch is None and s.batch_samples:
            batch, calls = s.batch_samples, s.batch_calls
    layers = (sum(stages.values()) if stages and set(stages) == set(range(len(stages)))
              else None)
    return Constraints(recorded=True, sharded=tuple(sharded.values()),
                       attention=tuple(heads.values()), layers=layers, batch_samples=batch,
                       batch_calls=calls, truncated=any(s.truncated for s in per_rank.values()))


def constraints(traces: TraceSet | None) -> Constraints:
    """The :class:`Constraints` of a loaded run: its ranks' recorded shapes
    (``traces.rank_meta[r].shapes``); ``recorded`` False when no rank has them (traces from
    elsewhere, or a run of a pardiag that did not record them)."""
    if traces is None:
        return Constraints()
    return constraints_of({r: m.shapes for r, m in traces.rank_meta.items()
                           if m.shapes is not None})


def _more(items: list[str], noun: str) -> str:
    """The first item, and how many more of ``noun`` (``"x and 2 more parameters"``)."""
    n = len(items) - 1
    return items[0] + (f" and {n} more {noun}{'s' if n > 1 else ''}" if n else "")


def check_tp_degree(tp: int, c: Constraints) -> str | None:
    """Why a tensor-parallel degree cannot be built with the model's shapes, or None.

    ``tp`` must divide the attention heads and KV heads of every attention module and every
    dimension a parameter shards over the TP mesh dimension (its full size). Failures are
    grouped by size, heads first; each names one module or parameter and counts the others;
    at most :data:`MAX_REASONS` sizes are named.

    Returns:
        e.g. ``"tp=4 does not divide 6 attention heads (attn)"``, ``"tp=3 does not divide
        1,000 (dim 0 of fc1.weight [1000, 64] and 1 more parameter)"``; None when it divides
        everything, when ``tp`` ≤ 1, or when nothing was recorded (see :func:`unchecked_tp`).
    """
    if tp <= 1:
        return None
    groups: dict[tuple, list[str]] = {}
    for a in c.attention:
        if a.heads % tp:
            groups.setdefault(("attention heads", a.heads), []).append(a.module)
        if a.kv_heads is not None and a.kv_heads % tp:
            groups.setdefault(("KV heads", a.kv_heads), []).append(a.module)
    items = [f"{n:,} {what} ({_more(mods, 'module')})" for (what, n), mods in groups.items()]
    dims: dict[int, list[str]] = {}
    for p in c.sharded:
        for d in p.tp_dims:
            if d < len(p.shape) and p.shape[d] % tp:
                dims.setdefault(p.shape[d], []).append(f"dim {d} of {p.name} {list(p.shape)}")
    items += [f"{size:,} ({_more(where, 'parameter')})" for size, where in dims.items()]
    if not items:
        return None
    more = len(items) - MAX_REASONS
    return (f"tp={tp} does not divide " + ", ".join(items[:MAX_REASONS])
            + (f" and {more} other size(s)" if more > 0 else ""))


def unchecked_tp(c: Constraints) -> str | None:
    """A caveat when a TP degree could not be checked against the model's shapes, else None."""
    if not c.recorded:
        return ("not checked against the model's tensor shapes (attention heads, sharded "
                "dimensions): the traces do not record them (`pardiag profile` does)")
    if not c.sharded and not c.attention:
        return ("not checked against the model's tensor shapes: no DTensor-sharded parameter "
                "and no attention heads were found (tensor parallelism without DTensor is not "
                "seen)")
    if c.truncated:
        return "checked against the first recorded parameters and modules only"
    return None


def check_stages(stages: int, chunks: int, layers: int | None) -> str | None:
    """Why ``stages`` pipeline ranks × ``chunks`` stages per rank (interleaving) cannot be
    built from ``layers`` splittable layers, or None (it fits, or ``layers`` is unknown).

    Returns:
        e.g. ``"3 stages × 2 chunks per rank = 6 stages, more than the 5 layers the stage
        modules can be split into"``.
    """
    total = stages * chunks
    if layers is None or total <= layers:
        return None
    head = f"{stages} stages × {chunks} chunks per rank = {total} stages" if chunks > 1 else \
        f"{stages} stages"
    return f"{head}, more than the {layers} layers the stage modules can be split into"


def check_microbatches(m: int, batch: int | None, what: str = "global batch") -> str | None:
    """Why ``m`` microbatches cannot split a batch of ``batch`` samples (``what`` names it),
    or None (whole microbatches of ≥ 1 sample each, or ``batch`` unknown).

    Returns:
        e.g. ``"8 microbatches would be under 1 sample each (global batch of 4 samples)"``,
        ``"3 microbatches do not divide the global batch of 32 samples"``.
    """
    if batch is None or m < 1:
        return None
    if m > batch:
        return f"{m} microbatches would be under 1 sample each ({what} of {batch:,} samples)"
    if batch % m:
        return f"{m} microbatches do not divide the {what} of {batch:,} samples"
    return None


def check_dp_degree(dp: int, global_batch: int | None, microbatches: int = 1) -> str | None:
    """Why ``dp`` data-parallel ranks cannot split the global batch into whole samples (and
    each rank's share into ``microbatches`` whole microbatches), or None (or unknown batch).

    Returns:
        e.g. ``"dp=2 does not divide the global batch of 3 samples"``.
    """
    if global_batch is None or dp < 1:
        return None
    if dp > global_batch:
        return f"dp={dp} leaves under 1 sample per rank of the global batch of {global_batch:,}"
    if global_batch % dp:
        return f"dp={dp} does not divide the global batch of {global_batch:,} samples"
    if microbatches > 1:
        why = check_microbatches(microbatches, global_batch // dp, "per-rank batch")
        return f"dp={dp}: {why}" if why else None
    return None


@dataclasses.dataclass(frozen=True)
class Batch:
    """Samples per optimizer step at each level (None: unknown).

    Attributes:
        global_samples: the global batch: samples per optimizer step over all data-parallel
            ranks (tensor- and pipeline-parallel ranks share theirs).
        per_rank: samples one data-parallel rank takes per optimizer step.
        microbatch: samples per forward/backward (a pipeline's microbatch, a gradient
            accumulation step's batch; the per-rank batch otherwise).
    """

    global_samples: int | None = None
    per_rank: int | None = None
    microbatch: int | None = None

    @property
    def microbatches(self) -> int:
        """Forward/backward passes per optimizer step (1 when unknown)."""
        if self.per_rank and self.microbatch and self.per_rank % self.microbatch == 0:
            return self.per_rank // self.microbatch
        return 1


def run_batch(c: Constraints, dp: int, pipeline_microbatches: int | None = None) -> Batch:
    """The run's :class:`Batch` from the recorded top-level input (``c.batch_samples``), the
    data-parallel degree and, in a pipeline, the microbatch count: a pipeline's stage module
    takes one microbatch (per-rank batch = microbatch × count); otherwise the model takes
    the per-rank batch, or one accumulation step of it when it was called several times with
    gradients on before the first optimizer step. Global = per-rank × ``dp``."""
    b = c.batch_samples
    if not b:
        return Batch()
    k = pipeline_microbatches or c.batch_calls or 1
    return Batch(global_samples=b * k * max(dp, 1), per_rank=b * k, microbatch=b)


def _size(n: int | None, x: Fraction) -> int | None:
    if n is None:
        return None
    v = n * x
    return int(v) if v.denominator == 1 else None


def _samples(n) -> str:
    return f"{n:,} samples" if n is not None else "samples"


def optimizer_effects(now: Batch, *, global_x: Fraction | int = 1, per_rank_x: Fraction | int = 1,
                      micro_x: Fraction | int = 1) -> tuple[dict, str]:
    """What a change does to the optimizer: the global batch, per-rank batch and microbatch
    each multiplied by a factor (1: unchanged), and the optimizer steps per sample (1 / global
    batch).

    Returns:
        ``(batch, statement)``. ``batch`` (JSON): ``{"global_batch", "per_rank_batch",
        "microbatch": {"now", "after" (samples, null when unknown), "factor"},
        "optimizer_steps_per_sample": {"factor"}, "global_batch_changes": bool}``.
        ``statement``: one or two sentences; a change of the global batch says that the
        learning rate and its warm-up need retuning (Goyal et al., 2017) or that gradient
        accumulation keeps it.
    """
    xs = {"global_batch": Fraction(global_x), "per_rank_batch": Fraction(per_rank_x),
          "microbatch": Fraction(micro_x)}
    nows = {"global_batch": now.global_samples, "per_rank_batch": now.per_rank,
            "microbatch": now.microbatch}
    batch: dict = {k: {"now": nows[k], "after": _size(nows[k], xs[k]), "factor": float(xs[k])}
                   for k in xs}
    batch["optimizer_steps_per_sample"] = {"factor": float(1 / xs["global_batch"])}
    batch["global_batch_changes"] = xs["global_batch"] != 1
    g = now.global_samples
    if all(x == 1 for x in xs.values()):
        return batch, ("Nothing changes for the optimizer: the global batch"
                       + (f" ({_samples(g)})" if g else "") + ", per-rank batch, microbatch size "
                       "and optimizer steps per sample stay the same.")
    moved = []
    # without microbatches (one forward/backward per step) the per-rank batch says it all
    one_pass = (now.per_rank == now.microbatch and now.per_rank is not None
                and xs["per_rank_batch"] == xs["microbatch"])
    for key, label in (("per_rank_batch", "per-rank batch"), ("microbatch", "microbatch")):
        x, n = xs[key], nows[key]
        if x != 1 and not (one_pass and key == "microbatch"):
            moved.append(f"{label} {n:,} → {_size(n, x):,} samples" if n is not None
                         and _size(n, x) is not None else f"{label} ×{float(x):g}")
    if xs["global_batch"] == 1:
        text = ("Same global batch" + (f" of {_samples(g)}" if g else "") + " and optimizer "
                "steps per sample: learning rate and schedule carry over")
        if moved:
            text += "; " + ", ".join(moved) + " (activation memory per rank changes" + (
                ", and so does the batch a BatchNorm layer normalizes over"
                if xs["microbatch"] != 1 else "") + ")"
        return batch, text + "."
    x = xs["global_batch"]
    after = _size(g, x)
    head = (f"The global batch changes {g:,} → {after:,} samples" if g and after is not None
            else f"The global batch changes ×{float(x):g}")
    return batch, (f"{head}, so the optimizer takes ×{float(1 / x):g} steps per sample: retune "
                   "the learning rate (e.g. the linear scaling rule) and its warm-up (Goyal et "
                   "al., 2017), or keep the global batch with gradient accumulation"
                   + ("; " + ", ".join(moved) if moved else "") + ".")
