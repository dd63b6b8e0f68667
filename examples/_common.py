"""Shared pieces of the example training scripts (CPU/gloo or GPU/NCCL, unchanged).

Every example takes the options that matter for diagnosis: ``--steps``, ``--batch``, ``--width``,
``--layers``, ``--optimizer``, and planted problems ``--slow-rank R --slow-ms D`` (sleep D ms
every step on rank R, outside any operator; with ``--slow-from A --slow-until B`` only in steps
A..B-1: a transient straggler; ``--slow-every P`` brings that period back every P steps),
``--slow-data-rank R --slow-data-ms D`` (rank R's
DataLoader takes D ms longer per batch: a slow input pipeline), ``--tiny-ops N`` (N extra tiny
tensor ops per step: launch- or CPU-bound), ``--fail-rank R --fail-step S`` (raise),
``--hang-rank R --hang-step S`` (block forever), plus ``--times-out FILE`` (per-step wall times,
for benchmarks/overhead.py). Batches come from a ``torch.utils.data.DataLoader``
(``num_workers=0``), so the traces show data loading as real scripts do.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn


@dataclasses.dataclass(frozen=True)
class Env:
    """Where this process runs: global rank, world size, local rank, device, backend."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None


def base_parser(description: str) -> argparse.ArgumentParser:
    """Argument parser with the options every example shares."""
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10, help="optimizer steps")
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--width", type=int, default=256, help="hidden width")
    p.add_argument("--layers", type=int, default=4, help="hidden layers (blocks)")
    p.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    p.add_argument("--slow-rank", type=int, default=-1, help="rank that sleeps every step")
    p.add_argument("--slow-ms", type=float, default=0.0, help="how long the slow rank sleeps (ms)")
    p.add_argument("--slow-from", type=int, default=0,
                   help="first step at which the slow rank sleeps (a transient straggler)")
    p.add_argument("--slow-until", type=int, default=-1,
                   help="step at which the slow rank stops sleeping (-1: never)")
    p.add_argument("--slow-every", type=int, default=0,
                   help="repeat the slow period (--slow-from..--slow-until) every this many "
                        "steps (0: once): a straggler that comes and goes")
    p.add_argument("--slow-data-rank", type=int, default=-1,
                   help="rank whose DataLoader is slow (sleeps in __getitem__)")
    p.add_argument("--slow-data-ms", type=float, default=0.0,
                   help="how much longer the slow data rank's DataLoader takes per batch (ms)")
    p.add_argument("--tiny-ops", type=int, default=0,
                   help="extra tiny tensor ops per step (a launch- or CPU-bound step)")
    p.add_argument("--fail-rank", type=int, default=-1, help="rank that raises at --fail-step")
    p.add_argument("--fail-step", type=int, default=2)
    p.add_argument("--hang-rank", type=int, default=-1, help="rank that blocks at --hang-step")
    p.add_argument("--hang-step", type=int, default=2)
    p.add_argument("--times-out", default=None, help="write per-step wall times (s) as JSON")
    p.add_argument("--pin-cpu", action="store_true",
                   help="pin each rank to its own CPU core (local rank mod cores): ranks sharing "
                        "a small machine stop slowing each other down")
    p.add_argument("--destroy", action="store_true",
                   help="end as many scripts do: dist.destroy_process_group(), then return and "
                        "let the interpreter end (run directly, gloo may hang or abort then)")
    return p


def init_distributed(pin_cpu: bool = False) -> Env:
    """Start the default process group (NCCL with CUDA, else gloo) when run under torchrun.

    ``EXAMPLES_BACKEND=gloo`` chooses gloo on GPUs too; then several ranks may share a GPU
    (local rank modulo the GPUs), as ``benchmarks/gpu_check.sh`` runs 2 ranks on one GPU."""
    use_cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if pin_cpu and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[local_rank % len(cores)]})
    gpu = local_rank % torch.cuda.device_count() if use_cuda else 0
    if use_cuda:
        torch.cuda.set_device(gpu)
    device = torch.device("cuda", gpu) if use_cuda else torch.device("cpu")
    if "WORLD_SIZE" not in os.environ:
        return Env(0, 1, 0, device, None)
    backend = os.environ.get("EXAMPLES_BACKEND") or ("nccl" if use_cuda else "gloo")
    dist.init_process_group(backend)
    return Env(dist.get_rank(), dist.get_world_size(), local_rank, device, backend)


class Block(nn.Module):
    """One layer of the example models: LayerNorm → Linear → GELU → Linear, residual."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.w1 = nn.Linear(width, 2 * width)
        self.w2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(torch.nn.functional.gelu(self.w1(self.norm(x))))


def build_model(width: int, layers: int, in_dim: int = 64, classes: int = 10) -> nn.Sequential:
    """``in_proj``, ``layers`` Blocks, ``head``; the same weights on every rank (seed 0)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(in_dim, width), *[Block(width) for _ in range(layers)],
                         nn.Linear(width, classes))


def train_sequence_sharded(args: argparse.Namespace, env: Env, model: nn.Module,
                           name: str) -> None:
    """Train ``model`` (its weights replicated on every rank, each rank holding a shard of every
    sequence: context or sequence parallelism) with :func:`train` on (batch, ``args.seq``)
    token batches: cross-entropy per token, the gradients all-reduced over every rank and
    averaged before each optimizer step."""
    opt = make_optimizer(model.parameters(), args.optimizer)
    loss_fn = nn.CrossEntropyLoss()

    def sync_grads() -> None:
        for q in model.parameters():
            if q.grad is not None:
                dist.all_reduce(q.grad)
                q.grad /= env.world_size

    train(args, env, opt, lambda x, y: loss_fn(model(x).flatten(0, 1), y.flatten()), name,
          seq=args.seq, after_backward=sync_grads)


def make_optimizer(params, name: str) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=1e-3) if name == "adam" else torch.optim.SGD(params, lr=1e-2)


def batch(env: Env, n: int, step: int, in_dim: int = 64, classes: int = 10, seq: int | None = None):
    """A random batch for this rank and step: inputs (n, in_dim) or (n, seq, in_dim), targets."""
    g = torch.Generator().manual_seed(1000 * step + env.rank)
    shape = (n, in_dim) if seq is None else (n, seq, in_dim)
    x = torch.randn(*shape, generator=g)
    y = torch.randint(0, classes, shape[:-1], generator=g)
    return x.to(env.device), y.to(env.device)


class StepBatches(torch.utils.data.Dataset):
    """Item ``i`` is step ``i``'s batch (:func:`batch`, on the CPU); on ``--slow-data-rank`` each
    item takes ``--slow-data-ms`` longer (a slow input pipeline)."""

    def __init__(self, args: argparse.Namespace, env: Env, n: int, seq: int | None,
                 data_env: Env, make=None) -> None:
        self.args, self.env, self.n, self.seq, self.data_env = args, env, n, seq, data_env
        self.make = make

    def __len__(self) -> int:
        return self.args.steps

    def __getitem__(self, step: int):
        if self.make is not None:
            return self.make(step)
        cpu = dataclasses.replace(self.data_env, device=torch.device("cpu"))
        if self.env.rank == self.args.slow_data_rank and self.args.slow_data_ms > 0:
            time.sleep(self.args.slow_data_ms / 1000.0)
        return batch(cpu, self.n, step, seq=self.seq)


def batches(args: argparse.Namespace, env: Env, n: int, seq: int | None = None,
            data_env: Env | None = None, make=None):
    """Every step's batch (of ``data_env``: whose batch this rank sees; ``make(step)`` when
    given: the CPU tensors ``(x, y)`` of a step) through a DataLoader
    (``num_workers=0``; moved to the device), the iterator's
    ``enumerate(DataLoader)#...__next__`` events in the trace."""
    loader = torch.utils.data.DataLoader(StepBatches(args, env, n, seq, data_env or env, make),
                                         batch_size=None,
                                         shuffle=False, num_workers=0)
    for x, y in loader:
        yield x.to(env.device), y.to(env.device)


def tiny_ops(args: argparse.Namespace, env: Env) -> None:
    """``--tiny-ops`` small element-wise ops (each a kernel launch on a GPU)."""
    if args.tiny_ops > 0:
        t = torch.zeros(8, device=env.device)
        for _ in range(args.tiny_ops):
            t = t + 1.0


def plant(args: argparse.Namespace, env: Env, step: int) -> None:
    """The planted problems: raise, block, or sleep on the chosen rank."""
    if env.rank == args.fail_rank and step == args.fail_step:
        raise RuntimeError(f"planted failure on rank {env.rank} at step {step}")
    if env.rank == args.hang_rank and step == args.hang_step:
        while True:  # a rank that never reaches the next collective
            time.sleep(1.0)
    if env.rank == args.slow_rank and args.slow_ms > 0 and step >= args.slow_from:
        at = step - args.slow_from
        if args.slow_every > 0:   # the period comes back every slow_every steps
            at %= args.slow_every
        if args.slow_until < 0 or at < args.slow_until - args.slow_from:
            time.sleep(args.slow_ms / 1000.0)


class StepTimes:
    """Wall time of every step; written to ``--times-out`` at the end when given."""

    def __init__(self, path: str | None, env: Env) -> None:
        self.path = path
        self.env = env
        self.times: list[float] = []
        self._t = time.perf_counter()

    def tick(self) -> None:
        if self.env.device.type == "cuda":
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.times.append(now - self._t)
        self._t = now

    def save(self) -> None:
        if self.path:
            with open(f"{self.path}.rank{self.env.rank}", "w") as f:
                json.dump(self.times, f)


def train(args: argparse.Namespace, env: Env, opt: torch.optim.Optimizer, loss_of, name: str,
          batch_env: Env | None = None, seq: int | None = None, after_backward=None) -> None:
    """The examples' training loop: batch, planted problems, forward/backward, step.

    ``loss_of(x, y)`` returns the loss; ``batch_env`` picks whose batch a rank sees (TP ranks
    share one); ``after_backward()`` runs before the optimizer step (manual gradient sync).
    """
    timer = StepTimes(args.times_out, env)
    loss = None
    for step, (x, y) in enumerate(batches(args, env, args.batch, seq, batch_env)):
        plant(args, env, step)
        tiny_ops(args, env)
        opt.zero_grad(set_to_none=True)
        loss = loss_of(x, y)
        loss.backward()
        if after_backward is not None:
            after_backward()
        opt.step()
        timer.tick()
    timer.save()
    finish(env, f"{name}: {args.steps} steps, loss {loss.item():.4f}", args.destroy)


def finish(env: Env, message: str, destroy: bool = False) -> None:
    """Print the summary, then end the way that never hangs or aborts with gloo (FACTS §1).

    The process group is not destroyed: freeing it (or objects holding it) at teardown can
    hang or abort a gloo process. Under ``pardiag profile`` the script returns and pardiag ends
    the process (barrier, flush, ``os._exit``) after writing its files; run directly, the
    script does the same itself. ``destroy`` (``--destroy``): end as many scripts do instead,
    with ``dist.destroy_process_group()``, and return.
    """
    if env.rank == 0:
        print(message, flush=True)
    if destroy and dist.is_initialized():
        dist.destroy_process_group()
        return
    if dist.is_initialized():
        dist.barrier()
        if "PARDIAG_PROFILE_CONFIG" not in os.environ:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
