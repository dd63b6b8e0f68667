"""The ideal bubble of any pipeline schedule: the action order each rank ran, replayed with
balanced stage costs and free transfers.

A formula for the ideal bubble holds for the schedule it was derived for (GPipe and 1F1B:
``(p − 1) / (m + p − 1)``; interleaved 1F1B: ``(p − 1) / (v·m + p − 1)``, Narayanan et al.,
SC'21) and for nothing else: split backward (zero-bubble), V placement, looped BFS each have
their own. The order a rank ran its actions in is recorded (pardiag's pipeline records, or the
per-microbatch ranges of ``torch.distributed.pipelining``), so the ideal is measured on that
order instead: each action costs the mean of its phase over the step (every stage equally
fast), a transfer costs nothing, and each action starts when its rank is free and its inputs
are ready:

* ``F`` of stage *s* needs ``F`` of stage *s − 1* (same microbatch);
* ``B`` or ``I`` (backward, or its input-gradient half) of stage *s* needs that of stage
  *s + 1* and its own ``F`` (the last stage: its ``F``);
* ``W`` (the weight-gradient half) needs its own ``I``.

The ideal bubble of a rank is the share of the replayed step (first start to last end over
all ranks) in which it runs nothing — the measured bubble's definition
(:func:`pardiag.analyzer.analyses.pipeline.compute_pipeline`) on the replayed timeline. For
GPipe and 1F1B with a constant backward-to-forward ratio it equals the formula (tests check).
"""

from __future__ import annotations

import pandas as pd

#: Backward phases that carry the gradient to the stage before.
_BACKWARD = ("B", "I")


def replay_ideal(chunks: pd.DataFrame) -> dict[int, float] | None:
    """Per rank, the ideal bubble (%) of one step's observed action order (module docstring).

    Args:
        chunks: the step's busy pieces: ``rank``, ``stage``, ``microbatch``, ``phase`` (``F``,
            ``B``, ``I`` or ``W``), ``start_us``, ``end_us`` (µs); pieces of one action (same
            rank, stage, microbatch and phase) are one action of their summed length.

    Returns:
        ``{rank: ideal bubble %}``; None when the order cannot be replayed (an action waits for
        one the step does not hold, or an unknown phase).
    """
    if chunks.empty or not set(chunks["phase"]) <= {"F", "B", "I", "W"}:
        return None
    acts = (chunks.assign(busy=chunks["end_us"] - chunks["start_us"])
            .groupby(["rank", "stage", "microbatch", "phase"], as_index=False)
            .agg(first=("start_us", "min"), busy=("busy", "sum")))
    cost = acts.groupby("phase")["busy"].mean().to_dict()
    last_stage = int(acts["stage"].max())
    holders: dict[tuple, int] = acts.groupby(["stage", "microbatch", "phase"]).size().to_dict()
    orders = {int(r): [(int(s), int(mb), str(ph)) for s, mb, ph in
                       g.sort_values("first", kind="stable")[["stage", "microbatch", "phase"]]
                       .itertuples(index=False)]
              for r, g in acts.groupby("rank")}

    def needs(s: int, mb: int, ph: str) -> list[tuple]:
        if ph == "F":
            return [(s - 1, mb, "F")] if s > 0 else []
        if ph == "W":
            return [(s, mb, "I")]
        own = [(s, mb, "F")]
        if s == last_stage:
            return own
        nxt = [(s + 1, mb, b) for b in _BACKWARD if (s + 1, mb, b) in holders]
        return own + nxt if nxt else own + [(s + 1, mb, "B")]

    done: dict[tuple, list[float]] = {}
    free = dict.fromkeys(orders, 0.0)
    pos = dict.fromkeys(orders, 0)
    spans: dict[int, list[tuple[float, float]]] = {r: [] for r in orders}
    progress = True
    while progress:
        progress = False
        for r, order in orders.items():
            while pos[r] < len(order):
                act = order[pos[r]]
                deps = needs(*act)
                if any(len(done.get(d, ())) < holders.get(d, 1) for d in deps):
                    break
                start = max([free[r], *(max(done[d]) for d in deps)])
                end = start + float(cost[act[2]])
                done.setdefault(act, []).append(end)
                spans[r].append((start, end))
                free[r] = end
                pos[r] += 1
                progress = True
    if any(pos[r] < len(o) for r, o in orders.items()):
        return None
    lo = min(a for s in spans.values() for a, _ in s)
    hi = max(b for s in spans.values() for _, b in s)
    if hi <= lo:
        return None
    # rounded to 1e-9 points: the formula's value where it holds, not a float's last bits
    return {r: round(100.0 * ((hi - lo) - sum(b - a for a, b in s)) / (hi - lo), 9)
            for r, s in spans.items()}
