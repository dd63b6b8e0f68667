"""What pardiag's wrappers cost a pipeline, inside one run: the pipeline example's 1F1B setup
(2 ranks, one stage each, 8 microbatches of ``--batch`` samples, width 256) under plain
``torchrun``, with the toggled code installed and removed every ``--block`` steps. Runs of a
pipeline differ by 20–100% on a 2-core VM; the steps of one run differ by a few percent, so
blocks of one run compare the toggled code's cost where whole runs cannot.

    .venv/bin/python benchmarks/monitor_toggle.py --blocks 20 --block 10 --runs 3
    .venv/bin/python benchmarks/monitor_toggle.py --variant recorder --block 1 --skip 0 \
        --blocks 600                                   # toggled every step

Per run: the median step time (ms) of the steps with the toggled code and without (each
block's first ``--skip`` steps left out), and their ratio − 1. Blocks run in the order with,
without, without, with (:func:`_kind`); ``--block 1 --skip 0`` toggles every step, which
halved the spread between runs on a 2-core VM.

``--variant`` (what is toggled):
- ``monitor`` (default): :class:`pardiag.collectors.monitor.Monitor`'s wrappers and its step
  record. It wraps collectives, not sends and receives, so on this pipeline little is left.
  Not the whole of ``--monitor``: the optimizer-step hooks and the watchdog thread are not
  toggled; ``overhead.py --monitor`` measures the whole against plain runs.
- ``recorder``: pardiag's point-to-point recorder
  (:class:`pardiag.collectors.comms.P2PRecorder`, installed for the whole of a profiled run,
  and of a monitored one only for its capture, or with ``--timeout``).
- ``passthrough``, ``flag-clock``, ``spin``: stand-ins at the sends and receives
  (:func:`_stand_in`): what host work there costs, whatever code does it.
- ``none``: nothing; its figure is the harness's own bias and noise, the yardstick.

``--with-recorder`` keeps the recorder installed for the whole run under the toggled code.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: ``--variant`` stand-ins at the sends and receives (:func:`_stand_in`)
STAND_INS = ("passthrough", "flag-clock", "spin")


#: ``--variant spin``: the host time spent after each send or receive (ns), about what
#: pardiag's point-to-point recorder adds to a call outside a window on this kind of machine
#: (``P2PRecorder.self_cost_us``: 1.15 µs on a 2-core EPYC VM)
SPIN_NS = 1200


def _stand_in(variant: str, nested, name: str, fn):
    """A stand-in wrapper of ``fn`` (a send or receive; ``--variant``): ``passthrough`` only
    calls through; ``flag-clock`` also keeps a per-thread flag and reads the clock before and
    after the call, recording nothing; ``spin`` then also busy-waits :data:`SPIN_NS` (host
    time, whatever code would spend it)."""
    if variant == "passthrough":
        @functools.wraps(fn)
        def passthrough(*args, **kwargs):
            return fn(*args, **kwargs)
        return passthrough

    @functools.wraps(fn)
    def flag_clock(*args, **kwargs):
        if getattr(nested, "inside", False):
            return fn(*args, **kwargs)
        nested.inside = True
        t0 = time.time_ns()
        try:
            out = fn(*args, **kwargs)
        finally:
            nested.inside = False
        t1 = time.time_ns()
        if variant == "spin":
            while time.time_ns() - t1 < SPIN_NS:
                pass
        del t0
        return out
    return flag_clock


def _kind(block: int) -> str:
    """Whether ``block`` (0: the warm-up) runs with the toggled code: in the order with,
    without, without, with, and again from block 1, so that a drift of the step time over the
    run falls equally on both (alternating blocks put every "with" block one block earlier)."""
    if block == 0:
        return "without"
    return "with" if (block - 1) % 4 in (0, 3) else "without"


def _rank(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(REPO / "examples"))
    import _common as C
    import torch
    import train_pp as T
    from torch import nn
    from torch.distributed.pipelining import PipelineStage

    from pardiag.collectors.monitor import Monitor

    env = C.init_distributed(True)
    rank, world = env.rank, env.world_size
    stage = PipelineStage(T.build_stage(256, 2, rank == 0, rank == world - 1, rank), rank,
                          world, env.device)
    sched = T.Schedule1F1B(stage, n_microbatches=8, loss_fn=nn.CrossEntropyLoss())
    opt = torch.optim.SGD(stage.submod.parameters(), lr=0.01)
    mon = Monitor(Path(args.work) / f"mon{rank}.jsonl", rank, 50, None, None)
    # pardiag's point-to-point recorder: under the monitor's wrappers for the whole run
    # (--with-recorder), or what is toggled (--variant recorder), or, its wrapper replaced by
    # a stand-in, the stand-in's
    from pardiag.collectors.comms import P2PRecorder
    recorder = P2PRecorder()
    toggled = recorder
    if args.variant in STAND_INS:
        toggled = P2PRecorder()
        toggled._wrap = functools.partial(_stand_in, args.variant, toggled._nested)
    if args.with_recorder:
        recorder.install()
    times: dict[str, list[float]] = {"with": [], "without": []}
    step = 0
    for blk in range(args.blocks + 1):   # block 0 warms up
        kind = _kind(blk)
        if kind == "without" or args.variant == "none":
            pass
        elif args.variant == "monitor":
            mon.install()
        else:
            toggled.install()
        for i in range(args.block):
            g = torch.Generator().manual_seed(step)
            x = torch.randn(args.batch, 64, generator=g)
            y = torch.randint(0, 10, (args.batch,), generator=g)
            t0, w0 = time.perf_counter_ns(), time.time_ns()
            opt.zero_grad(set_to_none=False)
            if rank == 0:
                sched.step(x)
            else:
                sched.step(target=y, losses=[])
            opt.step()
            t1 = time.perf_counter_ns()
            if kind == "with" and args.variant == "monitor":
                mon.on_step(step, w0, time.time_ns())
            if blk > 0 and i >= args.skip:
                times[kind].append((t1 - t0) / 1e6)
            step += 1
        if kind == "without" or args.variant == "none":
            pass
        elif args.variant == "monitor":   # the wrappers out, the file kept open
            for owner, name, orig in reversed(mon._patched):
                setattr(owner, name, orig)
            mon._patched.clear()
        else:
            toggled.uninstall()
    if rank == 0:
        med = {k: statistics.median(v) for k, v in times.items()}
        print(json.dumps({"with_ms": med["with"], "without_ms": med["without"],
                          "pct": 100 * (med["with"] / med["without"] - 1),
                          "steps_each": len(times["with"])}), flush=True)
    torch.distributed.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=20, help="timed blocks (half with)")
    p.add_argument("--block", type=int, default=10, help="steps per block")
    p.add_argument("--skip", type=int, default=2,
                   help="steps left out at each block's start (0 with --block 1)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--work", default="/tmp/monitor_toggle")
    p.add_argument("--variant",
                   choices=("monitor", "recorder", *STAND_INS, "none"),
                   default="monitor", help="what is toggled: the monitor's wrappers (default), "
                   "pardiag's point-to-point recorder, stand-ins at the sends and receives "
                   "(only calling through; also a flag and two clock reads; also spinning "
                   "SPIN_NS), or nothing (the harness's own bias and noise)")
    p.add_argument("--with-recorder", action="store_true",
                   help="pardiag's point-to-point recorder installed for the whole run, under "
                   "the monitor's wrappers, as in a monitored run")
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank:
        _rank(args)
        return
    Path(args.work).mkdir(parents=True, exist_ok=True)
    torchrun = Path(sys.executable).with_name("torchrun")
    rows = []
    for _ in range(args.runs):
        out = subprocess.run(
            [str(torchrun), "--nproc-per-node", "2", "--master-port", "29617", __file__,
             "--rank", "--blocks", str(args.blocks), "--block", str(args.block),
             "--batch", str(args.batch), "--work", args.work, "--variant", args.variant,
             "--skip", str(args.skip),
             *(["--with-recorder"] if args.with_recorder else [])],
            capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]))
    pcts = [r["pct"] for r in rows]
    print(f"{args.runs} runs × {args.blocks} blocks of {args.block} steps: {args.variant} adds "
          f"{statistics.median(pcts):+.1f}% (median; runs {min(pcts):+.1f}% to {max(pcts):+.1f}%)")


if __name__ == "__main__":
    main()
