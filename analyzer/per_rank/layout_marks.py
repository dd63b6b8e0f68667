"""What one rank's trace says about the parallel layout (:class:`RankMarks`): wrappers' ranges,
functional collectives, all-to-alls, the pipeline's per-microbatch ranges and its
point-to-point messages. :mod:`pardiag.analyzer.analyses.infer_layout` combines the ranks'
marks into a layout (see its docstring for what each mark means).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd

from ..trace import intervals as iv
from ..trace import vocab
from ..trace.classify import STEP_RE, Kind, classify, collective_type, name_test
from ..trace.traceset import ColumnTable, HoldsTables, RankTrace, StoredTable, isin_mask
from .comm_events import group_ranks, p2p_peer

#: Columns of :attr:`RankMarks.chunks`: the busy pieces of the pipeline's per-microbatch ranges.
#: ``stage`` -1 where the range does not name it (GPipe's ``Forward i``); ``phase`` F, B, I or
#: W; ``step`` the ``ProfilerStep`` holding the range (-1 outside every step); µs on the rank's
#: own clock.
CHUNK_COLUMNS = ("stage", "microbatch", "phase", "step", "start_us", "end_us")


#: Columns of :attr:`RankMarks.p2p`: ``op`` ``send``/``recv``; ``peer`` the peer's rank in the
#: group the message used (-1 where the trace does not say); ``global_peer`` its global rank
#: where the record names it or its group's ranks (-1 otherwise); ``step`` as above; µs.
P2P_COLUMNS = ("op", "peer", "global_peer", "step", "start_us", "end_us")


#: Keys of :attr:`RankMarks.counts` (events per marker).
MARKERS = ("fsdp2", "fsdp1", "ddp", "zero", "functional", "all_to_all", "zero3")

#: Keys of :attr:`RankMarks.counts` that say what the all-to-alls carry
#: (:func:`all_to_all_evidence`).
A2A_EVIDENCE = ("router", "sequence_exchange", "a2a_events", "a2a_attention")

#: Keys of :attr:`RankMarks.counts` that say whether the point-to-point messages are a ring
#: attention's (context parallelism) rather than a pipeline's (:func:`p2p_evidence`).
P2P_EVIDENCE = ("ring_exchange", "p2p_events", "p2p_attention")


@dataclasses.dataclass(frozen=True)
class RankMarks(HoldsTables):
    """What one rank's trace says about the layout (see the module docstring).

    Attributes:
        counts: ``{marker: events}`` for :data:`MARKERS` (FSDP2 / FSDP1 / DDP ranges,
            ZeroRedundancyOptimizer ranges, functional collectives, all-to-alls), and the
            all-to-alls' evidence :data:`A2A_EVIDENCE` (:func:`all_to_all_evidence`).
        chunks: :data:`CHUNK_COLUMNS`, one row per busy piece of a per-microbatch range.
        p2p: :data:`P2P_COLUMNS`, one row per point-to-point call.
        device_chunks: True when ``chunks`` come from the device timeline
            (``gpu_user_annotation`` copies of the ranges), False for the CPU ranges.
        send_dim0: ``{dim 0 of the first tensor a send carries: sends}`` where the trace has
            ``Input Dims`` (``record_shapes``); empty otherwise.
    """

    counts: dict[str, int]
    chunks: pd.DataFrame = StoredTable()
    p2p: pd.DataFrame = StoredTable()
    device_chunks: bool = False
    send_dim0: dict[int, int] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "device_chunks": self.device_chunks,
                "chunks": [list(r) for r in self.chunks.itertuples(index=False)],
                "p2p": [list(r) for r in self.p2p.itertuples(index=False)],
                "send_dim0": [[int(k), int(v)] for k, v in self.send_dim0.items()]}

    @staticmethod
    def from_json(d: dict[str, Any]) -> RankMarks:
        return RankMarks({k: int(v) for k, v in d["counts"].items()},
                         _row_table(d["chunks"], _CHUNK_DTYPES), _row_table(d["p2p"], _P2P_DTYPES),
                         bool(d.get("device_chunks")),
                         {int(k): int(v) for k, v in d.get("send_dim0") or []})


_CHUNK_DTYPES = {"stage": np.int64, "microbatch": np.int64, "phase": object, "step": np.int64,
                 "start_us": np.float64, "end_us": np.float64}


_P2P_DTYPES = {"op": object, "peer": np.int64, "global_peer": np.int64, "step": np.int64,
               "start_us": np.float64, "end_us": np.float64}


def _row_table(rows: list[Any], dtypes: dict[str, type[object]]) -> ColumnTable:
    """Stored rows (lists in the order of ``dtypes``) as a :class:`ColumnTable` of those column
    types, built when first read."""
    cols = [list(c) for c in zip(*rows)] if len(rows) else [[] for _ in dtypes]
    return ColumnTable(list(dtypes), [np.dtype(t).name for t in dtypes.values()], cols)


def _typed_frame(rows: list[Any], dtypes: dict[str, type[object]]) -> pd.DataFrame:
    """A table of ``rows`` (lists in the order of ``dtypes``) with those column types (the
    table :func:`_row_table` builds when read)."""
    return _row_table(rows, dtypes).frame()


def _chunk_frame(rows: list[Any]) -> pd.DataFrame:
    return _typed_frame(rows, _CHUNK_DTYPES)


def _p2p_frame(rows: list[Any]) -> pd.DataFrame:
    return _typed_frame(rows, _P2P_DTYPES)


def _step_of(times: np.ndarray, steps: list[tuple[int, float, float]]) -> np.ndarray:
    out = np.full(len(times), -1, dtype=np.int64)
    for n, lo, hi in steps:
        out[(times >= lo) & (times < hi)] = n
    return out


def _launched_at(starts: np.ndarray, names: pd.Series, ev: pd.DataFrame, host_rng: np.ndarray,
                 gpu_rng: np.ndarray) -> np.ndarray:
    """For times ``starts`` (µs) inside device ranges (``gpu_rng``: the pipeline ranges on
    the device), the start of the host range that opened each one: the k-th device range of a
    name is the k-th host range of that name (``host_rng``), where both count alike. A host
    that runs ahead of its device (nothing synchronises in the loop) opens the next step's
    ranges while the device still runs this step's: a range belongs to the step that launched
    it, not to the host step its device time falls in. Other times are kept."""
    out: np.ndarray = np.array(starts, dtype=float)
    if not host_rng.any() or not len(starts):
        return out
    host: dict[str, list[float]] = {}
    for n, t in zip(names[host_rng].tolist(), ev["ts"][host_rng].tolist()):
        host.setdefault(str(n), []).append(float(t))
    dev: dict[str, list[tuple[float, float]]] = {}
    for n, t, d in zip(names[gpu_rng].tolist(), ev["ts"][gpu_rng].tolist(),
                       ev["dur"][gpu_rng].tolist()):
        dev.setdefault(str(n), []).append((float(t), float(t + d)))
    spans = []
    for n, ranges in dev.items():
        opened = sorted(host.get(n, []))
        if len(opened) == len(ranges):
            spans += [(lo, hi, h) for (lo, hi), h in zip(sorted(ranges), opened)]
    if not spans:
        return out
    spans.sort()
    lo = np.array([x[0] for x in spans])
    hi = np.array([x[1] for x in spans])
    launched = np.array([x[2] for x in spans])
    at = np.searchsorted(lo, starts, side="right") - 1
    inside = (at >= 0) & (starts <= hi[np.maximum(at, 0)])
    out[inside] = launched[at[inside]]
    return out


def _peer(op: str, args: Any, c10d_call: bool = False) -> int:
    """The peer's rank in the group the message used (:func:`pardiag.analyzer.per_rank.
    comm_events.p2p_peer`, the group's ranks from the record alone), or -1."""
    return _peers(op, args, c10d_call)[0]


def _peers(op: str, args: Any, c10d_call: bool = False) -> tuple[int, int]:
    """(the peer's rank in the group the message used, its global rank), each -1 where the
    record does not give it (:func:`pardiag.analyzer.per_rank.comm_events.p2p_peer`, the
    group's ranks from the record alone)."""
    members = group_ranks(args, {}) if isinstance(args, dict) else None
    local, glob = p2p_peer(op, args, members, c10d_call)
    return (-1 if local is None else local), (-1 if glob is None else glob)


def _dim0(dims: Any) -> int | None:
    """Dim 0 of the first tensor in an op's ``Input Dims`` (``c10d::send`` takes a list of
    tensors: ``[[[8, 256]], …]``; NCCL's ``record_param_comms`` one: ``[[8, 256], …]``), or
    None when it is no tensor of two or more dimensions."""
    first = dims[0] if isinstance(dims, list) and dims else None
    if isinstance(first, list) and first and isinstance(first[0], list):
        first = first[0]
    if (isinstance(first, list) and len(first) >= 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in first)):
        return int(first[0])
    return None


def _step_number(name: str) -> int:
    """N of a ``ProfilerStep#N`` name (one that :data:`STEP_RE` matches)."""
    m = STEP_RE.match(name)
    assert m is not None
    return int(m.group(1))


def all_to_all_evidence(trace: RankTrace) -> dict[str, int]:
    """What one rank's trace says its all-to-alls carry, as counts (:data:`A2A_EVIDENCE`):

    * ``router``: events named as a mixture of experts' routing (:data:`vocab.ROUTER_RE`: a
      top-k gate, routers, experts, grouped GEMMs): all-to-alls that dispatch tokens;
    * ``sequence_exchange``: events named as a sequence-parallel exchange
      (:data:`vocab.SEQUENCE_EXCHANGE_RE`, DeepSpeed-Ulysses' ``_SeqAllToAll``);
    * ``a2a_events``: all-to-all events on the timeline read (the device's kernels when their
      records name them all-to-alls, else the host's ops);
    * ``a2a_attention``: those whose nearest computation before or after (skipping other
      communication and ops that only move data, :data:`vocab.RESHAPE_OP_RE`) is attention
      (:data:`vocab.ATTENTION_RE`): the exchange of sequence and head shards around attention
      that Ulysses-style sequence parallelism runs (DeepSpeed#5435), where an expert dispatch
      sits between a router and the experts' GEMMs.
    """
    n, near = _ops_next_to_attention(trace, ("all_to_all",))
    return {"router": int(name_test(trace, "router", vocab.ROUTER_RE.search).sum()),
            "sequence_exchange": int(name_test(trace, "sequence_exchange",
                                               vocab.SEQUENCE_EXCHANGE_RE.search).sum()),
            "a2a_events": n, "a2a_attention": near}


def p2p_evidence(trace: RankTrace) -> dict[str, int]:
    """What one rank's trace says its point-to-point messages are, as counts
    (:data:`P2P_EVIDENCE`):

    * ``ring_exchange``: events named as ring attention's exchange
      (:data:`vocab.RING_ATTENTION_RE`: TransformerEngine's ``flash_attn_p2p_communicate``,
      ring-flash-attention, torch's templated ring attention);
    * ``p2p_events``: send and receive events on the timeline read (the device's kernels when
      their records name them, or when they are ``SendRecv`` kernels of a coalesced block,
      ``batch_isend_irecv``; else the host's ops);
    * ``p2p_attention``: those whose nearest computation before or after is attention, as for
      all-to-alls (:func:`all_to_all_evidence`): a ring passes key/value shards between
      attention's blocks, a pipeline passes activations between layers of every kind.
    """
    n, near = _ops_next_to_attention(trace, ("send", "recv", "send_recv"))
    return {"ring_exchange": int(name_test(trace, "ring_exchange",
                                           vocab.RING_ATTENTION_RE.search).sum()),
            "p2p_events": n, "p2p_attention": near}


def _ops_next_to_attention(trace: RankTrace, ops: tuple[str, ...]) -> tuple[int, int]:
    """``(events, next to attention)`` of the communication events of types ``ops`` on the
    timeline read (the device's kernels when their records name them, else the host's ops):
    how many there are, and how many of them :func:`_next_to_attention` finds."""
    ev = trace.events
    kinds = classify(trace).to_numpy()
    names, args = ev["name"].to_numpy(), ev["args"].to_numpy()
    for comm_kind, comp_kind in ((Kind.GPU_COMM.value, Kind.GPU_COMPUTE.value),
                                 (Kind.CPU_COMM.value, Kind.CPU_COMPUTE.value)):
        comm = np.flatnonzero(kinds == comm_kind)
        sel = comm[[collective_type(n, a if isinstance(a, dict) else None) in ops
                    for n, a in zip(names[comm], args[comm])]]
        if len(sel):
            return len(sel), _next_to_attention(trace, kinds, sel, comp_kind)
    return 0, 0


def _next_to_attention(trace: RankTrace, kinds: np.ndarray, comm: np.ndarray,
                       comp_kind: str) -> int:
    """How many of the events ``comm`` (row positions) have attention
    (:data:`vocab.ATTENTION_RE`) as their nearest computation of ``comp_kind`` before or
    after, skipping ops that only move data (:data:`vocab.RESHAPE_OP_RE`)."""
    ev = trace.events
    comp = (kinds == comp_kind) & ~name_test(trace, "reshape", vocab.RESHAPE_OP_RE.search)
    att = name_test(trace, "attention", vocab.ATTENTION_RE.search)[comp]
    ts = ev["ts"].to_numpy(dtype=float)
    end = ts + ev["dur"].to_numpy(dtype=float)
    c_ts, c_end = ts[comp], end[comp]
    by_end, by_start = np.argsort(c_end, kind="stable"), np.argsort(c_ts, kind="stable")
    e_sorted, s_sorted = c_end[by_end], c_ts[by_start]
    n = len(e_sorted)
    before = np.searchsorted(e_sorted, ts[comm], side="right") - 1   # the last to end before
    after = np.searchsorted(s_sorted, end[comm], side="left")        # the first to start after
    att_before = (before >= 0) & att[by_end[np.clip(before, 0, max(n - 1, 0))]] if n else False
    att_after = (after < n) & att[by_start[np.clip(after, 0, max(n - 1, 0))]] if n else False
    return int(np.count_nonzero(att_before | att_after))


def _busy_marks(trace: RankTrace, device: bool) -> tuple[np.ndarray, np.ndarray]:
    """What :func:`_busy_part` reads of a rank: its computation (merged intervals, µs) and the
    sorted ends of its waits. Host ranges: CPU operators less the calls and waits that block,
    and the receives' and waits' ends. Device ranges, which hold their receive's kernel (it
    spins until the message comes) and their send's: the computing kernels, and the
    communication kernels' ends."""
    ev = trace.events
    kinds = classify(trace)

    def spans(sel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        e = ev[sel]
        ts = e["ts"].to_numpy(dtype=float)
        return ts, ts + e["dur"].to_numpy(dtype=float)

    if device:
        k = iv.union(*spans((kinds == Kind.GPU_COMPUTE.value).to_numpy()))
        return k, np.sort(spans((kinds == Kind.GPU_COMM.value).to_numpy())[1])
    cat = ev["cat"]
    cpu = isin_mask(cat, ["cpu_op", "user_annotation"])
    is_wait = (kinds == Kind.CPU_WAIT.value).to_numpy()
    blocking = ((kinds == Kind.CPU_COMM.value).to_numpy() & (cat == "cpu_op").to_numpy()) | is_wait
    k = iv.subtract(iv.union(*spans((kinds == Kind.CPU_COMPUTE.value).to_numpy())),
                    iv.union(*spans(blocking)))
    recv = name_test(trace, "recv", vocab.RECV_RE.match)
    return k, np.sort(spans((recv & cpu) | is_wait)[1])


def _busy_part(lo: float, hi: float, k: np.ndarray, wait_end: np.ndarray
               ) -> tuple[float, float]:
    """The busy part of a per-microbatch range ``[lo, hi]`` (µs): from the end of the wait for
    its input — the latest wait (a receive, a wait op, on a device a communication kernel) that
    ends inside the range with computation (``k``, merged intervals) covering less than half of
    the time before it — to the end of the range's last computation. ``wait_end`` sorted."""
    inside = wait_end[(wait_end > lo) & (wait_end < hi)]
    for w in inside[::-1]:
        if iv.total(iv.clip(k, lo, float(w))) < 0.5 * (float(w) - lo):
            lo = float(w)
            break
    kk = iv.clip(k, lo, hi)
    if len(kk):
        hi = float(kk[-1, 1])
    return lo, hi


#: One action of a combined range: (stage, microbatch, phase).
_Part = tuple[int, int, str]
#: A combined range's chunk row: (its first action, its second, busy start, busy end, where the
#: second begins or None, where the first ends when a wait lies between them, else None).
_Combined = tuple[_Part, _Part, float, float, float | None, float | None]


def _second_input(lo: float, hi: float, k: np.ndarray, wait_end: np.ndarray
                  ) -> tuple[float, float] | None:
    """On a device range ``[lo, hi]`` of a combined action (a forward, then a backward whose
    gradient comes from the next stage): ``(where the first part's computation ends, where the
    second part begins)`` when the second waited for its input inside the range — the last
    communication kernel (``wait_end``, sorted ends) that ends inside it after computation
    (``k``, merged intervals) and with none just before its end: the device was idle between
    the two parts, though the range was open. None without such a wait."""
    kk = iv.clip(k, lo, hi)
    if not len(kk):
        return None
    for w in wait_end[(wait_end > lo) & (wait_end < hi)][::-1].tolist():
        before = kk[kk[:, 1] <= w]
        after = kk[kk[:, 0] >= w]
        if len(before) and len(after) and not ((kk[:, 0] < w) & (kk[:, 1] > w)).any():
            end = float(before[-1, 1])
            if end < w:
                return end, float(w)
    return None


def _second_start(pair: tuple[_Part, _Part], bwd_starts: np.ndarray, lo: float, hi: float,
                  device: bool) -> float | None:
    """Where a combined action's second part (a backward after a forward) begins inside its
    busy span ``[lo, hi]`` of a host range: the first autograd function that starts there.
    None on a device range or when no such function marks it."""
    if device or pair[0][2] != "F" or pair[1][2] not in ("B", "I"):
        return None
    i = int(np.searchsorted(bwd_starts, lo, side="right"))
    return float(bwd_starts[i]) if i < len(bwd_starts) and bwd_starts[i] < hi else None


def _split_combined(combined: list[_Combined], rows: list[tuple[Any, ...]]
                    ) -> list[tuple[Any, ...]]:
    """Chunk rows for the combined actions (``PP_COMBINED_RE``): each range becomes its two
    actions, one after the other as the runtime runs them, split where the second begins
    (on a device range, after the wait for its input, which belongs to neither:
    :func:`_second_input`; on a host range, :func:`_second_start`); without that mark, in
    proportion to the mean length of the two phases' own ranges on the rank; without those
    either, each action is given the whole range (its busy time is still the rank's, and the
    order and microbatches still count)."""
    out: list[tuple[Any, ...]] = []
    if not combined:
        return out
    lengths: dict[str, list[float]] = {}
    for r in rows:
        lengths.setdefault(r[2], []).append(r[5] - r[4])
    mean = {ph: float(np.mean(v)) for ph, v in lengths.items() if v}
    for first, second, lo, hi, x, first_end in combined:
        if x is None and first[2] in mean and second[2] in mean and mean[first[2]] + mean[
                second[2]] > 0:
            x = lo + (hi - lo) * mean[first[2]] / (mean[first[2]] + mean[second[2]])
        a, b = (x, x) if x is not None else (hi, lo)
        if first_end is not None:   # the device idled between the parts: no one's work
            a = first_end
        out.append((first[0], first[1], first[2], -1, lo, a))
        out.append((second[0], second[1], second[2], -1, b, hi))
    return out


def rank_marks_of_trace(trace: RankTrace) -> RankMarks:
    ev = trace.events
    names = ev["name"]
    cat = ev["cat"]
    cpu = isin_mask(cat, ["cpu_op", "user_annotation"])
    counts = {key: int((name_test(trace, ("marker", key), rx.search) & cpu).sum())
              for key, rx in vocab.MARKER_RES.items()}
    counts.update(all_to_all_evidence(trace))
    counts.update(p2p_evidence(trace))
    is_step = cpu & name_test(trace, "step", STEP_RE.match)
    steps = [(_step_number(n), float(t), float(t + d)) for n, t, d in
             zip(names[is_step], ev["ts"][is_step], ev["dur"][is_step])]

    # point-to-point calls
    p2p_rows = []
    dim0: dict[int, int] = {}
    sel = cpu & name_test(trace, "p2p_op", lambda u: bool(
        vocab.C10D_P2P_RE.match(u) or u == "record_param_comms"))
    for n, t, d, a in zip(names[sel], ev["ts"][sel], ev["dur"][sel], ev["args"][sel]):
        if n == "record_param_comms":
            op = vocab.P2P_COLLECTIVE_NAMES.get(str(vocab.COLLECTIVE_NAME.get(a, "")).lower()) \
                if isinstance(a, dict) else None
        else:
            op = "send" if n == "c10d::send" else "recv"
        if op:
            p2p_rows.append((op, *_peers(op, a, n != "record_param_comms"), float(t),
                             float(t + d)))
            if op == "send" and (n0 := _dim0(vocab.INPUT_DIMS.get(a))):
                dim0[n0] = dim0.get(n0, 0) + 1
    p2p = _p2p_frame([(op, peer, glob, -1, t0, t1) for op, peer, glob, t0, t1 in p2p_rows])
    p2p["step"] = _step_of(p2p["start_us"].to_numpy(), steps)

    # per-microbatch ranges: the device timeline's copies when there are any
    rng = name_test(trace, "pipeline_range", lambda u: bool(vocab.GPIPE_RANGE_RE.match(u)
                                                            or vocab.PP_ACTION_RE.match(u)
                                                            or vocab.PP_COMBINED_RE.match(u)))
    gpu_rng = rng & (cat == "gpu_user_annotation").to_numpy()
    device = bool(gpu_rng.any())
    host_rng = rng & (cat == "user_annotation").to_numpy()
    rng = gpu_rng if device else host_rng
    k, wait_end = _busy_marks(trace, device) if rng.any() else (np.empty((0, 2)), np.empty(0))
    # where a backward begins on the host: splits a combined action's range
    autograd = name_test(trace, "autograd_function", vocab.AUTOGRAD_FUNCTION_RE.match) & cpu
    bwd_starts = np.sort(ev["ts"][autograd].to_numpy(dtype=float))
    rows = []
    combined: list[_Combined] = []
    for n, t, d in zip(names[rng], ev["ts"][rng], ev["dur"][rng]):
        m = vocab.GPIPE_RANGE_RE.match(n)
        pair = None
        if m:
            stage, phase, mb = -1, m.group(1)[0], int(m.group(2))
        elif m := vocab.PP_ACTION_RE.match(n):
            stage, phase, mb = int(m.group(1)), m.group(2), int(m.group(3))
        else:
            m = vocab.PP_COMBINED_RE.match(n)
            assert m is not None  # the range's name matched one of the three
            g = m.groups()
            pair = ((int(g[0]), int(g[2]), g[1]), (int(g[3]), int(g[5]), g[4]))
            stage, phase, mb = pair[0][0], pair[0][2], pair[0][1]
        waited = (_second_input(float(t), float(t + d), k, wait_end)
                  if pair is not None and device else None)
        if waited is not None and pair is not None:   # the first part's busy span, then the
            # second's from the end of the wait for its input
            lo = _busy_part(float(t), waited[0], k, wait_end)[0]
            kk = iv.clip(k, waited[1], float(t + d))
            combined.append((*pair, lo, float(kk[-1, 1]), waited[1], waited[0]))
            continue
        lo, hi = _busy_part(float(t), float(t + d), k, wait_end)
        if pair is not None:
            combined.append((*pair, lo, max(lo, hi), _second_start(pair, bwd_starts, lo, hi,
                                                                    device), None))
            continue
        rows.append((stage, mb, phase, -1, lo, max(lo, hi)))
    rows += _split_combined(combined, rows)
    chunks = _chunk_frame(rows)
    # a chunk's step: the step holding the start of its range (pieces keep their range's
    # step); a device range's, the step that launched it (its host range's start)
    starts = chunks["start_us"].to_numpy(dtype=float)
    if device:
        starts = _launched_at(starts, names, ev, host_rng, gpu_rng)
    chunks["step"] = _step_of(starts, steps)
    return RankMarks(counts, chunks.sort_values("start_us", kind="stable").reset_index(drop=True),
                     p2p.sort_values("start_us", kind="stable").reset_index(drop=True), device,
                     dim0)
