"""What ``pardiag profile``'s module ranges (:class:`pardiag.collectors.modules.ModuleRanges`) add
to each module call inside the profiled window: forwards of a model of many small modules (50
blocks of Linear(8, 8) + ReLU: 151 module calls), timed under an active CPU profiler with the
ranges installed and without, in interleaved blocks, one thread.

    .venv/bin/python benchmarks/module_ranges_cost.py --blocks 10
"""

import argparse
import statistics
import time

import torch
from torch import nn
from torch.profiler import profile

from pardiag.collectors.modules import ModuleRanges

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--blocks", type=int, default=10, help="interleaved blocks of each kind")
p.add_argument("--forwards", type=int, default=200, help="forwards timed per block")
a = p.parse_args()
torch.set_num_threads(1)
model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(50)])
calls = sum(1 for _ in model.modules())
x = torch.randn(2, 8)


def per_forward_us() -> float:
    t0 = time.perf_counter()
    for _ in range(a.forwards):
        model(x)
    return (time.perf_counter() - t0) / a.forwards * 1e6


times: dict[str, list[float]] = {"without": [], "with": []}
ranges = ModuleRanges()
with profile() as prof:
    per_forward_us()   # warm
    for i in range(a.blocks):
        for kind in (("without", "with") if i % 2 == 0 else ("with", "without")):
            if kind == "with":
                ranges.install()
            times[kind].append(per_forward_us())
            ranges.uninstall()
    prof.step()
med = {k: statistics.median(v) for k, v in times.items()}
extra = [(w - o) / calls for w, o in zip(times["with"], times["without"])]
print(f"torch {torch.__version__}; {calls} module calls per forward; "
      f"{a.blocks} interleaved blocks of {a.forwards} forwards")
for k, v in times.items():
    print(f"{k} ranges: per forward µs {[round(t, 1) for t in v]}, median {med[k]:.1f}")
print(f"added per module call: median {statistics.median(extra):.2f} µs "
      f"(min {min(extra):.2f}, max {max(extra):.2f})")
