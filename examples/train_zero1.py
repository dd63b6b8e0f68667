"""ZeRO-1: DDP for gradients, ``ZeroRedundancyOptimizer`` shards the optimizer state.

    pardiag profile examples/train_zero1.py --nproc-per-node 2
"""

from __future__ import annotations

import _common as C
import torch
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = C.base_parser(__doc__)
    p.add_argument("--bucket-mb", type=float, default=1.0, help="DDP bucket_cap_mb")
    args = p.parse_args()
    env = C.init_distributed(args.pin_cpu)
    model = DDP(C.build_model(args.width, args.layers).to(env.device), bucket_cap_mb=args.bucket_mb)
    cls = torch.optim.Adam if args.optimizer == "adam" else torch.optim.SGD
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=cls, lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    C.train(args, env, opt, lambda x, y: loss_fn(model(x), y), "train_zero1")


if __name__ == "__main__":
    main()
