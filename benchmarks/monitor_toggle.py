"""What ``pardiag profile --monitor``'s wrappers cost a pipeline, inside one run: the pipeline
example's 1F1B setup (2 ranks, one stage each, 8 microbatches of ``--batch`` samples, width 256)
under plain ``torchrun``, with :class:`pardiag.collectors.monitor.Monitor` installed and
removed every ``--block`` steps. Runs of a pipeline differ by 20–100% on a 2-core VM; the
steps of one run differ by a few percent, so blocks of one run compare the monitor's own cost
where whole runs cannot.

    .venv/bin/python benchmarks/monitor_toggle.py --blocks 20 --block 10 --runs 3
    .venv/bin/python benchmarks/monitor_toggle.py --variant passthrough   # stand-ins, below

Per run: the median step time (ms) of the blocks with the monitor and without (each block's
first two steps left out), and their ratio − 1. Not the whole of ``--monitor``: the rest of
pardiag's rank (the recorders' wrappers, the optimizer-step hooks, the watchdog thread) is not
toggled; ``overhead.py --monitor`` measures the whole against plain runs. ``--variant``
toggles a stand-in for the monitor's wrappers instead (:func:`_stand_in`): what a wrapper that
records nothing costs the same pipeline; ``--variant recorder`` toggles pardiag's
point-to-point recorder (:class:`pardiag.collectors.comms.P2PRecorder`, installed in every
profiled and monitored run), and ``--with-recorder`` keeps it installed under the monitor's
wrappers, as a monitored run does.
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


def _stand_in(variant: str, nested, name: str, fn):
    """A stand-in for the monitor's wrapper of ``fn`` (``--variant``): ``passthrough`` only
    calls through; ``flag-clock`` also keeps the monitor's per-thread flag and reads the clock
    before and after the call, recording nothing."""
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
        del t0, t1
        return out
    return flag_clock


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
    if args.variant in ("passthrough", "flag-clock"):
        mon._wrap = functools.partial(_stand_in, args.variant, mon._nested)
    # pardiag's point-to-point recorder: under a monitored run's wrappers for the whole run
    # (--with-recorder), or what is toggled (--variant recorder)
    from pardiag.collectors.comms import P2PRecorder
    recorder = P2PRecorder()
    if args.with_recorder:
        recorder.install()
    times: dict[str, list[float]] = {"with": [], "without": []}
    step = 0
    for blk in range(args.blocks + 1):   # block 0 warms up
        kind = "with" if blk % 2 else "without"
        if kind == "with" and args.variant == "recorder":
            recorder.install()
        elif kind == "with":
            mon.install()
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
            if kind == "with":
                mon.on_step(step, w0, time.time_ns())
            if blk > 0 and i >= 2:
                times[kind].append((t1 - t0) / 1e6)
            step += 1
        if kind == "with" and args.variant == "recorder":
            recorder.uninstall()
        elif kind == "with":   # the wrappers out, the file kept open
            for owner, name, orig in reversed(mon._patched):
                setattr(owner, name, orig)
            mon._patched.clear()
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
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--work", default="/tmp/monitor_toggle")
    p.add_argument("--variant", choices=("monitor", "passthrough", "flag-clock", "recorder"),
                   default="monitor", help="what is toggled: the monitor's wrappers (default), "
                   "wrappers that only call through, or that also keep its flag and read the "
                   "clock around the call, or pardiag's point-to-point recorder")
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
             *(["--with-recorder"] if args.with_recorder else [])],
            capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]))
    pcts = [r["pct"] for r in rows]
    print(f"{args.runs} runs × {args.blocks} blocks of {args.block} steps: {args.variant} adds "
          f"{statistics.median(pcts):+.1f}% (median; runs {min(pcts):+.1f}% to {max(pcts):+.1f}%)")


if __name__ == "__main__":
    main()
