"""FLOPs, MFU and the roofline (:mod:`pardiag.analyzer.analyses.efficiency`): exact counts on
synthetic traces with planted ops, torch's own FLOP formulas (``torch.utils.flop_counter``) as
the independent count on real GPU traces, and an analytic count of the H200 transformer."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest
import torch.utils.flop_counter as fc
from click.testing import CliRunner

from pardiag.analyzer.analyses.efficiency import compute_efficiency
from pardiag.analyzer.analyses.peaks import device_peak
from pardiag.analyzer.per_rank.flops import op_work
from pardiag.analyzer.trace import load_traces
from pardiag.cli import cli

from .paths import REPO
from .synth import TraceBuilder

BF16 = "c10::BFloat16"
#: Planted step: an addmm (under aten::linear), a causal flash attention, a layer norm, and the
#: addmm's backward (two mm), each with its kernel.
ADDMM = 2 * 8192 * 512 * 1024
ATTN = 2 * (2 * 8) * 256 * 256 * (64 + 64) // 2
LN = 5 * 8192 * 512
MODEL = 3 * ADDMM + ATTN


def _planted(recompute: bool = False, causal_known: bool = True,
             device: str = "NVIDIA H100 80GB HBM3") -> dict:
    b = TraceBuilder(rank=0, world_size=1)
    b.step(1, 0, 1000)
    b.cpu("aten::linear", 10, 100, args={"Input Dims": [[64, 128, 512], [1024, 512], [1024]],
                                         "Input type": [BF16] * 3})
    b.cpu("aten::addmm", 20, 80, args={
        "Input Dims": [[1024], [8192, 512], [512, 1024], [], []],
        "Input type": [BF16, BF16, BF16, "Scalar", "Scalar"]})
    b.kernel("sm90_gemm", 40, 50, launch_ts=30)
    conc = {"Concrete Inputs": ["", "", "", "0.", "True", "False", ""]} if causal_known else {}
    b.cpu("aten::scaled_dot_product_attention", 200, 100, args={
        "Input Dims": [[2, 8, 256, 64]] * 3 + [[]] * 5, "Input type": [BF16] * 3 + [""] * 5})
    b.cpu("aten::_scaled_dot_product_flash_attention", 210, 80, args={
        "Input Dims": [[2, 8, 256, 64]] * 3 + [[]] * 4, "Input type": [BF16] * 3 + [""] * 4,
        **conc})
    b.kernel("flash_fwd", 230, 40, launch_ts=220)
    # with recompute, the layer norm runs again inside the backward below, with its shapes
    for ln_at in (400, 520) if recompute else (400,):
        b.cpu("aten::native_layer_norm", ln_at, 20, args={
            "Input Dims": [[8192, 512], [], [512], [512], []],
            "Input type": [BF16, "ScalarList", BF16, BF16, "Scalar"]})
        b.kernel("layer_norm", ln_at + 5, 10, launch_ts=ln_at + 2)
    b.cpu("autograd::engine::evaluate_function: AddmmBackward0", 500, 200)
    for at, dims in ((550, [[8192, 1024], [1024, 512]]), (620, [[1024, 8192], [8192, 512]])):
        b.cpu("aten::mm", at, 60, args={"Input Dims": dims, "Input type": [BF16, BF16]})
        b.kernel("sm90_gemm", at + 10, 50, launch_ts=at + 5)
    doc = b.doc()
    doc["deviceProperties"] = [{"id": 0, "name": device}]
    return doc


def _report(tmp_path: Path, doc: dict, **kw):
    path = tmp_path / "rank0.trace.json"
    path.write_text(json.dumps(doc))
    return compute_efficiency(load_traces(path, cache=False), **kw)


def test_planted_ops_give_exact_flops_bytes_kernel_time_and_mfu(tmp_path):
    """Innermost ops only (the addmm, not its aten::linear; the flash kernel, not the SDPA
    wrapper), causal attention halved, kernels attributed through correlation; MFU against the
    H100's bfloat16 peak and against --peak-tflops."""
    e = _report(tmp_path, _planted())
    ops = e.ops.set_index("name")
    assert sorted(e.ops["name"]) == sorted(["aten::addmm", "aten::mm", "aten::mm",
                                            "aten::_scaled_dot_product_flash_attention",
                                            "aten::native_layer_norm"])
    assert ops.loc["aten::addmm", "flops"] == ADDMM
    assert ops.loc["aten::addmm", "bytes"] == 2 * (8192 * 512 + 512 * 1024 + 8192 * 1024)
    assert ops.loc["aten::_scaled_dot_product_flash_attention", "flops"] == ATTN
    assert ops.loc["aten::native_layer_norm", "flops"] == LN
    assert ops.loc["aten::addmm", "device_us"] == 50.0
    assert ops.loc["aten::_scaled_dot_product_flash_attention", "device_us"] == 40.0
    assert list(e.ops.loc[e.ops["name"] == "aten::mm", "flops"]) == [ADDMM, ADDMM]
    step = e.per_step.iloc[0]
    assert (step["model_flops"], step["executed_flops"]) == (MODEL, MODEL + LN)
    assert step["mfu_pct"] == pytest.approx(100 * MODEL / (1e-3 * 989.4e12), rel=1e-12)
    assert step["hfu_pct"] == pytest.approx(100 * (MODEL + LN) / (1e-3 * 989.4e12), rel=1e-12)
    rank = e.per_rank.iloc[0]
    assert (rank["device"], rank["dtype"], rank["peak_tflops"], rank["bandwidth_gbps"]) == (
        "H100 SXM", "bfloat16", 989.4, 3350.0)
    assert e.mfu_pct == pytest.approx(100 * MODEL / (1e-3 * 989.4e12), rel=1e-12)
    mm = e.per_class.set_index("op_class").loc["matmul"]
    assert mm["time_us"] == 150.0 and mm["time_basis"] == "device"
    assert mm["achieved_tflops"] == pytest.approx(3 * ADDMM / 150e-6 / 1e12, rel=1e-12)
    assert mm["intensity"] == pytest.approx(3 * ADDMM / mm["bytes"], rel=1e-12)

    given = _report(tmp_path, _planted(), peak_tflops=100.0, tokens_per_step=16_384)
    assert given.per_step.iloc[0]["mfu_pct"] == pytest.approx(100 * MODEL / 1e11, rel=1e-12)
    assert given.per_rank.iloc[0]["peak_source"] == "--peak-tflops"
    assert given.per_rank.iloc[0]["tokens_per_s"] == pytest.approx(16_384 / 1e-3)


def test_recomputation_unknown_causality_and_an_unknown_device_are_unknown_not_guessed(
        tmp_path):
    """A forward op inside the backward makes the model FLOPs unknown (MFU None, HFU stands);
    an attention whose is_causal was not recorded is not counted; a device missing from the
    table has no peak."""
    e = _report(tmp_path, _planted(recompute=True))
    assert e.per_rank.iloc[0]["recomputed_ops"] == 1
    assert math.isnan(e.per_step.iloc[0]["model_flops"]) and e.mfu_pct is None
    assert e.per_step.iloc[0]["hfu_pct"] == pytest.approx(
        100 * (MODEL + 2 * LN) / (1e-3 * 989.4e12), rel=1e-12)
    assert any("activation recomputation" in n for n in e.notes)

    e = _report(tmp_path, _planted(causal_known=False))
    assert math.isnan(e.per_step.iloc[0]["model_flops"]) and e.mfu_pct is None
    assert math.isnan(e.per_rank.iloc[0]["mfu_pct"])
    assert e.per_rank.iloc[0]["unknown_ops"] == 1
    assert any("aten::_scaled_dot_product_flash_attention ×1" in n for n in e.notes)

    e = _report(tmp_path, _planted(device="Some Accelerator 9000"))
    assert e.per_rank.iloc[0]["peak_tflops"] is None or math.isnan(
        e.per_rank.iloc[0]["peak_tflops"])
    assert e.mfu_pct is None
    assert any("no peak known for device 'Some Accelerator 9000'" in n for n in e.notes)


@pytest.mark.parametrize("name,args,expected", [
    ("aten::mm", {"Input Dims": [[32, 64], [64, 16]], "Input type": ["float"] * 2},
     fc.mm_flop([32, 64], [64, 16])),
    ("aten::bmm", {"Input Dims": [[4, 32, 64], [4, 64, 16]], "Input type": ["float"] * 2},
     fc.bmm_flop([4, 32, 64], [4, 64, 16])),
    ("aten::baddbmm", {"Input Dims": [[4, 32, 16], [4, 32, 64], [4, 64, 16], [], []],
                       "Input type": ["float"] * 3 + ["Scalar"] * 2},
     fc.baddbmm_flop([4, 32, 16], [4, 32, 64], [4, 64, 16])),
    ("aten::convolution", {
        "Input Dims": [[2, 3, 16, 16], [8, 3, 3, 3], [8], [], [], [], [], [], []],
        "Input type": ["float"] * 3 + ["ScalarList"] * 3 + ["Scalar", "ScalarList", "Scalar"],
        "Concrete Inputs": ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]},
     fc.conv_flop_count([2, 3, 16, 16], [8, 3, 3, 3], [2, 8, 8, 8])),
    # the weight gradient only (output_mask [False, True, True]): one convolution's count
    ("aten::convolution_backward", {
        "Input Dims": [[2, 8, 8, 8], [2, 3, 16, 16], [8, 3, 3, 3]] + [[]] * 8,
        "Input type": ["float"] * 3 + ["ScalarList"] * 4 + ["Scalar", "ScalarList", "Scalar",
                                                           "ScalarList"],
        "Concrete Inputs": ["", "", "", "[8]", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]",
                            "1", "[False, True, True]"]},
     fc.conv_flop_count([2, 3, 16, 16], [8, 3, 3, 3], [2, 8, 8, 8])),
    # transposed (stride 2, output padding 1): counted over the input's positions
    ("aten::convolution", {
        "Input Dims": [[2, 8, 7, 7], [8, 4, 3, 3], [4], [], [], [], [], [], []],
        "Input type": ["float"] * 3 + ["ScalarList"] * 3 + ["Scalar", "ScalarList", "Scalar"],
        "Concrete Inputs": ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "True", "[1, 1]", "1"]},
     fc.conv_flop_count([2, 8, 7, 7], [8, 4, 3, 3], [2, 4, 14, 14], transposed=True)),
    # not causal: torch's count; backward 2.5x the forward (torch counts the same five matmuls)
    ("aten::_scaled_dot_product_flash_attention_for_cpu", {
        "Input Dims": [[2, 4, 8, 16]] * 3 + [[]] * 4, "Input type": ["float"] * 3 + [""] * 4,
        "Concrete Inputs": ["", "", "", "0.", "False", "", ""]},
     fc.sdpa_flop_count([2, 4, 8, 16], [2, 4, 8, 16], [2, 4, 8, 16])),
    ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", {
        "Input Dims": [[2, 4, 8, 16]] * 5 + [[2, 4, 8]] + [[]] * 4,
        "Input type": ["float"] * 6 + [""] * 4,
        "Concrete Inputs": ["", "", "", "", "", "", "0.", "False", "", ""]},
     fc.sdpa_backward_flop_count([2, 4, 8, 16], [2, 4, 8, 16], [2, 4, 8, 16],
                                 [2, 4, 8, 16])),
])
def test_each_formula_agrees_with_torchs_flop_counter(name, args, expected):
    flops, _bytes = op_work(name, args)
    assert flops == expected


def test_the_peak_table_knows_each_device_by_its_trace_name():
    assert device_peak("Tesla V100-SXM2-16GB").tflops["float32"] == 15.7
    assert device_peak("NVIDIA A100-SXM4-80GB").bandwidth_gbps == 2039.0
    assert device_peak("NVIDIA A100-PG509-200").bandwidth_gbps is None   # memory not named
    assert device_peak("NVIDIA H100 80GB HBM3").label == "H100 SXM"
    assert device_peak("NVIDIA H100 PCIe").tflops["bfloat16"] == 756.0
    assert device_peak("NVIDIA H200").tflops["float8"] == 1978.9
    assert device_peak("NVIDIA H200 NVL") is None
    assert device_peak("AMD Instinct MI300X").tflops["bfloat16"] == 1307.4
    assert device_peak("AMD Radeon Graphics") is None


def _torch_count(name: str, dims: list) -> int | None:
    """torch.utils.flop_counter's count of one GEMM from its recorded shapes."""
    if name == "aten::mm":
        return fc.mm_flop(dims[0], dims[1])
    if name == "aten::addmm":
        return fc.addmm_flop(dims[0], dims[1], dims[2])
    if name == "aten::bmm":
        return fc.bmm_flop(dims[0], dims[1])
    if name == "aten::baddbmm":
        return fc.baddbmm_flop(dims[0], dims[1], dims[2])
    return None


@pytest.mark.parametrize("trace", ["dlrm_8rank_v100/worker0_step_12.1694128201545.pt.trace.json.gz",
                                   "hta_trace_diff_test"])
def test_gemm_flops_of_real_v100_traces_equal_torchs_count(real_traces, trace):
    """Every GEMM counted on a real V100 trace has the FLOPs torch's own flop counter gives
    for its recorded shapes (matched by name and start time), every recorded mm/addmm/bmm is
    counted, and the matmul class is shown with the V100's float32 peak."""
    path = real_traces / trace
    files = sorted(path.glob("*.json*"))[:1] if path.is_dir() else [path]
    raw = json.loads(gzip.open(files[0]).read() if files[0].suffix == ".gz"
                     else files[0].read_text())
    expected = {}
    for ev in raw["traceEvents"]:
        args = ev.get("args") or {}
        if ev.get("cat") == "cpu_op" and "Input Dims" in args:
            n = _torch_count(ev["name"], args["Input Dims"])
            if n is not None:
                expected[(ev["name"], round(float(ev["ts"]), 3))] = n
    assert len(expected) >= 20
    e = compute_efficiency(load_traces(files[0], cache=False))
    mm = e.ops[e.ops["op_class"] == "matmul"]
    base = float(raw.get("baseTimeNanoseconds", 0)) / 1e3
    got = {}
    for name, ts, flops in zip(mm["name"], mm["ts"], mm["flops"]):
        for key in ((name, round(ts, 3)), (name, round(ts + base, 3))):
            if key in expected:
                got[key] = flops
    assert got.keys() == expected.keys()
    assert all(got[k] == expected[k] for k in expected)
    row = e.per_class[e.per_class["op_class"] == "matmul"].iloc[0]
    assert row["peak_tflops"] == 15.7 and row["time_basis"] == "device"
    assert 0 < row["achieved_tflops"] < 15.7


def test_h200_transformer_model_flops_equal_the_analytic_count():
    """The H200 bf16 transformer (tests/gpu_traces): 6 · (Linear weights) · tokens for the
    matmuls, plus causal attention forward 2·B·H·L²·2E/2 and backward 2.5×, per layer; MFU
    against the H200's 989.4 TFLOP/s; the terminal and JSON show it."""
    model = json.loads((REPO / "tests" / "gpu_traces" / "h200_transformer_bf16.model.json")
                       .read_text())
    m, tokens = model["model"], model["tokens_per_step"]
    d, ffn, layers = m["d_model"], m["ffn"], m["layers"]
    weights = layers * (d * 3 * d + d * d + 2 * d * ffn) + d * d   # + the head
    attn_fwd = 2 * model["batch"] * m["heads"] * model["seq"] ** 2 * 2 * m["head_dim"] / 2
    analytic = 6 * weights * tokens + layers * attn_fwd * (1 + 2.5)
    path = REPO / "tests" / "gpu_traces" / "h200_transformer_bf16" / "rank0.trace.json.gz"
    e = compute_efficiency(load_traces(path, cache=False), tokens_per_step=tokens)
    assert len(e.per_step) == 3
    for flops in e.per_step["model_flops"]:
        assert flops == pytest.approx(analytic, rel=1e-9)
    for _, s in e.per_step.iterrows():
        assert s["mfu_pct"] == pytest.approx(100 * analytic / (s["step_us"] / 1e6 * 989.4e12))
    res = CliRunner().invoke(cli, ["report", str(path), "-o", "/dev/null", "--no-cache",
                                   "--json", "-", "--tokens-per-step", str(tokens)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout[res.stdout.index("{"):])
    assert doc["efficiency"]["per_rank"][0]["dtype"] == "bfloat16"
    assert "MFU " in doc["verdict"] and "H200 SXM's bfloat16 peak" in doc["verdict"]


@pytest.mark.parametrize("recompute", [False, True, "custom"])
def test_torch_checkpoint_is_seen_as_recomputation(tmp_path, recompute):
    """A block run under torch.utils.checkpoint (non-reentrant) reruns its forward ops inside
    the backward: model FLOPs and MFU are unknown, HFU counts the recomputed forward too. The
    same block without it: model FLOPs are the exact count (forward, the weight gradients, the
    second layer's input gradient; the input needs none)."""
    import torch
    from torch.profiler import profile, schedule
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    lin1, ln, lin2 = torch.nn.Linear(64, 128), torch.nn.LayerNorm(128), torch.nn.Linear(128, 64)
    opt = torch.optim.SGD([*lin1.parameters(), *ln.parameters(), *lin2.parameters()], lr=0.1)

    class Scaled(torch.autograd.Function):
        """A backward that calls addmm on its gradients: no recomputation."""

        @staticmethod
        def forward(ctx, x):
            return x * 2.0

        @staticmethod
        def backward(ctx, g):
            return torch.addmm(g, g, torch.eye(g.shape[1]))

    def block(x):
        y = lin2(torch.nn.functional.gelu(ln(lin1(x))))
        return Scaled.apply(y) if recompute == "custom" else y

    out = tmp_path / "rank0.trace.json"
    with profile(record_shapes=True, schedule=schedule(wait=0, warmup=1, active=2),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(out))) as prof:
        for _ in range(3):
            x = torch.randn(32, 64)
            y = checkpoint(block, x, use_reentrant=False) if recompute is True else block(x)
            y.sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    e = compute_efficiency(load_traces(out, cache=False), peak_tflops=1.0)
    rank = e.per_rank.iloc[0]
    forward = 2 * 32 * (64 * 128 + 128 * 64)
    if recompute is True:
        assert rank["recomputed_ops"] > 0 and math.isnan(rank["model_tflop_per_step"])
        assert e.mfu_pct is None and rank["hfu_pct"] > 0
        assert rank["executed_tflop_per_step"] * 1e12 > 2 * forward + 2 * 32 * 128 * 64
    else:
        assert rank["recomputed_ops"] == 0
        extra = 2 * 32 * 64 * 64 if recompute == "custom" else 0   # the backward's own addmm
        assert rank["model_tflop_per_step"] * 1e12 == pytest.approx(
            forward + forward + 2 * 32 * 128 * 64 + extra, rel=1e-12)


def test_each_evaluated_change_states_its_predicted_mfu():
    """On a pipeline sample with a peak given: each change that keeps the global batch states
    the MFU at the measured and at the predicted step (the ranks' model FLOPs per step over the
    step × their peaks); the ratio of the two is that of the step times."""
    from pardiag.api import analyze

    rep = analyze(REPO / "sample_traces" / "pp_1f1b_cpu_2rank", peak_tflops=0.05)
    doc = rep.to_json()
    flops = sum(r["model_tflop_per_step"] for r in doc["efficiency"]["per_rank"]) * 1e12
    peak = 0.05e12 * len(doc["efficiency"]["per_rank"])
    stated = [c for c in doc["recommendations"] + doc["not_recommended"]
              if c["predicted_mfu_pct"] is not None]
    assert stated
    for c in stated:
        assert c["measured_mfu_pct"] == pytest.approx(
            100 * flops / (c["measured_step_us"] / 1e6 * peak), rel=1e-9)
        assert c["predicted_mfu_pct"] == pytest.approx(
            100 * flops / (c["predicted_step_us"] / 1e6 * peak), rel=1e-9)
    for c in doc["recommendations"] + doc["not_recommended"]:
        if c["ruled_out"] or c["batch"].get("global_batch_changes"):
            assert c["predicted_mfu_pct"] is None
    plain = analyze(REPO / "sample_traces" / "pp_1f1b_cpu_2rank").to_json()
    assert all(c["predicted_mfu_pct"] is None
               for c in plain["recommendations"] + plain["not_recommended"])


def test_a_peak_or_token_count_that_is_not_a_positive_number_is_one_line(tmp_path):
    """--peak-tflops and --tokens-per-step: 0, negative, NaN, inf and text are refused in one
    line (exit 2), as in the API; a peak below what the rank reached is said, the verdict names
    the given peak; on a monitored run both options (and --hta) are refused."""
    import pardiag
    from pardiag.errors import PardiagError

    sample = str(REPO / "sample_traces" / "ddp_cpu_2rank")
    for bad in ("0", "-1", "nan", "inf", "abc"):
        for opt in ("--peak-tflops", "--tokens-per-step"):
            res = CliRunner().invoke(cli, ["report", sample, "-o", str(tmp_path / "r.html"),
                                           "-q", f"{opt}={bad}"])
            assert res.exit_code == 2 and f"Invalid value for '{opt}'" in res.output, res.output
    for bad in (0, -1.0, float("nan"), "abc", True):
        with pytest.raises(PardiagError, match="peak_tflops must be a positive, finite number"):
            pardiag.analyze(sample, peak_tflops=bad)
    rep = pardiag.analyze(sample, peak_tflops=1e-6)
    assert any("no device runs above its peak" in n for n in rep.efficiency.notes)
    assert "of the given peak (--peak-tflops 1e-06)" in rep.verdict
    run = tmp_path / "monitored"
    (run / "pardiag").mkdir(parents=True)
    (run / "pardiag" / "rank0.monitor.jsonl").write_text("")
    res = CliRunner().invoke(cli, ["report", str(run), "--tokens-per-step", "8"])
    assert res.exit_code == 2 and "--tokens-per-step: only for a traced run" in res.output
    # --hta, which a monitored run's report ignored: refused alike
    res = CliRunner().invoke(cli, ["report", str(run), "--hta"])
    assert res.exit_code == 2 and "--hta: only for a traced run" in res.output, res.output


def test_a_trace_without_shapes_has_no_flops_and_says_why(real_traces):
    """A real V100 trace recorded without record_shapes: no per-rank row (no 0.0 FLOPs), one
    note naming the rank."""
    e = compute_efficiency(load_traces(real_traces / "ddp_2rank_v100_rank0", cache=False))
    assert e.per_rank.empty and e.mfu_pct is None
    assert any(n.startswith("rank 0: none of its") and "record_shapes" in n for n in e.notes)


def test_tokens_per_second_from_the_recorded_model_input(tmp_path):
    """pardiag profile records the model's first input: integer token ids of shape [8, 512],
    called twice per optimizer step (gradient accumulation), give 8192 tokens per step, so
    tokens/s = 8192 / the 1 ms step, with a note saying where they came from;
    --tokens-per-step overrides; a floating-point input (an image batch, or a later pipeline
    stage's activations) or one of another rank leaves tokens/s unknown."""
    from pardiag.analyzer.analyses.efficiency import recorded_tokens
    from pardiag.layout import ModelShapes

    from .synth import write_sidecar

    def run(shapes: dict) -> Path:
        out = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        out.mkdir()
        (out / "rank0.trace.json").write_text(json.dumps(_planted()))
        write_sidecar(out / "rank0.meta.json", "rank", 0, {"optimizer_steps": 4,
                                                          "shapes": shapes})
        return out

    ids = {"batch_samples": 8, "batch_calls": 2, "batch_shape": [8, 512],
           "batch_integer": True}
    e = compute_efficiency(load_traces(run(ids), cache=False))
    assert e.per_rank.iloc[0]["tokens_per_s"] == pytest.approx(8192 / 1e-3)
    assert ("tokens per step from the model's recorded input (integer token ids [batch, "
            "sequence] × its calls per optimizer step; --tokens-per-step overrides): rank 0: "
            "8192 (8 × 512 token ids × 2 call(s))") in e.notes
    given = compute_efficiency(load_traces(run(ids), cache=False), tokens_per_step=100)
    assert given.per_rank.iloc[0]["tokens_per_s"] == pytest.approx(100 / 1e-3)
    assert not any(n.startswith("tokens per step from") for n in given.notes)
    images = {**ids, "batch_shape": [8, 3, 224, 224], "batch_integer": False}
    e = compute_efficiency(load_traces(run(images), cache=False))
    assert math.isnan(e.per_rank.iloc[0]["tokens_per_s"])
    assert recorded_tokens(None) is None
    assert recorded_tokens(type("M", (), {"shapes": ModelShapes(
        batch_shape=[8, 512], batch_integer=False, batch_calls=1)})()) is None
    assert recorded_tokens(type("M", (), {"shapes": ModelShapes(
        batch_shape=[8, 512, 4], batch_integer=True, batch_calls=1)})()) is None


def test_the_mfu_spread_leaves_out_the_steps_the_step_time_leaves_out(tmp_path):
    """Five steps of one bf16 matmul each, the fourth 5× as long (a step that writes a trace):
    the step time leaves it out as an outlier, and so does the MFU's spread over the profiled
    steps (it had run down to the outlier's fifth)."""
    import pardiag

    b = TraceBuilder(rank=0, world_size=1)
    for i, (t0, dur) in enumerate(((0, 1000), (1000, 1000), (2000, 1000), (3000, 5000),
                                   (8000, 1000)), 1):
        b.step(i, t0, dur)
        b.cpu("aten::mm", t0 + 10, 60, args={"Input Dims": [[8192, 1024], [1024, 512]],
                                            "Input type": [BF16, BF16]})
        b.kernel("sm90_gemm", t0 + 20, 50, launch_ts=t0 + 15)
        b.cpu("aten::copy_", t0 + 100, dur - 110)   # the rest of the step's host work
    doc = b.doc()
    doc["deviceProperties"] = [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]
    path = tmp_path / "rank0.trace.json"
    path.write_text(json.dumps(doc))
    rep = pardiag.analyze(path, cache=False)
    per = rep.efficiency.per_step.set_index("step")["mfu_pct"]
    assert per[4] == pytest.approx(per[1] / 5)
    assert "step(s) [4] over 1.5× the median" in rep.verdict
    assert f"({per[1]:.1f}–{per[5]:.1f}% in the 4 profiled steps, the outlier step(s) left out)" \
        in rep.verdict


def test_a_cpu_ranks_peak_is_its_hosts_best(monkeypatch):
    """Four CPU ranks measured their float32 peak at once after their scripts; rank 1 shared a
    core then and measured half of rank 0's. Its MFU is against its host's best (rank 0's),
    with a note; rank 2, on another host, keeps its own."""
    from types import SimpleNamespace as NS

    from pardiag.analyzer.analyses import efficiency as E

    monkeypatch.setattr(E, "device_kind", lambda trace: "cpu")
    metas = {0: NS(host="a", peak_flops={"float32": 9.0e10}),
             1: NS(host="a", peak_flops={"float32": 4.5e10}),
             2: NS(host="b", peak_flops={"float32": 5.0e10})}
    notes: list[str] = []
    best = E._host_peaks(metas)
    assert best == {("a", "float32"): 9.0e10, ("b", "float32"): 5.0e10}
    peaks = [E._peak(NS(rank=r), metas[r], "float32", None, notes, best)[0] for r in range(3)]
    assert peaks == [0.09, 0.09, 0.05]
    assert notes == ["rank 1 measured 0.045 TFLOP/s (float32), under the 0.09 another rank of "
                     "its host measured (it shared a core then): its MFU is against the host's"]
    # without the others' metadata (or a host name) a rank keeps its own
    assert E._peak(NS(rank=1), metas[1], "float32", None, [])[0] == 0.045
