"""Lightning ``Trainer(strategy="ddp")``: a tiny GPT-2 built from a config, random tokens.

    pardiag profile examples/frameworks/train_lightning.py --nproc-per-node 2 -- --steps 6
    torchrun --nproc-per-node 2 examples/frameworks/train_lightning.py    # without pardiag

Under torchrun Lightning joins the job torchrun started (it spawns no processes of its own);
``--devices`` must equal the processes per node (default: torchrun's ``LOCAL_WORLD_SIZE``).
"""

from __future__ import annotations

import os

import _data
import lightning as L
import torch


class LitLM(L.LightningModule):
    """The model, its loss and its optimizer, as Lightning wants them."""

    def __init__(self, hidden: int, layers: int, seq: int) -> None:
        super().__init__()
        self.model = _data.tiny_gpt2(hidden, layers, seq)

    def training_step(self, batch, batch_idx):
        return self.model(**batch).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    p = _data.parser(__doc__)
    p.add_argument("--devices", type=int, default=int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    p.add_argument("--profiler", choices=["simple", "advanced", "pytorch"], default=None,
                   help="Lightning's own profiler (pytorch: a second torch profiler)")
    args = p.parse_args()
    _data.pin_cpu(args)
    n = args.batch * args.grad_accum * (args.steps + 1) * 8
    loader = torch.utils.data.DataLoader(_data.RandomTokens(n, args.seq), batch_size=args.batch)
    trainer = L.Trainer(
        accelerator="gpu" if torch.cuda.is_available() else "cpu", devices=args.devices,
        strategy="ddp", max_steps=args.steps, accumulate_grad_batches=args.grad_accum,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, profiler=args.profiler)
    trainer.fit(LitLM(args.hidden, args.layers, args.seq), loader)


if __name__ == "__main__":
    main()
