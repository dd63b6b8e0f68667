"""DeepSpeed ZeRO 1, 2 or 3: a tiny GPT-2 built from a config, random tokens, DeepSpeed's loop.

    pardiag profile examples/frameworks/train_deepspeed.py --nproc-per-node 2 -- --zero-stage 2
    torchrun --nproc-per-node 2 examples/frameworks/train_deepspeed.py --zero-stage 3

``deepspeed.initialize`` wraps the model in a ``DeepSpeedEngine`` whose optimizer is a
``DeepSpeedZeroOptimizer`` (stages 1 and 2: the optimizer state, and at stage 2 the gradients,
partitioned over the ranks; gradients all-reduced — reduce-scattered — in buckets, the updated
partitions all-gathered) or ``DeepSpeedZeroOptimizer_Stage3`` (the parameters partitioned too:
all-gathered per module before its forward and backward, gradients reduce-scattered). On a CPU
the script selects DeepSpeed's CPU accelerator (``DS_ACCELERATOR=cpu``, gloo) and PyTorch's own
Adam (``torch_adam``): DeepSpeed's fused CPU Adam would need a compiler at run time. For the
same reason it tells DeepSpeed not to build its shared-memory all-reduce op (a C++ build of about
two minutes on 2 cores at the first ``init_distributed``): that op serves only
``inference_all_reduce``; training's collectives go through ``torch.distributed`` either way.
"""

from __future__ import annotations

import json
import os
import time

import torch

if not torch.cuda.is_available():   # before DeepSpeed is imported: it picks its accelerator then
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

import _data  # noqa: E402
import deepspeed  # noqa: E402

if not torch.cuda.is_available():
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def main() -> None:
    p = _data.parser(__doc__)
    p.add_argument("--zero-stage", type=int, choices=(1, 2, 3), default=2, help="ZeRO stage")
    p.add_argument("--reduce-bucket-size", type=int, default=500_000_000,
                   help="elements per gradient reduction bucket (DeepSpeed's default 5e8)")
    p.add_argument("--allgather-bucket-size", type=int, default=500_000_000,
                   help="elements per all-gather bucket of the updated partitions (stages 1-2)")
    p.add_argument("--overlap-comm", action="store_true",
                   help="overlap the gradient reduction with the backward")
    p.add_argument("--times-out", default=None,
                   help="write each optimizer step's wall time (s) as JSON to FILE.rank<r>")
    args = p.parse_args()
    _data.pin_cpu(args)
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    model = _data.tiny_gpt2(args.hidden, args.layers, args.seq)
    config = {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": args.grad_accum,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": args.zero_stage,
                              "reduce_bucket_size": args.reduce_bucket_size,
                              "allgather_bucket_size": args.allgather_bucket_size,
                              "overlap_comm": args.overlap_comm},
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
    world = engine.world_size
    n = args.batch * args.grad_accum * args.steps * world
    data = _data.RandomTokens(n, args.seq)
    loader = torch.utils.data.DataLoader(
        data, batch_size=args.batch,
        sampler=torch.utils.data.DistributedSampler(data, num_replicas=world,
                                                    rank=engine.global_rank, shuffle=False))
    engine.train()
    times, last = [], time.perf_counter()
    for batch in loader:
        batch = {k: v.to(engine.device) for k, v in batch.items()}
        loss = engine(**batch).loss
        engine.backward(loss)
        steps = engine.global_steps
        engine.step()   # an optimizer step every --grad-accum micro-batches
        if engine.global_steps != steps:
            now = time.perf_counter()
            times.append(now - last)
            last = now
    if args.times_out:
        with open(f"{args.times_out}.rank{engine.global_rank}", "w") as f:
            json.dump(times, f)
    if engine.global_rank == 0:
        print(f"train_deepspeed: ZeRO-{args.zero_stage}, {args.steps} steps, last loss "
              f"{loss.item():.3f}")


if __name__ == "__main__":
    main()
