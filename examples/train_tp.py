"""Tensor parallel with sequence parallel (DTensor ``parallelize_module``) over every rank.

Each block: LayerNorm sequence-parallel, w1 column-wise, w2 row-wise (Megatron-style); inputs
are (batch, seq, features) with the sequence sharded between blocks.

    pardiag profile examples/train_tp.py --nproc-per-node 2
"""

from __future__ import annotations

import _common as C
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


def tp_plan() -> dict:
    """Megatron-style plan of one Block with sequence parallelism."""
    return {"norm": SequenceParallel(),
            "w1": ColwiseParallel(input_layouts=Shard(1)),
            "w2": RowwiseParallel(output_layouts=Shard(1))}


def main() -> None:
    p = C.base_parser(__doc__)
    p.add_argument("--seq", type=int, default=16, help="sequence length (divisible by world)")
    args = p.parse_args()
    env = C.init_distributed(args.pin_cpu)
    mesh = init_device_mesh(env.device.type, (env.world_size,), mesh_dim_names=("tp",))
    model = C.build_model(args.width, args.layers).to(env.device)
    for block in model:
        if isinstance(block, C.Block):
            parallelize_module(block, mesh, tp_plan())
    # in_proj replicated, output sharded on the sequence; head gathers it back
    parallelize_module(model[0], mesh, ColwiseParallel(output_layouts=Shard(1),
                                                       input_layouts=Replicate()))
    parallelize_module(model[-1], mesh, RowwiseParallel(input_layouts=Shard(1),
                                                        output_layouts=Replicate()))
    opt = C.make_optimizer(model.parameters(), args.optimizer)
    loss_fn = nn.CrossEntropyLoss()

    def loss_of(x, y):
        out = model(x)
        return loss_fn(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    # every TP rank sees the same batch
    C.train(args, env, opt, loss_of, "train_tp", batch_env=C.Env(0, env.world_size, 0, env.device,
                                                                   env.backend), seq=args.seq)

if __name__ == "__main__":
    main()
