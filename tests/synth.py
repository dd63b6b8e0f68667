"""Builders for synthetic Kineto traces whose right answers are known."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


class TraceBuilder:
    """Accumulates Chrome-trace events for one rank; ``write`` saves a Kineto-like file."""

    def __init__(self, rank: int | None = 0, world_size: int = 2, backend: str = "nccl",
                 pid: int = 100, main_tid: int = 1) -> None:
        self.events: list[dict] = []
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.pid = pid
        self.main_tid = main_tid
        self._corr = 0

    def thread_name(self, tid, name: str) -> TraceBuilder:
        self.events.append({"ph": "M", "name": "thread_name", "pid": self.pid, "tid": tid,
                            "args": {"name": name}})
        return self

    def cpu(self, name: str, ts: float, dur: float, tid=None, cat: str = "cpu_op",
            args: dict | None = None) -> TraceBuilder:
        ev = {"ph": "X", "cat": cat, "name": name, "pid": self.pid,
              "tid": self.main_tid if tid is None else tid, "ts": ts, "dur": dur}
        if args:
            ev["args"] = args
        self.events.append(ev)
        return self

    def step(self, n: int, ts: float, dur: float) -> TraceBuilder:
        return self.cpu(f"ProfilerStep#{n}", ts, dur, cat="user_annotation")

    def kernel(self, name: str, ts: float, dur: float, stream: int = 7,
               launch_ts: float | None = None, cat: str = "kernel",
               args: dict | None = None) -> TraceBuilder:
        """A GPU kernel; with ``launch_ts`` a cudaLaunchKernel runtime event links to it."""
        self._corr += 1
        kargs = {"device": 0, "stream": stream, "correlation": self._corr, **(args or {})}
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream,
                            "ts": ts, "dur": dur, "args": kargs})
        if launch_ts is not None:
            self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                                "pid": self.pid, "tid": self.main_tid, "ts": launch_ts, "dur": 1,
                                "args": {"correlation": self._corr}})
        return self

    def doc(self) -> dict:
        d = {"schemaVersion": 1, "traceEvents": self.events}
        if self.rank is not None:
            d["distributedInfo"] = {"backend": self.backend, "rank": self.rank,
                                    "world_size": self.world_size}
        return d

    def write(self, path: Path, gz: bool = False) -> Path:
        data = json.dumps(self.doc()).encode()
        path = Path(path)
        path.write_bytes(gzip.compress(data) if gz else data)
        return path


def gpu_rank(rank: int = 0) -> TraceBuilder:
    """The planted GPU trace of the tests (answers in test_breakdown.py).

    Steps: #1 CPU [0,100), #2 CPU [100,200). Compute kernels [10,40) [50,70) (step 1), [110,150)
    (step 2); all-reduce [30,60) (step 1); all-gather [140,180) (step 2); memcpy [80,90) (step 1).
    """
    b = TraceBuilder(rank=rank)
    b.step(1, 0, 100).step(2, 100, 100)
    b.kernel("void gemm_kernel<float>(float*)", 10, 30, launch_ts=1)
    b.kernel("void relu_kernel(float*)", 50, 20, launch_ts=2)
    b.kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
             30, 30, stream=20, launch_ts=3)
    b.kernel("Memcpy DtoH (Device -> Pinned)", 80, 10, stream=9, launch_ts=4, cat="gpu_memcpy")
    b.kernel("void gemm_kernel<float>(float*)", 110, 40, launch_ts=101)
    b.kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 140, 40,
             stream=20, launch_ts=102)
    return b


def cpu_rank(rank: int = 0) -> TraceBuilder:
    """The planted CPU/gloo trace of the tests (answers in test_breakdown.py).

    Main thread 1: step #5 [0,100); aten::addmm [0,40); autograd op [40,80) holding aten::mm
    [41,59) and c10d::allreduce_ [60,62); c10d::wait [85,95). gloo thread 2: gloo:all_reduce
    [62,95) and an aten::copy_ [70,72) that is not compute (worker thread).
    """
    b = TraceBuilder(rank=rank, backend="gloo")
    b.thread_name(1, "thread 1 (python3)").thread_name(2, "thread 2 (pt_gloo_runloop)")
    b.step(5, 0, 100)
    b.cpu("aten::addmm", 0, 40)
    b.cpu("autograd::engine::evaluate_function: AddmmBackward0", 40, 40)
    b.cpu("aten::mm", 41, 18)
    b.cpu("c10d::allreduce_", 60, 2, args={"Input Dims": [[1024]], "Input type": ["float"]})
    b.cpu("c10d::wait", 85, 10)
    b.cpu("gloo:all_reduce", 62, 33, tid=2, cat="user_annotation")
    b.cpu("aten::copy_", 70, 2, tid=2)
    return b


def write_sidecar(path: Path, kind: str, rank: int | None, body: dict) -> Path:
    """A pardiag sidecar (run.json or rank{R}.<kind>.json) with the schema header."""
    from pardiag import layout

    doc = {**layout.sidecar_header(kind), **({"rank": rank} if rank is not None else {}), **body}
    Path(path).write_text(json.dumps(doc))
    return Path(path)


def record(op: str, seq: int, start: float, end: float, pg: str = "0", ranks=(0, 1, 2),
           nbytes: int = 1_000_000, issue: float | None = None, peer=None) -> dict:
    """One collective record as rank{R}.comms.json holds it (µs on the rank's clock)."""
    # an all-gather's input is its share of the gathered buffer (the recorder's sizes)
    in_bytes = nbytes // max(len(ranks), 1) if op == "all_gather" else nbytes
    return {"op": op, "pg_name": pg, "pg_desc": "default_pg", "pg_ranks": list(ranks), "seq": seq,
            "bytes": nbytes, "in_bytes": in_bytes, "out_bytes": nbytes, "dtype": "Float",
            "peer": peer, "issue_us": start if issue is None else issue, "start_us": start,
            "end_us": end, "matched": "gloo", "source": "flight_recorder"}


def relayout(src: Path, dst: Path, *, old: bool = False) -> Path:
    """A copy of the run folder ``src`` (of either layout) in today's layout
    (:mod:`pardiag.layout`: only the traces at the top, sidecars in ``pardiag/``), or with
    ``old`` in the older one (sidecars beside the traces)."""
    import shutil

    from pardiag import layout

    dst = Path(dst)
    side = dst if old else layout.sidecar_dir(dst)
    side.mkdir(parents=True, exist_ok=True)
    sidecars = layout.find_sidecars(src)
    for f in sidecars:
        shutil.copy2(f, side / f.name)
    for f in Path(src).iterdir():
        if f.is_file() and f not in sidecars:
            shutil.copy2(f, dst / f.name)
    return dst


def recorded_op_counts(run: Path, rank: int) -> dict[str, int]:
    """``{op: records}`` of a pardiag run's ``rank{R}.comms.json`` placed in the trace (what a
    rank's collective counts must equal; a record issued as the profiler's window closed can
    have no transfer in the trace, ``start_us`` null)."""
    from collections import Counter

    from pardiag import layout

    doc = json.loads(layout.comms_path(Path(run), rank).read_text())
    return dict(Counter(rec["op"] for rec in doc["records"] if rec["start_us"] is not None))
