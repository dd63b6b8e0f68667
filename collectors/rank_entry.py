"""Entry point of every rank under ``pardiag profile`` (run by torchrun as ``-m``).

It reads its configuration from the ``PARDIAG_PROFILE_CONFIG`` environment variable (JSON written
by :mod:`pardiag.collectors.launch`), wraps the user's unmodified script in ``torch.profiler``,
steps the profiler on every step of the first top-level optimizer, writes the rank's trace and
metadata into the run folder, then ends the process cleanly (barrier, flush, ``os._exit``) with the
script's own exit code. See FACTS §1: gloo runs that leave the process group alive end in SIGABRT
10-40% of the time without this.
"""

from __future__ import annotations

import json
import os
import platform
import runpy
import socket
import sys
import time
import traceback
from pathlib import Path

from pardiag import __version__, layout

CONFIG_ENV = "PARDIAG_PROFILE_CONFIG"


class _OptimizerStepper:
    """Steps a profiler once per step of the first top-level optimizer.

    Global optimizer hooks fire for every optimizer, including ones nested inside another
    (``ZeroRedundancyOptimizer`` calls its inner optimizer's ``step``). The stepper counts the
    step depth with a pre-hook and steps only when the outermost step of the first optimizer it
    saw at depth 0 ends.
    """

    def __init__(self, on_step) -> None:
        self._on_step = on_step
        self._depth = 0
        self._owner: int | None = None
        self.steps = 0

    def pre(self, optimizer, args, kwargs) -> None:
        self._depth += 1

    def post(self, optimizer, args, kwargs) -> None:
        self._depth -= 1
        if self._depth != 0:
            return
        if self._owner is None:
            self._owner = id(optimizer)
        if id(optimizer) == self._owner:
            self.steps += 1
            self._on_step()


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    os.replace(tmp, path)


def _exit_code_of(exc: BaseException | None) -> int:
    if exc is None:
        return 0
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        return 1  # sys.exit("message") prints the message and exits 1
    return 1


def _device_info(torch) -> dict:
    if torch.cuda.is_available():
        idx = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        return {"device": f"cuda:{idx}", "device_name": props.name,
                "device_memory_bytes": int(props.total_memory)}
    return {"device": "cpu", "device_name": platform.processor() or platform.machine(),
            "device_memory_bytes": None}


def main() -> None:
    """Run the user's script as ``__main__`` under the profiler; never returns."""
    import torch
    import torch.distributed as dist
    from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                       register_optimizer_step_pre_hook)
    from torch.profiler import ProfilerActivity, profile, schedule

    cfg = json.loads(os.environ[CONFIG_ENV])
    out = Path(cfg["out"])
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    script = cfg["script"]

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    trace_file = layout.trace_path(out, rank)
    traces_written: list[str] = []
    seen: dict = {"backend": None}

    def on_trace_ready(prof) -> None:
        prof.export_chrome_trace(str(trace_file))
        traces_written.append(trace_file.name)
        if dist.is_available() and dist.is_initialized():  # the script may destroy it later
            seen["backend"] = str(dist.get_backend())

    prof = profile(
        activities=activities,
        schedule=schedule(wait=cfg["wait"], warmup=cfg["warmup"], active=cfg["active"], repeat=1),
        on_trace_ready=on_trace_ready,
        record_shapes=True,
        profile_memory=True,
    )
    stepper = _OptimizerStepper(prof.step)
    hooks = [
        register_optimizer_step_pre_hook(stepper.pre),
        register_optimizer_step_post_hook(stepper.post),
    ]

    started = time.time()
    error: BaseException | None = None
    saved_argv = sys.argv
    sys.argv = [script, *cfg["args"]]
    sys.path.insert(0, str(Path(script).resolve().parent))
    prof.start()
    try:
        runpy.run_path(script, run_name="__main__")
    except BaseException as exc:  # the script's own failure: recorded, reported, exit code kept
        error = exc
    finally:
        sys.argv = saved_argv
        for h in hooks:
            h.remove()
        try:
            prof.stop()
        except Exception as exc:  # a trace that cannot be written must not hide the script's result
            print(f"pardiag: rank {rank}: could not write the trace: {exc}", file=sys.stderr)

    code = _exit_code_of(error)
    failed = error is not None and code != 0
    meta = {
        **layout.sidecar_header("rank"),
        "rank": rank,
        "world_size": world_size,
        "local_rank": local_rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "cpu_count": os.cpu_count(),
        "torch_version": torch.__version__,
        "pardiag_version": __version__,
        "backend": seen["backend"] or (str(dist.get_backend())
                                       if dist.is_available() and dist.is_initialized() else None),
        **_device_info(torch),
        "optimizer_steps": stepper.steps,
        "trace_file": traces_written[-1] if traces_written else None,
        "started_unix": started,
        "ended_unix": time.time(),
        "exit_code": code,
        "status": "error" if failed else "ok",
        "error": None if not failed else "".join(traceback.format_exception_only(type(error), error)).strip(),
    }
    _write_json(layout.rank_meta_path(out, rank), meta)
    if failed:
        traceback.print_exception(type(error), error, error.__traceback__)
        print(f"pardiag: rank {rank} raised {meta['error']}", file=sys.stderr, flush=True)
    elif dist.is_available() and dist.is_initialized():
        try:
            dist.barrier()
            dist.destroy_process_group()
        except Exception:  # a peer already gone: nothing left to synchronise with
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
