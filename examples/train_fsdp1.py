"""FSDP1 (``FullyShardedDataParallel``), one FSDP unit per block, full sharding.

    pardiag profile examples/train_fsdp1.py --nproc-per-node 2

``--sharding-strategy shard_grad_op`` keeps the parameters unsharded between forward and
backward; ``--forward-prefetch`` gathers the next unit during the current one's forward.
"""

from __future__ import annotations

import _common as C
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy


def main() -> None:
    p = C.base_parser(__doc__)
    p.add_argument("--sharding-strategy", choices=["full_shard", "shard_grad_op"],
                   default="full_shard", help="FSDP1 sharding strategy (default full_shard)")
    p.add_argument("--forward-prefetch", action="store_true",
                   help="FSDP1 forward_prefetch=True")
    args = p.parse_args()
    env = C.init_distributed(args.pin_cpu)
    model = C.build_model(args.width, args.layers).to(env.device)
    model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({C.Block}), use_orig_params=True,
                 device_id=env.device,
                 sharding_strategy=ShardingStrategy[args.sharding_strategy.upper()],
                 forward_prefetch=args.forward_prefetch)
    opt = C.make_optimizer(model.parameters(), args.optimizer)
    loss_fn = nn.CrossEntropyLoss()
    C.train(args, env, opt, lambda x, y: loss_fn(model(x), y), "train_fsdp1")


if __name__ == "__main__":
    main()
