"""2D parallelism: FSDP2 over the ``dp`` mesh dimension × tensor parallel (with sequence
parallel) over ``tp``, on a (dp, tp) device mesh; 4 ranks by default (2 × 2). ``--tp 1`` is
FSDP2 alone over every rank (no TP plan).

    pardiag profile examples/train_2d.py --nproc-per-node 4 -- --tp 2

``--tp-outer`` orders the mesh (tp, dp) instead: each TP group then holds ranks world/tp apart,
so on 2 nodes of 2 ranks each TP group spans both nodes (a placement to correct).
"""

from __future__ import annotations

import warnings

import _common as C
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from train_tp import tp_plan

# The root's output is a view of the replicated TP output; nothing here modifies it in place.
warnings.filterwarnings("ignore", message=".*returned a view tensor.*")


def main() -> None:
    p = C.base_parser(__doc__)
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel degree")
    p.add_argument("--seq", type=int, default=16, help="sequence length (divisible by tp)")
    p.add_argument("--tp-outer", action="store_true",
                   help="mesh (tp, dp): TP groups of ranks world/tp apart (across nodes)")
    args = p.parse_args()
    env = C.init_distributed(args.pin_cpu)
    if env.world_size % args.tp:
        raise SystemExit(f"world size {env.world_size} is not divisible by --tp {args.tp}")
    if args.tp_outer:
        mesh = init_device_mesh(env.device.type, (args.tp, env.world_size // args.tp),
                                mesh_dim_names=("tp", "dp"))
    else:
        mesh = init_device_mesh(env.device.type, (env.world_size // args.tp, args.tp),
                                mesh_dim_names=("dp", "tp"))
    model = C.build_model(args.width, args.layers).to(env.device)
    # tp=1 is plain FSDP2 over every rank: no TP plan over a one-rank mesh (its DTensor
    # dispatch would cost time a run without TP does not spend)
    tp = args.tp > 1
    for block in model:
        if isinstance(block, C.Block):
            if tp:
                parallelize_module(block, mesh["tp"], tp_plan())
            fully_shard(block, mesh=mesh["dp"])
    if tp:
        parallelize_module(model[0], mesh["tp"], ColwiseParallel(output_layouts=Shard(1),
                                                                 input_layouts=Replicate()))
        parallelize_module(model[-1], mesh["tp"], RowwiseParallel(input_layouts=Shard(1),
                                                                  output_layouts=Replicate()))
    fully_shard(model, mesh=mesh["dp"])
    opt = C.make_optimizer(model.parameters(), args.optimizer)
    loss_fn = nn.CrossEntropyLoss()

    def loss_of(x, y):
        out = model(x)
        return loss_fn(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    # the same batch within a TP group, different ones across DP replicas
    dp = C.Env(mesh.get_local_rank("dp"), env.world_size, 0, env.device, env.backend)
    C.train(args, env, opt, loss_of, "train_2d", batch_env=dp, seq=args.seq)

if __name__ == "__main__":
    main()
