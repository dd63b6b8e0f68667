"""Sequence parallel, Ulysses-style (DeepSpeed-Ulysses): each rank holds a shard of every
sequence; around attention an all-to-all swaps it for all of the sequence on a share of the
heads, and a second one swaps it back; the weights are replicated, their gradients all-reduced
over every rank. No mixture of experts: the all-to-alls carry sequence and head shards.

    pardiag profile examples/train_ulysses.py --nproc-per-node 2
    pardiag profile examples/train_ulysses.py --nproc-per-node 4 -- --dp 2

Each block: LayerNorm, q/k/v projections of the rank's shard, an all-to-all each (sequence
shards to head shards, ``all_to_all_single`` with autograd), attention over the whole sequence
on the rank's heads, an all-to-all back (head shards to sequence shards), the output projection
and an MLP. ``--heads`` must be a multiple of the sequence-parallel size; ``--dp N`` (a divisor
of the world size) makes ``N`` replicas of the sequence-parallel group (a (dp, cp) mesh). The
group is made with ``new_group`` and no description: nothing names it sequence parallel.
"""

from __future__ import annotations

import warnings

import _common as C
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.nn.functional import all_to_all_single

warnings.filterwarnings("ignore", message=".*all_to_all_single is deprecated.*")


def _swap(x: torch.Tensor, group, n: int, to_heads: bool) -> torch.Tensor:
    """(b, s/n, H, d) → (b, s, H/n, d) when ``to_heads``, else back: one all-to-all over the
    ``n`` ranks of ``group`` (chunk ``i`` of dim 0 goes to rank ``i``)."""
    if to_heads:
        b, s, h, d = x.shape
        x = x.reshape(b, s, n, h // n, d).permute(2, 0, 1, 3, 4).contiguous()
        out = all_to_all_single(torch.empty_like(x), x, group=group)   # (n: source, b, s, h/n, d)
        return out.permute(1, 0, 2, 3, 4).reshape(b, n * s, h // n, d)
    b, s, h, d = x.shape
    x = x.reshape(b, n, s // n, h, d).permute(1, 0, 2, 3, 4).contiguous()
    out = all_to_all_single(torch.empty_like(x), x, group=group)   # (n: source heads, b, s/n, h, d)
    return out.permute(1, 2, 0, 3, 4).reshape(b, s // n, n * h, d)


class UlyssesBlock(nn.Module):
    """LayerNorm, attention over the whole sequence through two all-to-alls, output
    projection, MLP (residuals)."""

    def __init__(self, width: int, heads: int, group) -> None:
        super().__init__()
        self.group, self.n, self.heads = group, dist.get_world_size(group), heads
        self.norm, self.qkv, self.out = nn.LayerNorm(width), nn.Linear(width, 3 * width), \
            nn.Linear(width, width)
        self.mlp = C.Block(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        q, k, v = (t.reshape(b, s, self.heads, w // self.heads)
                   for t in self.qkv(self.norm(x)).chunk(3, dim=-1))
        q, k, v = (_swap(t, self.group, self.n, True).transpose(1, 2) for t in (q, k, v))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v)   # (b, h/n, s, d)
        a = _swap(a.transpose(1, 2), self.group, self.n, False)        # (b, s/n, h, d)
        return self.mlp(x + self.out(a.reshape(b, s, w)))


def main() -> None:
    p = C.base_parser(__doc__)
    p.add_argument("--seq", type=int, default=16, help="tokens of each rank's sequence shard")
    p.add_argument("--heads", type=int, default=8, help="attention heads")
    p.add_argument("--dp", type=int, default=1, help="replicas of the sequence-parallel group")
    args = p.parse_args()
    env = C.init_distributed(args.pin_cpu)
    if args.dp < 1 or env.world_size % args.dp:
        p.error(f"--dp must divide the world size ({env.world_size})")
    sp = env.world_size // args.dp
    if args.heads % sp or args.width % args.heads:
        p.error(f"--heads must be a multiple of {sp} and divide --width")
    groups = [dist.new_group(list(range(i * sp, (i + 1) * sp))) for i in range(args.dp)]
    group = groups[env.rank // sp]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, args.width),
                          *[UlyssesBlock(args.width, args.heads, group)
                            for _ in range(args.layers)],
                          nn.Linear(args.width, 10)).to(env.device)
    C.train_sequence_sharded(args, env, model, "train_ulysses")


if __name__ == "__main__":
    main()
