"""Records ``tests/cpu_traces/fsdp2_with_stack/``: FSDP2 (fully_shard per block and the model)
over 2 ranks on gloo, one step profiled by the script's own torch profiler with Python stacks,
as a user records a trace for other tools (nothing of pardiag runs).

    torchrun --nproc-per-node 2 tests/cpu_traces/record_fsdp2_with_stack.py OUT_FOLDER

Record it on a quiet machine: the check it serves compares two measures of one trace, and a
rank descheduled while it waits resumes late, which blurs where its waits end."""

import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.profiler import ProfilerActivity, profile

dist.init_process_group("gloo")
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.GELU())
                              for _ in range(4)])
for block in model:
    fully_shard(block)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), 1e-3)
x = torch.randn(64, 512)


def step() -> None:
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()


for _ in range(3):
    step()
with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
    step()
prof.export_chrome_trace(f"{sys.argv[1]}/rank{dist.get_rank()}.json")
dist.destroy_process_group()
