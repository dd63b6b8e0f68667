"""FSDP2 (``fully_shard``): every block and the root sharded over all ranks.

    pardiag profile examples/train_fsdp2.py --nproc-per-node 2 -- --reshard-after-forward false
"""

from __future__ import annotations

from torch import nn
from torch.distributed.fsdp import fully_shard

import _common as C


def main() -> None:
    p = C.base_parser(__doc__)
    p.add_argument("--reshard-after-forward", choices=["true", "false"], default="true",
                   help="free gathered parameters after forward (ZeRO-3) or keep them (ZeRO-2)")
    args = p.parse_args()
    env = C.init_distributed()
    reshard = args.reshard_after_forward == "true"
    model = C.build_model(args.width, args.layers).to(env.device)
    for block in model:
        if isinstance(block, C.Block):
            fully_shard(block, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
    opt = C.make_optimizer(model.parameters(), args.optimizer)
    loss_fn = nn.CrossEntropyLoss()
    C.train(args, env, opt, lambda x, y: loss_fn(model(x), y), "train_fsdp2")


if __name__ == "__main__":
    main()
