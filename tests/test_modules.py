"""FLOPs, time and achieved rate per module (``efficiency.per_module``): forward ops by the module
range around them, backward ops by autograd's sequence number, pardiag's ranges and the
profiler's own module frames, on planted traces with exact answers; and the ranges
``pardiag profile`` records (:class:`pardiag.collectors.modules.ModuleRanges`) on a real model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from pardiag.analyzer.analyses.efficiency import compute_efficiency
from pardiag.analyzer.trace import load_traces
from pardiag.collectors.modules import ModuleRanges

from .synth import TraceBuilder

F32 = "float"
#: One planted addmm [64, 256] · [256, 512]: 2·64·256·512 FLOPs; its backward's two mm the same.
MM = 2 * 64 * 256 * 512


def _addmm(b: TraceBuilder, ts: float, seq: int, tid=None) -> None:
    b.cpu("aten::addmm", ts, 10, tid=tid, args={
        "Input Dims": [[512], [64, 256], [256, 512], [], []],
        "Input type": [F32, F32, F32, "Scalar", "Scalar"], "Sequence number": seq})


def _mm(b: TraceBuilder, ts: float, dims, tid=None) -> None:
    b.cpu("aten::mm", ts, 5, tid=tid, args={"Input Dims": dims, "Input type": [F32, F32]})


def _planted(python_frames: bool = False) -> dict:
    """One step: module ``blocks.0.fc`` (then ``blocks.1.fc``) runs an addmm each (sequence numbers
    7 and 9); a ``relu`` outside every range; the backward of each addmm (its two mm) in the
    engine's range, whose sequence number is recorded on the node's own range only for the
    first (as where FSDP's hooks run before the node); a backward function with a number no
    forward op has; the optimizer's step with one elementwise op."""
    b = TraceBuilder(rank=0, world_size=1, backend="gloo")
    b.step(1, 0, 1000)

    def rng(path: str, cls: str, ts: float, dur: float) -> None:
        if python_frames:   # the instance number: the block's
            b.cpu(f"nn.Module: {cls}_{path.split('.')[1] if '.' in path else 0}", ts, dur,
                  cat="python_function")
        else:
            b.cpu(f"pardiag::module::{path} ({cls})", ts, dur, cat="user_annotation")

    rng("Net", "Net", 10, 200)
    rng("blocks.0", "Block", 20, 50)
    rng("blocks.0.fc", "Linear", 25, 30)
    _addmm(b, 30, seq=7)
    rng("blocks.1", "Block", 80, 50)
    rng("blocks.1.fc", "Linear", 85, 30)
    _addmm(b, 90, seq=9)
    b.cpu("aten::relu", 300, 5, args={"Input Dims": [[64, 512]], "Input type": [F32],
                                      "Sequence number": 11})
    for at, seq, on_node in ((400, 9, False), (500, 7, True)):
        b.cpu("autograd::engine::evaluate_function: AddmmBackward0", at, 80,
              args={} if on_node else {"Sequence number": seq})
        b.cpu("AddmmBackward0", at + 40, 30, args={"Sequence number": seq} if on_node else {})
        _mm(b, at + 42, [[64, 512], [512, 256]])
        _mm(b, at + 52, [[256, 64], [64, 512]])
    b.cpu("autograd::engine::evaluate_function: ReluBackward0", 600, 20,
          args={"Sequence number": 99})
    b.cpu("aten::threshold_backward", 605, 5, args={"Input Dims": [[64, 512], [64, 512], []],
                                                    "Input type": [F32, F32, "Scalar"]})
    b.cpu("Optimizer.step#SGD.step", 700, 100, cat="user_annotation")
    b.cpu("aten::add_", 710, 8, args={"Input Dims": [[512, 256], [512, 256], []],
                                      "Input type": [F32, F32, "Scalar"]})
    return b.doc()


def _efficiency(tmp_path: Path, doc: dict):
    path = tmp_path / "rank0.trace.json"
    path.write_text(json.dumps(doc))
    return compute_efficiency(load_traces(path, cache=False))


def test_planted_modules_get_their_forward_and_backward_flops(tmp_path):
    """Each Linear has its addmm forward and both mm of its backward (linked by the engine's
    range or by the node's own), none of the other's; the relu, outside every range, and the
    backward whose number no forward op has are the row of no module; the optimizer's op is
    ``(optimizer)``; time shares of the counted ops' time."""
    e = _efficiency(tmp_path, _planted())
    ops = e.ops
    assert list(ops.loc[ops["name"] == "aten::mm", "module"]) == ["blocks.1.fc"] * 2 + [
        "blocks.0.fc"] * 2
    assert ops.loc[ops["name"] == "aten::mm", "backward"].all()
    assert not ops.loc[ops["name"] == "aten::addmm", "backward"].any()
    pm = e.per_module.set_index("module", drop=False)
    for name in ("blocks.0.fc", "blocks.1.fc"):
        row = pm.loc[name]
        assert (row["module_class"], row["ops"], row["ranks"]) == ("Linear", 3, 1)
        assert (row["forward_flops"], row["backward_flops"], row["flops"]) == (MM, 2 * MM, 3 * MM)
        assert row["time_us"] == 20.0   # 10 + 5 + 5
        assert row["achieved_tflops"] == pytest.approx(3 * MM / 20e-6 / 1e12)
    opt = pm.loc["(optimizer)"]
    assert (opt["module_class"], opt["ops"], opt["flops"]) == ("SGD", 1, 512 * 256)
    none = e.per_module[e.per_module["module"].isna()].iloc[0]
    assert none["module_class"] is None
    assert (none["ops"], none["forward_flops"], none["backward_flops"]) == (2, 64 * 512, 64 * 512)
    assert e.per_module["time_pct"].sum() == pytest.approx(100.0)
    assert pm.loc["blocks.0.fc", "time_pct"] == pytest.approx(100 * 20 / (2 * 20 + 8 + 10))
    assert any("2 counted op(s) ran for no known module" in n for n in e.notes)
    # inclusive: a Linear holds nothing under it; the optimizer is its own
    assert pm.loc["blocks.0.fc", "inclusive_flops"] == 3 * MM
    assert pm.loc["(optimizer)", "inclusive_flops"] == 512 * 256


def test_inclusive_flops_and_time_add_the_modules_under_a_module(tmp_path):
    """``Net.block`` runs a residual add of its own and holds ``Net.block.fc`` (an addmm), a
    sibling ``Net.blockx`` whose name only starts alike is not under it: inclusive = own +
    the Linear's."""
    b = TraceBuilder(rank=0, world_size=1, backend="gloo")
    b.step(1, 0, 1000)
    b.cpu("pardiag::module::Net.block (Block)", 10, 100, cat="user_annotation")
    b.cpu("pardiag::module::Net.block.fc (Linear)", 20, 30, cat="user_annotation")
    _addmm(b, 25, seq=1)
    b.cpu("aten::add", 60, 4, args={"Input Dims": [[64, 512], [64, 512], []],
                                    "Input type": [F32, F32, "Scalar"]})
    b.cpu("pardiag::module::Net.blockx (Linear)", 200, 30, cat="user_annotation")
    _addmm(b, 205, seq=2)
    e = _efficiency(tmp_path, b.doc())
    pm = e.per_module.set_index("module")
    assert pm.loc["Net.block", "flops"] == 64 * 512
    assert pm.loc["Net.block", "inclusive_flops"] == 64 * 512 + MM
    assert pm.loc["Net.block", "inclusive_time_us"] == 4 + 10
    assert pm.loc["Net.blockx", "inclusive_flops"] == MM


def test_profiler_frames_give_paths_by_their_nesting(tmp_path):
    """``nn.Module: Linear_0`` frames (with_stack=True) name a module by the frames around it."""
    e = _efficiency(tmp_path, _planted(python_frames=True))
    pm = e.per_module.set_index("module")
    assert pm.loc["Net_0.Block_0.Linear_0", "backward_flops"] == 2 * MM
    assert pm.loc["Net_0.Block_1.Linear_1", "forward_flops"] == MM


def test_a_sequence_number_of_two_modules_links_to_none(tmp_path):
    """Two forward ops of different modules with one sequence number (two forward threads):
    their backward is of no known module, not of either."""
    doc = _planted()
    for ev in doc["traceEvents"]:
        if ev.get("name") == "aten::addmm" and ev["ts"] == 90:
            ev["args"]["Sequence number"] = 7
    e = _efficiency(tmp_path, doc)
    mm = e.ops[e.ops["name"] == "aten::mm"]
    assert mm["module"].isna().all()


def test_a_trace_without_module_ranges_says_so(tmp_path):
    doc = _planted()
    doc["traceEvents"] = [ev for ev in doc["traceEvents"]
                          if not str(ev.get("name", "")).startswith("pardiag::module::")]
    e = _efficiency(tmp_path, doc)
    assert set(e.per_module["module"].dropna()) == {"(optimizer)"}
    assert any("only the optimizer's step is told apart" in n for n in e.notes)
    assert not any("ran for no known module" in n for n in e.notes)


def test_no_ranges_at_all_leaves_the_table_empty_with_a_note(tmp_path):
    doc = _planted()
    doc["traceEvents"] = [ev for ev in doc["traceEvents"]
                          if not str(ev.get("name", "")).startswith(("pardiag::module::",
                                                                     "Optimizer.step"))]
    e = _efficiency(tmp_path, doc)
    assert e.per_module.empty
    assert any("the traces hold no module ranges" in n for n in e.notes)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return x + self.fc(x)


class _Boom(nn.Module):
    def forward(self, x):
        raise ValueError("boom")


def test_module_ranges_name_each_call_and_close_on_an_exception():
    """Qualified names in the outermost module called (the root by its class), nested as the
    calls are; a forward that raises closes its range (the next call's ranges are not inside
    it); uninstalled, no range."""
    from torch.profiler import profile

    model = nn.Sequential(_Block(), _Block())
    x = torch.randn(4, 16)
    rec = ModuleRanges()
    rec.install()
    try:
        with profile() as prof:
            model(x)
            with pytest.raises(ValueError):
                _Boom()(x)
            model(x)
    finally:
        rec.uninstall()
    names = [e.name for e in prof.events() if e.name.startswith("pardiag::module::")]
    assert names.count("pardiag::module::Sequential (Sequential)") == 2
    assert names.count("pardiag::module::Sequential.0.fc (Linear)") == 2
    assert names.count("pardiag::module::_Boom (_Boom)") == 1
    spans = {(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
             if e.name.startswith("pardiag::module::")}
    boom = next(s for s in spans if "_Boom" in s[0])
    assert not any(s[1] > boom[1] and s[2] <= boom[2] for s in spans if s != boom)
    assert rec.calls == 2 * 5 + 1
    with profile() as prof:
        model(x)
    assert not [e for e in prof.events() if e.name.startswith("pardiag::module::")]


def test_module_ranges_written_as_operators_are_no_work(tmp_path):
    """torch's fast record function writes a module range as a ``cpu_op``; one around the whole
    planted CPU step (its operators, a collective and a wait) changes no number of the
    breakdown (test_breakdown.py's answers: compute 78, comm 35, overlap 18, idle 5 µs)."""
    from pardiag.analyzer.analyses.breakdown import compute_time_breakdown

    from .synth import cpu_rank

    b = cpu_rank(0)
    b.cpu("pardiag::module::Net (Net)", 0, 99, cat="cpu_op")
    b.cpu("pardiag::module::attn.router (Router)", 84, 12, cat="cpu_op")
    b.write(tmp_path / "a.json")
    t = compute_time_breakdown(load_traces(tmp_path, cache=False)).totals.iloc[0]
    assert (t.compute_us, t.comm_us, t.overlap_us, t.idle_us) == (78.0, 35.0, 18.0, 5.0)
    events = load_traces(tmp_path, cache=False).ranks[0].events
    cats = set(events.loc[events["name"].str.startswith("pardiag::module::"), "cat"])
    assert cats == {"user_annotation"}


def test_the_terminal_page_and_json_show_the_modules(tmp_path):
    """The planted modules in the terminal's table, the page's table and roofline (a trace of
    the modules, hidden until clicked), and ``efficiency.per_module`` in the JSON."""
    from click.testing import CliRunner

    from pardiag.cli import cli

    path = tmp_path / "rank0.trace.json"
    path.write_text(json.dumps(_planted()))
    page, js = tmp_path / "r.html", tmp_path / "r.json"
    res = CliRunner().invoke(cli, ["report", str(path), "-o", str(page), "--no-cache",
                                   "--json", str(js), "--peak-tflops", "1"])
    assert res.exit_code == 0, res.output
    assert "Achieved rate per module" in res.output and "blocks.0.fc" in res.output
    assert "(no known module)" in res.output
    html = page.read_text()
    assert "blocks.1.fc" in html and "modules (the 3 longest)" in html   # two Linear, the optimizer
    rows = {r["module"]: r for r in json.loads(js.read_text())["efficiency"]["per_module"]}
    assert rows["blocks.0.fc"]["backward_flops"] == 2 * MM
    assert rows[None]["ops"] == 2


class _Attn(nn.Module):
    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.qkv, self.o = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, d))


class _GPTBlock(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(d), _Attn(d), nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


class _GPT(nn.Module):
    def __init__(self, vocab: int = 64, d: int = 32) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([_GPTBlock(d) for _ in range(2)])
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.emb(ids)
        for blk in self.blocks:
            x = blk(x)
        return self.head(x)


def test_a_transformers_modules_against_torchs_flop_counter(tmp_path):
    """A small GPT (token ids [4, 16], causal attention, MLP, two blocks) trained two profiled
    steps with the module ranges: every Linear's matmul FLOPs, forward and backward, equal
    ``torch.utils.flop_counter.FlopCounterMode``'s count for that module (per module, by
    qualified name, the same names as pardiag's) × 2 steps; each attention module holds its
    causal SDPA forward and backward (FlashAttention-2's count: 2·B·H·L·S·(E+Ev)/2, backward
    2.5×)."""
    from torch.profiler import profile, schedule
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model = _GPT()
    opt = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, 64, (4, 16))

    def step() -> None:
        loss = nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()

    with FlopCounterMode(display=False) as counter:
        step()
    expected = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}
    rec = ModuleRanges()
    rec.install()
    try:
        with profile(record_shapes=True,
                     schedule=schedule(wait=0, warmup=1, active=2, repeat=1),
                     on_trace_ready=lambda p: p.export_chrome_trace(
                         str(tmp_path / "rank0.trace.json"))) as prof:
            for _ in range(3):
                step()
                prof.step()
    finally:
        rec.uninstall()
    e = compute_efficiency(load_traces(tmp_path / "rank0.trace.json", cache=False))
    model_ops = e.ops[e.ops["model"] & e.ops["step"].notna()]
    ours = model_ops.groupby("module")["flops"].sum()
    linears = [f"_GPT.{n}" for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 9
    for name in linears:
        assert ours[name] == 2 * expected[name], name
    b, h, t, e_ = 4, 4, 16, 8
    sdpa = 2 * b * h * t * t * (e_ + e_) / 2
    for blk in ("_GPT.blocks.0", "_GPT.blocks.1"):
        assert ours[f"{blk}.attn"] == 2 * sdpa * (1 + 2.5)
    assert not model_ops["module"].isna().any()   # every matmul and attention has its module


def _profiled(tmp_path: Path, step, steps: int = 2):
    """``step()`` run ``steps`` profiled times (after one warmup) with the module ranges and
    shapes; the efficiency of the trace."""
    from torch.profiler import profile, schedule

    rec = ModuleRanges()
    rec.install()
    try:
        with profile(record_shapes=True,
                     schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
                     on_trace_ready=lambda p: p.export_chrome_trace(
                         str(tmp_path / "rank0.trace.json"))) as prof:
            for _ in range(steps + 1):
                step()
                prof.step()
    finally:
        rec.uninstall()
    return compute_efficiency(load_traces(tmp_path / "rank0.trace.json", cache=False))


def test_a_closures_forward_and_backward_are_the_modules_not_the_optimizers(tmp_path):
    """``optimizer.step(closure)`` (Lightning's automatic optimization) runs the forward and
    the backward inside the optimizer's range: each Linear still has its forward 2·B·K·N and
    backward 4·B·K·N (2·B·K·N for the first: no input gradient); the optimizer's row holds no
    backward."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))
    opt = torch.optim.AdamW(model.parameters())
    x, y = torch.randn(16, 64), torch.randn(16, 32)

    def closure():
        opt.zero_grad()
        loss = (model(x) - y).square().mean()
        loss.backward()
        return loss

    e = _profiled(tmp_path, lambda: opt.step(closure))
    pm = e.per_module.set_index("module")
    for name, (k, n, grads) in {"Sequential.0": (64, 128, 2), "Sequential.2": (128, 32, 4)
                                }.items():
        assert pm.loc[name, "forward_flops"] == 2 * (2 * 16 * k * n), name
        model_bwd = e.ops[(e.ops["module"] == name) & e.ops["model"] & e.ops["backward"]]
        assert model_bwd["flops"].sum() == 2 * (grads * 16 * k * n), name
    assert pm.loc["(optimizer)", "backward_flops"] == 0


def test_a_reentrant_checkpoints_backward_links_to_the_recomputed_forward(tmp_path):
    """``checkpoint(block, use_reentrant=True)``: the block's Linears rerun their forward inside
    the backward (recomputed) and their backward links to that rerun; per step, each has its
    forward 2·B·K·N, the recomputed 2·B·K·N and the backward 4·B·K·N, none of it left to no
    module."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    stem = nn.Linear(32, 64)
    block = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))
    params = [*stem.parameters(), *block.parameters()]
    opt = torch.optim.SGD(params, lr=0.01)
    x = torch.randn(16, 32)

    def step() -> None:
        opt.zero_grad()
        checkpoint(block, stem(x), use_reentrant=True).square().mean().backward()
        opt.step()

    e = _profiled(tmp_path, step)
    model_ops = e.ops[e.ops["model"] & e.ops["step"].notna()]
    assert not model_ops["module"].isna().any()
    pm = e.per_module.set_index("module")
    for name, (k, n) in {"Sequential.0": (64, 128), "Sequential.2": (128, 64)}.items():
        mm = 2 * 16 * k * n * 2   # × 2 steps
        rows = model_ops[model_ops["module"] == name]
        assert rows["flops"].sum() == mm * (1 + 1 + 2), name
        assert pm.loc[name, "recomputed_flops"] == mm, name
        assert pm.loc[name, "forward_flops"] == mm, name


def test_names_by_root_renamed_under_a_later_root_and_printable():
    """Two roots of one class are ``Sequential`` and ``Sequential_1``; a module called alone
    first (``Dec``) is renamed when a root that holds it is called (``Model.dec``); names that
    are not printable ASCII are escaped (Kineto writes such a range as ``unknown``)."""
    from torch.profiler import profile

    class Dec(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.dec = Dec()
            self.parts = nn.ModuleDict({"ü_块": nn.Linear(4, 4), "tab\there": nn.ReLU()})

        def forward(self, x):
            return self.parts["tab\there"](self.parts["ü_块"](self.dec(x)))

    g, d, model = nn.Sequential(nn.Linear(4, 4)), nn.Sequential(nn.Linear(4, 4)), Model()
    x = torch.randn(2, 4)
    rec = ModuleRanges()
    rec.install()
    try:
        with profile() as prof:
            d(g(x))
            model.dec(x)
            model(x)
    finally:
        rec.uninstall()
    names = [e.name.removeprefix("pardiag::module::") for e in prof.events()
             if e.name.startswith("pardiag::module::")]
    assert names[:4] == ["Sequential (Sequential)", "Sequential.0 (Linear)",
                         "Sequential_1 (Sequential)", "Sequential_1.0 (Linear)"]
    assert names[4:6] == ["Dec (Dec)", "Dec.fc (Linear)"]
    assert names[6:] == ["Model (Model)", "Model.dec (Dec)", "Model.dec.fc (Linear)",
                         "Model.parts.\\xfc_\\u5757 (Linear)", "Model.parts.tab\\there (ReLU)"]


def test_names_with_brackets_are_text_in_the_terminal(tmp_path):
    """A module named like rich markup (``y[/]``, ``[bold]x``) is printed as it is."""
    from click.testing import CliRunner

    from pardiag.cli import cli

    b = TraceBuilder(rank=0, world_size=1, backend="gloo")
    b.step(1, 0, 1000)
    for i, name in enumerate(("Net.y[/]", "Net.[bold]x")):
        b.cpu(f"pardiag::module::{name} (Linear)", 10 + 100 * i, 50, cat="user_annotation")
        _addmm(b, 20 + 100 * i, seq=i)
    path = tmp_path / "rank0.trace.json"
    path.write_text(json.dumps(b.doc()))
    res = CliRunner().invoke(cli, ["report", str(path), "-o", str(tmp_path / "r.html"),
                                   "--no-cache"], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "Net.y[/]" in res.output and "Net.[bold]x" in res.output
