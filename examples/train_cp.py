"""Context parallel: each rank holds a shard of every sequence, and attention's keys and values
go around the ranks of the cp group as a ring (point-to-point sends and receives), as ring
attention does; the weights are replicated, their gradients all-reduced over every rank.

    pardiag profile examples/train_cp.py --nproc-per-node 2
    pardiag profile examples/train_cp.py --nproc-per-node 4 -- --dp 2

Each block: LayerNorm, q/k/v projections of the rank's sequence shard, then ``cp - 1`` ring
rounds in which every rank sends the key/value block it holds to the next rank of its cp group
and receives the previous rank's (``isend``/``irecv``), computing attention's scores on each
block as it holds it; softmax over all blocks, the output projection and an MLP. The backward
sends each block's key/value gradients around the ring the same way until they reach the rank
that owns them. The exchange runs inside ``record_function("ring_attn_kv_exchange")``, as ring
attention implementations name theirs (TransformerEngine's ``flash_attn_p2p_communicate``).
``--dp N`` (a divisor of the world size) makes ``N`` replicas of the cp group (a (dp, cp) mesh).
"""

from __future__ import annotations

import _common as C
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh


def _ring_pass(t: torch.Tensor, group, nxt: int, prv: int) -> torch.Tensor:
    """Send ``t`` to group rank ``nxt`` and receive a tensor like it from ``prv``."""
    out = torch.empty_like(t)
    ops = [dist.P2POp(dist.isend, t.contiguous(), dist.get_global_rank(group, nxt), group),
           dist.P2POp(dist.irecv, out, dist.get_global_rank(group, prv), group)]
    with torch.profiler.record_function("ring_attn_kv_exchange"):
        for w in dist.batch_isend_irecv(ops):
            w.wait()
    return out


class RingScores(torch.autograd.Function):
    """Attention's scores of the local queries against every rank's keys, and the values
    gathered in the same order: the key/value block goes around the ring (``cp - 1`` passes),
    the scores of each block computed while the rank holds it. Backward: each block's key and
    value gradients go around the ring in the same direction, accumulated until they reach
    the rank that owns the block."""

    @staticmethod
    def forward(ctx, q, k, v, group):
        n, me = dist.get_world_size(group), dist.get_rank(group)
        nxt, prv = (me + 1) % n, (me - 1) % n
        kv = torch.cat([k, v], dim=-1)
        blocks, scores = [None] * n, [None] * n
        owner = me
        for i in range(n):
            blocks[owner] = kv
            kb = kv[..., : k.shape[-1]]
            scores[owner] = q @ kb.transpose(-1, -2) / k.shape[-1] ** 0.5
            if i < n - 1:
                kv = _ring_pass(kv, group, nxt, prv)
                owner = (owner - 1) % n
        ctx.save_for_backward(q, torch.stack(blocks))
        ctx.group, ctx.dk = group, k.shape[-1]
        kv_all = torch.cat(blocks, dim=-2)
        return torch.cat(scores, dim=-1), kv_all[..., k.shape[-1]:]

    @staticmethod
    def backward(ctx, d_scores, d_v_all):
        q, blocks = ctx.saved_tensors
        group, dk = ctx.group, ctx.dk
        n, me = dist.get_world_size(group), dist.get_rank(group)
        nxt, prv = (me + 1) % n, (me - 1) % n
        s = blocks.shape[-2]
        scale = dk ** -0.5
        d_q = torch.zeros_like(q)
        grads = []   # per block owner: this rank's share of the key/value gradients
        for b in range(n):
            kb, ds = blocks[b][..., :dk], d_scores[..., b * s:(b + 1) * s] * scale
            d_q = d_q + ds @ kb
            grads.append(torch.cat([ds.transpose(-1, -2) @ q,
                                    d_v_all[..., b * s:(b + 1) * s, :]], dim=-1))
        # around the ring: each rank starts the previous rank's block; after n - 1 passes,
        # each adding the holder's share, every rank holds the whole gradient of its own block
        owner = (me - 1) % n
        acc = grads[owner]
        for _ in range(n - 1):
            acc = _ring_pass(acc, group, nxt, prv)
            owner = (owner - 1) % n
            acc = acc + grads[owner]
        return d_q, acc[..., :dk], acc[..., dk:], None


class RingAttentionBlock(nn.Module):
    """LayerNorm, ring attention over the cp group, output projection, MLP (residuals)."""

    def __init__(self, width: int, group) -> None:
        super().__init__()
        self.group = group
        self.norm, self.qkv, self.out = nn.LayerNorm(width), nn.Linear(width, 3 * width), \
            nn.Linear(width, width)
        self.mlp = C.Block(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        scores, v_all = RingScores.apply(q, k, v, self.group)
        x = x + self.out(torch.softmax(scores, dim=-1) @ v_all)
        return self.mlp(x)


def main() -> None:
    p = C.base_parser(__doc__)
    p.add_argument("--seq", type=int, default=16, help="tokens of each rank's sequence shard")
    p.add_argument("--dp", type=int, default=1, help="replicas of the cp group (divides world)")
    args = p.parse_args()
    env = C.init_distributed(args.pin_cpu)
    if args.dp < 1 or env.world_size % args.dp:
        p.error(f"--dp must divide the world size ({env.world_size})")
    cp = env.world_size // args.dp
    mesh = init_device_mesh(env.device.type, (args.dp, cp), mesh_dim_names=("dp", "cp"))
    group = mesh.get_group("cp")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, args.width),
                          *[RingAttentionBlock(args.width, group) for _ in range(args.layers)],
                          nn.Linear(args.width, 10)).to(env.device)
    C.train_sequence_sharded(args, env, model, "train_cp")


if __name__ == "__main__":
    main()
