"""Recommendations that respect tensor shapes and say what changes for the optimizer:
the collector's shape recording on planted torch modules (in-process, one gloo rank), the
checks on what it recorded, the batch statements, and the reasons in a report's JSON, HTML and
terminal output."""

import json
from fractions import Fraction

import pytest

from pardiag.analyzer.predict import shapes
from pardiag.analyzer.render.html import render_html
from pardiag.analyzer.report.registry import build_report, report_json
from pardiag.analyzer.trace import load_traces

from .synth_report import big_run


@pytest.fixture(scope="module")
def tp_mesh():
    """A one-rank gloo group and a 1-D device mesh named "tp": DTensor parameters carry their
    full shapes and placements as on any TP degree."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    finally:
        dist.destroy_process_group()


def _recorded(**kw):
    from pardiag.collectors import shapes
    return shapes.model_shapes(**({"roots": [], "stages": {}} | kw))


def test_mlp_widths_rule_out_tp3_and_allow_tp2_and_tp4(tp_mesh):
    """Widths 1,000 and 4,096, column-wise then row-wise (Megatron MLP twice): tp = 3 divides
    neither; 2 and 4 divide both. Biases of row-wise layers stay replicated (not recorded)."""
    from torch import nn
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    mlp = nn.Sequential(nn.Linear(64, 1000), nn.ReLU(), nn.Linear(1000, 64),
                        nn.Linear(64, 4096), nn.ReLU(), nn.Linear(4096, 64))
    parallelize_module(mlp, tp_mesh, {"0": ColwiseParallel(), "2": RowwiseParallel(),
                                      "3": ColwiseParallel(), "5": RowwiseParallel()})
    rec = _recorded(roots=[mlp])
    got = [(p.name, p.shape, p.tp_dims, p.placements, p.mesh_dims) for p in rec.sharded_params]
    assert got == [
        ("0.weight", [1000, 64], [0], ["Shard(dim=0)"], ["tp"]),
        ("0.bias", [1000], [0], ["Shard(dim=0)"], ["tp"]),
        ("2.weight", [64, 1000], [1], ["Shard(dim=1)"], ["tp"]),
        ("3.weight", [4096, 64], [0], ["Shard(dim=0)"], ["tp"]),
        ("3.bias", [4096], [0], ["Shard(dim=0)"], ["tp"]),
        ("5.weight", [64, 4096], [1], ["Shard(dim=1)"], ["tp"])]
    c = shapes.constraints_of({0: rec})
    assert shapes.check_tp_degree(3, c) == (
        "tp=3 does not divide 1,000 (dim 0 of 0.weight [1000, 64] and 2 more parameters), "
        "4,096 (dim 0 of 3.weight [4096, 64] and 2 more parameters)")
    assert shapes.check_tp_degree(2, c) is None and shapes.check_tp_degree(4, c) is None
    assert shapes.check_tp_degree(16, c).startswith("tp=16 does not divide 1,000 ")
    assert shapes.unchecked_tp(c) is None


def test_attention_heads_rule_out_tp4(tp_mesh):
    """6 heads (torch's MultiheadAttention) rule out tp = 4 and allow 2, 3, 6; under GQA the
    KV heads count too (8 heads, 2 KV heads: tp = 4 fails on the KV heads); a Hugging Face
    style module shows its heads only through q_proj/k_proj over head_dim."""
    from torch import nn

    class Gqa(nn.Module):
        def __init__(self):
            super().__init__()
            self.num_attention_heads, self.num_key_value_heads = 8, 2

    class LlamaAttention(nn.Module):   # heads from projections: 64 / 8 = 8, 16 / 8 = 2
        def __init__(self):
            super().__init__()
            self.head_dim = 8
            self.q_proj, self.k_proj = nn.Linear(64, 64), nn.Linear(64, 16)

    model = nn.ModuleDict({"attn": nn.MultiheadAttention(48, 6)})
    rec = _recorded(roots=[model])
    assert [(a.module, a.type, a.heads, a.kv_heads, a.source) for a in rec.attention] == [
        ("attn", "MultiheadAttention", 6, None, "attributes")]
    c = shapes.constraints_of({0: rec})
    assert shapes.check_tp_degree(4, c) == "tp=4 does not divide 6 attention heads (attn)"
    assert [shapes.check_tp_degree(t, c) for t in (2, 3, 6)] == [None] * 3
    gqa = nn.ModuleDict({"gqa": Gqa(), "hf": LlamaAttention()})
    rec = _recorded(roots=[gqa])
    assert [(a.module, a.heads, a.kv_heads, a.source) for a in rec.attention] == [
        ("gqa", 8, 2, "attributes"), ("hf", 8, 2, "projections")]
    assert shapes.check_tp_degree(4, shapes.constraints_of({0: rec})) == \
        "tp=4 does not divide 2 KV heads (gqa and 1 more module)"
    assert shapes.check_tp_degree(2, shapes.constraints_of({0: rec})) is None


def test_five_layer_pipeline_rules_out_three_stages_of_two_chunks():
    """Stage modules of 2 and 3 splittable layers (a ModuleList counts by its items) on two
    ranks: 5 layers. 3 stages × 2 chunks (6) cannot be built; 2 × 2 and 5 × 1 can."""
    from torch import nn

    class Tail(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
            self.norm = nn.LayerNorm(4)

    per_rank = {0: _recorded(stages={0: nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))}),
                1: _recorded(stages={1: Tail()})}
    assert (per_rank[0].stage_layers, per_rank[1].stage_layers) == ({"0": 2}, {"1": 3})
    c = shapes.constraints_of(per_rank)
    assert c.layers == 5
    assert shapes.check_stages(3, 2, c.layers) == (
        "3 stages × 2 chunks per rank = 6 stages, more than the 5 layers the stage modules can "
        "be split into")
    assert shapes.check_stages(2, 2, c.layers) is None and shapes.check_stages(5, 1, 5) is None
    assert shapes.check_stages(6, 1, 5) == (
        "6 stages, more than the 5 layers the stage modules can be split into")
    # a stage nobody recorded: the layer count is unknown, nothing is ruled out
    assert shapes.constraints_of({1: per_rank[1]}).layers is None


def test_batch_recorder_takes_the_model_and_counts_accumulation():
    """An evaluation pass under no_grad (5 samples), then two accumulation steps of 3 samples
    and the loss module: the model's 3 samples, 2 calls."""
    import torch
    from torch import nn

    from pardiag.collectors.shapes import BatchRecorder

    model, loss = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2)), nn.CrossEntropyLoss()
    rec = BatchRecorder()
    rec.install()
    try:
        with torch.no_grad():
            model(torch.zeros(5, 4))
        for _ in range(2):
            loss(model(torch.zeros(3, 4)), torch.zeros(3, dtype=torch.long))
    finally:
        rec.uninstall()
    model(torch.zeros(7, 4))   # after uninstall: not seen
    assert (rec.samples, rec.module, rec.calls) == (3, "Sequential", 2)
    c = shapes.Constraints(recorded=True, batch_samples=3, batch_calls=2)
    assert shapes.run_batch(c, dp=4) == shapes.Batch(24, 6, 3)
    assert shapes.run_batch(c, dp=1, pipeline_microbatches=4) == shapes.Batch(12, 12, 3)


def test_batch_recorder_reads_keyword_and_dict_inputs():
    """Hugging Face models take ``model(**batch)`` (keyword tensors only) and Lightning's DDP
    wrapper ``(batch_dict, batch_idx)``: the first tensor of at least one dimension in the
    keyword arguments or inside a dict is the batch (a 0-d tensor before it is not)."""
    import torch
    from torch import nn

    from pardiag.collectors.shapes import BatchRecorder

    class KwModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 2)

        def forward(self, scale=None, input_ids=None, labels=None):
            return self.lin(input_ids).sum()

    class Wrapper(nn.Module):   # what Lightning's strategy wrapper receives
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, batch, idx):
            return self.inner(**batch)

    model = KwModel()
    wrapper = Wrapper(model)
    for call, expected in (
            (lambda: model(scale=torch.tensor(2.0), input_ids=torch.zeros(6, 4),
                           labels=torch.zeros(6)), (6, "KwModel", 3)),
            (lambda: wrapper({"input_ids": torch.zeros(5, 4)}, 0), (5, "Wrapper", 3))):
        rec = BatchRecorder()
        rec.install()
        try:
            for _ in range(3):
                call()
        finally:
            rec.uninstall()
        assert (rec.samples, rec.module, rec.calls) == expected


def test_batch_checks():
    assert shapes.check_microbatches(8, 4) == ("8 microbatches would be under 1 sample each "
                                               "(global batch of 4 samples)")
    assert shapes.check_microbatches(3, 32) == ("3 microbatches do not divide the global batch "
                                                "of 32 samples")
    assert shapes.check_microbatches(4, 32) is None and shapes.check_microbatches(3, None) is None
    assert shapes.check_dp_degree(2, 3) == "dp=2 does not divide the global batch of 3 samples"
    assert shapes.check_dp_degree(8, 6) == ("dp=8 leaves under 1 sample per rank of the global "
                                            "batch of 6")
    assert shapes.check_dp_degree(4, 24, microbatches=4) == (
        "dp=4: 4 microbatches do not divide the per-rank batch of 6 samples")
    assert shapes.check_dp_degree(2, 24, microbatches=4) is None


def test_optimizer_effects():
    """Unchanged; the same global batch with a smaller per-rank batch (more DP at a fixed global
    batch); a doubled global batch (more DP at a fixed per-rank batch): retune."""
    now = shapes.Batch(64, 32, 8)
    batch, text = shapes.optimizer_effects(now)
    assert text == ("Nothing changes for the optimizer: the global batch (64 samples), per-rank "
                    "batch, microbatch size and optimizer steps per sample stay the same.")
    assert batch["global_batch"] == {"now": 64, "after": 64, "factor": 1.0}
    assert batch["global_batch_changes"] is False
    batch, text = shapes.optimizer_effects(now, per_rank_x=Fraction(1, 2), micro_x=Fraction(1, 2))
    assert batch["per_rank_batch"] == {"now": 32, "after": 16, "factor": 0.5}
    assert batch["microbatch"] == {"now": 8, "after": 4, "factor": 0.5}
    assert batch["optimizer_steps_per_sample"] == {"factor": 1.0}
    assert text == ("Same global batch of 64 samples and optimizer steps per sample: learning rate "
                    "and schedule carry over; per-rank batch 32 → 16 samples, microbatch 8 → 4 "
                    "samples (activation memory per rank changes, and so does the batch a "
                    "BatchNorm layer normalizes over).")
    batch, text = shapes.optimizer_effects(now, global_x=2)
    assert batch["global_batch"] == {"now": 64, "after": 128, "factor": 2.0}
    assert batch["optimizer_steps_per_sample"] == {"factor": 0.5} and batch["global_batch_changes"]
    assert text == ("The global batch changes 64 → 128 samples, so the optimizer takes ×0.5 steps "
                    "per sample: retune the learning rate (e.g. the linear scaling rule) and its "
                    "warm-up (Goyal et al., 2017), or keep the global batch with gradient "
                    "accumulation.")


def _tp_run(tmp_path, recorded=True):
    """An 8-rank dp = 4 × tp = 2 CPU run on two nodes of 4 (synth_report.big_run): DP × TP
    candidates tp = 1 (dp = 8) and tp = 4 (dp = 2; tp = 8 would span nodes). Recorded: 6
    attention heads and 4 samples per rank (global batch 16)."""
    out = big_run(tmp_path / "run", ranks=8, steps=3, tp=2)
    if recorded:
        for r in range(8):
            f = out / f"rank{r}.meta.json"
            doc = json.loads(f.read_text())
            doc["shapes"] = {"attention": [{"module": "layers.0.attention", "type": "Attention",
                                            "heads": 6}], "batch_samples": 4, "batch_calls": 1}
            f.write_text(json.dumps(doc))
    return build_report(load_traces(out))


def test_ruled_out_degree_reaches_json_html_and_terminal(tmp_path):
    from rich.console import Console

    from pardiag.analyzer.render.terminal import render_recommendations

    rep = _tp_run(tmp_path)
    data = report_json(rep)
    by = {c["change"]: c for c in data["recommendations"] + data["not_recommended"]}
    bad = by["dp=2, tp=4 (TP inside each node; same global batch)"]
    assert bad["ruled_out"] == "tp=4 does not divide 6 attention heads (layers.0.attention)"
    assert bad["predicted_step_us"] is None and bad in data["not_recommended"]
    ok = by["dp=8, tp=1 (data parallel only; same global batch)"]
    assert ok["ruled_out"] == "" and ok["predicted_step_us"] > 0
    assert ok["batch"]["global_batch"] == {"now": 16, "after": 16, "factor": 1.0}
    assert ok["batch"]["per_rank_batch"] == {"now": 4, "after": 2, "factor": 0.5}
    assert ok["optimizer_effect"].startswith("Same global batch of 16 samples and optimizer steps "
                                             "per sample: learning rate and schedule carry over; "
                                             "per-rank batch 4 → 2 samples")
    assert not any("not checked" in x for x in ok["caveats"])
    page = render_html(rep, include_plotlyjs="cdn")
    verdict = page.split("<h2 id='verdict'>")[1].split("<h2 id='summary'>")[0]
    # in the table of changes not recommended: the change, no prediction, and why
    assert ("<td class='l'>dp=2, tp=4 (TP inside each node; same global batch)</td><td>–</td>"
            "<td>–</td><td class='l'>ruled out by the model&#x27;s shapes or batch: tp=4 does "
            "not divide 6 attention heads (layers.0.attention)</td>") in verdict
    con = Console(record=True, width=200, color_system=None)
    render_recommendations(rep, con)
    assert ("dp=2, tp=4 (TP inside each node; same global batch): ruled out by the model's "
            "shapes or batch: tp=4 does not divide 6 attention heads (layers.0.attention)"
            ) in con.export_text()


def test_traces_without_shapes_say_the_candidates_were_not_checked(tmp_path):
    data = report_json(_tp_run(tmp_path, recorded=False))
    by = {c["change"]: c for c in data["recommendations"] + data["not_recommended"]}
    tp4 = by["dp=2, tp=4 (TP inside each node; same global batch)"]
    assert tp4["ruled_out"] == ""
    assert tp4["caveats"][-2:] == [
        "not checked against the model's tensor shapes (attention heads, sharded dimensions): "
        "the traces do not record them (`pardiag profile` does)",
        "not checked against the global batch: its size was not recorded"]
    # tp = 1 needs no shape: only the batch is unchecked
    tp1 = by["dp=8, tp=1 (data parallel only; same global batch)"]
    assert tp1["caveats"][-1] == "not checked against the global batch: its size was not recorded"
    assert not any("tensor shapes" in x for x in tp1["caveats"])
