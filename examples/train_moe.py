"""Expert parallel: a mixture-of-experts layer whose tokens go out and back with
``all_to_all_single`` (dispatch and combine); the dense layers are data parallel (all-reduce).

Each rank holds ``--experts-per-rank`` experts; a top-1 router sends each token to one expert.
``--route-skew S`` (0 to 1) plants a skewed router: on every rank the first ``round(S × tokens)``
tokens go to the first expert of ``--hot-rank`` (default 0), the rest where the router sends them,
so that rank's experts process at least ``S`` of all tokens and the others wait for it at the
combine.

    pardiag profile examples/train_moe.py --nproc-per-node 2
    pardiag profile examples/train_moe.py --nproc-per-node 2 -- --route-skew 0.8 --batch 256

``--ep N`` (a divisor of the world size, below it) folds expert parallelism into data parallelism
as Megatron's MoE parallel folding does: the experts are split over groups of N consecutive
ranks (EP), the dense weights stay data parallel over every rank (their gradients are all-reduced
on the world), and each expert's gradients are all-reduced over the ranks that hold the same
experts (the expert-data-parallel groups, world / N ranks each).

    pardiag profile examples/train_moe.py --nproc-per-node 4 -- --ep 2
"""

from __future__ import annotations

import warnings

import _common as C
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.nn.functional import all_to_all_single

# The autograd-aware all_to_all_single is deprecated in favour of the functional collectives,
# whose gloo path falls back to all-gather + chunk; keep the real all-to-all on gloo.
warnings.filterwarnings("ignore", message=".*all_to_all_single is deprecated.*")


class MoE(nn.Module):
    """Top-1 routed experts, ``experts_per_rank`` on each rank of the EP group."""

    def __init__(self, width: int, experts_per_rank: int, group, rank: int, world: int,
                 route_skew: float = 0.0, hot_rank: int = 0) -> None:
        super().__init__()
        self.group, self.world, self.local = group, world, experts_per_rank
        self.route_skew, self.hot_expert = route_skew, hot_rank * experts_per_rank
        self.router = nn.Linear(width, experts_per_rank * world)
        torch.manual_seed(100 + rank)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(),
                                                   nn.Linear(2 * width, width))
                                     for _ in range(experts_per_rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        expert = self.router(x).argmax(dim=-1)                 # (tokens,)
        skewed = round(self.route_skew * expert.shape[0])
        if skewed:  # the planted skewed router: these tokens all go to one expert
            expert = torch.cat([torch.full_like(expert[:skewed], self.hot_expert),
                                expert[skewed:]])
        order = torch.argsort(expert)
        dest = expert[order] // self.local                     # destination rank per token
        send_counts = torch.bincount(dest, minlength=self.world)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        send, recv = send_counts.tolist(), recv_counts.tolist()
        tokens = all_to_all_single(x.new_empty(sum(recv), x.shape[-1]), x[order],
                                   recv, send, group=self.group)   # dispatch
        local_ids = all_to_all_single(expert.new_empty(sum(recv)), expert[order] % self.local,
                                      recv, send, group=self.group)
        out = torch.zeros_like(tokens)
        for e, mod in enumerate(self.experts):
            mask = local_ids == e
            if mask.any():
                out = out.index_put((mask.nonzero(as_tuple=True)[0],), mod(tokens[mask]))
        back = all_to_all_single(x.new_empty(x.shape[0], x.shape[-1]), out, send, recv,
                                 group=self.group)              # combine
        result = torch.empty_like(back)
        result[order] = back
        return x + result


def main() -> None:
    p = C.base_parser(__doc__)
    p.add_argument("--experts-per-rank", type=int, default=2)
    p.add_argument("--route-skew", type=float, default=0.0,
                   help="share of every rank's tokens routed to --hot-rank's first expert (0-1)")
    p.add_argument("--hot-rank", type=int, default=0, help="the rank the skewed router favours")
    p.add_argument("--ep", type=int, default=0,
                   help="ranks per expert-parallel group, folded into data parallel (default: "
                        "the world size, no folding)")
    args = p.parse_args()
    env = C.init_distributed(args.pin_cpu)
    ep = args.ep or env.world_size
    if ep < 1 or env.world_size % ep:
        p.error(f"--ep must divide the world size ({env.world_size})")
    if ep == env.world_size:
        mesh = init_device_mesh(env.device.type, (ep,), mesh_dim_names=("ep",))
        group = dense_group = mesh.get_group("ep")
        expert_group = None
    else:  # folded: (expert data parallel, expert parallel); the dense weights on the world
        mesh = init_device_mesh(env.device.type, (env.world_size // ep, ep),
                                mesh_dim_names=("edp", "ep"))
        group, expert_group = mesh.get_group("ep"), mesh.get_group("edp")
        dense_group = dist.group.WORLD
    torch.manual_seed(0)
    dense = nn.Sequential(nn.Linear(64, args.width), C.Block(args.width))
    if not 0.0 <= args.route_skew <= 1.0:
        p.error("--route-skew must be between 0 and 1")
    moe = MoE(args.width, args.experts_per_rank, group, dist.get_rank(group), ep,
              args.route_skew, args.hot_rank % ep)
    head = nn.Linear(args.width, 10)
    model = nn.ModuleDict({"dense": dense, "moe": moe, "head": head}).to(env.device)
    expert_params = {id(q) for q in moe.experts.parameters()}
    dense_params = [q for q in model.parameters() if id(q) not in expert_params]
    opt = C.make_optimizer(model.parameters(), args.optimizer)
    loss_fn = nn.CrossEntropyLoss()

    expert_list = list(moe.experts.parameters())

    def sync_dense_grads() -> None:  # data parallel for the replicated (non-expert) weights
        for q in dense_params:
            if q.grad is not None:
                dist.all_reduce(q.grad, group=dense_group)
                q.grad /= env.world_size
        if expert_group is not None:  # the same experts on the other EP groups' ranks
            for q in expert_list:   # an expert that got no token here still takes part
                if q.grad is None:
                    q.grad = torch.zeros_like(q)
                dist.all_reduce(q.grad, group=expert_group)
                q.grad /= env.world_size // ep

    C.train(args, env, opt, lambda x, y: loss_fn(head(moe(dense(x))), y), "train_moe",
            after_backward=sync_dense_grads)

if __name__ == "__main__":
    main()
