"""What counting FLOPs costs a report: ``pardiag report FOLDER --no-cache`` timed with the FLOP
counting on, on without the per-module attribution (backward functions' args not kept, no op
given a module), and off (the FLOP op table emptied before the command runs: no op's args are
kept for it and no op is counted), interleaved, each run a fresh process.

    .venv/bin/python benchmarks/bench_report.py --repeat 1 --replicate \
        ../shared/real_traces/hta_trace_diff_test/rank1.json.gz:8 --work /tmp/bw
    .venv/bin/python benchmarks/flops_cost.py /tmp/bw/hta_trace_diff_test_rank1_x8 --pairs 5
"""

import argparse
import statistics
import subprocess
import sys
import time

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("folder")
p.add_argument("--pairs", type=int, default=5)
a = p.parse_args()
base = ["report", a.folder, "--no-cache", "-q", "-o", "/tmp/flops_cost.html"]
run = f"from pardiag.cli import run; import sys; sys.argv = ['pardiag'] + {base!r}; run()"
# "no modules": the backward functions' args not kept and no op given a module (what the
# per-module attribution adds to the FLOP counting)
no_modules = (
    "import numpy as np, pardiag.analyzer.trace.columns as c; "
    "import pardiag.analyzer.per_rank.flops as f; "
    "c._keeps = lambda n: bool(c._KEEP_ARGS_RE.search(n)) or n in c.vocab.FLOP_OPS; "
    "f.attribute_modules = lambda ev, ops: (np.full(len(ops), None, dtype=object), "
    "np.full(len(ops), None, dtype=object), np.zeros(len(ops), dtype=bool)); ")
code = {"with": run, "no modules": no_modules + run,
        "without": "import pardiag.analyzer.trace.vocab as v; v.FLOP_OPS.clear(); " + run}
times: dict[str, list[float]] = {k: [] for k in code}
order = list(code)
for i in range(a.pairs):
    for k in (order if i % 2 == 0 else order[::-1]):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code[k]], check=True, capture_output=True)
        times[k].append(time.perf_counter() - t0)
for k, v in times.items():
    print(f"{k} FLOP counting: {[round(x, 2) for x in v]} s, median {statistics.median(v):.2f} s")
