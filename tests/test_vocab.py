"""One trace vocabulary (``analyzer/trace/vocab.py``): every key is spelled there only, every
torch dtype has its element size, and what pardiag does not know is a warning, never a default."""

from __future__ import annotations

import ast
import json

import pytest

from pardiag.analyzer.per_rank import REDUCER
from pardiag.analyzer.per_rank.summary import summary_of
from pardiag.analyzer.trace import load_traces, vocab

from .paths import REPO
from .synth import TraceBuilder

#: Spellings that are also pardiag's own column or field names (``stream``, ``rank``, ...): a
#: module may use those words for its own tables; every other spelling is the vocabulary's.
SHARED_WORDS = {"stream", "device", "correlation", "name", "labels", "rank", "backend",
                "world_size", "ranks", "peer", "dst", "src", "dtype", "pg_name", "pg_desc",
                "pg_count", "pg_config", "process_group", "input_sizes", "input_dtypes",
                "output_sizes", "output_dtypes", "is_p2p", "p2p_seq_id", "collective_seq_id",
                "time_created_ns", "profiling_name", "flops"}


def _string_constants(path) -> set[str]:
    return {n.value for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def test_no_module_but_the_vocabulary_spells_a_trace_key():
    spellings = {s for key in vocab.KEYS.values() for s in key.spellings} - SHARED_WORDS
    assert "Dst Rank" in spellings and "Input Dims" in spellings and "distributedInfo" in spellings
    offenders = {}
    for path in sorted((REPO / "analyzer").rglob("*.py")):
        if path.name == "vocab.py" and path.parent.name == "trace":
            continue
        found = _string_constants(path) & spellings
        if found:
            offenders[str(path.relative_to(REPO))] = sorted(found)
    assert offenders == {}


def test_every_torch_dtype_has_its_element_size():
    torch = pytest.importorskip("torch")
    dtypes = {v for v in vars(torch).values() if isinstance(v, torch.dtype)}
    assert len(dtypes) > 30
    for dt in dtypes:
        name = str(dt)   # torch.float8_e4m3fnuz
        assert vocab.dtype_bytes(name) == dt.itemsize, name
        assert vocab.dtype_bytes(name.removeprefix("torch.")) == dt.itemsize, name
    # c10's ScalarType names (what record_param_comms writes) have their Python names' sizes
    for c10, py, n in vocab._DTYPES:
        assert vocab.dtype_bytes(c10) == vocab.dtype_bytes(py) == n
    assert vocab.dtype_bytes('"BFloat16"') == 2 and vocab.dtype_bytes("c10::Half") == 2
    assert vocab.dtype_bytes("Float8_e4m3fnuz") == 1 and vocab.dtype_bytes("Float12") is None
    assert vocab.dtype_bytes(None) is None


def test_a_key_is_read_under_each_of_its_spellings():
    assert vocab.DST_RANK.get({"Dst Rank": 3}) == 3 and vocab.DST_RANK.get({"Dst rank": 4}) == 4
    assert vocab.DST_RANK.get({"Src Rank": 3}) is None and vocab.DST_RANK.get(None, -1) == -1
    assert vocab.SRC_RANK.present({"Src rank": 1}) and not vocab.SRC_RANK.present([1])


def _allgather_rank(rank: int, dtype: str) -> TraceBuilder:
    """One all-gather of 1,000 → 4,000 elements of ``dtype`` on a GPU rank, 400 µs."""
    args = {"Collective name": "_allgather_base", "dtype": dtype, "In msg nelems": 1000,
            "Out msg nelems": 4000, "Group size": 4, "Process Group Name": "0",
            "Process Group Ranks": "[0, 1, 2, 3]", "Seq": 1}
    b = TraceBuilder(rank=rank, world_size=4)
    b.step(1, 0.0, 2000.0)
    b.cpu("record_param_comms", 50.0, 10.0, args=args)
    b.kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 100.0, 400.0,
             launch_ts=55.0, args=args)
    b.kernel("gemm", 600.0, 500.0, launch_ts=60.0)
    return b


@pytest.mark.parametrize("dtype, size", [("Float8_e4m3fnuz", 1), ("Float8_e5m2fnuz", 1),
                                         ("Float8_e8m0fnu", 1), ("BFloat16", 2)])
def test_a_known_dtype_gives_the_bytes_of_its_size(tmp_path, dtype, size):
    for r in range(2):
        _allgather_rank(r, dtype).write(tmp_path / f"rank{r}.json")
    traces = load_traces(tmp_path, reducer=REDUCER)
    comm = summary_of(traces.ranks[0], []).comm
    assert comm["bytes"].tolist() == [4000 * size]
    assert not [w for w in traces.warnings if "does not know" in w]


def test_an_unknown_dtype_is_a_warning_and_no_bytes(tmp_path):
    for r in range(2):
        _allgather_rank(r, "Float7_e3m3").write(tmp_path / f"rank{r}.json")
    traces = load_traces(tmp_path, reducer=REDUCER)
    comm = summary_of(traces.ranks[0], []).comm
    assert comm["bytes"].isna().all() and len(comm) == 1
    lines = [w for w in traces.warnings if "does not know" in w]
    assert len(lines) == 2 and "'Float7_e3m3' (2)" in lines[0]   # the op and its kernel
    assert "message sizes and bandwidth are left out" in lines[0]


def _p2p_rank(rank: int, spelling: tuple[str, str]) -> TraceBuilder:
    """A two-stage pipeline over the group [2, 3] of a world of 4: global rank 2 sends each of
    2 microbatches to global rank 3 (``record_param_comms`` with the peer's global rank)."""
    b = TraceBuilder(rank=rank, world_size=4)
    b.step(1, 0.0, 5000.0)
    for mb in range(2):
        t = 100.0 + 2000.0 * mb
        b.cpu(f"Forward {mb}", t, 1000.0, cat="user_annotation")
        op = "send" if rank == 2 else "recv"
        key, peer = (spelling[0], 3) if op == "send" else (spelling[1], 2)
        b.cpu("record_param_comms", t + (900.0 if op == "send" else 0.0), 50.0, args={
            "Collective name": op, "dtype": "Float", "In msg nelems": 256,
            "Out msg nelems": 256, "Group size": 2, "Process Group Name": "5",
            "Process Group Description": "pp", "Process Group Ranks": "[2, 3]", "Seq": mb + 1,
            key: peer})
    return b


@pytest.mark.parametrize("spelling", [("Dst Rank", "Src Rank"), ("Dst rank", "Src rank")])
def test_a_send_recv_peer_is_read_under_both_spellings(tmp_path, spelling):
    """torch writes ``Dst Rank``/``Src Rank`` (global ranks); the layout places them in the
    group (stage 0's peer is the group's rank 1) under either spelling."""
    for r in (2, 3):
        _p2p_rank(r, spelling).write(tmp_path / f"rank{r}.json")
    traces = load_traces(tmp_path, reducer=REDUCER)
    p2p = {r: summary_of(t).marks.p2p for r, t in traces.ranks.items()}
    assert p2p[2]["op"].tolist() == ["send", "send"] and p2p[2]["peer"].tolist() == [1, 1]
    assert p2p[3]["op"].tolist() == ["recv", "recv"] and p2p[3]["peer"].tolist() == [0, 0]


def test_the_fp8_fnuz_repro_has_its_bandwidth():
    """MI300's float8 (``Float8_e4m3fnuz``) is 1 byte: the all-gather's algbw is 41.943 GB/s,
    not 4× that or none (``../shared/repros/h47_fp8_fnuz_allgather_mi300``)."""
    from .paths import REPROS

    case = REPROS / "h47_fp8_fnuz_allgather_mi300"
    if not case.is_dir():
        pytest.skip("../shared/repros is not beside the checkout")
    import pardiag

    rep = pardiag.analyze(case, cache=False)
    want = json.loads((case / "expect.json").read_text())["algbw_gbps"]
    bw = rep.sync.bandwidth
    for op, gbps in want.items():
        got = bw.loc[bw["op"] == op, "algbw_gbps"].dropna().tolist()
        assert got and all(g == pytest.approx(gbps, rel=0.01) for g in got), (op, got)


def test_the_per_rank_stage_names_no_op_of_its_own():
    """The ops, ranges and runtime calls a per-rank quantity looks for are named in the
    vocabulary: no per-rank module compiles a name pattern of its own (``summary.py`` compiles
    the user's ``--comm-kernel`` patterns, which are no literal)."""
    compiled = {}
    for path in sorted((REPO / "analyzer" / "per_rank").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "compile" and node.args
                    and isinstance(node.args[0], ast.Constant)):
                compiled.setdefault(path.name, []).append(node.args[0].value)
    assert compiled == {}
    assert vocab.DATALOADER_RE.match("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__")
    assert vocab.PP_ACTION_RE.match("PP:3W1").groups() == ("3", "W", "1")
    assert vocab.HOST_SYNC_RE.match("cudaStreamSynchronize") and not vocab.HOST_SYNC_RE.match(
        "cudaStreamWaitEvent")


def test_every_dtype_spelling_has_torchs_name():
    """Each spelling of a torch dtype (c10's, Python's, ``torch.``-prefixed, ``Input type``'s
    C++ names of the floating types) gives torch's name; an unknown one gives None."""
    for c10, py, _ in vocab._DTYPES:
        assert vocab.dtype_name(c10) == vocab.dtype_name(f"torch.{py}") == py
    assert [vocab.dtype_name(t) for t in ("float", "c10::BFloat16", "c10::Half", "double",
                                          "c10::Float8_e4m3fn", "long int", "Scalar")] == [
        "float32", "bfloat16", "float16", "float64", "float8_e4m3fn", "int64", None]
