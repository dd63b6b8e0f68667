"""What the framework examples share: a tiny causal language model built from a config (no
download) and a synthetic token dataset. Nothing here knows about pardiag."""

from __future__ import annotations

import argparse
import os

import torch

#: no network: the model is built from a config, the tokens are random
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def parser(description: str) -> argparse.ArgumentParser:
    """The options every framework example takes."""
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10, help="optimizer steps")
    p.add_argument("--batch", type=int, default=4, help="sequences per rank per micro-batch")
    p.add_argument("--seq", type=int, default=32, help="tokens per sequence")
    p.add_argument("--grad-accum", type=int, default=2,
                   help="micro-batches per optimizer step (gradient accumulation)")
    p.add_argument("--hidden", type=int, default=64, help="hidden size")
    p.add_argument("--layers", type=int, default=2, help="transformer layers")
    p.add_argument("--pin-cpu", action="store_true",
                   help="pin each rank to its own CPU core (local rank mod cores), as the other "
                        "examples do")
    return p


def pin_cpu(args: argparse.Namespace) -> None:
    """With ``--pin-cpu``: this rank runs on one core of those it may use, chosen by its local
    rank (as ``examples/_common.py`` pins)."""
    if args.pin_cpu and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[int(os.environ.get("LOCAL_RANK", "0")) % len(cores)]})


def tiny_gpt2(hidden: int, layers: int, seq: int, vocab: int = 512):
    """A GPT-2 language model of ``layers`` layers and ``hidden`` width (4 heads), random
    weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=hidden, n_layer=layers, n_head=4,
                     bos_token_id=vocab - 1, eos_token_id=vocab - 1, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(cfg)


class RandomTokens(torch.utils.data.Dataset):
    """``n`` random token sequences of ``seq`` tokens; labels are the inputs (causal LM)."""

    def __init__(self, n: int, seq: int, vocab: int = 512) -> None:
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}
