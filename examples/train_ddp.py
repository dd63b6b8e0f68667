"""DDP: a small model, data parallel over every rank.

    pardiag profile examples/train_ddp.py --nproc-per-node 2 -- --steps 8 --bucket-mb 1
    torchrun --nproc-per-node 2 examples/train_ddp.py      # the same, without pardiag
"""

from __future__ import annotations

import _common as C
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = C.base_parser(__doc__)
    p.add_argument("--bucket-mb", type=float, default=1.0,
                   help="DDP bucket_cap_mb (0: torch's default, 25 MiB after a 1 MiB first bucket)")
    args = p.parse_args()
    env = C.init_distributed(args.pin_cpu)
    model = C.build_model(args.width, args.layers).to(env.device)
    if env.world_size > 1:
        model = DDP(model, bucket_cap_mb=args.bucket_mb or None)
    opt = C.make_optimizer(model.parameters(), args.optimizer)
    loss_fn = nn.CrossEntropyLoss()
    C.train(args, env, opt, lambda x, y: loss_fn(model(x), y), "train_ddp")


if __name__ == "__main__":
    main()
