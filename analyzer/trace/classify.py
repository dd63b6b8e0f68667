"""Classify trace events: communication vs computation, GPU vs CPU, steps, memory.

Rules (FACTS §1-2):

* GPU kernels (``cat`` ``kernel``) whose name contains ``nccl``, ``rccl``, ``hccl``, ``oneccl``,
  ``msccl`` or ``xccl`` (any case: ``ncclKernel_*``, ``ncclDevKernel_*``, ``rcclGenericKernel``,
  Intel XPU's ``oneccl_allreduce_kernel<...>``, ...) or matches a user pattern
  (``--comm-kernel REGEX``, for custom kernels such as DeepEP ``dispatch``/``combine`` or
  ``multimem_all_reduce_kernel``) are **gpu_comm**; memcpy/memset (``gpu_memcpy``/``gpu_memset``
  or names starting ``Memcpy``/``Memset``) are **gpu_memory** unless a user pattern names them
  (copy-engine communication: ``Memcpy PtoP``, symmetric memory, async TP), then **gpu_comm**;
  other kernels are **gpu_compute**. Kernels on XPU sit on SYCL queues (read as streams).
* ``gloo:*`` events in a trace with GPU kernels are communication too (the gloo backend on CUDA
  tensors: the transfer runs on a CPU worker thread while the computation runs on the GPU).
* CPU events named ``gloo:*``, ``nccl:*``, ``c10d::*``, ``_c10d_functional::*`` or
  ``record_param_comms`` are **cpu_comm**; wait and synchronize calls (``c10d::wait``,
  ``_c10d_functional::wait_tensor``, ``aten::wait``, ``cuda*Synchronize``) are **cpu_wait**.
* CPU operators (``cpu_op``) on threads that are not communication worker threads are
  **cpu_compute** (worker threads: see :func:`comm_threads`).
* ``ProfilerStep#N`` CPU annotations are **step**; ``[memory]`` instant events are **memory**.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

import numpy as np
import pandas as pd

from pardiag.errors import PardiagError

from . import intervals as iv
from . import vocab
from .traceset import RankTrace, isin_mask


class Kind(str, enum.Enum):
    """Event classes used by every analysis."""

    GPU_COMPUTE = "gpu_compute"
    GPU_COMM = "gpu_comm"
    GPU_MEMORY = "gpu_memory"
    CPU_COMPUTE = "cpu_compute"
    CPU_COMM = "cpu_comm"
    CPU_WAIT = "cpu_wait"
    STEP = "step"
    MEMORY = "memory"
    OTHER = "other"


GPU_COMM_RE = re.compile(r"nccl|rccl|hccl|oneccl|msccl|xccl", re.IGNORECASE)
CPU_COMM_RE = re.compile(  # _c10d_functional::_wrap_tensor_autograd and the like are helpers
    r"^(gloo:|nccl:|c10d::|_c10d_functional::(?!_)|c10d_functional::(?!_)|record_param_comms)")
CPU_WAIT_RE = re.compile(
    r"^(aten::_?wait\b|c10d::wait|_c10d_functional::wait_tensor|c10d_functional::wait_tensor"
    r"|cudaStreamSynchronize|cudaDeviceSynchronize|cudaEventSynchronize"
    r"|cudaStreamWaitEvent|hipStreamSynchronize|hipDeviceSynchronize|hipEventSynchronize)")
STEP_RE = re.compile(r"^ProfilerStep\s*#\s*(\d+)")
_MEMORY_NAME_RE = re.compile(r"^(Memcpy|Memset)", re.IGNORECASE)
_COMM_THREAD_RE = re.compile(r"gloo|nccl", re.IGNORECASE)
#: The ops a program calls to issue communication (on its own thread).
_ISSUING_RE = re.compile(r"^(c10d::|_c10d_functional::|c10d_functional::)")


def pattern_key(comm_patterns: Iterable) -> tuple[str, ...]:
    """Hashable key of a list of ``--comm-kernel`` patterns (their source strings)."""
    return tuple(p.pattern if isinstance(p, re.Pattern) else str(p) for p in comm_patterns)


_T = TypeVar("_T")


def cached(trace: RankTrace, key: Hashable, compute: Callable[[], _T]) -> _T:
    """``compute()`` once per trace object and ``key``: the breakdown and the synchronization
    analysis share one classification of each trace. The cache lives on the trace object, so a
    trace made with ``dataclasses.replace`` starts afresh; do not modify ``trace.events`` in place
    after analysing it."""
    store = trace.__dict__.get("_pardiag_cache")
    if store is None:
        store = {}
        object.__setattr__(trace, "_pardiag_cache", store)
    if key not in store:
        store[key] = compute()
    return store[key]


def name_codes(trace: RankTrace) -> tuple[np.ndarray, np.ndarray]:
    """``pd.factorize`` of the events' names (``(codes, uniques)``: int64 code per event, each
    distinct name once), computed once per trace (:func:`cached`)."""
    return cached(trace, "name_codes", lambda: pd.factorize(trace.events["name"],
                                                            use_na_sentinel=False))


def name_test(trace: RankTrace, key: Hashable, test: Callable[[str], object]) -> np.ndarray:
    """``test(name)`` for every event of ``trace`` (bool array), evaluated once per distinct
    name and cached under ``key``; a fixed test per key (its answers are kept for the process,
    :data:`_NAME_TESTS`). pardiag's module ranges
    (:data:`vocab.MODULE_RANGE_PREFIX`) are never a hit: they carry the user's module names
    (an ``attn``, a ``router``), which say nothing of what ran, only where."""
    def compute() -> np.ndarray:
        codes, uniques = name_codes(trace)
        memo = _NAME_TESTS.setdefault(key, {})
        if len(memo) > _NAME_TESTS_MAX:
            memo.clear()

        def judged(u: object) -> bool:
            got = memo.get(u) if type(u) is str else None
            if got is None:
                got = bool(test(u)) if isinstance(u, str) and not u.startswith(
                    vocab.MODULE_RANGE_PREFIX) else False
                if type(u) is str:
                    memo[u] = got
            return got
        hit = np.fromiter(map(judged, uniques), dtype=bool, count=len(uniques))
        return hit[codes] if len(uniques) else np.zeros(len(codes), dtype=bool)
    return cached(trace, ("name_test", key), compute)


#: :func:`name_test`'s answers ``{key: {name: bool}}`` for the whole process: the ranks of a run
#: share their names (a worker summarizing several ranks tests each kernel name once, and a
#: long templated kernel name costs a regular expression tens of µs); a key's memo is dropped
#: past :data:`_NAME_TESTS_MAX` names.
_NAME_TESTS: dict[Hashable, dict[str, bool]] = {}
_NAME_TESTS_MAX = 200_000


def name_tests_known() -> dict[Hashable, dict[str, bool]]:
    """:func:`name_test`'s answers so far in this process (``{key: {name: bool}}``), for a
    worker to hand to its parent (:func:`learn_name_tests`)."""
    return _NAME_TESTS


def learn_name_tests(known: dict[Hashable, dict[str, bool]]) -> None:
    """Take another process's :func:`name_tests_known` as this process's own answers."""
    for key, answers in known.items():
        memo = _NAME_TESTS.setdefault(key, {})
        if len(memo) + len(answers) <= _NAME_TESTS_MAX:
            memo.update(answers)


def memory_events(trace: RankTrace) -> np.ndarray:
    """Bool per event of ``trace``: it is named ``[memory]`` (the profiler's memory instants;
    :func:`name_test`, cached)."""
    return name_test(trace, "memory", "[memory]".__eq__)


def compile_comm_patterns(patterns: Iterable[str]) -> list[re.Pattern]:
    """Compile user ``--comm-kernel`` regular expressions.

    Raises:
        PardiagError: a pattern is not a valid regular expression, or matches every name.
    """
    out = []
    for p in patterns:
        try:
            pat = re.compile(p)
        except re.error as exc:
            raise PardiagError(f"--comm-kernel {p!r}: invalid regular expression ({exc})") from None
        if pat.search("") is not None:
            raise PardiagError(f"--comm-kernel {p!r}: matches the empty string, so every kernel "
                               f"would count as communication")
        out.append(pat)
    return out


def comm_threads(trace: RankTrace) -> set[tuple[str, str]]:
    """``(pid, tid)`` of communication worker threads (gloo/NCCL runloops).

    A thread is a worker when its name says gloo or nccl (``pt_gloo_runloop``), or when it holds
    ``gloo:*`` events, issues no ``c10d::*``/``_c10d_functional::*`` ops and is not the process's
    main thread (tid ≠ pid): Kineto may name a gloo worker ``python3`` (its name when the profiler
    first saw it). Gloo runs point-to-point ``gloo:send``/``gloo:recv`` on the caller's (main)
    thread, which issues the ``c10d::*`` ops and is therefore not a worker.
    """
    return set(cached(trace, "comm_threads", lambda: _comm_threads(trace)))


def _comm_threads(trace: RankTrace) -> frozenset:
    ev = trace.events
    named = trace.thread_names
    threads = {k for k, name in named.items() if _COMM_THREAD_RE.search(name)}
    gloo = ev[name_test(trace, "gloo", lambda n: n.startswith("gloo:"))]
    issuing = ev[name_test(trace, "issuing", _ISSUING_RE.match)]
    callers = set(zip(issuing["pid"], issuing["tid"]))
    for pid, tid in set(zip(gloo["pid"], gloo["tid"])):
        if (pid, tid) not in callers and pid != tid:
            threads.add((pid, tid))
    return frozenset(threads)


def classify(trace: RankTrace, comm_patterns: Iterable[re.Pattern] = ()) -> pd.Series:
    """Kind of every event of ``trace``.

    Returns:
        categorical Series of :class:`Kind` values (as strings; every kind a category), aligned
        with ``trace.events``. Computed once per trace and pattern list (see :func:`cached`).
    """
    comm_patterns = list(comm_patterns)
    return cached(trace, ("classify", pattern_key(comm_patterns)),
                  lambda: _classify(trace, comm_patterns))


#: The categories of :func:`classify`'s result, in :class:`Kind`'s order.
_KIND_VALUES = [k.value for k in Kind]
_CODE = {k: i for i, k in enumerate(Kind)}


def _classify(trace: RankTrace, comm_patterns: list[re.Pattern]) -> pd.Series:
    ev = trace.events
    cat = ev["cat"]
    # category codes (compared as small integers, not strings)
    kind = np.full(len(ev), _CODE[Kind.OTHER], dtype=np.int8)

    is_kernel = (cat == "kernel").to_numpy()
    is_gpu_mem = (isin_mask(cat, ["gpu_memcpy", "gpu_memset"])
                  | (is_kernel & name_test(trace, "memory_name", _MEMORY_NAME_RE.match)))
    user = np.zeros(len(ev), dtype=bool)
    for pat in comm_patterns:
        user = user | name_test(trace, ("pattern", pat.pattern, pat.flags), pat.search)
    comm_k = name_test(trace, "gpu_comm", GPU_COMM_RE.search) | user
    kind[is_kernel] = _CODE[Kind.GPU_COMPUTE]
    kind[is_kernel & comm_k] = _CODE[Kind.GPU_COMM]
    kind[is_gpu_mem] = _CODE[Kind.GPU_MEMORY]
    kind[is_gpu_mem & user] = _CODE[Kind.GPU_COMM]  # copy-engine communication named by the user

    cpu_side = isin_mask(cat, ["cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"])
    is_comm = cpu_side & name_test(trace, "cpu_comm", CPU_COMM_RE.match)
    is_wait = cpu_side & name_test(trace, "cpu_wait", CPU_WAIT_RE.match)
    on_comm_thread = on_threads(ev, comm_threads(trace))
    is_cpu_op = (cat == "cpu_op").to_numpy()
    kind[is_cpu_op & ~on_comm_thread] = _CODE[Kind.CPU_COMPUTE]
    kind[is_comm] = _CODE[Kind.CPU_COMM]
    kind[is_wait] = _CODE[Kind.CPU_WAIT]  # c10d::wait, wait_tensor: waiting, not transferring
    is_step = (isin_mask(cat, ["user_annotation", "cpu_op"])
               & name_test(trace, "step", STEP_RE.match))
    kind[is_step] = _CODE[Kind.STEP]
    memory = np.flatnonzero(memory_events(trace))
    kind[memory[ev["ph"].to_numpy()[memory] == "i"]] = _CODE[Kind.MEMORY]
    return pd.Series(pd.Categorical.from_codes(kind, categories=_KIND_VALUES), index=ev.index,
                     name="kind")


def on_threads(ev: pd.DataFrame, threads) -> np.ndarray:
    """Bool per event: its ``(pid, tid)`` is in ``threads``."""
    if not threads or ev.empty:
        return np.zeros(len(ev), dtype=bool)
    pid_ok = ev["pid"].isin({p for p, _ in threads}).to_numpy()
    out = np.zeros(len(ev), dtype=bool)
    idx = np.flatnonzero(pid_ok)
    if len(idx):
        sub = ev.iloc[idx]
        out[idx] = np.fromiter(((p, t) in threads for p, t in zip(sub["pid"], sub["tid"])),
                               dtype=bool, count=len(idx))
    return out


def transport(trace: RankTrace) -> np.ndarray:
    """Bool per event: a *transport* event, the span of a transfer rather than a call that
    blocks its thread: any event on a communication worker thread (:func:`comm_threads`), and
    gloo's ``gloo:*`` spans on the calling thread (an async ``isend``/``irecv`` is recorded from
    its issue to its completion while the thread goes on computing). Communication in flight,
    never time taken from the thread's own work; the calls that block (``c10d::recv_`` of a
    blocking receive, waits) are other events."""
    def compute() -> np.ndarray:
        ev = trace.events
        return (on_threads(ev, comm_threads(trace))
                | name_test(trace, "gloo", lambda n: n.startswith("gloo:")))
    return cached(trace, "transport", compute)


def profiler_steps(trace: RankTrace, kinds: pd.Series) -> pd.DataFrame:
    """The training steps of a rank on the CPU timeline: its ``ProfilerStep#N`` windows, or,
    where the optimizer steps once every few profiler steps (gradient accumulation with
    ``prof.step()`` per micro-batch), those profiler steps joined into one step per optimizer
    step (:func:`training_steps`).

    Annotations with the same step number are merged (earliest start, latest end). Computed
    once per trace (which events are steps does not depend on ``--comm-kernel`` patterns).

    Returns:
        DataFrame with columns ``step`` (int: the profiler step number, or that of the profiler
        step that holds the optimizer step), ``start_us``, ``end_us`` (float, trace clock),
        ``profiler_steps`` (int: how many profiler steps the step joins, 1 without
        accumulation), sorted by start.
    """
    return cached(trace, "profiler_steps",
                  lambda: training_steps(_profiler_steps(trace, kinds), optimizer_steps(trace),
                                         scaler_updates(trace)))


def _profiler_steps(trace: RankTrace, kinds: pd.Series) -> pd.DataFrame:
    ev = trace.events[(kinds == Kind.STEP.value).to_numpy()]
    if ev.empty:
        return pd.DataFrame({"step": pd.Series(dtype=np.int64), "start_us": pd.Series(dtype=float),
                             "end_us": pd.Series(dtype=float)})
    step = ev["name"].str.extract(STEP_RE, expand=False).astype(np.int64)
    df = pd.DataFrame({"step": step, "start_us": ev["ts"], "end_us": ev["ts"] + ev["dur"]})
    df = df.groupby("step", as_index=False).agg(start_us=("start_us", "min"),
                                                end_us=("end_us", "max"))
    return df.sort_values("start_us", kind="stable").reset_index(drop=True)


def optimizer_steps(trace: RankTrace) -> np.ndarray:
    """Start times (µs, trace clock, sorted) of the rank's optimizer steps: the host ranges
    torch's optimizers record around ``step()`` (:data:`vocab.OPTIMIZER_STEP_RE`)."""
    ev = trace.events
    hit = (isin_mask(ev["cat"], ["user_annotation", "cpu_op"])
           & name_test(trace, "optimizer_step", vocab.OPTIMIZER_STEP_RE.match))
    return np.sort(ev["ts"].to_numpy(dtype=float)[hit])


def scaler_updates(trace: RankTrace) -> np.ndarray:
    """Start times (µs, trace clock, sorted) of the rank's gradient scaler updates
    (:data:`vocab.SCALER_UPDATE_RE`): one per training step of a mixed-precision run, where the
    scaler skipped the optimizer's ``step()`` too."""
    ev = trace.events
    hit = (isin_mask(ev["cat"], ["cpu_op"])
           & name_test(trace, "scaler_update", vocab.SCALER_UPDATE_RE.match))
    return np.sort(ev["ts"].to_numpy(dtype=float)[hit])


def training_steps(steps: pd.DataFrame, optimizer_starts: np.ndarray,
                   update_starts: np.ndarray | None = None) -> pd.DataFrame:
    """Profiler steps (``step``, ``start_us``, ``end_us``) joined into training steps, one per
    optimizer step, when the evidence says the optimizer steps once every few profiler steps.

    The evidence: every profiler step holds at most one optimizer step (or every one that
    holds any holds as many: several optimizers stepped together), and some hold none while
    others hold one. A profiler step that holds a gradient scaler's update
    (``update_starts``, :func:`scaler_updates`) ends a training step too, where the scaler
    skipped the optimizer (inf or NaN gradients). A training step is then the profiler steps
    after one such end up to and including the next; it takes the number of the profiler step
    that holds its end. The profiler steps before the first optimizer step form a training step
    only when they are as many as those of the next one (else the window began inside an
    accumulation); those after the last optimizer step are left out (no optimizer step ended
    them). Without that evidence (no optimizer ranges recorded, one in every profiler step,
    more in some profiler steps than in others, or only one optimizer step to measure the
    period by) the profiler steps stay as they are.

    Returns:
        ``steps`` with a ``profiler_steps`` column (int, profiler steps per row), joined
        where the evidence holds; sorted by start.
    """
    out = steps.assign(profiler_steps=np.ones(len(steps), dtype=np.int64))
    updates = np.empty(0) if update_starts is None else update_starts
    if len(steps) < 2 or len(optimizer_starts) + len(updates) < 2:
        return out
    starts = steps["start_us"].to_numpy(dtype=float)
    ends = steps["end_us"].to_numpy(dtype=float)
    held = np.array([int(((optimizer_starts >= s) & (optimizer_starts < e)).sum())
                     for s, e in zip(starts, ends)])
    if held.max() > 1:
        # several optimizers that step one after another (modded-nanogpt's Adam, Adam and
        # Muon) are one optimizer step: so where every profiler step that holds any holds as
        # many; else several optimizer steps may share a profiler step, and they stay as they are
        if len(set(held[held > 0].tolist())) > 1:
            return out
        held = np.minimum(held, 1)
    updated = np.array([bool(((updates >= s) & (updates < e)).any())
                        for s, e in zip(starts, ends)], dtype=bool)
    held = np.where(updated, 1, held)
    if held.min() > 0 or (held == 1).sum() < 2:
        return out
    ends_at = np.flatnonzero(held == 1)
    groups = [range(int(a) + 1, int(b) + 1) for a, b in zip(ends_at[:-1], ends_at[1:])]
    if ends_at[0] + 1 == len(groups[0]):
        groups.insert(0, range(0, int(ends_at[0]) + 1))
    numbers = steps["step"].to_numpy()
    return pd.DataFrame({
        "step": np.array([numbers[g[-1]] for g in groups], dtype=np.int64),
        "start_us": np.array([starts[g[0]] for g in groups], dtype=float),
        "end_us": np.array([ends[g[-1]] for g in groups], dtype=float),
        "profiler_steps": np.array([len(g) for g in groups], dtype=np.int64)})


_NCCL_TYPE_RE = re.compile(
    r"(All_?Reduce|All_?Gather|Reduce_?Scatter|All_?To_?All|Broadcast|Bcast|Reduce|SendRecv"
    r"|Send|Recv)",
    re.IGNORECASE)
#: Collective names with underscores removed → the standard name.
_CANON = {
    "allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all", "alltoallv": "all_to_all", "broadcast": "broadcast",
    "bcast": "broadcast",
    "reduce": "reduce", "sendrecv": "send_recv", "send": "send", "recv": "recv",
    "recvanysource": "recv", "barrier": "barrier", "gather": "gather", "scatter": "scatter",
}
#: The standard collective names :func:`collective_type` returns for known operations.
STANDARD_COLLECTIVES = frozenset(_CANON.values())
_OP_SUFFIXES = ("_coalesced", "_base", "_single", "_into_tensor", "_tensor")


def _canonical(op: str) -> str:
    """``_allgather_base_`` → ``all_gather``; ``reduce_scatter_tensor_coalesced`` →
    ``reduce_scatter``; unknown names come back lower-cased."""
    key = op.lower().strip("_")
    changed = True
    while changed:
        changed = False
        for suffix in _OP_SUFFIXES:
            if key.endswith(suffix):
                key = key[: -len(suffix)].strip("_")
                changed = True
    return _CANON.get(key.replace("_", ""), op.lower().strip("_"))


def collective_type(name: str, args: dict | None = None) -> str:
    """Standard collective name (``all_reduce``, ``all_gather``, ``reduce_scatter``,
    ``all_to_all``, ``broadcast``, ``send_recv``, ...) of a communication event.

    ``record_param_comms`` and generic kernels take the ``Collective name`` arg when present.
    Names that match nothing known come back unchanged (custom kernels keep their own name).
    """
    if coll := vocab.COLLECTIVE_NAME.get(args):
        return _canonical(str(coll))
    for prefix in ("gloo:", "nccl:", "c10d::", "_c10d_functional::", "c10d_functional::"):
        if name.startswith(prefix):
            return _canonical(name[len(prefix):])
    if fw := vocab.FRAMEWORK_COLLECTIVE_RE.match(name):
        return fw.group(1)
    if GPU_COMM_RE.search(name):
        m = _NCCL_TYPE_RE.search(name.split("(")[0])
        if m:
            return _canonical(m.group(1))
        return name.split("(")[0]
    return name.split("(")[0][:80]


def normalize_schedule(name: str | None) -> str:
    """``"gpipe"``, ``"1f1b"`` or ``"interleaved"`` from a schedule name such as
    ``"ScheduleInterleaved1F1B"``; raises ValueError for other names (zero-bubble, DualPipe…)."""
    s = (name or "").lower().removeprefix("schedule")
    if "interleaved" in s and "zero" not in s:
        return "interleaved"
    if s in ("gpipe", "filldrain"):
        return "gpipe"
    if s == "1f1b":
        return "1f1b"
    raise ValueError(f"schedule {name!r} is not modelled (GPipe, 1F1B and Interleaved1F1B are)")


#: Device names in ``deviceProperties`` → the accelerator kind (first match wins).
_DEVICE_NAME_KINDS = (
    (re.compile(r"nvidia|tesla|geforce|quadro|\b[ahlbv]100\b|\bh200\b|\bgb?200\b", re.I), "cuda"),
    (re.compile(r"\bamd\b|instinct|radeon|\bmi\d{3}", re.I), "rocm"),
    (re.compile(r"intel|data center gpu max|\barc\b", re.I), "xpu"),
    (re.compile(r"gaudi|habana|\bhl-\d", re.I), "hpu"),
    (re.compile(r"mtia", re.I), "mtia"),
)
#: ``distributedInfo.backend`` → the accelerator kind, where the backend tells.
_BACKEND_KINDS = {"xccl": "xpu", "ccl": "xpu", "hccl": "hpu", "nccl": "cuda"}


#: Runtime calls that launch a kernel (``cudaLaunchKernel``, ``cudaLaunchKernelExC``,
#: ``cuLaunchKernelEx``, ``hipLaunchKernel``, ``hipExtModuleLaunchKernel``, SYCL's
#: ``urEnqueueKernelLaunch``).
LAUNCH_CALL_RE = re.compile(r"launch\w*kernel|kernel\w*launch", re.IGNORECASE)
#: Host ops that name the collective they run (a c10d record, a backend's range): a kernel
#: launched inside one is that collective's (outer wrappers such as functional collectives
#: also launch copies and reshapes).
_COLLECTIVE_OP_RE = re.compile(r"^(nccl:|rccl:|xccl:|record_param_comms$)")


def unnamed_comm_kernels(trace: RankTrace, comm_patterns: Iterable[re.Pattern] = ()
                         ) -> dict[str, int]:
    """GPU kernels that collectives launched and no communication pattern names:
    ``{kernel name: launches}``, over the collectives none of whose launched kernels (``cat``
    ``kernel``) is a communication kernel (:func:`classify` with ``comm_patterns``). Such a
    kernel is the collective's communication under a name nobody told pardiag (a custom or
    renamed collective kernel): the breakdown counts it as computation. A collective is a span
    of a thread's time covered by records or a backend's ranges (``record_param_comms``,
    ``nccl:*``, nested or not); a launch inside it (a runtime call, tied to its kernel by
    ``correlation``) is its. Copies never count (gloo copies CUDA tensors to the host and
    communicates there). Empty when every collective launched a communication kernel."""
    ev = trace.events
    if ev is None or not len(ev) or not trace.has_gpu:
        return {}
    cat = ev["cat"]
    op_rows = np.flatnonzero(name_test(trace, "collective_op", _COLLECTIVE_OP_RE.match)
                             & isin_mask(cat, ["cpu_op", "user_annotation"]))
    if not len(op_rows):
        return {}
    # numpy columns and row positions throughout: a few hundred ops in a large table
    ts, corr = ev["ts"].to_numpy(dtype=float), ev["correlation"].to_numpy()
    end = ts + ev["dur"].to_numpy(dtype=float)
    thread = list(zip(ev["pid"].to_numpy()[op_rows].tolist(),
                      ev["tid"].to_numpy()[op_rows].tolist()))
    l_rows = np.flatnonzero(isin_mask(cat, ["cuda_runtime", "cuda_driver"])
                            & name_test(trace, "launch_call", LAUNCH_CALL_RE.search)
                            & (corr >= 0))
    launches: dict[tuple, list[int]] = {}
    for row, key in zip(l_rows.tolist(), zip(ev["pid"].to_numpy()[l_rows].tolist(),
                                             ev["tid"].to_numpy()[l_rows].tolist())):
        launches.setdefault(key, []).append(row)
    by_thread: dict[tuple, list[int]] = {}
    for row, key in zip(op_rows.tolist(), thread):
        by_thread.setdefault(key, []).append(row)
    span_of: dict[int, tuple] = {}   # launch correlation -> (thread, span) of its collective
    for key, rows in by_thread.items():
        mine = np.asarray(launches.get(key, []), dtype=np.int64)
        if not len(mine):
            continue
        spans = iv.union(ts[rows], end[rows] + 1e-9)
        at = np.searchsorted(spans[:, 0], ts[mine], side="right") - 1
        inside = (at >= 0) & (ts[mine] <= spans[np.clip(at, 0, None), 1])
        for span, c in zip(at[inside].tolist(), corr[mine[inside]].tolist()):
            span_of[c] = (key, span)
    if not span_of:
        return {}
    # only the kernels those launches ran
    k_rows = np.flatnonzero(np.isin(corr, np.fromiter(span_of, np.int64, len(span_of)))
                            & (cat == "kernel").to_numpy())
    is_comm = (classify(trace, comm_patterns) == Kind.GPU_COMM.value).to_numpy()
    per_span: dict[tuple, list[tuple[str, bool]]] = {}
    for c, name, comm in zip(corr[k_rows].tolist(), ev["name"].to_numpy()[k_rows].tolist(),
                             is_comm[k_rows].tolist()):
        per_span.setdefault(span_of[c], []).append((name, comm))
    out: dict[str, int] = {}
    for launched in per_span.values():
        if not any(comm for _, comm in launched):
            for name, _ in launched:
                out[name] = out.get(name, 0) + 1
    return out


def kernel_warnings(trace: RankTrace, comm_patterns: Iterable[re.Pattern] = ()) -> list[str]:
    """The loader's warnings about what a rank's kernels say (each starts with its file): its
    collectives launched kernels no communication pattern names (:func:`unnamed_comm_kernels`),
    it is a GPU run whose trace holds no kernel (:func:`missing_device_activity`), or its
    events hold a dtype or device type pardiag does not know
    (:func:`pardiag.analyzer.trace.vocab.unknown_values`: the bytes of those ops are left out,
    never guessed)."""
    out = []
    unknown = vocab.unknown_values(trace.events["args"].dropna()) if len(trace.events) else {}
    for what, counts in unknown.items():
        if counts:
            top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
            shown = ", ".join(f"{v!r} ({n})" for v, n in top[:3])
            left = ("their message sizes and bandwidth are left out" if what == "dtype"
                    else "their memory is shown under that number")
            out.append(f"{trace.path}: {sum(counts.values())} event(s) name a {what} pardiag "
                       f"does not know: {shown}; {left}")
    unnamed = unnamed_comm_kernels(trace, comm_patterns)
    if unnamed:
        top = sorted(unnamed.items(), key=lambda kv: (-kv[1], kv[0]))
        shown = ", ".join(f"{name} ({n})" for name, n in top[:3])
        more = f" and {len(top) - 3} more" if len(top) > 3 else ""
        out.append(f"{trace.path}: communication ops launched {sum(unnamed.values())} GPU "
                   f"kernel(s) that no communication pattern names, counted as computation: "
                   f"{shown}{more}; name them with --comm-kernel REGEX")
    gpu_run = missing_device_activity(trace)
    copies = (int(isin_mask(trace.events["cat"], ["gpu_memcpy", "gpu_memset"]).sum())
              if gpu_run and len(trace.events) else 0)
    if copies:   # the device's activity was recorded: it ran no kernel
        out.append(f"{trace.path}: a GPU run ({gpu_run}) whose device ran {copies} copies "
                   f"and memsets and no kernel: it is analysed on its host's timeline")
    elif gpu_run:
        out.append(f"{trace.path}: a GPU run ({gpu_run}) whose trace holds no GPU kernel "
                   f"(profiled without the device's activity?): its computation and "
                   f"communication on the device are not in it, and the communication times "
                   f"are the host's calls, not the transfers")
    return out


_GPU_BACKEND_OP_RE = re.compile(r"^(nccl|rccl|xccl|hccl):")


def missing_device_activity(trace: RankTrace) -> str | None:
    """What shows that a rank whose trace holds no GPU kernel ran on a GPU: its backend
    (``distributedInfo.backend`` nccl, rccl, xccl, ccl, hccl), its runtime calls
    (``cuda_runtime``/``cuda_driver`` events: kernels were launched) or a GPU backend's ranges
    (``nccl:all_reduce``), e.g. ``"backend nccl, 120 runtime calls"``; None for a rank with
    kernels or without such signs (a CPU run). Such a trace was recorded without the device's
    activity (``ProfilerActivity.CUDA`` left out, or lost): its computation and communication
    on the device are not in it."""
    if trace.has_gpu:
        return None
    backend = str(vocab.DIST_BACKEND.get(vocab.DISTRIBUTED_INFO.get(trace.metadata), "")).lower()
    signs = [f"backend {backend}"] if backend in (*_BACKEND_KINDS, "rccl") else []
    if trace.events is not None and len(trace.events):
        ev = trace.events
        n = int(isin_mask(ev["cat"], ["cuda_runtime", "cuda_driver"]).sum())
        if n:
            signs.append(f"{n} runtime calls")
        # a GPU backend's own ranges: ProcessGroupNCCL records 'nccl:all_reduce' and the like
        # (whatever distributedInfo says: 'undefined' when init_process_group named none)
        gpu_ops = int((name_test(trace, "gpu_backend_op", _GPU_BACKEND_OP_RE.match)
                       & isin_mask(ev["cat"], ["cpu_op", "user_annotation"])).sum())
        if gpu_ops:
            signs.append(f"{gpu_ops} GPU-backend ops")
    return ", ".join(signs) or None


def device_kind(trace: RankTrace) -> str:
    """The rank's device: ``"cpu"`` (no kernels), else ``"cuda"``, ``"rocm"``, ``"xpu"``,
    ``"hpu"``, ``"mtia"`` from the device name in ``deviceProperties``, else from
    ``distributedInfo.backend`` (``nccl`` → cuda, ``xccl`` → xpu, ``hccl`` → hpu), else
    ``"unknown"`` (a device the trace does not name is reported as unknown, never guessed)."""
    if not trace.has_gpu:
        return "cpu"
    props = vocab.DEVICE_PROPERTIES.get(trace.metadata)
    names = [str(vocab.DEVICE_NAME.get(p, "")) for p in props if isinstance(p, dict)] if isinstance(
        props, list) else []
    for name in names:
        for pat, kind in _DEVICE_NAME_KINDS:
            if pat.search(name):
                return kind
    backend = str(vocab.DIST_BACKEND.get(vocab.DISTRIBUTED_INFO.get(trace.metadata), "")).lower()
    return _BACKEND_KINDS.get(backend, "unknown")

