"""Communication a trace cannot show: point-to-point calls (:class:`P2PRecorder`), the c10d
flight recorder's collectives and the process groups this rank knows.

Times are epoch nanoseconds (``time.time_ns()``), the clock of the trace's
``baseTimeNanoseconds`` (FACTS §1) and of the flight recorder's ``time_created_ns``.
"""

from __future__ import annotations

import collections
import functools
import json
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

from .hooks import added_cost_us


def group_name(group) -> str:
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    return dist.distributed_c10d._world.pg_names.get(pg, "")


class P2PRecorder:
    """Wraps ``torch.distributed.{send,recv,isend,irecv}`` to record each call.

    Records (while :attr:`recording`, i.e. inside the profiler's window, the only calls the
    comms sidecar keeps): ``{"op": "send"|"recv", "peer": global rank, "pg_name", "bytes",
    "dtype", "issue_ns", "returned_ns", "seq", "source": "p2p_hook"}`` (``seq``: 1-based count
    of this rank's calls with the same group, op and peer since the script started, so ranks
    pair their sends and receives whatever step the window starts at).

    Outside the window a call costs two clock reads, a counter and a tuple appended to a
    bounded buffer (:attr:`recent`, the last :data:`RECENT` calls, for a hang dump): the
    peer's global rank, group name, bytes and dtype are only worked out while recording or
    when a hang dump asks (:meth:`recent_rows`).

    Attributes:
        calls_outside, calls_recorded: calls seen outside and inside the window.
    """

    _NAMES = ("send", "recv", "isend", "irecv")
    #: calls kept for a hang dump
    RECENT = 50

    def __init__(self) -> None:
        self.records: list[dict] = []
        self.recording = False
        self.recent: collections.deque = collections.deque(maxlen=self.RECENT)
        self.calls_outside = 0
        self.calls_recorded = 0
        self._seq: dict[tuple, int] = {}
        self._originals: dict[str, Any] = {}
        #: per thread: inside a recorded call (torch's ``send`` calls ``isend``, ``recv``
        #: ``irecv``, both wrapped: the inner call is the outer's, not another message)
        self._nested = threading.local()

    @staticmethod
    def _row(raw: tuple) -> dict:
        """A raw call ``(op, peer, group, group_peer, bytes, dtype, issue_ns, returned_ns,
        seq)`` as a record."""
        op, peer, group, group_peer, nbytes, dtype, t0, t1, seq = raw
        if peer is None and group_peer is not None and group is not None:
            peer = dist.get_global_rank(group, group_peer)
        return {"op": op, "peer": peer, "pg_name": group_name(group),
                "bytes": nbytes, "dtype": str(dtype).removeprefix("torch."),
                "issue_ns": t0, "returned_ns": t1, "seq": seq, "source": "p2p_hook"}

    def recent_rows(self) -> list[dict]:
        """The last :data:`RECENT` calls as records (for a hang dump; rows that cannot be
        resolved are left out)."""
        out = []
        for raw in list(self.recent):
            try:
                out.append(self._row(raw))
            except Exception:  # a group already destroyed
                continue
        return out

    def self_cost_us(self, calls: int = 2000, blocks: int = 5) -> float:
        """What the wrapper adds to one call outside the window (µs): ``calls`` calls of a
        wrapped no-op less as many of the no-op, median of ``blocks``; measured after the run,
        its counts and buffer taken back."""
        def noop(tensor, dst=None, group=None):
            return None

        wrapped = self._wrap("send", noop)
        t = torch.zeros(1)
        state = (list(self.recent), dict(self._seq), self.calls_outside, self.recording)
        self.recording = False
        try:
            return added_cost_us(wrapped, noop, lambda i: (t, 1, None), calls, blocks)
        finally:
            recent, seq, self.calls_outside, self.recording = state
            self.recent.clear()
            self.recent.extend(recent)
            self._seq.clear()
            self._seq.update(seq)

    def _wrap(self, name: str, fn):
        op = "send" if "send" in name else "recv"
        rec = self
        seqs = self._seq
        recent = self.recent

        nested = self._nested

        @functools.wraps(fn)
        def wrapper(tensor, *args, **kwargs):
            if getattr(nested, "inside", False):   # torch's send is isend + wait: one call
                return fn(tensor, *args, **kwargs)
            nested.inside = True
            t0 = time.time_ns()
            try:
                out = fn(tensor, *args, **kwargs)
            finally:
                nested.inside = False
            t1 = time.time_ns()
            peer = args[0] if args else kwargs.get("dst" if op == "send" else "src")
            group = args[1] if len(args) > 1 else kwargs.get("group")
            group_peer = kwargs.get("group_dst" if op == "send" else "group_src")
            key = (op, peer, group_peer, id(group))
            seq = seqs.get(key, 0) + 1
            seqs[key] = seq
            # sizes, not the tensor: the buffer must not keep activations alive
            raw = (op, peer, group, group_peer, tensor.numel() * tensor.element_size(),
                   tensor.dtype, t0, t1, seq)
            recent.append(raw)
            if rec.recording:
                rec.calls_recorded += 1
                rec.records.append(rec._row(raw))
            else:
                rec.calls_outside += 1
            return out

        return wrapper

    def install(self) -> None:
        """Patch ``torch.distributed`` and ``distributed_c10d`` (``P2POp`` checks the latter)."""
        c10d = dist.distributed_c10d
        for name in self._NAMES:
            orig = getattr(c10d, name)
            self._originals[name] = orig
            wrapped = self._wrap(name, orig)
            setattr(c10d, name, wrapped)
            setattr(dist, name, wrapped)

    def uninstall(self) -> None:
        for name, orig in self._originals.items():
            setattr(dist.distributed_c10d, name, orig)
            setattr(dist, name, orig)
        self._originals.clear()


def flight_recorder_entries() -> list[dict]:
    """Entries of the c10d flight recorder (collectives; on gloo no point-to-point ops).

    Returns ``[]`` when the recorder is unavailable or disabled (``TORCH_FR_BUFFER_SIZE=0``).
    """
    try:
        dump = torch._C._distributed_c10d._dump_fr_trace_json()
    except (AttributeError, RuntimeError):
        return []
    entries = json.loads(dump).get("entries", []) if dump else []
    return [{k: v for k, v in e.items() if k != "frames"} for e in entries]


def process_groups() -> list[dict]:
    """Every process group this rank knows: name, description, global ranks, size, backend."""
    if not (dist.is_available() and dist.is_initialized()):
        return []
    out = []
    for pg, name in dist.distributed_c10d._world.pg_names.items():
        try:
            ranks = dist.get_process_group_ranks(pg)
        except (RuntimeError, ValueError):
            ranks = []
        try:
            backend = str(dist.get_backend(pg))
        except (RuntimeError, ValueError):
            backend = None
        out.append({"name": name, "desc": getattr(pg, "group_desc", ""), "ranks": ranks,
                    "size": len(ranks), "backend": backend})
    return out
