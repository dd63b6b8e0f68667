"""Pipeline parallel with ``torch.distributed.pipelining``, on any schedule torch ships.

Stages = ranks × ``--stages-per-rank`` (v). The looped schedules (``interleaved``,
``interleaved-zb``, ``looped-bfs``) place stage s on rank s mod ranks and need v ≥ 2; the V
schedules (``zbv``, ``dualpipev``) place two stages per rank in a V (rank r holds stages r and
2·ranks − 1 − r). ``--layers-per-stage`` sets how many blocks each stage holds, e.g. ``2,6``
for a planted imbalance (default: even); it replaces ``--layers``. The first stage also holds
the input projection and the last the head: pardiag's stage boundaries count those child
modules too ([0–3 | 4–7], "child modules per stage 4,4", is ``--layers-per-stage 3,3`` here).

    pardiag profile examples/train_pp.py --nproc-per-node 2 -- --schedule 1f1b --microbatches 8
    pardiag profile examples/train_pp.py --nproc-per-node 4 -- --schedule gpipe
    pardiag profile examples/train_pp.py --nproc-per-node 2 -- --schedule interleaved
        --stages-per-rank 2
    pardiag profile examples/train_pp.py --nproc-per-node 2 -- --schedule zbv --microbatches 4
"""

from __future__ import annotations

import _common as C
import torch
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleLoopedBFS,
    ScheduleZBVZeroBubble,
)

#: --schedule: (torch's class, placement: "one" stage per rank, "looped" or "v")
SCHEDULES = {
    "gpipe": (ScheduleGPipe, "one"), "1f1b": (Schedule1F1B, "one"),
    "interleaved": (ScheduleInterleaved1F1B, "looped"),
    "interleaved-zb": (ScheduleInterleavedZeroBubble, "looped"),
    "looped-bfs": (ScheduleLoopedBFS, "looped"),
    "zbv": (ScheduleZBVZeroBubble, "v"), "dualpipev": (ScheduleDualPipeV, "v"),
}


def stages_of(rank: int, world: int, v: int, placement: str) -> list[int]:
    """The stage indices rank ``rank`` holds: looped (s mod world) or V (r and 2w − 1 − r)."""
    if placement == "v":
        return [rank, 2 * world - 1 - rank]
    return [s for s in range(world * v) if s % world == rank]


def stage_layers(args, num_stages: int) -> list[int]:
    if args.layers_per_stage:
        counts = [int(c) for c in args.layers_per_stage.split(",")]
        if len(counts) != num_stages:
            raise SystemExit(f"--layers-per-stage has {len(counts)} entries for "
                             f"{num_stages} stages")
        return counts
    return [args.layers] * num_stages


def build_stage(width: int, n_blocks: int, first: bool, last: bool, index: int) -> nn.Sequential:
    torch.manual_seed(index)
    mods: list[nn.Module] = [nn.Linear(64, width)] if first else []
    mods += [C.Block(width) for _ in range(n_blocks)]
    if last:
        mods.append(nn.Linear(width, 10))
    return nn.Sequential(*mods)


def main() -> None:
    p = C.base_parser(__doc__)
    p.set_defaults(layers=2)
    p.add_argument("--schedule", choices=list(SCHEDULES), default="1f1b")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--stages-per-rank", type=int, default=1, help="v: virtual stages per rank")
    p.add_argument("--layers-per-stage", default="",
                   help="blocks per stage, comma-separated (replaces --layers)")
    args = p.parse_args()
    env = C.init_distributed(args.pin_cpu)
    cls, placement = SCHEDULES[args.schedule]
    v = {"one": 1, "v": 2}.get(placement, max(args.stages_per_rank, 2))
    num_stages = env.world_size * v
    counts = stage_layers(args, num_stages)
    my = stages_of(env.rank, env.world_size, v, placement)
    stages = [PipelineStage(build_stage(args.width, counts[s], s == 0, s == num_stages - 1, s)
                            .to(env.device), s, num_stages, env.device) for s in my]
    loss_fn = nn.CrossEntropyLoss()
    sched = cls(stages if placement != "one" else stages[0], n_microbatches=args.microbatches,
                loss_fn=loss_fn)
    params = [q for st in stages for q in st.submod.parameters()]
    opt = C.make_optimizer(params, args.optimizer)
    timer = C.StepTimes(args.times_out, env)
    first, last = 0 in my, (num_stages - 1) in my

    def make(step):
        g = torch.Generator().manual_seed(step)  # the same batch on every rank
        return torch.randn(args.batch, 64, generator=g), torch.randint(0, 10, (args.batch,),
                                                                        generator=g)

    for step, (x, y) in enumerate(C.batches(args, env, args.batch, make=make)):
        C.plant(args, env, step)
        C.tiny_ops(args, env)
        # keep the gradient buffers: re-allocating them makes each step's first backward slower
        opt.zero_grad(set_to_none=False)
        losses: list = []
        if first and last:
            sched.step(x, target=y, losses=losses)
        elif first:
            sched.step(x)
        elif last:
            sched.step(target=y, losses=losses)
        else:
            sched.step()
        opt.step()
        timer.tick()
    timer.save()
    C.finish(env, f"train_pp: {args.steps} steps, {num_stages} stages, {args.schedule}, "
                  f"{args.microbatches} microbatches", args.destroy)


if __name__ == "__main__":
    main()
