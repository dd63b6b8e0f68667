"""The trace vocabulary: every key pardiag reads from a Kineto trace, an NCCL or c10d record, and
the element size of every torch dtype. No other module spells a raw key (``tests/test_vocab.py``
holds that); each reads it through the :class:`ArgKey` here, which knows every spelling that
torch, Kineto and NCCL have written it with.

Keys (what writes them):

* an event's own fields: ``stream`` (GPU kernels), ``sycl queue`` (Intel XPU kernels),
  ``correlation`` (runtime call ↔ kernel); metadata events' ``name``/``labels``;
* ``record_param_comms`` and NCCL kernels' args (torch ``ParamCommsUtils``): ``Collective
  name``, ``dtype``, ``In msg nelems``/``Out msg nelems``, ``In split size``/``Out split size``,
  ``Group size``, ``Global rank start``/``Global rank stride``, ``Process Group Name``/
  ``Description``/``Ranks``, ``Rank``, ``Seq``, ``Dst Rank``/``Src Rank`` (send and recv; torch
  writes them capitalised, earlier notes said ``Dst rank``: both are read);
* any op recorded with shapes (``record_shapes``): ``Input Dims``, ``Input type``,
  ``Concrete Inputs``;
* ``[memory]`` instants: ``Device Type``, ``Total Allocated``, ``Total Reserved``;
* the file's top level: ``distributedInfo`` (``rank``, ``backend``, ``world_size``,
  ``pg_config``, ``pg_count``), ``deviceProperties``, ``baseTimeNanoseconds``,
  ``displayTimeUnit``.

Op and kernel names: the ranges, ops and runtime calls a per-rank quantity looks for (the
DataLoader's, the optimizer's, device synchronizations, wrappers' and schedules' ranges, the ops
that issue communication), at the end of this module; how events are told apart as
communication or computation is :mod:`pardiag.analyzer.trace.classify`'s.

Dtypes: :data:`DTYPE_BYTES` maps every torch dtype, as c10's ``ScalarType`` names it (what
``record_param_comms`` writes: ``BFloat16``, ``Float8_e4m3fnuz``), as Python names it
(``bfloat16``, ``torch.float8_e4m3fnuz``) and as ``Input type`` names it (``c10::BFloat16``,
``float``, ``long int``), to its element size in bytes. :func:`dtype_bytes` gives None for a
dtype it does not know: a size is never guessed; :func:`unknown_values` lists such values so
that the loader warns.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class ArgKey:
    """One key of a trace event's ``args`` (or of a record), with every spelling it has been
    written with (the first is torch's current one).

    Attributes:
        spellings: the key's spellings, read in this order.
        what: what the value is (units, whose rank).
    """

    spellings: tuple[str, ...]
    what: str

    @property
    def name(self) -> str:
        """The current spelling."""
        return self.spellings[0]

    def get(self, args: Any, default: Any = None) -> Any:
        """The value under the first spelling ``args`` holds (``default`` when none does, or
        when ``args`` is not a dict)."""
        # ``type(...) is dict`` and ``None`` (most events' args) first: the ABC check costs
        # more than the lookup, per event
        if args is None or (type(args) is not dict and not isinstance(args, Mapping)):
            return default
        for k in self.spellings:
            if k in args:
                return args[k]
        return default

    def values(self, args_list: Iterable[Any], default: Any = None) -> list[Any]:
        """:meth:`get` of each of ``args_list`` (a column of events' args), in one list: the
        way to read a key of every event."""
        if len(self.spellings) == 1:
            key = self.spellings[0]
            return [a.get(key, default) if type(a) is dict else default if a is None
                    else self.get(a, default) for a in args_list]
        return [self.get(a, default) for a in args_list]

    def present(self, args: Any) -> bool:
        """Whether ``args`` holds the key under any spelling."""
        return isinstance(args, Mapping) and any(k in args for k in self.spellings)


# -- an event's own fields -----------------------------------------------------------------------
STREAM = ArgKey(("stream",), "the GPU stream a kernel, memcpy or memset ran on")
DEVICE = ArgKey(("device",), "the device a kernel, memcpy or memset ran on")
SYCL_QUEUE = ArgKey(("sycl queue",), "the SYCL queue an Intel XPU kernel ran on (its stream)")
CORRELATION = ArgKey(("correlation",), "links a runtime call with the kernel it launched")
THREAD_NAME = ArgKey(("name",), "a thread_name or process_name metadata event's name")
PROCESS_LABELS = ArgKey(("labels",), "a process_labels metadata event's labels")

# -- record_param_comms and NCCL kernels ---------------------------------------------------------
COLLECTIVE_NAME = ArgKey(("Collective name",), "the collective (allreduce, send, ...)")
DTYPE = ArgKey(("dtype",), "the element type, as c10's ScalarType names it")
IN_NELEMS = ArgKey(("In msg nelems",), "elements of the input buffer")
OUT_NELEMS = ArgKey(("Out msg nelems",), "elements of the output buffer")
IN_SPLITS = ArgKey(("In split size",), "an all-to-all's input split sizes (rows), a list as text")
OUT_SPLITS = ArgKey(("Out split size",), "an all-to-all's output split sizes, a list as text")
GROUP_SIZE = ArgKey(("Group size",), "ranks of the process group")
GLOBAL_RANK_START = ArgKey(("Global rank start",), "global rank of the group's rank 0")
GLOBAL_RANK_STRIDE = ArgKey(("Global rank stride",), "global-rank step between group ranks")
PG_NAME = ArgKey(("Process Group Name",), "the group's name (creation order, per rank)")
PG_DESC = ArgKey(("Process Group Description",), "the group's description (mesh_tp, ...)")
PG_RANKS = ArgKey(("Process Group Ranks",), "the group's global ranks, a list as text")
RANK = ArgKey(("Rank",), "the caller's rank in the group; the root's for a rooted op, the "
                        "peer's for a send or recv")
#: Ops whose record's ``Rank`` is the caller's own rank in the group: ``ProcessGroupNCCL`` records
#: ``rank_`` for these (``RECORD_PARAM_COMMS_DATA``) and the root for broadcast, reduce, scatter
#: and gather, the peer for send and recv.
OWN_RANK_OPS = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier"})
SEQ = ArgKey(("Seq",), "the group's own sequence number of the op")
DST_RANK = ArgKey(("Dst Rank", "Dst rank"), "a send's destination, a global rank")
SRC_RANK = ArgKey(("Src Rank", "Src rank"), "a recv's source, a global rank")
#: Spellings of a point-to-point peer's rank *in its group* that other tools' records use.
PEER = ArgKey(("Peer", "peer", "dst", "src"), "a point-to-point peer's rank in its group")

# -- ops recorded with shapes --------------------------------------------------------------------
INPUT_DIMS = ArgKey(("Input Dims",), "the shape of each input (a list per input)")
INPUT_TYPE = ArgKey(("Input type",), "the dtype of each input, as C++ names it")
CONCRETE_INPUTS = ArgKey(("Concrete Inputs",), "scalar inputs as text (a peer, split sizes)")
OP_FLOPS = ArgKey(("flops",), "the profiler's own FLOP count of the op (with_flops=True)")
SEQUENCE_NUMBER = ArgKey(("Sequence number",), "autograd's number of a forward op, and of the "
                         "backward function that op built (the link from one to the other)")

# -- [memory] instants ---------------------------------------------------------------------------
DEVICE_TYPE = ArgKey(("Device Type",), "c10::DeviceType number of the device")
TOTAL_ALLOCATED = ArgKey(("Total Allocated",), "bytes allocated on the device after the event")
TOTAL_RESERVED = ArgKey(("Total Reserved",), "bytes the caching allocator reserved")

# -- the c10d flight recorder's entries (torch.distributed's _dump_*_trace) ----------------------
FR_PROCESS_GROUP = ArgKey(("process_group",), "[group name, group description]")
FR_PROFILING_NAME = ArgKey(("profiling_name",), "the op as the profiler names it (nccl:...)")
FR_INPUT_SIZES = ArgKey(("input_sizes",), "the shape of each input")
FR_INPUT_DTYPES = ArgKey(("input_dtypes",), "the dtype of each input (ScalarType names)")
FR_OUTPUT_SIZES = ArgKey(("output_sizes",), "the shape of each output")
FR_OUTPUT_DTYPES = ArgKey(("output_dtypes",), "the dtype of each output")
FR_IS_P2P = ArgKey(("is_p2p",), "a send or recv (numbered by p2p_seq_id)")
FR_P2P_SEQ = ArgKey(("p2p_seq_id",), "the group's sequence number of a point-to-point op")
FR_COLLECTIVE_SEQ = ArgKey(("collective_seq_id",), "the group's sequence number of a collective")
FR_TIME_CREATED = ArgKey(("time_created_ns",), "when the op was issued, epoch ns")

# -- the file's top level ------------------------------------------------------------------------
DISTRIBUTED_INFO = ArgKey(("distributedInfo",), "torch.distributed's view of the rank")
DIST_RANK = ArgKey(("rank",), "distributedInfo: the global rank")
DIST_BACKEND = ArgKey(("backend",), "distributedInfo: nccl, gloo, xccl, ...")
DIST_WORLD_SIZE = ArgKey(("world_size",), "distributedInfo: ranks of the job")
DIST_PG_CONFIG = ArgKey(("pg_config",), "distributedInfo: the process groups of the rank")
DIST_PG_COUNT = ArgKey(("pg_count",), "distributedInfo: process groups created")
PG_CONFIG_RANKS = ArgKey(("ranks",), "a pg_config entry: the group's global ranks")
PG_CONFIG_NAME = ArgKey(("pg_name",), "a pg_config entry: the group's name")
PG_CONFIG_DESC = ArgKey(("pg_desc",), "a pg_config entry: the group's description")
DEVICE_PROPERTIES = ArgKey(("deviceProperties",), "one entry per GPU (name, memory, SMs)")
DEVICE_NAME = ArgKey(("name",), "deviceProperties: the device's name")
DEVICE_TOTAL_MEMORY = ArgKey(("totalGlobalMem",), "deviceProperties: the device's memory, bytes")
BASE_TIME_NS = ArgKey(("baseTimeNanoseconds",), "epoch ns of the trace's time zero")
HOST_NAME = ArgKey(("host_name",), "the host the trace was recorded on")
DISPLAY_TIME_UNIT = ArgKey(("displayTimeUnit",), "the unit of ts and dur (us by default)")

#: Every key of this module, by its Python name (``tests/test_vocab.py`` reads it).
KEYS: dict[str, ArgKey] = {n: v for n, v in dict(globals()).items() if isinstance(v, ArgKey)}

#: torch's device types (``c10::DeviceType``), as ``[memory]`` events number them.
DEVICE_TYPES = {0: "cpu", 1: "cuda", 2: "mkldnn", 3: "opengl", 4: "opencl", 5: "ideep", 6: "hip",
                7: "fpga", 8: "maia", 9: "xla", 10: "vulkan", 11: "metal", 12: "xpu", 13: "mps",
                14: "meta", 15: "hpu", 16: "ve", 17: "lazy", 18: "ipu", 19: "mtia",
                20: "privateuseone"}

#: Element size in bytes of every torch dtype: (c10 ScalarType name, torch name, bytes); the
#: C++ spellings of ``Input type`` are in :data:`_CPP_NAMES`. Sub-byte types count one byte per
#: element as torch stores them (``float4_e2m1fn_x2``: two values in one byte element).
_DTYPES = (
    ("Byte", "uint8", 1), ("Char", "int8", 1), ("Short", "int16", 2), ("Int", "int32", 4),
    ("Long", "int64", 8), ("Half", "float16", 2), ("Float", "float32", 4),
    ("Double", "float64", 8), ("ComplexHalf", "complex32", 4), ("ComplexFloat", "complex64", 8),
    ("ComplexDouble", "complex128", 16), ("Bool", "bool", 1), ("QInt8", "qint8", 1),
    ("QUInt8", "quint8", 1), ("QInt32", "qint32", 4), ("BFloat16", "bfloat16", 2),
    ("QUInt4x2", "quint4x2", 1), ("QUInt2x4", "quint2x4", 1), ("Bits1x8", "bits1x8", 1),
    ("Bits2x4", "bits2x4", 1), ("Bits4x2", "bits4x2", 1), ("Bits8", "bits8", 1),
    ("Bits16", "bits16", 2), ("Float8_e5m2", "float8_e5m2", 1),
    ("Float8_e4m3fn", "float8_e4m3fn", 1), ("Float8_e5m2fnuz", "float8_e5m2fnuz", 1),
    ("Float8_e4m3fnuz", "float8_e4m3fnuz", 1), ("UInt16", "uint16", 2), ("UInt32", "uint32", 4),
    ("UInt64", "uint64", 8), ("UInt1", "uint1", 1), ("UInt2", "uint2", 1), ("UInt3", "uint3", 1),
    ("UInt4", "uint4", 1), ("UInt5", "uint5", 1), ("UInt6", "uint6", 1), ("UInt7", "uint7", 1),
    ("Int1", "int1", 1), ("Int2", "int2", 1), ("Int3", "int3", 1), ("Int4", "int4", 1),
    ("Int5", "int5", 1), ("Int6", "int6", 1), ("Int7", "int7", 1),
    ("Float8_e8m0fnu", "float8_e8m0fnu", 1), ("Float4_e2m1fn_x2", "float4_e2m1fn_x2", 1),
)
#: ``Input type`` names (C++ type names) and torch's short aliases.
_CPP_NAMES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8,
              "long": 8, "int": 4, "short int": 2, "short": 2, "signed char": 1,
              "unsigned char": 1, "bool": 1, "c10::complex<float>": 8,
              "c10::complex<double>": 16, "c10::complex<c10::Half>": 4,
              "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1,
              "c10::Float8_e5m2fnuz": 1, "c10::Float8_e8m0fnu": 1, "unsigned short": 2,
              "unsigned int": 4, "unsigned long": 8,
              "half": 2, "float16": 2, "float32": 4, "float64": 8, "cfloat": 8, "cdouble": 16,
              "long long": 8}

#: dtype name (any spelling above, also ``torch.``-prefixed) → element size in bytes.
DTYPE_BYTES: dict[str, int] = {
    **{c10: n for c10, _, n in _DTYPES},
    **{py: n for _, py, n in _DTYPES},
    **{f"torch.{py}": n for _, py, n in _DTYPES},
    **_CPP_NAMES,
}


def int_arg(v: Any) -> int | None:
    """An integer from a trace arg (Kineto writes many as strings: ``"3"``); None otherwise."""
    if isinstance(v, bool) or v is None:
        return None
    out = None
    if isinstance(v, int):
        out = v
    elif isinstance(v, float):
        out = int(v) if math.isfinite(v) and v == int(v) else None
    elif isinstance(v, str):
        try:
            out = int(v.strip().strip('"'))
        except ValueError:
            return None
    # beyond 2^53 it is no count, rank or sequence number (and would not fit the tables)
    return out if out is not None and abs(out) < 2 ** 53 else None


#: A merge tool's prefix of every event name with its rank (``[R3] ProfilerStep#5``,
#: ``[rank3] aten::mm``); VeOmni's ``merge_chrome_trace.py`` prefixes the metadata events too
#: (``[R3] process_name``, ``[R3] thread_name``).
RANK_NAME_PREFIX_RE = re.compile(r"^\[(?:R|rank\s*)(\d+)\]\s")


def metadata_name(name: Any) -> tuple[Any, int | None]:
    """(a metadata event's name without a merge tool's rank prefix, that rank or None)."""
    if type(name) is str and name.startswith("["):
        m = RANK_NAME_PREFIX_RE.match(name)
        if m is not None:
            return name[m.end():], int(m.group(1))
    return name, None


def rank_list(v: Any) -> list[int] | None:
    """Global ranks from ``Process Group Ranks`` / ``pg_config`` (a list, or text such as
    ``"[0, 1]"``); None when unreadable or truncated (``"[0, 1, ...]"``)."""
    if isinstance(v, str):
        text = v.strip().strip('"').strip()
        if not (text.startswith("[") and text.endswith("]")) or "..." in text:
            return None
        items = [t for t in text[1:-1].replace(" ", "").split(",") if t]
        v = items
    if not isinstance(v, (list, tuple)):
        return None
    out = [int_arg(x) for x in v]
    ranks = [x for x in out if x is not None and x >= 0]
    return ranks if out and len(ranks) == len(out) else None


def dtype_bytes(dtype: Any) -> int | None:
    """Element size in bytes of ``dtype`` (any spelling of :data:`DTYPE_BYTES`, surrounding
    quotes removed), or None when pardiag does not know it (no size is guessed)."""
    if dtype is None:
        return None
    return DTYPE_BYTES.get(str(dtype).strip().strip('"'))


#: C++ spellings of ``Input type`` (:data:`_CPP_NAMES`) → torch's dtype name.
_CPP_DTYPES = {"float": "float32", "double": "float64", "c10::Half": "float16",
               "c10::BFloat16": "bfloat16", "half": "float16", "long int": "int64",
               "long": "int64", "long long": "int64", "int": "int32", "short int": "int16",
               "short": "int16", "signed char": "int8", "unsigned char": "uint8", "bool": "bool",
               "c10::Float8_e4m3fn": "float8_e4m3fn", "c10::Float8_e5m2": "float8_e5m2",
               "c10::Float8_e4m3fnuz": "float8_e4m3fnuz", "c10::Float8_e5m2fnuz": "float8_e5m2fnuz",
               "c10::Float8_e8m0fnu": "float8_e8m0fnu"}
#: Any spelling of :data:`DTYPE_BYTES` that names a torch dtype → torch's name (``float32``).
DTYPE_NAMES: dict[str, str] = {**{c10: py for c10, py, _ in _DTYPES},
                               **{py: py for _, py, _ in _DTYPES},
                               **{f"torch.{py}": py for _, py, _ in _DTYPES}, **_CPP_DTYPES}


def dtype_name(dtype: Any) -> str | None:
    """torch's name of ``dtype`` (``"c10::BFloat16"`` → ``"bfloat16"``, ``"float"`` →
    ``"float32"``), or None when pardiag does not know it."""
    if dtype is None:
        return None
    return DTYPE_NAMES.get(str(dtype).strip().strip('"'))


def unknown_values(args_list: Iterable[Any]) -> dict[str, Counter]:
    """Values of the events' ``args`` that pardiag cannot read: ``{"dtype": Counter of unknown
    dtype names, "device type": Counter of unknown device-type numbers}`` (empty Counters when
    every value is known). Read from ``dtype``, ``Input type`` and ``Device Type``."""
    dtypes: Counter = Counter()
    devices: Counter = Counter()
    # once per event of a trace: the keys' single spellings looked up directly, each distinct
    # value judged once
    dtype_key, = DTYPE.spellings
    types_key, = INPUT_TYPE.spellings
    device_key, = DEVICE_TYPE.spellings
    known: dict[str, bool] = {}
    for a in args_list:
        if type(a) is not dict and not isinstance(a, Mapping):
            continue
        d = a.get(dtype_key)
        if d is not None and d != "":
            ok = known.get(d) if type(d) is str else None
            if ok is None:
                ok = dtype_bytes(d) is not None
                if type(d) is str:
                    known[d] = ok
            if not ok:
                dtypes[str(d)] += 1
        types = a.get(types_key)
        if type(types) is list:
            for t in types:
                if type(t) is str and t.startswith(_ELEMENT_PREFIXES) and dtype_bytes(t) is None:
                    dtypes[t] += 1
        dev = a.get(device_key)
        # a value of any JSON type: a list or an object is no device number either
        if dev is not None and not (isinstance(dev, int) and dev in DEVICE_TYPES):
            devices[str(dev)] += 1
    return {"dtype": dtypes, "device type": devices}


#: Prefixes of the ``Input type`` entries that name a floating-point element type of c10
#: (``Input type`` also names ``ScalarList``, ``GenericList``, ``c10::Device`` and the like,
#: which carry no element size): the kinds new torch releases add.
_ELEMENT_PREFIXES = ("c10::Float8", "c10::Float4", "c10::Float6")


# -- op and kernel names -------------------------------------------------------------------------

#: Ops whose FLOPs and bytes pardiag counts from their ``Input Dims``, by name → op class
#: (:mod:`pardiag.analyzer.per_rank.flops` holds each class's formula). Wrappers (``aten::linear``,
#: ``aten::matmul``, ``aten::scaled_dot_product_attention``) count only where the trace holds none
#: of the ops they call.
FLOP_OPS: dict[str, str] = {
    **dict.fromkeys(("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul",
                     "aten::linear", "aten::_scaled_mm"), "matmul"),
    **dict.fromkeys(("aten::convolution", "aten::convolution_backward"), "convolution"),
    **dict.fromkeys((
        "aten::scaled_dot_product_attention",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_cudnn_attention",
        "aten::_flash_attention_forward", "aten::_efficient_attention_forward",
        "aten::_scaled_dot_product_flash_attention_backward",
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
        "aten::_scaled_dot_product_efficient_attention_backward",
        "aten::_scaled_dot_product_cudnn_attention_backward",
        "aten::_flash_attention_backward", "aten::_efficient_attention_backward"), "attention"),
    **dict.fromkeys(("aten::native_layer_norm", "aten::native_layer_norm_backward",
                     "aten::native_batch_norm", "aten::native_batch_norm_backward",
                     "aten::_fused_rms_norm", "aten::_fused_rms_norm_backward",
                     "aten::native_group_norm", "aten::native_group_norm_backward"), "norm"),
    **dict.fromkeys(("aten::_softmax", "aten::_log_softmax", "aten::_softmax_backward_data",
                     "aten::_log_softmax_backward_data"), "softmax"),
    **dict.fromkeys(("aten::add", "aten::add_", "aten::sub", "aten::sub_", "aten::mul",
                     "aten::mul_", "aten::div", "aten::div_", "aten::relu", "aten::relu_",
                     "aten::gelu", "aten::gelu_backward", "aten::silu", "aten::silu_",
                     "aten::silu_backward", "aten::tanh", "aten::tanh_backward",
                     "aten::sigmoid", "aten::sigmoid_backward", "aten::threshold_backward",
                     "aten::exp", "aten::pow", "aten::rsqrt", "aten::neg", "aten::where",
                     "aten::addcmul_", "aten::addcdiv_", "aten::lerp_"), "elementwise"),
}
#: Attention ops → the position of ``is_causal`` among their inputs (``Concrete Inputs``; an int
#: position holds ``custom_mask_type``, causal when 1 or 2), from each op's ATen signature.
CAUSAL_INPUT: dict[str, int] = {
    "aten::scaled_dot_product_attention": 5,
    "aten::_scaled_dot_product_flash_attention": 4,
    "aten::_scaled_dot_product_flash_attention_for_cpu": 4,
    "aten::_scaled_dot_product_efficient_attention": 6,
    "aten::_scaled_dot_product_cudnn_attention": 6,
    "aten::_flash_attention_forward": 8,
    "aten::_efficient_attention_forward": 9,
    "aten::_scaled_dot_product_flash_attention_backward": 11,
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": 7,
    "aten::_scaled_dot_product_efficient_attention_backward": 11,
    "aten::_scaled_dot_product_cudnn_attention_backward": 14,
    "aten::_flash_attention_backward": 11,
    "aten::_efficient_attention_backward": 14,
}
#: The op classes whose FLOPs are the model's (the "6 · parameters · tokens" of matmuls, plus
#: convolutions and attention; PaLM, Chowdhery et al. 2022, appendix B): MFU counts these.
MODEL_FLOP_CLASSES = frozenset({"matmul", "convolution", "attention"})
#: Counted ops that run only in a forward pass: one inside the autograd engine's backward
#: (:data:`BACKWARD_FUNCTION_RE`) is a recomputed forward (activation checkpointing).
FORWARD_ONLY_OPS = frozenset(
    n for n, c in FLOP_OPS.items()
    if c in ("convolution", "attention", "norm", "softmax") and not n.endswith(
        ("_backward", "_backward_data"))) | {"aten::addmm", "aten::baddbmm"}
#: The autograd engine's range around each backward function it runs.
BACKWARD_FUNCTION_RE = re.compile(r"^autograd::engine::evaluate_function: ")
#: An autograd node's own range inside that one, named by its class (``AddmmBackward0``, a custom
#: Function's ``MyFunctionBackward``): it carries the ``Sequence number`` of the forward op that
#: built it, which the engine's range lacks where hooks run before the node (FSDP's unshard).
BACKWARD_NODE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*Backward\d*$")
#: The ``torch.distributed`` calls ``pardiag profile --monitor`` times, each with the position of
#: its group and of its tensor argument (-1: none), and DDP's bucket all-reduce (its
#: communication hook, ``ddp_all_reduce``). A monitored run's lines name an op by its position
#: in the ``ops`` they carry (:mod:`pardiag.collectors.monitor`).
MONITOR_CALLS: dict[str, tuple[int, int]] = {
    "all_reduce": (2, 0), "broadcast": (2, 0), "reduce": (3, 0), "all_gather": (2, 0),
    "all_gather_into_tensor": (2, 0), "reduce_scatter": (3, 1), "reduce_scatter_tensor": (3, 1),
    "all_to_all_single": (4, 1), "all_to_all": (2, 1), "barrier": (0, -1),
    "send": (2, 0), "recv": (2, 0), "isend": (2, 0), "irecv": (2, 0),
    # FSDP2's gathers and scatters from torch 2.13 (before: the *_tensor forms above)
    "all_gather_single": (2, 0), "reduce_scatter_single": (3, 1),
}
#: DDP's bucket all-reduce, timed through its communication hook.
MONITOR_DDP_ALL_REDUCE = "ddp_all_reduce"
#: Point-to-point ops in monitor records: matched by peer, not by group order; no step's
#: arrival. The monitor no longer wraps them; records written before may hold them.
MONITOR_P2P = frozenset({"send", "recv", "isend", "irecv"})
#: Monitored ops whose members complete together (their completions align clocks); not a
#: broadcast's or a reduce's (the root may leave before the others receive).
MONITOR_RELEASE_TOGETHER = frozenset(
    {n for n in MONITOR_CALLS if n not in MONITOR_P2P and n not in ("broadcast", "reduce")}
    | {MONITOR_DDP_ALL_REDUCE})
#: pardiag's range around each module call (``pardiag profile``,
#: :mod:`pardiag.collectors.modules`): ``pardiag::module::{qualified name} ({class})``.
MODULE_RANGE_PREFIX = "pardiag::module::"
MODULE_RANGE_RE = re.compile(r"^pardiag::module::(?P<path>.+) \((?P<cls>[^()]*)\)$")
#: The profiler's own frame of a module call (``with_stack=True``, category
#: ``python_function``): ``nn.Module: Linear_0`` (class, and its instance number).
PYTHON_MODULE_RE = re.compile(r"^nn\.Module: (?P<cls>.+)_(?P<idx>\d+)$")
# The names (and name patterns) of the ops, ranges and runtime calls a per-rank quantity looks for;
# the communication and computation kinds of events are told apart in classify.py.


#: FSDP2's hooks (``torch.distributed.fsdp.fully_shard``) name their record_function ranges so.
FSDP_RE = re.compile(r"^FSDP::")


#: DTensor's redistributions and local-tensor wraps (torch.distributed.tensor), by event name.
DTENSOR_EVENTS = frozenset({"Redistribute", "RedistributeBackward", "NestedRedistribute",
                            "_FromTorchTensor", "_ToTorchTensor"})


#: The event torch's profiler records around a tensor subclass's ``__torch_dispatch__``.
SUBCLASS_DISPATCH = "PythonSubclass"


#: The DataLoader iterator's range (``enumerate(DataLoader)#...__next__``).
DATALOADER_RE = re.compile(r"^enumerate\(DataLoader\)")


#: Waits for communication: the host blocks on a collective's work, not on the device.
COMM_WAIT_RE = re.compile(r"^(aten::_?wait\b|c10d::wait|_?c10d_functional::wait_tensor)")


#: Host calls that wait for the device, or make a stream wait (device synchronization).
SYNC_RE = re.compile(r"^(cudaStreamSynchronize|cudaDeviceSynchronize|cudaEventSynchronize"
                     r"|cudaStreamWaitEvent|hipStreamSynchronize|hipDeviceSynchronize"
                     r"|hipEventSynchronize)|^(aten::_local_scalar_dense|cudaMemcpy|hipMemcpy)$")


#: Host calls that block the host until the device has run up to them (not
#: ``cudaStreamWaitEvent``: that makes a stream wait, the host goes on).
HOST_SYNC_RE = re.compile(r"^(cuda|hip)(Stream|Device|Event)Synchronize"
                          r"|^(aten::_local_scalar_dense|cudaMemcpy|hipMemcpy)$")


#: Ranges of the optimizer (``Optimizer.step#Adam.step``, ``...zero_grad``).
OPTIMIZER_RE = re.compile(r"optimizer", re.IGNORECASE)


#: The range torch's optimizers record around each ``step()`` (``Optimizer.step#AdamW.step``;
#: every ``torch.optim.Optimizer`` subclass records it): one per optimizer step.
OPTIMIZER_STEP_RE = re.compile(r"^Optimizer\.step#")
#: The op ``torch.amp.GradScaler.update()`` runs once per training step, whether or not the
#: scaler stepped the optimizer (it skips ``step()`` where the gradients hold inf or NaN).
SCALER_UPDATE_RE = re.compile(r"^aten::_amp_update_scale_$")


#: Names of a mixture of experts' routing (host ops, ranges or kernels): the gate's top-k
#: (``aten::topk``, its ``sbtopk`` kernels), routers and gates, MoE layers and experts, grouped
#: GEMMs. Evidence that an all-to-all dispatches tokens to experts.
ROUTER_RE = re.compile(r"^aten::topk$|sbtopk|router|gating|topkgate|moelayer|(^|[^a-z])moe"
                       r"|expert|grouped_?gemm", re.IGNORECASE)


#: Names of a sequence-parallel exchange (DeepSpeed-Ulysses' ``_SeqAllToAll`` autograd function,
#: its ``DistributedAttention``): evidence that an all-to-all swaps sequence and head shards.
SEQUENCE_EXCHANGE_RE = re.compile(r"seq_?all_?to_?all|ulysses|distributedattention",
                                  re.IGNORECASE)


#: Names of ring attention's point-to-point exchange (context parallelism: each rank passes
#: its key/value shard to the next rank of its group while computing attention on the one it
#: holds): TransformerEngine's ``flash_attn_p2p_communicate`` and ``AttnFuncWithCPAndKVP2P``
#: (what Megatron's context parallelism runs), ring-flash-attention's ``ring_flash_attn_*``,
#: torch's ``_templated_ring_attention``. Evidence that sends and receives are no pipeline's.
RING_ATTENTION_RE = re.compile(r"p2p_communicate|withcpandkvp2p|ring_?(flash_?)?attn"
                               r"|ring_?attention|kv_?ring", re.IGNORECASE)


#: Attention's computation (host ops, autograd nodes, kernels): ``aten::scaled_dot_product_*``,
#: ``aten::_flash_attention_forward``, ``void flash::flash_fwd_kernel<...>``, ``fmha_*``, ...
ATTENTION_RE = re.compile(r"attention|attn|fmha|scaled_dot_product|(^|[^a-z])flash(::|_)",
                          re.IGNORECASE)


#: Ops that only move or reshape data (views, copies, concatenation, their autograd nodes, and
#: torch.distributed.nn's autograd functions around a collective), skipped when looking for the
#: computation next to a collective.
RESHAPE_OP_RE = re.compile(r"^aten::(view|reshape|_reshape_alias|transpose|permute|contiguous|t"
                           r"|as_strided|split|split_with_sizes|chunk|cat|stack|select|slice"
                           r"|unflatten|flatten|expand|clone|copy_|empty|empty_like|empty_strided"
                           r"|detach|to|_to_copy|narrow|squeeze|unsqueeze|zeros|zeros_like"
                           r"|view_as|_unsafe_view)$"
                           r"|^(autograd::engine::evaluate_function: )?(Permute|View|UnsafeView"
                           r"|Transpose|T|Reshape\w*|Clone|Expand|Squeeze|Unsqueeze|Split\w*"
                           r"|Cat|Stack|Select|Slice|ToCopy)Backward\d*$"
                           r"|^(autograd::engine::evaluate_function: )?_(AlltoAll|AllGather"
                           r"|AllReduce|ReduceScatter|Broadcast)\w*$"
                           r"|copy_kernel|CatArrayBatchedCopy|^Memcpy|^Memset", re.IGNORECASE)


#: Host ranges that run the backward: autograd's functions (``evaluate_function:
#: MmBackward0``) and a compiled graph's backward (``CompiledFunctionBackward``, torch.compile).
BACKWARD_SPAN_RE = re.compile(r"^(autograd::engine::evaluate_function: |CompiledFunctionBackward$)")

#: Ranges of the backward (autograd's ``evaluate_function: ...Backward0``).
BACKWARD_RE = re.compile(r"backward", re.IGNORECASE)


#: What each wrapper's or parallel style's ranges are named (the layout's marks).
MARKER_RES = {
    "fsdp2": re.compile(r"^FSDP::(pre_forward|all_gather|pre_backward)"),
    "fsdp1": re.compile(r"^FullyShardedDataParallel\.(forward|_pre_forward|_pre_backward_hook)"),
    "ddp": re.compile(r"^DistributedDataParallel\.forward"),
    "zero": re.compile(r"ZeroRedundancyOptimizer"),
    "functional": re.compile(r"^_?c10d_functional::(all_reduce|all_gather_into_tensor"
                             r"|reduce_scatter_tensor)"),
    "all_to_all": re.compile(r"^(c10d::alltoall|gloo:all_to_all|nccl:all_to_all"
                             r"|_?c10d_functional::all_to_all)"),
    # DeepSpeed ZeRO-3's autograd functions (deepspeed/runtime/zero/linear.py,
    # parameter_offload.py), run for every partitioned module
    "zero3": re.compile(r"LinearFunctionForZeroStage3|PreBackwardFunctionForModule"
                        r"|PostBackwardFunctionModule"),
}


#: torch.distributed.pipelining's GPipe ranges: ``Forward i`` / ``Backward i``.
GPIPE_RANGE_RE = re.compile(r"^(Forward|Backward) (\d+)$")


#: Ranges of schedules run by the action runtime: ``PP:{stage}{F|B|I|W}{microbatch}``.
PP_ACTION_RE = re.compile(r"^PP:(\d+)([FBIW])(\d+)$")


#: The action runtime's combined actions (``ScheduleDualPipeV``): ``PP:(0F3;3B1)OVERLAP_F_B``,
#: a forward and a backward of other stages and microbatches in one range, run one after the
#: other in the order named (torch's ``_PipelineScheduleRuntime``).
PP_COMBINED_RE = re.compile(r"^PP:\((\d+)([FBIW])(\d+);(\d+)([FBIW])(\d+)\)OVERLAP_F_B$")


#: The autograd engine's own ranges, one per backward function it runs: where a backward
#: begins on the host.
AUTOGRAD_FUNCTION_RE = re.compile(r"^autograd::engine::evaluate_function: ")


#: c10d's point-to-point ops on the calling thread.
C10D_P2P_RE = re.compile(r"^c10d::(send|recv_)$")


#: A receive, whatever its backend.
RECV_RE = re.compile(r"^(c10d::recv_|gloo:recv|nccl:recv)")


#: ``Collective name`` values of a send or a receive.
P2P_COLLECTIVE_NAMES = {"send": "send", "recv": "recv", "_send": "send", "_recv": "recv"}


#: Frameworks' own collective ops that wrap a communicator's call, named by the collective:
#: vLLM's (``vllm::all_reduce``, registered by vllm/distributed/parallel_state.py around its
#: PyNccl or custom all-reduce, with no c10d record inside).
FRAMEWORK_COLLECTIVE_RE = re.compile(r"^vllm::(all_reduce|all_gather|reduce_scatter)$")

#: Ops that issue communication (outermost on their thread).
ISSUING_OP_RE = re.compile(
    r"^(c10d::|_c10d_functional::|c10d_functional::|nccl:|record_param_comms"
    r"|vllm::(?:all_reduce|all_gather|reduce_scatter)$)")


#: Functional collectives (tensor parallelism, DTensor).
FUNCTIONAL_PREFIXES = ("_c10d_functional::", "c10d_functional::")


#: Host ops that issue communication and enclose their kernels' launches (functional
#: collectives, DTensor's and tensor parallelism's, wrap the c10d op they call).
LAUNCH_OP_RE = re.compile(r"^(nccl:|c10d::|record_param_comms|_?c10d_functional::"
                          r"|vllm::(?:all_reduce|all_gather|reduce_scatter)$)")


#: ``Collective name`` values (lower case, no underscores) of coalescing blocks.
COALESCING_NAMES = frozenset({"coalesced", "startcoalescing", "endcoalescing"})
