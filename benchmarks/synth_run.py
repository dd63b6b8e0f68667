"""Write a synthetic multi-rank GPU run: Kineto-like traces that HTA and pardiag both read.

    .venv/bin/python benchmarks/synth_run.py OUT --ranks 64 --mb 15 [--gz]

Per rank and profiler step: a forward and a backward pass over ``layers`` layers (CPU ops
``aten::linear``/``aten::addmm`` and their backward ops on the main thread, each launching a
compute kernel on stream 7 through ``cudaLaunchKernel`` with correlation ids and flow events),
DDP-style gradient buckets (``record_param_comms`` + ``nccl:all_reduce`` on the CPU, an
``ncclKernel_AllReduce`` on stream 20 with NCCL metadata args) overlapping the backward pass,
and ``[memory]`` instant events. Each rank's clock is shifted by up to ±200 µs; rank 3's kernels
run 15% longer; the layer count varies a little per rank. Ranks are generated independently:
a collective starts when that rank is ready, so cross-rank waiting is not modelled (the files
exercise parsing and every analysis at scale, not a realistic straggler). Steps are added until the
JSON of rank 0 reaches ``--mb`` MB (10⁶ bytes).
"""

from __future__ import annotations

import argparse
import gzip
import random
import time
from pathlib import Path

import orjson

EPOCH_US = 1_764_000_000_000_000  # µs since the epoch, late 2025


def _rank_events(rank: int, world: int, steps: int, layers: int) -> list[dict]:
    rng = random.Random(rank)
    pid, tid = 1000 + rank, 1000 + rank
    slow = 1.15 if rank == 3 else 1.0
    t = EPOCH_US + rng.uniform(-200, 200) + 10_000
    ev: list[dict] = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "python3"}},
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
         "args": {"name": f"thread {tid} (python3)"}},
        {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
    ]
    # ids start high, as in real traces (HTA 0.5.0 downcasts small correlation ids to int16
    # and then fails to store event indices above 32767 in that column)
    corr = 1_000_000
    ext = 1_000_000
    seq = 0
    n_layers = layers + rank % 3

    def launch(ts: float, kname: str, kts: float, kdur: float, stream: int, kargs: dict) -> None:
        nonlocal corr, ext
        corr += 1
        ext += 1
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid,
                   "tid": tid, "ts": round(ts, 3), "dur": 4.0,
                   "args": {"External id": ext, "cbid": 211, "correlation": corr}})
        ev.append({"ph": "s", "id": corr, "pid": pid, "tid": tid, "ts": round(ts, 3),
                   "cat": "ac2g", "name": "ac2g"})
        ev.append({"ph": "X", "cat": "kernel", "name": kname, "pid": 0, "tid": stream,
                   "ts": round(kts, 3), "dur": round(kdur, 3),
                   "args": {"External id": ext, "queued": 0, "device": 0, "context": 1,
                            "stream": stream, "correlation": corr, "registers per thread": 96,
                            "shared memory": 16384, "blocks per SM": 1.6, "warps per SM": 12.8,
                            "grid": [128, 1, 1], "block": [256, 1, 1],
                            "est. achieved occupancy %": 25, **kargs}})
        ev.append({"ph": "f", "id": corr, "pid": pid, "tid": tid, "ts": round(kts, 3),
                   "cat": "ac2g", "name": "ac2g", "bp": "e"})

    gpu_free = t
    comm_free = t
    alloc = 2_000_000_000
    for step in range(1, steps + 1):
        s0 = t
        step_ev = {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}",
                   "pid": pid, "tid": tid, "ts": round(s0, 3), "dur": 0.0, "args": {}}
        ev.append(step_ev)
        for phase in ("fwd", "bwd"):
            for layer in range(n_layers):
                op = ("aten::linear" if phase == "fwd"
                      else "autograd::engine::evaluate_function: AddmmBackward0")
                dur = rng.uniform(30, 50)
                ext += 1
                ev.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": pid, "tid": tid,
                           "ts": round(t, 3), "dur": round(dur, 3),
                           "args": {"External id": ext, "Ev Idx": ext, "Sequence number": seq,
                                    "Fwd thread id": 0}})
                seq += 1
                ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": pid,
                           "tid": tid, "ts": round(t + 2, 3), "dur": round(dur - 6, 3),
                           "args": {"External id": ext + 1, "Ev Idx": ext + 1,
                                    "Input Dims": [[4096], [512, 4096], [4096, 4096]],
                                    "Input type": ["c10::BFloat16"] * 3}})
                kdur = rng.uniform(60, 120) * slow * (2 if phase == "bwd" else 1)
                kts = max(gpu_free, t + 10)
                launch(t + 5, "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_"
                              "bf16_64x64_32x6_tn_align8>(cutlass_80_tensorop_bf16_s16816gemm_"
                              "relu_bf16_64x64_32x6_tn_align8::Params)", kts, kdur, 7, {})
                gpu_free = kts + kdur
                if layer % 4 == 0:
                    alloc += rng.randint(-1, 1) * 8_388_608
                    ev.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                               "pid": pid, "tid": tid, "ts": round(t + 3, 3),
                               "args": {"Total Reserved": 4_000_000_000, "Total Allocated": alloc,
                                        "Bytes": 8_388_608, "Addr": 140_000_000_000 + layer,
                                        "Device Id": 0, "Device Type": 1}})
                t += dur + rng.uniform(1, 4)
                if phase == "bwd" and layer % 8 == 7:  # a gradient bucket is ready
                    ext += 1
                    ev.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms",
                               "pid": pid, "tid": tid, "ts": round(t, 3), "dur": 12.0,
                               "args": {"External id": ext, "Collective name": "allreduce",
                                        "dtype": "BFloat16", "In msg nelems": 25_000_000,
                                        "Out msg nelems": 25_000_000, "Group size": world,
                                        "Process Group Name": "0",
                                        "Process Group Description": "default_pg",
                                        "Process Group Ranks": f"[0, ..., {world - 1}]"}})
                    ev.append({"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce",
                               "pid": pid, "tid": tid, "ts": round(t + 1, 3), "dur": 10.0,
                               "args": {"External id": ext + 1}})
                    cts = max(comm_free, gpu_free - 50)
                    cdur = rng.uniform(200, 260)
                    launch(t + 2, "ncclKernel_AllReduce_RING_LL_Sum_bf16(ncclWorkElem)", cts,
                           cdur, 20, {"Collective name": "allreduce", "Group size": world,
                                      "In msg nelems": 25_000_000, "dtype": "BFloat16",
                                      "Process Group Name": "0"})
                    comm_free = cts + cdur
                    t += 14
        t = max(t, gpu_free, comm_free) + 20  # optimizer step, synchronize
        step_ev["dur"] = round(t - s0, 3)
    ev.append({"ph": "X", "cat": "Trace", "ts": EPOCH_US, "dur": round(t - EPOCH_US, 3),
               "pid": "Spans", "tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)",
               "args": {"Op count": 0}})
    return ev


def rank_doc(rank: int, world: int, steps: int, layers: int = 24) -> dict:
    """The trace document of one rank (see the module docstring)."""
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
            "record_shapes": 1, "traceEvents": _rank_events(rank, world, steps, layers),
            "traceName": f"rank{rank}.pt.trace.json", "displayTimeUnit": "ms"}


def dumps(doc: dict) -> bytes:
    """JSON spaced like Kineto's files (``"rank": 0``, ``, "``): HTA 0.5.0 finds a file's rank
    with the pattern ``"rank":\\s+(\\d+)`` and takes every compact file for rank 0. (The
    generated strings hold no ``":`` or ``,"``, so the replacement touches only separators.)"""
    return orjson.dumps(doc).replace(b'":', b'": ').replace(b',"', b', "')


def steps_for(mb: float, layers: int = 24) -> int:
    """Profiler steps that make one rank's JSON about ``mb`` MB."""
    one = len(dumps(rank_doc(0, 2, 1, layers)))
    return max(1, round(mb * 1e6 / one))


def write_run(out: Path, ranks: int, mb: float, gz: bool = False, layers: int = 24) -> Path:
    """Write ``ranks`` trace files of about ``mb`` MB each into ``out`` (created); returns it."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    steps = steps_for(mb, layers)
    for r in range(ranks):
        data = dumps(rank_doc(r, ranks, steps, layers))
        name = f"rank{r}.pt.trace.json" + (".gz" if gz else "")
        (out / name).write_bytes(gzip.compress(data, 3) if gz else data)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("out", type=Path)
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--mb", type=float, default=15.0, help="JSON size per rank, MB")
    p.add_argument("--gz", action="store_true", help="gzip the files")
    a = p.parse_args()
    t0 = time.perf_counter()
    write_run(a.out, a.ranks, a.mb, a.gz)
    size = sum(f.stat().st_size for f in a.out.iterdir()) / 1e6
    print(f"wrote {a.ranks} ranks to {a.out} ({size:.0f} MB on disk) in "
          f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
