"""Hugging Face Accelerate: a tiny GPT-2 built from a config, random tokens, a plain loop.

    pardiag profile examples/frameworks/train_accelerate.py --nproc-per-node 2 -- --steps 6
    torchrun --nproc-per-node 2 examples/frameworks/train_accelerate.py   # without pardiag
    accelerate launch --num_processes 2 --cpu examples/frameworks/train_accelerate.py

``Accelerator.prepare`` wraps the model in DDP and the optimizer in its own
``AcceleratedOptimizer``; ``accelerator.accumulate`` skips the gradient all-reduce and the
optimizer step on all but every ``--grad-accum``-th micro-batch.
"""

from __future__ import annotations

import _data
import torch
from accelerate import Accelerator


def main() -> None:
    args = _data.parser(__doc__).parse_args()
    _data.pin_cpu(args)
    accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum,
                              cpu=not torch.cuda.is_available())
    model = _data.tiny_gpt2(args.hidden, args.layers, args.seq)
    n = args.batch * args.grad_accum * args.steps * accelerator.num_processes
    loader = torch.utils.data.DataLoader(_data.RandomTokens(n, args.seq), batch_size=args.batch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    model.train()
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
    accelerator.print(f"train_accelerate: {args.steps} steps, last loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
