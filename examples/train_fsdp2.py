"""FSDP2 (``fully_shard``): every block and the root sharded over all ranks.

    pardiag profile examples/train_fsdp2.py --nproc-per-node 2 -- --reshard-after-forward false
"""

from __future__ import annotations

import _common as C
from torch import nn
from torch.distributed.fsdp import fully_shard


def main() -> None:
    p = C.base_parser(__doc__)
    p.add_argument("--reshard-after-forward", choices=["true", "false"], default="true",
                   help="free gathered parameters after forward (ZeRO-3) or keep them (ZeRO-2)")
    p.add_argument("--prefetch", type=int, default=0,
                   help="explicit prefetching: each block gathers the next N blocks' parameters "
                        "(forward) and the previous N (backward); 0 = FSDP2's defaults")
    args = p.parse_args()
    env = C.init_distributed(args.pin_cpu)
    reshard = args.reshard_after_forward == "true"
    model = C.build_model(args.width, args.layers).to(env.device)
    for block in model:
        if isinstance(block, C.Block):
            fully_shard(block, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
    blocks = [b for b in model if isinstance(b, C.Block)]
    if args.prefetch > 0:
        for i, b in enumerate(blocks):
            b.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + args.prefetch])
            b.set_modules_to_backward_prefetch(blocks[max(i - args.prefetch, 0):i][::-1])
    opt = C.make_optimizer(model.parameters(), args.optimizer)
    loss_fn = nn.CrossEntropyLoss()
    C.train(args, env, opt, lambda x, y: loss_fn(model(x), y), "train_fsdp2")


if __name__ == "__main__":
    main()
