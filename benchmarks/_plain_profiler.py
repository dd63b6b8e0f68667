"""What a user would write by hand: the script under torch.profiler, stepped by the optimizer,
with the same schedule and options as pardiag but none of pardiag's hooks (benchmark baseline).

    torchrun ... benchmarks/_plain_profiler.py WAIT WARMUP ACTIVE OUTDIR SCRIPT [script args]
"""

import os
import runpy
import sys

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.profiler import ProfilerActivity, profile, schedule

wait, warmup, active, out, script, *args = sys.argv[1:]
rank = int(os.environ.get("RANK", "0"))
prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                                    if torch.cuda.is_available() else []),
               schedule=schedule(wait=int(wait), warmup=int(warmup), active=int(active), repeat=1),
               on_trace_ready=lambda p: p.export_chrome_trace(f"{out}/plain{rank}.json.gz"),
               record_shapes=True, profile_memory=True)
register_optimizer_step_post_hook(lambda *a: prof.step())
sys.argv = [script, *args]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
prof.start()
runpy.run_path(script, run_name="__main__")
prof.stop()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)  # gloo processes can abort at interpreter exit (FACTS §1); the baseline must not
