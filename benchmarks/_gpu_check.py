"""Checks of ``benchmarks/gpu_check.sh`` on its profiled runs (not a test: it needs a GPU).

    python benchmarks/_gpu_check.py RUN_DIR --backend nccl|gloo [--expect-comm-kernels]

Prints one ``PASS``/``FAIL`` line per check and exits 1 when any failed:

* every rank wrote its metadata with status ok, on a CUDA device, with the given backend;
* the CUDA peaks are in the metadata (``memory.peak_allocated_bytes`` from the allocator and
  ``memory.trace_peaks.cuda`` from the trace's memory events, both > 0);
* rank 0's metadata holds ``nvidia-smi topo -m`` (on a node where nvidia-smi runs);
* each trace holds GPU kernels (``cat`` ``kernel``);
* ``--expect-comm-kernels`` (NCCL, 2 ranks or more; skipped with one, whose NCCL launches no
  kernel): the collective records were placed on NCCL kernels of the trace (``matched``
  ``kernel``), not only on the CPU ops that launched them; gloo runs:
  the records were placed on gloo's own ops (``matched`` ``gloo``).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path)
    p.add_argument("--backend", choices=["nccl", "gloo"], required=True)
    p.add_argument("--expect-comm-kernels", action="store_true")
    a = p.parse_args()
    from pardiag.analyzer.trace import read_trace_json

    failed = 0

    def check(ok: bool, what: str) -> None:
        nonlocal failed
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {a.run.name}: {what}", flush=True)

    metas = sorted((a.run / "pardiag").glob("rank*.meta.json"))
    check(bool(metas), f"{len(metas)} rank metadata file(s)")
    matched: collections.Counter = collections.Counter()
    for path in metas:
        m = json.loads(path.read_text())
        r = m["rank"]
        check(m["status"] == "ok" and str(m["device"]).startswith("cuda")
              and m["backend"] == a.backend,
              f"rank {r}: status {m['status']}, device {m['device']}, backend {m['backend']}")
        mem = m.get("memory") or {}
        cuda_trace = ((mem.get("trace_peaks") or {}).get("cuda") or {})
        check((mem.get("peak_allocated_bytes") or 0) > 0
              and (cuda_trace.get("peak_allocated_bytes") or 0) > 0,
              f"rank {r}: CUDA peak allocated {mem.get('peak_allocated_bytes')} B (allocator), "
              f"{cuda_trace.get('peak_allocated_bytes')} B (trace)")
        if m["local_rank"] == 0:
            topo = m.get("nvidia_smi_topo") or ""
            check("GPU0" in topo, f"rank {r}: nvidia-smi topo -m in the metadata "
                                  f"({len(topo.splitlines())} lines)")
        if not m.get("trace_file"):
            check(False, f"rank {r}: no trace written")
            continue
        doc = read_trace_json(a.run / m["trace_file"])
        kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
        nccl = [e for e in kernels if "nccl" in str(e.get("name", "")).lower()]
        check(bool(kernels), f"rank {r}: {len(kernels)} GPU kernels in the trace "
                             f"({len(nccl)} NCCL)")
        comms = a.run / "pardiag" / f"rank{r}.comms.json"
        if comms.exists():
            recs = json.loads(comms.read_text())["records"]
            matched.update(x.get("matched") for x in recs)
    if a.expect_comm_kernels and len(metas) < 2:
        # a group of one: NCCL copies on the device and launches no kernel of its own
        print(f"SKIP {a.run.name}: collective records on NCCL kernels need 2 ranks or more "
              f"(one rank here; records: {dict(matched)})", flush=True)
    elif a.expect_comm_kernels:
        check(matched.get("kernel", 0) > 0,
              f"collective records placed on NCCL kernels: {dict(matched)}")
    elif a.backend == "gloo":
        check(matched.get("gloo", 0) > 0, f"collective records placed on gloo ops: {dict(matched)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
