"""Hugging Face Transformers ``Trainer``: a tiny GPT-2 built from a config, random tokens.

    pardiag profile examples/frameworks/train_hf_trainer.py --nproc-per-node 2 -- --steps 6
    torchrun --nproc-per-node 2 examples/frameworks/train_hf_trainer.py   # without pardiag

The Trainer wraps the model in DDP itself (gloo on CPU, NCCL on GPUs) and accumulates
``--grad-accum`` micro-batches per optimizer step.
"""

from __future__ import annotations

import tempfile

import _data
import torch
from transformers import Trainer, TrainingArguments


def main() -> None:
    args = _data.parser(__doc__).parse_args()
    _data.pin_cpu(args)
    model = _data.tiny_gpt2(args.hidden, args.layers, args.seq)
    n = args.batch * args.grad_accum * (args.steps + 1) * 8   # enough for every rank
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(
            output_dir=out, max_steps=args.steps, per_device_train_batch_size=args.batch,
            gradient_accumulation_steps=args.grad_accum, learning_rate=1e-3,
            use_cpu=not torch.cuda.is_available(), report_to="none", save_strategy="no",
            logging_steps=max(args.steps, 1), dataloader_num_workers=0, disable_tqdm=True,
            ddp_find_unused_parameters=False)
        Trainer(model=model, args=targs,
                train_dataset=_data.RandomTokens(n, args.seq)).train()


if __name__ == "__main__":
    main()
