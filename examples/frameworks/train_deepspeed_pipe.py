"""DeepSpeed's pipeline engine: a stack of blocks split into stages by ``PipelineModule``,
trained by ``PipelineEngine.train_batch`` (DeepSpeed's 1F1B ``TrainSchedule``), with data
parallelism over the rest of the ranks.

    pardiag profile examples/frameworks/train_deepspeed_pipe.py --nproc-per-node 2
    pardiag profile examples/frameworks/train_deepspeed_pipe.py --nproc-per-node 4 -- --stages 2
    torchrun --nproc-per-node 2 examples/frameworks/train_deepspeed_pipe.py

``--stages`` pipeline stages (default: every rank a stage), ``--grad-accum`` microbatches per
step (DeepSpeed's ``gradient_accumulation_steps``: a pipeline step runs that many microbatches
through the stages). Each stage sends its activations to the next stage and the gradients back
with ``torch.distributed`` point-to-point calls (DeepSpeed's ``pipe/p2p.py``). On a CPU the
script selects DeepSpeed's CPU accelerator (``DS_ACCELERATOR=cpu``, gloo) as
``train_deepspeed.py`` does.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():   # before DeepSpeed is imported: it picks its accelerator then
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

import _data  # noqa: E402
import deepspeed  # noqa: E402
from deepspeed.pipe import PipelineModule  # noqa: E402
from torch import nn  # noqa: E402

if not torch.cuda.is_available():
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


class Block(nn.Module):
    """A residual MLP block: ``x + W2 gelu(W1 x)``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class Samples(torch.utils.data.Dataset):
    """Random inputs of ``width`` features and class labels (0-9), fixed by the index."""

    def __init__(self, n: int, width: int) -> None:
        self.n, self.width = n, width

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        return torch.randn(self.width, generator=g), torch.randint(0, 10, (), generator=g)


def main() -> None:
    p = _data.parser(__doc__)
    p.add_argument("--stages", type=int, default=0,
                   help="pipeline stages (default: the world size; the rest is data parallel)")
    p.add_argument("--width", type=int, default=256, help="features per block")
    args = p.parse_args()
    _data.pin_cpu(args)
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    stages = args.stages or world
    if world % stages:
        p.error(f"--stages must divide the world size ({world})")
    layers = [nn.Linear(args.width, args.width)] + [Block(args.width)
                                                    for _ in range(2 * args.layers)]
    layers.append(nn.Linear(args.width, 10))
    model = PipelineModule(layers=layers, num_stages=stages, loss_fn=nn.CrossEntropyLoss(),
                           partition_method="uniform")
    config = {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": args.grad_accum,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
    dp = world // stages
    data = Samples(args.batch * args.grad_accum * args.steps * dp, args.width)
    loader = iter(deepspeed.utils.RepeatingLoader(torch.utils.data.DataLoader(
        data, batch_size=args.batch, drop_last=True,
        sampler=torch.utils.data.DistributedSampler(
            data, num_replicas=dp, rank=engine.grid.get_data_parallel_rank(), shuffle=False))))
    loss = None
    for _ in range(args.steps):
        loss = engine.train_batch(data_iter=loader)
    if engine.global_rank == 0:
        print(f"train_deepspeed_pipe: pp={stages} dp={dp}, {args.steps} steps, "
              f"{args.grad_accum} microbatches, last loss {float(loss):.3f}")


if __name__ == "__main__":
    main()
