"""A small DDP training script: runs on CPU/gloo in seconds and unchanged on GPU/NCCL.

    pardiag profile examples/train_ddp.py --nproc-per-node 2 -- --steps 8
    torchrun --nproc-per-node 2 examples/train_ddp.py      # the same, without pardiag

Options that matter for diagnosis: ``--bucket-mb`` (DDP bucket size), ``--slow-rank R --slow-ms D``
(plant a slowdown on one rank), ``--fail-rank R`` (plant an exception on one rank).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=8, help="optimizer steps")
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--width", type=int, default=512, help="hidden width of the MLP")
    p.add_argument("--layers", type=int, default=4, help="hidden layers of the MLP")
    p.add_argument("--bucket-mb", type=float, default=1.0, help="DDP bucket_cap_mb")
    p.add_argument("--slow-rank", type=int, default=-1, help="rank that sleeps every step")
    p.add_argument("--slow-ms", type=float, default=0.0, help="how long the slow rank sleeps (ms)")
    p.add_argument("--fail-rank", type=int, default=-1, help="rank that raises at --fail-step")
    p.add_argument("--fail-step", type=int, default=2, help="step at which --fail-rank raises")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    distributed = "WORLD_SIZE" in os.environ
    use_cuda = torch.cuda.is_available()
    if distributed:
        dist.init_process_group("nccl" if use_cuda else "gloo")
    rank = dist.get_rank() if distributed else 0
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    device = torch.device("cuda" if use_cuda else "cpu")
    torch.manual_seed(0)

    layers: list[nn.Module] = [nn.Linear(64, args.width), nn.ReLU()]
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    layers.append(nn.Linear(args.width, 10))
    model = nn.Sequential(*layers).to(device)
    if distributed:
        model = DDP(model, bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()

    gen = torch.Generator().manual_seed(1234 + rank)
    for step in range(args.steps):
        x = torch.randn(args.batch, 64, generator=gen).to(device)
        y = torch.randint(0, 10, (args.batch,), generator=gen).to(device)
        if rank == args.fail_rank and step == args.fail_step:
            raise RuntimeError(f"planted failure on rank {rank} at step {step}")
        if rank == args.slow_rank and args.slow_ms > 0:
            time.sleep(args.slow_ms / 1000.0)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    if rank == 0:
        print(f"train_ddp: {args.steps} steps done, final loss {loss.item():.4f}")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
