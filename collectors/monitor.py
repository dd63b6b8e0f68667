"""Always-on monitoring of a long run (``pardiag profile --monitor``): no Kineto, every step
and every collective issued, at a cost meant to stay inside a step's noise.

Per optimizer step (:class:`Monitor`, stepped by the rank entry's optimizer hooks): its end
(epoch ns), its wall time (µs, from the previous step's end), the optimizer step's own time and
the time the script spent in ``DataLoader`` iterators' ``__next__`` (µs).

Per collective issued from Python (``torch.distributed``'s functions, FSDP2's gathers and
scatters among them; not point-to-point calls, :data:`_WRAPPED`) and per DDP gradient bucket (a
timed copy of DDP's default all-reduce registered as its communication hook; a script's own
hook is timed instead): the op, the process group's name, bytes, the issue time (the rank's
arrival), the time the call returned and, where the work completes later, the completion time
(its future's callback; never a host synchronisation). Times are the host's wall clock (epoch
ns), the clock of the rank's other records. Functional collectives (``_c10d_functional``) and
collectives issued from C++ other than DDP's are not seen.

Every :data:`FLUSH_EVERY` steps the rank appends one JSON line to ``rank{R}.monitor.jsonl``
(:func:`pardiag.layout.monitor_path`) and clears its buffers, so memory is bounded (at most
:data:`MAX_CALLS` calls between flushes; more are counted, not kept) and a killed job keeps
every line written before. A line (``schema`` :data:`SCHEMA`)::

    {"schema": ..., "rank": R, "base_ns": epoch ns, "steps": {"index": [...],
     "end_us": [...], "dur_us": [...], "optimizer_us": [...], "data_us": [...],
     "arrive_us": [...], "arrive_first_us": [...], "arrive_last_us": [...]},
     "calls": {"step": [...], "group": [...], "op": [...], "bytes": [...],
     "issue_us": [...], "return_us": [...], "done_us": [...]},
     "dropped_calls": n, "memory": {"rss_bytes": n, "device_bytes": n | null},
     "last": true}   # only on the line written when the script ended

``*_us`` times are µs after ``base_ns`` (``done_us`` -1: not known); ``step`` of a call is the
index of the step it was issued in; ``arrive_us`` is the median issue time of the step's
collectives (-1: none), the rank's arrival in that step as a summary, and ``arrive_first_us``
and ``arrive_last_us`` its first and last collective's: a rank late at one join only (an FSDP
rank that slows before its forward is late at the first all-gather) shows there. With
``keep_calls`` False the line's ``calls`` are empty: only the per-step summary travels (large
jobs).
"""

from __future__ import annotations

import functools
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from ..analyzer.trace import vocab

SCHEMA = "pardiag.monitor/1"
#: Steps between two lines written (and buffers cleared).
FLUSH_EVERY = 50
#: Calls kept between two flushes; more are counted in ``dropped_calls``.
MAX_CALLS = 50_000

#: ``torch.distributed`` functions timed, with the position of their ``group`` argument and of
#: the tensor whose bytes are the message's (nccl-tests' S: all-gather's output, reduce-scatter's
#: input; a list: the sum of its tensors). The collectives only: a point-to-point call pairs
#: with one peer and joins no group, so no finding reads it, and host work at a pipeline's
#: sends and receives costs its steps far more than its own time (docs/commands.md).
_WRAPPED = {n: v for n, v in vocab.MONITOR_CALLS.items() if n not in vocab.MONITOR_P2P}
#: Kept op names (an op's index in a line's ``calls.op`` is its position here).
OPS: tuple[str, ...] = (*_WRAPPED, vocab.MONITOR_DDP_ALL_REDUCE)


def _nbytes(x) -> int:
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(t) for t in x)
    try:
        return int(x.numel() * x.element_size())
    except AttributeError:
        return 0


def _rss_bytes() -> int | None:
    """The process's resident memory (bytes; Linux ``/proc/self/statm``), else None."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            import os
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class Monitor:
    """A rank's step and collective records, appended to ``path`` every ``every`` steps.

    Args:
        path: the rank's monitor file (appended to; created when missing).
        rank: the rank's global rank.
        every: steps per line.
        device_memory: a callable giving the device's allocated bytes (None on CPU).

    Call :meth:`install` before the script, :meth:`on_step` after each optimizer step
    (``index`` 0-based, the optimizer step's start and end in epoch ns) and :meth:`close` at
    the end (writes what is buffered, restores what was patched).
    """

    def __init__(self, path: Path, rank: int, every: int = FLUSH_EVERY,
                 device_memory=None, capture_request: Path | None = None,
                 keep_calls: bool = True) -> None:
        self.path = Path(path)
        self.rank = rank
        self.every = max(1, int(every))
        self.device_memory = device_memory
        self.base_ns = time.time_ns()
        self._last_end = self.base_ns
        self._step = 0
        self._steps: list[tuple[int, int, int, int, int]] = []
        self._calls: list[list] = []
        self._dropped = 0
        self._data_ns = 0
        self._groups: dict[int, str] = {}
        self._patched: list[tuple[Any, str, Any]] = []
        self._nested = threading.local()
        #: (op, on CUDA) whose works have no future (as gloo's send and recv): asking again would
        #: raise again, and a c10 error costs 0.1 ms (it takes a backtrace) on every call
        self._no_future: set[tuple[int, bool]] = set()
        self._fh = None
        self._closing = False
        self.lines = 0
        self.keep_calls = keep_calls
        #: calls and steps recorded over the run (the monitor's cost per step is its cost per
        #: call × calls per step)
        self.calls_total = 0
        self.steps_total = 0
        #: where the launcher asks for a deep capture (looked at every step while no capture is
        #: pending; None: never)
        self.capture_request = capture_request
        #: ``(first step, steps)`` of the deep capture asked for and not yet ended (the rank
        #: sets it back to None when its capture ends; the next request is then taken)
        self.capture: tuple[int, int] | None = None
        #: the request file's (mtime ns, size) when last read: it is read again only when changed
        self._request_seen: tuple[int, int] | None = None

    # -- recording ---------------------------------------------------------------------------

    def _group(self, group) -> str:
        key = id(group)
        name = self._groups.get(key)
        if name is None:
            from .comms import group_name
            try:
                name = group_name(group)
            except Exception:   # no default group yet, or a destroyed one
                name = ""
            self._groups[key] = name
        return name

    def _call(self, op: int, group, nbytes: int, t0: int, t1: int) -> list | None:
        self.calls_total += 1
        if len(self._calls) >= MAX_CALLS:
            self._dropped += 1
            return None
        rec = [self._step, self._group(group), op, nbytes, t0, t1, -1]
        self._calls.append(rec)
        return rec

    @staticmethod
    def _on_done(rec: list, _fut) -> None:
        rec[6] = time.time_ns()

    def _wrap(self, name: str, fn):
        gpos, tpos = _WRAPPED[name]
        op = OPS.index(name)
        mon = self
        nested = self._nested

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if getattr(nested, "inside", False):   # a call inside another wrapped call
                return fn(*args, **kwargs)
            nested.inside = True
            t0 = time.time_ns()
            try:
                out = fn(*args, **kwargs)
            finally:
                nested.inside = False
            t1 = time.time_ns()
            group = args[gpos] if len(args) > gpos else kwargs.get("group")
            tensor = args[tpos] if 0 <= tpos < len(args) else None
            rec = mon._call(op, group, _nbytes(tensor) if tensor is not None else 0, t0, t1)
            if rec is not None:
                first = tensor[0] if isinstance(tensor, (list, tuple)) and tensor else tensor
                cuda = bool(getattr(first, "is_cuda", False))
                if out is None and not cuda:
                    rec[6] = t1   # a host collective returns when done (not a CUDA one)
                elif (op, cuda) not in mon._no_future:
                    try:
                        out.get_future().add_done_callback(
                            functools.partial(Monitor._on_done, rec))
                    except Exception:   # a work without a future: completion unknown
                        mon._no_future.add((op, cuda))
            return out

        return wrapper

    def _timed_hook(self, hook):
        """DDP's communication hook ``hook(state, bucket) -> Future`` timed as one
        ``ddp_all_reduce`` call per bucket."""
        op = OPS.index(vocab.MONITOR_DDP_ALL_REDUCE)
        mon = self
        nested = self._nested

        @functools.wraps(hook)
        def timed(state, bucket):
            nested.inside = True   # the hook's own all_reduce is this call
            t0 = time.time_ns()
            try:
                fut = hook(state, bucket)
            finally:
                nested.inside = False
            t1 = time.time_ns()
            try:
                nbytes = _nbytes(bucket.buffer())
            except Exception:
                nbytes = 0
            rec = mon._call(op, state if state is not None else None, nbytes, t0, t1)
            if rec is not None:
                fut.add_done_callback(functools.partial(Monitor._on_done, rec))
            return fut

        return timed

    def _install_ddp(self) -> None:
        """Time DDP's gradient buckets: a script's own communication hook is wrapped; without
        one, DDP's default all-reduce (``default_hooks.allreduce_hook``, the same reduction:
        divide by the group's size, all-reduce) is registered as the hook at the model's first
        forward, so a hook the script registers after building the model still wins."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel as DDP

        mon = self
        orig_register = DDP.register_comm_hook
        orig_builtin = DDP._register_builtin_comm_hook
        orig_init = DDP.__init__

        @functools.wraps(orig_register)
        def register_comm_hook(ddp, state, hook):
            ddp._pardiag_hooked = True
            return orig_register(ddp, state, mon._timed_hook(hook))

        @functools.wraps(orig_builtin)
        def register_builtin(ddp, comm_hook_type):
            ddp._pardiag_hooked = True   # a C++ hook: its buckets are not seen
            return orig_builtin(ddp, comm_hook_type)

        def first_forward(ddp, args):
            handle = getattr(ddp, "_pardiag_pre", None)
            if handle is not None:
                handle.remove()
            if not getattr(ddp, "_pardiag_hooked", False):
                register_comm_hook(ddp, ddp.process_group, default_hooks.allreduce_hook)

        @functools.wraps(orig_init)
        def init(ddp, *args, **kwargs):
            orig_init(ddp, *args, **kwargs)
            ddp._pardiag_pre = ddp.register_forward_pre_hook(first_forward)

        for name, new, orig in (("register_comm_hook", register_comm_hook, orig_register),
                                ("_register_builtin_comm_hook", register_builtin, orig_builtin),
                                ("__init__", init, orig_init)):
            setattr(DDP, name, new)
            self._patched.append((DDP, name, orig))

    def _install_data(self) -> None:
        from torch.utils.data import dataloader

        cls = dataloader._BaseDataLoaderIter
        orig = cls.__next__
        mon = self

        @functools.wraps(orig)
        def next_(it):
            t0 = time.perf_counter_ns()
            try:
                return orig(it)
            finally:
                mon._data_ns += time.perf_counter_ns() - t0

        cls.__next__ = next_
        self._patched.append((cls, "__next__", orig))

    def install(self) -> None:
        """Patch ``torch.distributed``'s functions (and ``distributed_c10d``'s), DDP and the
        DataLoader iterators; open the file."""
        import torch.distributed as dist

        c10d = dist.distributed_c10d
        for name in _WRAPPED:
            orig = getattr(dist, name, None)
            if orig is None:
                continue
            wrapped = self._wrap(name, orig)
            for mod in (dist, c10d):
                if getattr(mod, name, None) is not None:
                    self._patched.append((mod, name, getattr(mod, name)))
                    setattr(mod, name, wrapped)
        self._install_ddp()
        self._install_data()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "ab")

    def on_step(self, index: int, opt_start_ns: int, opt_end_ns: int) -> None:
        """Record optimizer step ``index`` (0-based) that ran from ``opt_start_ns`` to
        ``opt_end_ns`` (epoch ns); every :attr:`every` steps, write a line."""
        self._steps.append((index, opt_end_ns, opt_end_ns - self._last_end,
                            opt_end_ns - opt_start_ns, self._data_ns))
        self._last_end = opt_end_ns
        self._data_ns = 0
        self._step = index + 1
        self.steps_total += 1
        if self.capture is None and self.capture_request is not None:
            self._read_capture_request()   # a stat per step until a capture is asked for
        if len(self._steps) >= self.every:
            self.flush()

    def self_cost_us(self, calls: int = 2000, blocks: int = 5) -> float:
        """What the collective wrapper adds to one call (µs): a wrapped no-op returning a
        completed work's stand-in less the no-op, median of ``blocks``; measured after the
        run, its records taken back."""
        from .hooks import added_cost_us

        class _Work:
            def get_future(self):
                return _Future()

        class _Future:
            def add_done_callback(self, fn) -> None:
                fn(self)

        work = _Work()

        def noop(tensor, op=None, group=None, async_op=False):
            return work

        wrapped = self._wrap("all_reduce", noop)
        saved = (self._calls, self._dropped, self._step, self.calls_total)
        self._calls = []
        try:
            return added_cost_us(wrapped, noop, lambda i: (None,), calls, blocks,
                                 after_block=self._calls.clear)
        finally:
            self._calls, self._dropped, self._step, self.calls_total = saved

    # -- writing -----------------------------------------------------------------------------

    def _line(self) -> dict:
        base = self.base_ns
        st = self._steps
        calls = self._calls
        arrive: dict[int, list[int]] = {}
        for c in calls:
            arrive.setdefault(c[0], []).append(c[4])
        # per step: the median, first and last issue time of its collectives (-1: none)
        summary = {"arrive_us": [], "arrive_first_us": [], "arrive_last_us": []}
        for s in st:
            v = sorted(arrive.get(s[0], ()))
            for key, t in zip(summary, (v[len(v) // 2], v[0], v[-1]) if v else (-1, -1, -1)):
                summary[key].append((t - base) // 1000 if v else -1)
        if not self.keep_calls:
            calls = []
        mem = {"rss_bytes": _rss_bytes(), "device_bytes": None}
        if self.device_memory is not None:
            try:
                mem["device_bytes"] = int(self.device_memory())
            except Exception:
                pass
        return {
            "schema": SCHEMA, "rank": self.rank, "base_ns": base, "ops": list(OPS),
            "steps": {"index": [s[0] for s in st],
                      "end_us": [(s[1] - base) // 1000 for s in st],
                      "dur_us": [s[2] // 1000 for s in st],
                      "optimizer_us": [s[3] // 1000 for s in st],
                      "data_us": [s[4] // 1000 for s in st], **summary},
            "calls": {"step": [c[0] for c in calls], "group": [c[1] for c in calls],
                      "op": [c[2] for c in calls], "bytes": [c[3] for c in calls],
                      "issue_us": [(c[4] - base) // 1000 for c in calls],
                      "return_us": [(c[5] - base) // 1000 for c in calls],
                      "done_us": [(c[6] - base) // 1000 if c[6] > 0 else -1 for c in calls]},
            "dropped_calls": self._dropped, "memory": mem,
            **({"last": True} if self._closing else {}),
        }

    def flush(self) -> None:
        """Append one line with what is buffered, then clear the buffers (a call still in
        flight is written with ``done_us`` -1)."""
        if self._fh is None or (not self._steps and not self._calls):
            return
        line = self._line()
        self._steps, self._calls, self._dropped = [], [], 0
        self._fh.write(orjson.dumps(line) + b"\n")
        self._fh.flush()
        self.lines += 1
        if self.capture is None and self.capture_request is not None:
            self._read_capture_request()

    def _read_capture_request(self) -> None:
        """Take the launcher's request for a deep capture when there is one, it changed since
        last read, and it starts after this rank's current step (every rank then captures the
        same steps; one that comes too late is left, and so is a request already captured)."""
        try:
            st = self.capture_request.stat()
        except OSError:
            return
        seen = (st.st_mtime_ns, st.st_size)
        if seen == self._request_seen:
            return   # a stat per step; read only when the launcher wrote a new request
        self._request_seen = seen
        try:
            req = orjson.loads(self.capture_request.read_bytes())
            start, steps = int(req["start_step"]), int(req["steps"])
        except (OSError, ValueError, KeyError, TypeError):
            self._request_seen = None   # caught mid-write elsewhere: read it again
            return
        if start > self._step and steps > 0:
            self.capture = (start, steps)

    def close(self) -> None:
        """Write what is buffered, close the file and restore everything patched."""
        self._closing = True   # the line written now is the script's last
        try:
            self.flush()
        finally:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
            for owner, name, orig in reversed(self._patched):
                setattr(owner, name, orig)
            self._patched.clear()
