"""MoE routing imbalance: planted split sizes, exact values."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import pardiag
from pardiag.analyzer.analyses.routing import IMBALANCE_MIN
from pardiag.analyzer.trace import load_traces
from pardiag.analyzer.trace.comm_records import all_to_all_ops, parse_splits
from pardiag.cli import cli

from .paths import REPO
from .synth import TraceBuilder

EPOCH = 1_700_000_000_000_000.0  # µs
#: rows rank src sends rank dst in the dispatch (H = 8 floats per row): every rank sends 40,
#: rank 0 receives 80 of the 160 (max/mean 2.0)
S = [[10, 10, 10, 10], [25, 5, 5, 5], [25, 5, 5, 5], [20, 10, 5, 5]]
H = 8


def _a2a(b: TraceBuilder, seq: int, start: float, dur: float, send, recv, dtype="Float",
         row: int = H, desc: str = "ep", before: str | None = None) -> None:
    """One all-to-all: the record_param_comms op issuing it and its NCCL kernel, its group
    described as ``desc``; ``before``: a 5 µs compute kernel of that name just before it."""
    args = {"Collective name": "all_to_all", "dtype": dtype, "In msg nelems": sum(send) * row,
            "Out msg nelems": sum(recv) * row, "Group size": 4, "Process Group Name": "0",
            "Process Group Description": desc, "Process Group Ranks": "[0, 1, 2, 3]",
            "Seq": str(seq), "In split size": str(send), "Out split size": str(recv)}
    if before:
        b.kernel(before, EPOCH + start - 8, 5, stream=7, launch_ts=EPOCH + start - 30)
    b.cpu("record_param_comms", EPOCH + start - 20, 10, args=args)
    b.kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", EPOCH + start, dur,
             stream=20, launch_ts=EPOCH + start - 15, args=args)


def _planted(tmp_path: Path, desc: str = "ep", before: str | None = None) -> Path:
    """4 ranks, 2 steps. Per step: a count exchange (even split), the dispatch (everyone at
    +100 µs for 50 µs) and the combine: rank 0 (the hot rank) arrives at +600 in step 1 (the
    others at 300, 350, 350) and at +700 in step 2 (the others at 400); the combine ends at
    +650 / +750 everywhere. The group is described as ``desc``; ``before``: a compute kernel
    of that name just before each dispatch and combine."""
    for r in range(4):
        b = TraceBuilder(rank=r, world_size=4)
        for k, t0 in enumerate((0.0, 1000.0)):
            b.step(k + 1, EPOCH + t0, 1000)
            _a2a(b, 3 * k + 1, t0 + 40, 10, [], [], dtype="Long", row=1, desc=desc)
            _a2a(b, 3 * k + 2, t0 + 100, 50, S[r], [S[s][r] for s in range(4)], desc=desc,
                 before=before)
            arrive = ({0: 600, 1: 300, 2: 350, 3: 350} if k == 0 else
                      {0: 700, 1: 400, 2: 400, 3: 400})[r]
            end = 650 if k == 0 else 750
            _a2a(b, 3 * k + 3, t0 + arrive, end - arrive, [S[s][r] for s in range(4)], S[r],
                 desc=desc, before=before)
        b.write(tmp_path / f"rank{r}.json")
    return tmp_path


def test_split_sizes_parse():
    assert parse_splits("[226, 30]") == [226, 30]
    assert parse_splits("[]") == [] and parse_splits([3, 4]) == [3, 4]
    assert parse_splits("[1, 2, ...]") is None and parse_splits(None) is None
    assert parse_splits("[-1]") is None and parse_splits("abc") is None


def test_c10d_alltoall_base_gives_splits_shapes_and_row_size(tmp_path):
    # as torch 2.13 records it on CPU (record_shapes): output, input, group, output splits,
    # input splits
    b = TraceBuilder(rank=0, backend="gloo")
    b.cpu("c10d::alltoall_base_", 100, 50, args={
        "Concrete Inputs": ["", "", "", "[226, 231]", "[226, 30]", "False", "-1"],
        "Input type": ["float", "float", "", "ScalarList", "ScalarList", "Scalar", "Scalar"],
        "Input Dims": [[457, 256], [256, 256], [], [], [], [], []]})
    ev = load_traces(b.write(tmp_path / "rank0.json")).ranks[0].events
    ops = all_to_all_ops(ev)
    assert len(ops) == 1
    row = ops.iloc[0]
    assert row["send_splits"] == [226, 30] and row["recv_splits"] == [226, 231]
    assert (row["send_elems"], row["recv_elems"], row["row_elems"], row["elem_bytes"]) == (
        256 * 256, 457 * 256, 256, 4)
    assert row["source"] == "c10d"


def test_planted_routing_exact_values(tmp_path):
    rep = pardiag.analyze(_planted(tmp_path), cache=False)
    r = rep.routing
    assert "2 all-to-all instance(s) split evenly" in " ".join(r.notes)
    inst = r.instances
    assert len(inst) == 4 and set(inst["unit"]) == {"rows"}
    assert list(inst["side"]) == ["recv", "send", "recv", "send"]
    assert inst["imbalance"].tolist() == pytest.approx([2.0] * 4)
    assert set(inst["hot_rank"]) == {0}
    assert inst["last_rank"].tolist()[1::2] == [0, 0]
    assert inst["wait_us"].tolist()[1::2] == pytest.approx([800.0, 900.0])
    pr = r.per_rank.set_index(["step", "rank"])
    # rank 0: dispatch receives 80, combine sends 80; everyone sends and receives 40 of its own
    assert pr.loc[(1, 0), ["sent_rows", "recv_rows", "load_rows"]].tolist() == [120, 120, 160]
    assert [pr.loc[(1, k), "load_rows"] for k in range(4)] == [160, 60, 50, 50]
    assert [pr.loc[(1, k), "waited_us"] for k in range(4)] == pytest.approx([0, 300, 250, 250])
    st = r.steps.set_index("step")
    assert st["imbalance"].tolist() == pytest.approx([2.0, 2.0])
    assert st["max_rows"].tolist() == [160, 160] and st["mean_rows"].tolist() == [80, 80]
    assert st["wait_us"].tolist() == pytest.approx([800.0, 900.0])
    assert st["saving_us"].tolist() == pytest.approx([200.0, 225.0])
    g = r.groups.iloc[0]
    assert g["group"] == "0,1,2,3|ep" and g["ranks"] == 4 and g["steps"] == 2
    assert g["hot_rank"] == 0 and g["hot_steps"] == 2 and g["row_bytes"] == H * 4
    assert g["imbalance"] == pytest.approx(2.0)
    assert (g["hot_rows"], g["mean_rows"]) == (160, 80)
    assert g["wait_us"] == pytest.approx(850.0) and g["saving_us"] == pytest.approx(212.5)
    assert (g["saving_q1_us"], g["saving_q3_us"]) == pytest.approx((206.25, 218.75))
    m = r.matrix.set_index(["src", "dst"])["rows"]
    assert [[m[(s, d)] for d in range(4)] for s in range(4)] == S
    assert r.finding is not None and r.finding["hot_rank"] == 0
    assert "rank 0's experts take 2.00× the mean tokens" in rep.verdict
    # the rule: the step less the saving (profiled steps: 1000 µs each)
    rec = [c for c in (*rep.recommendations.recommendations, *rep.recommendations.rejected)
           if c.kind == "moe_routing"]
    assert len(rec) == 1 and rec[0].params["hot_rank"] == 0
    assert rec[0].measured_step_us - rec[0].predicted_step_us == pytest.approx(212.5)
    assert any("capacity factor drops" in c for c in rec[0].caveats)


def test_planted_routing_in_json_html_and_terminal(tmp_path):
    (tmp_path / "run").mkdir()
    d = _planted(tmp_path / "run")
    out = tmp_path / "s.json"
    res = CliRunner().invoke(cli, ["report", str(d), "--no-cache", "--json", str(out), "-o",
                                   str(tmp_path / "r.html")], env={"COLUMNS": "120"})
    assert res.exit_code == 0, res.output
    assert "cause: MoE routing is imbalanced: rank 0's experts take 2.00×" in " ".join(
        res.output.split())
    j = json.loads(out.read_text())["routing"]
    assert set(j) == {"groups", "steps", "per_rank", "instances", "matrix", "notes", "finding"}
    assert j["groups"][0]["saving_us"] == pytest.approx(212.5)
    assert len(j["per_rank"]) == 8 and len(j["matrix"]) == 16
    page = (tmp_path / "r.html").read_text()
    assert "<h2 id='routing'" in page and "MoE routing, group 0,1,2,3" in page


def test_even_routing_names_no_imbalance(tmp_path):
    # every rank sends 10 rows to every rank: split sizes given, all equal -> not routed
    for r in range(4):
        b = TraceBuilder(rank=r, world_size=4)
        b.step(1, EPOCH, 1000)
        _a2a(b, 1, 100, 50, [10] * 4, [10] * 4)
        b.write(tmp_path / f"rank{r}.json")
    rep = pardiag.analyze(tmp_path, cache=False)
    assert rep.routing.groups.empty and rep.routing.finding is None
    assert "1 all-to-all instance(s) split evenly" in rep.routing.notes[0]
    assert "MoE routing" not in rep.verdict
    assert rep.to_json()["routing"]["finding"] is None


def test_dlrm_all_to_alls_are_not_called_imbalanced(real_traces):
    # DLRM's embedding all-to-alls: about even sizes (one rank's differ), no MoE imbalance; the
    # layout finds no expert dimension, so neither the terminal nor the page speaks of experts
    rep = pardiag.analyze(real_traces / "dlrm_8rank_v100")
    g = rep.routing.groups
    assert len(g) <= 1 and (g.empty or g["imbalance"].iloc[0] < IMBALANCE_MIN)
    assert rep.routing.finding is None and "MoE routing" not in rep.verdict
    assert "ep" not in rep.layout.dims and not rep.routing.expert
    assert not g["expert"].any() and rep.to_json()["routing"]["groups"][0]["expert"] is False
    text = " ".join(rep.summary(width=200).split())
    assert "MoE routing" not in text and "expert side" not in text
    assert "All-to-all split sizes, per step (what they carry is unknown)" in text


def test_uneven_all_to_alls_without_an_expert_dimension_say_nothing_of_experts(tmp_path):
    """The planted 2.0 imbalance, read with a layout that has no ``ep`` dimension: the same
    numbers, said of rows and a group, and no MoE recommendation (it would rest on a guess)."""
    import dataclasses
    from types import SimpleNamespace

    from pardiag.analyzer.analyses.routing import compute_routing
    from pardiag.analyzer.predict.recommend.rules.routing import moe_routing

    rep = pardiag.analyze(_planted(tmp_path), cache=False)
    assert rep.routing.expert and rep.routing.finding["expert"]
    r = compute_routing(rep.traces, rep.sync, dataclasses.replace(rep.layout, dims={"dp": 4}))
    assert not r.expert and r.groups["saving_us"].iloc[0] == pytest.approx(212.5)
    assert r.describe() == (
        "all-to-all sizes are uneven: rank 0 takes 2.00× the mean rows of group [0,1,2,3] "
        "(median over 2 step(s), range 2.00–2.00); the others wait 0.8 ms per step for it at "
        "the all-to-alls; what the all-to-alls carry is unknown, so no MoE routing is inferred")
    ctx = SimpleNamespace(routing=r, model=None, measured_us=1000.0)
    assert moe_routing(ctx) == []
    assert len(moe_routing(SimpleNamespace(routing=rep.routing, model=None,
                                           measured_us=1000.0))) == 1


@pytest.mark.e2e
def test_profiled_skewed_router_is_named(tmp_path):
    # train_moe.py --route-skew 0.9: on every rank 90% of the tokens go to rank 0's first
    # expert, so in every dispatch rank 0 receives ≥ 0.9 of all tokens: max/mean ≥ 1.8 by
    # construction (2 ranks), whatever the timing
    out = tmp_path / "moe"
    res = subprocess.run([sys.executable, "-m", "pardiag", "profile", REPO / "examples" /
                          "train_moe.py", "--nproc-per-node", "2", "--pin-cpu", "--out", out,
                          "--", "--steps", "6", "--batch", "128", "--route-skew", "0.9"],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    rep = pardiag.analyze(out)
    g = rep.moe_routing
    assert len(g) == 1 and g["dim"].iloc[0] == "ep" and g["unit"].iloc[0] == "rows"
    assert g["hot_rank"].iloc[0] == 0 and g["hot_steps"].iloc[0] == g["steps"].iloc[0] >= 2
    assert g["imbalance_min"].iloc[0] >= 1.8
    assert (rep.routing.steps["instances"] >= 3).all()   # dispatch, ids, combine (+ backward)
    assert g["wait_us"].iloc[0] > 0          # rank 1 waits for rank 0's experts
    assert "MoE routing is imbalanced: rank 0's experts take" in rep.verdict
    assert "cause: MoE routing is imbalanced: rank 0" in " ".join(rep.summary(width=120).split())
    rec = [c for c in (*rep.recommendations.recommendations, *rep.recommendations.rejected)
           if c.kind == "moe_routing"]
    assert len(rec) == 1 and rec[0].params["hot_rank"] == 0
    assert rec[0].predicted_step_us < rec[0].measured_step_us


def test_rank_load_is_each_ranks_median_over_steps(tmp_path):
    """The routing chart's bars: each rank's expert-side rows per step, median over steps (the
    planted steps are equal: rank 0 160, the others 60, 50, 50)."""
    import pandas as pd

    from pardiag.analyzer.analyses.routing import rank_load

    r = pardiag.analyze(_planted(tmp_path), cache=False).routing
    load = r.rank_load
    assert list(load.columns) == ["group", "rank", "load_rows"]
    assert load["group"].unique().tolist() == ["0,1,2,3|ep"]
    assert load["rank"].tolist() == [0, 1, 2, 3]
    assert load["load_rows"].tolist() == [160, 60, 50, 50]
    pr = pd.DataFrame({"group": ["g"] * 6, "step": [1, 1, 2, 2, 3, 3], "rank": [0, 1] * 3,
                       "load_rows": [10, 1, 30, 2, 20, 9]})
    assert rank_load(pr)["load_rows"].tolist() == [20, 2]


ATTENTION = "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>"
GEMM = "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm>"


@pytest.mark.parametrize("desc, before, routed", [
    ("ep", ATTENTION, True),          # a group described as expert parallel: routing
    ("undefined", GEMM, True),        # split sizes that differ, next to GEMMs: routing
    ("undefined", ATTENTION, False),  # the same sizes around attention: a sequence exchange?
])
def test_all_to_alls_around_attention_are_not_read_as_routing(tmp_path, desc, before, routed):
    """Split sizes that differ are what routing shows, but also what attention heads split
    unevenly over ranks show (Ulysses with 14 heads over 4 ranks: 4, 4, 3, 3). Where the
    all-to-alls sit next to attention and no group is described as expert parallel, what
    they carry is unknown: no routing table, no imbalance in the verdict, and a note saying
    why. Per step, 7 of the 12 all-to-alls send split sizes that differ (the dispatch on ranks
    1-3, the combine on all 4): 14 over 2 steps; every one of the 24, the count exchange
    included, has attention as its nearest computation."""
    rep = pardiag.analyze(_planted(tmp_path, desc, before), cache=False)
    r = rep.routing
    if routed:
        assert r.steps["imbalance"].tolist() == pytest.approx([2.0, 2.0])
        assert r.finding is not None and r.finding["hot_rank"] == 0
        return
    assert r.instances.empty and r.steps.empty and r.finding is None
    assert r.notes == ("the all-to-alls are not analysed as MoE routing: what the all-to-alls "
                       "carry is unknown: expert dispatch by 14 with split sizes that differ, "
                       "but a sequence exchange by 24 of 24 next to attention",)
    assert "experts take" not in rep.verdict
    assert "ep" not in rep.layout.dims
