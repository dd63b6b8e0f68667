"""FSDP1 (``FullyShardedDataParallel``), one FSDP unit per block, full sharding.

    pardiag profile examples/train_fsdp1.py --nproc-per-node 2
"""

from __future__ import annotations

from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import _common as C


def main() -> None:
    args = C.base_parser(__doc__).parse_args()
    env = C.init_distributed(args.pin_cpu)
    model = C.build_model(args.width, args.layers).to(env.device)
    model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({C.Block}), use_orig_params=True,
                 device_id=env.device)
    opt = C.make_optimizer(model.parameters(), args.optimizer)
    loss_fn = nn.CrossEntropyLoss()
    C.train(args, env, opt, lambda x, y: loss_fn(model(x), y), "train_fsdp1")


if __name__ == "__main__":
    main()
