"""The what-if model and the recommendations: schedule orders as torch runs them,
closed-form replays, the optimal partition, and exact predictions on planted runs."""

import json

import pytest

from pardiag.analyzer.predict import whatif
from pardiag.analyzer.report.registry import build_report, report_json
from pardiag.analyzer.trace import load_traces

from .paths import REPO
from .synth import TraceBuilder, record, write_sidecar

# ---- schedule orders and replays ------------------------------------------------------------

@pytest.mark.parametrize("sample", ["pp_gpipe_cpu_2rank", "pp_1f1b_cpu_2rank",
                                    "pp_unbalanced_cpu_2rank", "pp_1f1b_cpu_4rank",
                                    "pp_interleaved_cpu_2rank"])
def test_schedule_order_is_the_order_torch_ran(sample):
    """The recorded chunk order of every rank and step equals :func:`schedule_order`."""
    docs = {}
    for f in (REPO / "sample_traces" / sample / "pardiag").glob("rank*.pipeline.json"):
        d = json.loads(f.read_text())
        docs[d["rank"]] = d
    sch = docs[0]["schedule"]
    orders = whatif.schedule_order(sch["schedule"], sch["pp_group_size"], sch["microbatches"],
                                   sch.get("stages_per_rank") or 1)
    steps = {r["optimizer_step"] for r in docs[0]["records"]}
    assert len(steps) >= 4
    for rank, d in docs.items():
        for step in steps:
            rec = sorted((r for r in d["records"] if r["optimizer_step"] == step),
                         key=lambda r: r["start_us"])
            assert [(r["stage"], r["phase"], r["microbatch"]) for r in rec] == orders[rank]


@pytest.mark.parametrize("schedule,p,m,v", [("gpipe", 2, 4, 1), ("gpipe", 4, 8, 1),
                                             ("1f1b", 2, 4, 1), ("1f1b", 4, 8, 1),
                                             ("1f1b", 4, 2, 1), ("interleaved", 2, 4, 2),
                                             ("interleaved", 4, 8, 2), ("interleaved", 2, 8, 4)])
def test_replay_of_balanced_stages_matches_the_closed_form(schedule, p, m, v):
    """Window = (v·m + p − 1) · (F + B)/v with no hop latency (Narayanan et al., SC'21), i.e. a
    bubble share of (p − 1)/(v·m + p − 1); 1F1B with m < p degenerates to (m + p − 1)."""
    f, b = 1000.0 / v, 2000.0 / v
    sim = whatif.simulate(whatif.schedule_order(schedule, p, m, v), [f] * (p * v), [b] * (p * v))
    assert sim.window_us == pytest.approx((v * m + p - 1) * (f + b))
    for r in range(p):
        assert sim.bubble_pct[r] == pytest.approx(100.0 * (p - 1) / (v * m + p - 1))


def test_hop_latency_and_tails():
    """GPipe p = 2, m = 4: a hop of 100 µs adds one hop forward and one back; a rank whose
    optimizer runs 500 µs makes the step window + 500."""
    o = whatif.schedule_order("gpipe", 2, 4)
    assert whatif.simulate(o, [1000, 1000], [2000, 2000], 100).window_us == 15200
    period, _ = whatif.simulate_period(o, [1000, 1000], [2000, 2000], 0.0, {0: 500, 1: 500})
    assert period == 15500
    # the last stage's longer tail (2500 µs after its last backward at 13000) delays step k+1
    period, _ = whatif.simulate_period(o, [1000, 1000], [2000, 2000], 0.0, {0: 500, 1: 4000})
    assert period == 16000
    assert whatif.calibrate_hop(o, [1000, 1000], [2000, 2000], 15900.0, {0: 500, 1: 500}) == \
        pytest.approx(200.0, abs=1e-3)


def test_replay_of_a_split_backward_in_the_run_s_own_order():
    """ScheduleZBVZeroBubble on 2 ranks, 2 microbatches (its own order, V placement, backward
    split into I and W): every action 100 µs (backward 200 µs, half of it I) replays to a
    1300 µs window in which each rank runs 1200 (rank 1 starts 100 µs late, nothing else
    waits); a 50 µs hop on each dependency between ranks (stage 0 → 1 and 2 → 3 and back)
    lengthens it; I/W without the input share is refused."""
    r0 = [(0, "F", 0), (0, "F", 1), (3, "F", 0), (3, "I", 0), (3, "F", 1), (3, "I", 1),
          (0, "I", 0), (3, "W", 0), (0, "I", 1), (3, "W", 1), (0, "W", 0), (0, "W", 1)]
    r1 = [(1, "F", 0), (2, "F", 0), (1, "F", 1), (2, "F", 1), (2, "I", 0), (1, "I", 0),
          (2, "I", 1), (1, "I", 1), (2, "W", 0), (1, "W", 0), (2, "W", 1), (1, "W", 1)]
    orders = {0: r0, 1: r1}
    sim = whatif.simulate(orders, [100.0] * 4, [200.0] * 4, input_share=[0.5] * 4)
    assert sim.window_us == 1300.0 and sim.busy_us == {0: 1200.0, 1: 1200.0}
    assert sim.bubble_pct[0] == pytest.approx(100 / 13)
    assert whatif.simulate(orders, [100.0] * 4, [200.0] * 4, 50.0,
                           input_share=[0.5] * 4).window_us > 1300.0
    with pytest.raises(ValueError, match="no input share"):
        whatif.simulate(orders, [100.0] * 4, [200.0] * 4)


def test_best_partition_and_boundaries():
    assert whatif.best_partition([1] * 8, 2) == [4, 4]
    assert whatif.best_partition([5, 1, 1, 1, 1, 1], 2) == [1, 5]
    assert whatif.best_partition([1, 2, 3, 4, 5, 6, 7, 8, 9], 3) == [5, 2, 2]   # 15 | 13 | 17
    assert whatif.boundaries_text([4, 4]) == "[0–3 | 4–7]"
    assert whatif.boundaries_text([1, 2]) == "[0 | 1–2]"
    with pytest.raises(ValueError, match="cannot split 2 layers into 3"):
        whatif.best_partition([1, 1], 3)


def test_scaled_chunk_and_errors():
    assert whatif.scaled_chunk_us(1000, 0.5, 8, 4) == 750
    assert whatif.scaled_chunk_us(1000, 0.0, 8, 16) == 2000
    with pytest.raises(ValueError, match="not modelled"):
        whatif.schedule_order("ZeroBubble", 2, 4)
    with pytest.raises(ValueError, match="multiple of its rounds"):
        whatif.schedule_order("interleaved", 2, 5, 2)


def test_chunk_cost_split_on_planted_operators():
    """Operators timed exactly 2 µs + 0.001 µs per byte moved (twice their inputs): [8, 100]
    (8 rows = the microbatch: per-sample) 8.4 µs, [100, 50] (a weight: fixed) 42 µs, [8, 200]
    14.8 µs, in a 100 µs forward chunk. Per-sample: 6.4 + 12.8 µs → fixed share 0.808."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": "pardiag:PP:S0:F0", "tid": 1, "ts": 0,
           "dur": 100}]
    t = 0.0
    for dims, dur in (([[8, 100]], 8.4), ([[100, 50]], 42.0), ([[8, 200]], 14.8)):
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::gelu", "tid": 1, "ts": t,
                   "dur": dur, "args": {"Input Dims": dims}})
        t += dur
    ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "tid": 2, "ts": 0, "dur": 50,
               "args": {"Input Dims": [[8, 4], [4, 4]]}})   # another thread: not in the chunk
    (out,) = whatif.chunk_cost_split(ev, {0: 8})
    assert (out["stage"], out["phase"], out["chunks"], out["chunk_us"]) == (0, "F", 1, 100.0)
    assert out["fixed_share"] == pytest.approx(0.808)
    assert out["fit"] == pytest.approx([2.0, 0.001, 0.0], abs=1e-9)


def test_operator_work():
    """addmm [8, 64] × [64, 256] with n = 8: 4·(512 + 16384 + 2048) bytes, 2·8·64·256 flops, of
    which the input and output (rows n) and all flops grow; a weight gradient [256, 8] × [8, 64]
    has all its flops grow (K = n) but not its weight-shaped result."""
    assert whatif.op_work("aten::addmm", [[256], [8, 64], [64, 256]], 8) == (
        75776.0, 262144.0, 10240.0, 262144.0)
    assert whatif.op_work("aten::mm", [[256, 8], [8, 64]], 8) == (
        75776.0, 262144.0, 10240.0, 262144.0)
    assert whatif.op_work("aten::add_", [[256, 64], [256, 64], []], 8) == (
        262144.0, 0.0, 0.0, 0.0)
    assert whatif.op_work("aten::view", [], 8) is None
    assert whatif.interpolate([1, 2, 4], [10, 20, 30], 3) == 25
    assert whatif.interpolate([1, 2, 4], [10, 20, 30], 8) == 50     # continued linearly
    assert whatif.interpolate([1, 2, 4], [10, 20, 30], 0.5) == 5
    # least squares through (1, 10), (2, 30), (3, 30), (4, 50): y = 12·x
    assert whatif.affine([1, 2, 3, 4], [10, 30, 30, 50], 8) == pytest.approx(96)
    assert whatif.affine([1, 2, 3, 4], [10, 30, 30, 50], 0) == pytest.approx(0.1)   # 1% floor
    with pytest.raises(ValueError):
        whatif.affine([2, 2], [10, 30], 4)


def test_the_demo_sample_recommends_moving_the_stage_boundary():
    """``make demo``'s run (1F1B, stages of 1 and 5 blocks): the top recommendation moves the
    boundary to [0–3 | 4–7] — 3 blocks each, the input projection and head counted — and
    predicts a faster step; it shows first in the terminal summary's data and the JSON."""
    rep = build_report(load_traces(REPO / "sample_traces" / "pp_unbalanced_cpu_2rank"))
    res = rep.results["recommendations"]
    top = res.recommendations[0]
    assert top.kind == "rebalance_stages" and top.params["layers_per_stage"] == [4, 4]
    assert top.predicted_step_us < 0.9 * top.measured_step_us
    assert report_json(rep)["recommendations"][0]["change"] == top.change


# ---- planted runs: exact predictions ----------------------------------------------------------

def _pipeline_run(tmp_path, schedule, p, m, fwd, bwd, tails, steps=6, layers=None,
                  fixed_share=None, samples=None, opt=None, extra=None):
    """Records of ``steps`` identical steps replayed with the given costs (hop 0), each rank
    idle ``tails[r]`` after its last chunk; optimizer records ``opt[r]`` µs at the start of
    the tail."""
    orders = whatif.schedule_order(schedule, p, m)
    ready = {r: 0.0 for r in range(p)}
    recs = {r: [] for r in range(p)}
    opt_recs = {r: [] for r in range(p)}
    for step in range(steps):
        sim = whatif.simulate(orders, fwd, bwd, 0.0, ready)
        for r, s, ph, mb, a, e in sim.actions:
            row = {"stage": s, "microbatch": mb, "phase": ph, "start_us": 1e6 + a,
                   "end_us": 1e6 + e, "optimizer_step": step, "profiled": False}
            if samples and ph == "F":
                row["samples"] = samples
            recs[r].append(row)
        last = {r: max(a[5] for a in sim.actions if a[0] == r) for r in range(p)}
        for r in range(p):
            if opt:
                opt_recs[r].append({"optimizer_step": step, "start_us": 1e6 + last[r],
                                    "end_us": 1e6 + last[r] + opt[r]})
        ready = {r: last[r] + tails[r] for r in range(p)}
    for r in range(p):
        b = TraceBuilder(rank=r, world_size=p, backend="gloo")
        b.step(1, 1e6, 1000).cpu("aten::mm", 1e6 + 10, 500)
        b.write(tmp_path / f"rank{r}.trace.json")
        body = {"records": recs[r], "optimizer": opt_recs[r]}
        if layers:
            body["layers"] = [{"stage": r, "index": i, "name": str(i), "type": "Block",
                               "params_bytes": pb, "fwd_us": {str(s): t for s in range(steps)}}
                              for i, (t, pb) in enumerate(layers[r])]
        if fixed_share is not None:
            body["chunk_costs"] = [{"stage": r, "phase": ph, "chunks": 4, "chunk_us": 1.0,
                                    "fixed_share": fixed_share} for ph in "FB"]
        body.update((extra or {}).get(r, {}))
        write_sidecar(tmp_path / f"rank{r}.pipeline.json", "pipeline", r, body)
    names = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}
    write_sidecar(tmp_path / "run.json", "run", None, {"world_size": p, "layout": {
        "dims": {"pp": p}, "strategies": ["pipeline"], "pipeline": {
            "schedule": names[schedule], "stages": p, "microbatches": m, "pp_group_size": p,
            "stages_per_rank": 1}}})
    return load_traces(tmp_path)


def _by_change(result):
    return {c.change: c for c in (*result.recommendations, *result.rejected)}


def test_microbatch_predictions_are_exact(tmp_path):
    """GPipe p = 2, m = 4, F = 1000, B = 2000 µs, half of each chunk fixed, 500 µs tails
    (300 optimizer + 200 other): step 15500 µs. Predicted (window (m + 1)·(F' + B') + 500):
    m = 2 → F' 1500, B' 3000: 14000; m = 8 → 750/1500: 20750; m = 16 → 625/1250: 32375."""
    traces = _pipeline_run(tmp_path, "gpipe", 2, 4, [1000, 1000], [2000, 2000], {0: 500, 1: 500},
                           fixed_share=0.5, samples=8, opt={0: 300, 1: 300})
    rep = build_report(traces)
    model, why = __import__("pardiag.analyzer.predict.recommend", fromlist=["x"]).pipeline_model(
        traces, rep.results["pipeline"])
    assert why == ""
    assert (model.fwd_us, model.bwd_us, model.period_us, model.hop_us) == \
        ((1000.0, 1000.0), (2000.0, 2000.0), 15500.0, 0.0)
    assert model.tail_us == {0: 500.0, 1: 500.0} and model.opt_us == {0: 300.0, 1: 300.0}
    res = rep.results["recommendations"]
    ch = _by_change(res)
    assert ch["microbatches 2 of 16 samples (same global batch)"].predicted_step_us == 14000
    assert ch["microbatches 8 of 4 samples (same global batch)"].predicted_step_us == 20750
    assert ch["microbatches 16 of 2 samples (same global batch)"].predicted_step_us == 32375
    assert ch["schedule 1F1B"].predicted_step_us == 15500     # same bubble as GPipe
    top = res.recommendations[0]
    assert top.kind == "microbatches" and top.measured_step_us == 15500
    assert top.gain_pct == pytest.approx(100 * 1500 / 15500)
    assert [c.kind for c in res.recommendations] == ["microbatches"]   # the rest gain < 2%
    data = report_json(rep)
    assert data["recommendations"][0]["predicted_step_us"] == 14000
    assert {c["change"] for c in data["not_recommended"]} >= {"schedule 1F1B"}


def test_unequal_stages_fit_a_chunk_as_a_line_in_its_layers(tmp_path):
    """1F1B p = 2, m = 4; stage 0 holds 6 layers, stage 1 holds 2, 100 µs forward each; a
    chunk's forward is 50 µs + its layers', its backward 300 µs + twice theirs (650/1500 and
    250/700 µs). The lines through the two stages give exactly that back: per layer 100/200,
    per chunk 50/300. Balanced [0–3 | 4–7]: 450 + 1100 µs per chunk, (m + 1) · 1550 = 7750,
    rank 0 restarts 400 µs (its optimizer) later: 8150 µs. (The stages' mean overhead and each
    stage's own backward/forward ratio would put 128 µs of the backward per chunk and 231 or 280
    per layer.)"""
    rec = __import__("pardiag.analyzer.predict.recommend", fromlist=["x"])
    layers = {0: [(100.0, 1000)] * 6, 1: [(100.0, 1000)] * 2}
    traces = _pipeline_run(tmp_path, "1f1b", 2, 4, [650, 250], [1500, 700], {0: 600, 1: 200},
                           layers=layers, fixed_share=0.0, samples=8, opt={0: 600, 1: 200})
    rep = build_report(traces)
    model, _ = rec.pipeline_model(traces, rep.results["pipeline"])
    _, fw, bw, over = model.layer_costs()
    assert fw == pytest.approx([100.0] * 8) and bw == pytest.approx([200.0] * 8)
    assert over == pytest.approx([50.0, 300.0])
    (reb,) = [c for c in rep.results["recommendations"].recommendations
              if c.kind == "rebalance_stages"]
    assert reb.params["layers_per_stage"] == [4, 4]
    assert reb.predicted_step_us == pytest.approx(8150.0)


def test_microbatch_sizes_follow_the_line_through_the_timed_sizes(tmp_path):
    """As above but without fixed shares: each stage module was timed at 4, 8, 16, 32 samples,
    forward 300, 540, 840, 1720 µs — the line 100 + 50·n plus noise that leaves the
    least-squares line unchanged — and backward twice that. A chunk keeps its ratio to the line
    (1000 µs vs 500 at 8 samples): m = 2 (16 samples) → F' 1800, B' 3600: 3 · 5400 + 500 =
    16700 µs (through the timings themselves, 840/540, it would be 16055); m = 8 → 600/1200:
    9 · 1800 + 500 = 16700; m = 16 → 400/800: 17 · 1200 + 500 = 20900."""
    fwd = {4: 300, 8: 540, 16: 840, 32: 1720}
    extra = {r: {"size_scaling": [{"stage": r, "samples": n, "fwd_us": f, "bwd_us": 2 * f}
                                  for n, f in fwd.items()]} for r in range(2)}
    traces = _pipeline_run(tmp_path, "gpipe", 2, 4, [1000, 1000], [2000, 2000], {0: 500, 1: 500},
                           samples=8, opt={0: 300, 1: 300}, extra=extra)
    ch = _by_change(build_report(traces).results["recommendations"])
    assert ch["microbatches 2 of 16 samples (same global batch)"].predicted_step_us == \
        pytest.approx(16700)
    assert ch["microbatches 8 of 4 samples (same global batch)"].predicted_step_us == \
        pytest.approx(16700)
    assert ch["microbatches 16 of 2 samples (same global batch)"].predicted_step_us == \
        pytest.approx(20900)


def test_rebalancing_predictions_are_exact(tmp_path):
    """1F1B p = 2, m = 4: stage 0 holds 6 layers, stage 1 holds 2, 100 µs forward each,
    backward 2× forward, 1000 parameter bytes each; optimizer 0.1 µs per byte (600 / 200 µs),
    nothing else between steps; nothing fixed in a chunk.

    Measured: stage 0 is busy every microbatch: 4 · 1800 + its 600 µs optimizer = 7800 µs (and
    so is any microbatch count: no gain). Balanced [0–3 | 4–7]: F 400, B 800 µs per stage,
    optimizer 400 µs each → window (m + 1) · 1200 = 6000, rank 0 restarts 400 µs later: 6400.
    Interleaving re-splits the 8 layers too and, with no hop latency, is better still: 5800 µs
    with 2 stages per rank, 5500 with 4."""
    layers = {0: [(100.0, 1000)] * 6, 1: [(100.0, 1000)] * 2}
    traces = _pipeline_run(tmp_path, "1f1b", 2, 4, [600, 200], [1200, 400], {0: 600, 1: 200},
                           layers=layers, fixed_share=0.0, samples=8, opt={0: 600, 1: 200})
    res = build_report(traces).results["recommendations"]
    ch = {c.kind + (c.change[:40] if c.kind == "interleave" else ""): c
          for c in res.recommendations}
    reb = ch["rebalance_stages"]
    assert reb.change.startswith("stage boundaries [0–3 | 4–7] (child modules per stage 4,4; "
                                 "now [0–5 | 6–7])")
    assert reb.measured_step_us == 7800 and reb.predicted_step_us == pytest.approx(6400.0)
    # interleaving must beat 6400 by 10%: 4 stages per rank (5500) does, 2 (5800) does not
    v2 = [c for c in res.rejected if c.change.startswith(
        "schedule Interleaved1F1B, 2 stages per rank, stage boundaries [0–1 | 2–3 | 4–5 | 6–7]")]
    assert len(v2) == 1 and v2[0].predicted_step_us == pytest.approx(5800.0)
    assert v2[0].caveats[-1].startswith("predicted less than 10% faster than the best change")
    assert [c.kind for c in res.recommendations] == ["interleave", "rebalance_stages"]
    assert res.recommendations[0].predicted_step_us == pytest.approx(5500.0)
    assert all(c.predicted_step_us == 7800 for c in res.rejected if c.kind == "microbatches")



def _dp_run(tmp_path, **more):
    """The GPipe run the data-parallel what-if is tested on (see the test below), with the
    stage modules timed at 8 and 16 samples and all-reduces at 1 and 4 MiB after the run, plus
    ``more`` pipeline-sidecar keys on each rank."""
    mib = 2**20
    extra = {r: {"size_scaling": [{"stage": r, "samples": 8, "fwd_us": 1000, "bwd_us": 2000},
                                  {"stage": r, "samples": 16, "fwd_us": 1800, "bwd_us": 3600}],
                 "allreduce_calibration": [{"bytes": mib, "us": 1100},
                                           {"bytes": 4 * mib, "us": 4100}], **more}
             for r in range(2)}
    return _pipeline_run(tmp_path, "gpipe", 2, 4, [1000, 1000], [2000, 2000], {0: 500, 1: 500},
                         layers=[[(500, mib)] * 2] * 2, samples=8, opt={0: 300, 1: 300},
                         extra=extra)


def test_data_parallel_instead_of_the_pipeline_is_exact(tmp_path):
    """GPipe p = 2, m = 4 of 8 samples (step 15500 µs, as above); 2 layers of 1 MiB per stage;
    optimizer 300 µs per rank, tails 500. As dp = 2 each rank runs 16 samples: the stage modules
    take 1800 + 3600 µs each there (10800); optimizer 2 × 300; other 500 − 300 = 200; 4 MiB of
    gradients in DDP's default buckets (1 MiB first, then the rest: 1 and 3 MiB), all-reduce
    α = 100 µs + 1 MiB per 1000 µs (timed after the run): 1100 + 3100. On CPU all of it adds:
    15800 µs."""
    traces = _dp_run(tmp_path)
    res = build_report(traces).results["recommendations"]
    (dp,) = [c for c in (*res.recommendations, *res.rejected) if c.kind == "pp_to_dp"]
    assert dp.params == {"pp": 1, "dp": 2}
    assert dp.measured_step_us == 15500
    assert dp.predicted_step_us == pytest.approx(15800)
    assert dp in res.rejected      # slower than the pipeline
    assert dp.evidence[2].startswith("4 MiB of gradients in 2 bucket(s): all-reduce 4.20 ms")


def test_data_parallel_uses_ddp_timed_on_a_stand_in(tmp_path):
    """As above, but pardiag profile also timed DDP itself on a stand-in with 2 MiB of
    gradients: it added 1500 µs, so 4 MiB add 3000 (scaled by bytes): 10800 + 600 + 200 +
    3000 = 14600 µs, faster than the pipeline's 15500."""
    traces = _dp_run(tmp_path, ddp_calibration={
        "grad_bytes": 2 * 2**20, "rows": 16, "plain_us": 500, "ddp_us": 2000,
        "overhead_us": 1500})
    res = build_report(traces).results["recommendations"]
    (dp,) = [c for c in (*res.recommendations, *res.rejected) if c.kind == "pp_to_dp"]
    assert dp.predicted_step_us == pytest.approx(14600)
    assert dp in res.recommendations
    assert dp.evidence[2].endswith("DDP itself, timed after the run on a stand-in with 2 MiB of "
                                   "gradients, adds 1.50 ms: 3.00 ms at this size")

def _scaling_with_samples(spread):
    """size_scaling rows as in _dp_run, each median with 3 timings ± ``spread`` µs (the 95%
    bootstrap interval of a median of 3 is their [min, max])."""
    return {"size_scaling": [
        {"stage": r, "samples": n, "fwd_us": f, "bwd_us": b,
         "fwd_samples_us": [f - spread, f, f + spread],
         "bwd_samples_us": [b - spread, b, b + spread]}
        for r in range(2) for n, f, b in ((8, 1000, 2000), (16, 1800, 3600))]}


def _dp_interval_run(tmp_path, overhead_samples):
    mib = 2**20
    traces = _dp_run(tmp_path, ddp_calibration={
        "grad_bytes": 2 * mib, "rows": 16, "plain_us": 500, "ddp_us": 2000,
        "overhead_us": 1500, "overhead_samples_us": overhead_samples},
        **_scaling_with_samples(100))   # both stages' rows on each rank: the same lines
    return traces


def test_data_parallel_carries_the_stand_in_interval(tmp_path):
    """As the stand-in test above (14600 µs), with the stage modules' timings ± 100
    µs and DDP's cost timed 1400, 1500, 1600 µs. The lines through the low and high ends give
    1700 + 3500 and 1900 + 3700 µs per stage at 16 samples: 10400–11200 for both; DDP's 1400–
    1600 µs for 2 MiB is 2800–3200 for 4 MiB. Step: 10400 + 800 + 2800 = 14000 to 11200 + 800
    + 3200 = 15200 µs, below the measured 15500: still recommended."""
    traces = _dp_interval_run(tmp_path, [1400, 1500, 1600])
    res = build_report(traces).results["recommendations"]
    (dp,) = [c for c in (*res.recommendations, *res.rejected) if c.kind == "pp_to_dp"]
    assert dp.predicted_step_us == pytest.approx(14600)
    assert dp.predicted_low_us == pytest.approx(14000)
    assert dp.predicted_high_us == pytest.approx(15200)
    assert dp in res.recommendations
    assert dp.evidence[3] == (
        "with the stand-in timings' 95% intervals the step is 14.00–15.20 ms (stage modules "
        "10.40–11.20 ms, gradient synchronisation 2.80–3.20 ms; bootstrap intervals of their "
        "medians)")


def test_data_parallel_whose_interval_spans_no_gain_is_not_recommended(tmp_path):
    """The same with DDP's cost timed 500, 1500, 2500 µs: 1000–5000 µs for 4 MiB, so the step
    is 12200–17000 µs; the interval reaches the measured 15500: not recommended although the
    point prediction (14600) is 5.8% faster."""
    traces = _dp_interval_run(tmp_path, [500, 1500, 2500])
    res = build_report(traces).results["recommendations"]
    (dp,) = [c for c in (*res.recommendations, *res.rejected) if c.kind == "pp_to_dp"]
    assert dp.predicted_step_us == pytest.approx(14600)
    assert (dp.predicted_low_us, dp.predicted_high_us) == (pytest.approx(12200),
                                                           pytest.approx(17000))
    assert dp in res.rejected
    assert dp.caveats[-1].endswith("which reaches the measured 15.5 ms: it may gain nothing, "
                                   "so it is not recommended")


@pytest.mark.parametrize("static,peak,meas,pred", [
    ((10, 10), (14, 18), 18, 26),       # a device peak holds the static state
    ((20, 20), (1, 2), 22, 41.5)])      # a CPU window's peak: only what it allocated
def test_data_parallel_peak_memory(tmp_path, static, peak, meas, pred):
    """GPipe m = 4 (4 microbatches in flight), 8 samples each; as dp = 2 each rank holds both
    stages' static bytes and 16 samples' activations: Σ static + Σ activations / 4 · 2. A device
    peak holds the static state (activations = peak − static: 4 + 8 MiB → 20 + 6 = 26 MiB,
    measured 18); a CPU trace's window peak below the static bytes is all activations (1 + 2
    MiB → 40 + 1.5 = 41.5 MiB; measured static + window peak, 22)."""
    import pandas as pd

    from pardiag.analyzer.analyses.memory import peak_bytes
    from pardiag.analyzer.predict.recommend import build_context
    from pardiag.analyzer.predict.recommend.rules.pp_to_dp import pp_to_dp
    mib = 2**20
    traces = _dp_run(tmp_path)
    done = dict(build_report(traces).results)
    per_rank = pd.DataFrame({
        "rank": [0, 1], "static_bytes": [s * mib for s in static],
        "peak_allocated_bytes": [p * mib for p in peak], "peak_rss_bytes": [None, None]})
    per_rank["peak_bytes"], definition = peak_bytes(per_rank)   # the memory analysis' peak
    done["memory"] = _Obj(per_rank=per_rank, peak_definition=definition)
    (dp,) = pp_to_dp(build_context(traces, done))   # the rule, on the run's real context
    assert dp.measured_peak_bytes == meas * mib
    assert dp.predicted_peak_bytes == pytest.approx(pred * mib)


def _write_all_reduces(b, tmp_path, r, spans, ranks, worker=True):
    """Write rank ``r``'s trace — with each all-reduce ``(start, end)`` on gloo's worker
    thread, as a profiled CPU run has it (``worker``) — and its comms sidecar."""
    if worker:
        b.thread_name(2, "thread 2 (pt_gloo_runloop)")
        for start, end in spans:
            b.cpu("gloo:all_reduce", start, end - start, tid=2, cat="user_annotation")
    b.write(tmp_path / f"rank{r}.trace.json")
    write_sidecar(tmp_path / f"rank{r}.comms.json", "comms", r, {
        "process_groups": [{"name": "0", "desc": "default_pg", "ranks": list(ranks),
                            "size": len(ranks), "dim": "dp"}],
        "records": [record("all_reduce", i, a, e, ranks=ranks)
                    for i, (a, e) in enumerate(spans, start=1)]})


def test_straggler_is_named_with_its_cost(tmp_path):
    """3 ranks, 2 steps, 2 all-reduces per step; rank 2 arrives 100 µs after rank 0 and 80 µs
    after rank 1 at each: each other rank waits (100 + 80)/2 · 2 = 180 µs per step for it."""
    arrival = {0: 0.0, 1: 20.0, 2: 100.0}
    for r in range(3):
        b = TraceBuilder(rank=r, world_size=3, backend="gloo")
        b.step(1, 0, 2500).step(2, 2500, 2500)
        b.cpu("aten::mm", 10, 5)
        _write_all_reduces(b, tmp_path, r, [(t + arrival[r], t + 150)
                                            for t in (1000, 2000, 3000, 4000)], (0, 1, 2))
    res = build_report(load_traces(tmp_path)).results["recommendations"]
    top = res.recommendations[0]
    assert top.kind == "straggler" and top.title == "Rank 2 is a straggler"
    assert top.measured_step_us == 2500
    assert top.predicted_step_us == pytest.approx(2500 - 180)


def test_straggler_saving_leaves_out_the_computing_while_it_waits(tmp_path):
    """2 ranks, 2 steps of 5000 µs, 2 all-reduces per step; rank 1 arrives 1000 µs after rank 0
    at each, and rank 0 computes 400 µs of each wait (an asynchronous collective): it sits idle
    600 µs per all-reduce, 1200 µs per step — what the step would lose."""
    for r in range(2):
        b = TraceBuilder(rank=r, world_size=2, backend="gloo")
        b.step(1, 0, 5000).step(2, 5000, 5000)
        starts = (1000, 3000, 6000, 8000)
        if r == 0:
            for t in starts:
                b.cpu("aten::mm", t + 100, 400)
        _write_all_reduces(b, tmp_path, r, [(t + 1000 * r, t + 1200) for t in starts], (0, 1))
    res = build_report(load_traces(tmp_path)).results["recommendations"]
    top = res.recommendations[0]
    assert top.kind == "straggler" and top.params == {"without_rank": 1}
    assert top.predicted_step_us == pytest.approx(5000 - 1200)
    assert "sit idle 1.20 ms per step" in top.evidence[0]


def _straggler_that_computes_more(tmp_path, gpu: bool):
    """2 ranks, 2 steps of 5000 µs, 2 all-reduces per step at 1000 and 3000 µs into it; rank 1
    computes 400 µs right before each and arrives 1000 µs after rank 0, which does nothing
    else besides 10 µs at each end of a step, as rank 1: rank 0 waits 2000 µs per step for it.
    Idle per step: rank 1 5000 − 20 − 2 · (400 + 200) = 3780 µs, rank 0 5000 − 20 − 2 · 1200 =
    2580: rank 1 idles 1200 µs more and computes 800 µs more."""
    starts = (1000, 3000, 6000, 8000)
    for r in range(2):
        b = TraceBuilder(rank=r, world_size=2, backend="nccl" if gpu else "gloo")
        b.step(1, 0, 5000).step(2, 5000, 5000)
        for edge in (0, 4990, 5000, 9990):    # a step's work starts and ends at its edges
            (b.kernel("elementwise_kernel", edge, 10, launch_ts=edge) if gpu else
             b.cpu("aten::add", edge, 10))
        for t in starts:
            if r == 1:
                (b.kernel("sm80_xmma_gemm", t + 600, 400, launch_ts=t + 590) if gpu else
                 b.cpu("aten::mm", t + 600, 400))
            if gpu:
                b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", t + 1000 * r, 1200 - 1000 * r,
                         stream=20, launch_ts=t + 1000 * r - 5)
        _write_all_reduces(b, tmp_path, r, [(t + 1000 * r, t + 1200) for t in starts], (0, 1),
                           worker=not gpu)
    res = build_report(load_traces(tmp_path)).results["recommendations"]
    (top,) = [c for c in res.recommendations if c.kind == "straggler"]
    assert top.params == {"without_rank": 1}
    assert "sit idle 2.00 ms per step" in top.evidence[0]
    return top


def test_straggler_saving_on_cpu_is_its_extra_idle_time(tmp_path):
    """On CPU only the extra idle time is removed (op times follow the host): 5000 − 1200."""
    top = _straggler_that_computes_more(tmp_path, gpu=False)
    assert top.predicted_step_us == pytest.approx(5000 - 1200)
    assert top.evidence[1] == ("rank 1 is idle (no op, no collective) 1.20 ms per step more "
                               "than the others (median)")


def test_straggler_saving_on_gpu_is_the_others_waiting(tmp_path):
    """On a GPU (a rank's step window starts at its first kernel) the others' waiting is
    removed as it is: all 2000 µs."""
    top = _straggler_that_computes_more(tmp_path, gpu=True)
    assert top.predicted_step_us == pytest.approx(5000 - 2000)
    assert not any("is idle" in e for e in top.evidence)


def test_no_recommendation_says_why(tmp_path):
    b = TraceBuilder(rank=0, world_size=1, backend="gloo")
    b.step(1, 0, 100).cpu("aten::mm", 10, 50)
    b.write(tmp_path / "rank0.trace.json")
    res = build_report(load_traces(tmp_path)).results["recommendations"]
    assert res.recommendations == ()
    assert res.why_none == ("nothing to evaluate: no pipeline, no significant straggler, and "
                            "no DDP, FSDP, ZeRO or tensor-parallel setting to change")
    assert res.verdict.startswith("Step 0.1 ms (while profiled; 1 step recorded: a one-off "
                                  "cannot be told from a persistent cause)")


def test_strategies_shown_without_settings_are_named(tmp_path):
    """DDP's marks in traces from elsewhere: the layout shows ddp, the traces hold none of its
    settings, and the report says so instead of "no DDP setting to change"."""
    for r in range(2):
        b = TraceBuilder(rank=r, world_size=2, backend="gloo")
        b.step(1, 0, 1000).cpu("DistributedDataParallel.forward", 10, 50,
                               cat="user_annotation")
        b.cpu("aten::mm", 100, 500)
        b.write(tmp_path / f"rank{r}.trace.json")
    res = build_report(load_traces(tmp_path)).results["recommendations"]
    assert res.recommendations == ()
    assert res.why_none == (
        "nothing to evaluate: ddp is in the layout the traces show, but not their settings "
        "(bucket sizes, resharding, prefetching, the ZeRO stage, static memory) nor, on a CPU, "
        "each collective's group: run under `pardiag profile` to evaluate changes to them")


# ---- communication changes: exact on planted numbers ------------------------------------------

def test_alpha_beta_resamples_equal_one_fit_per_resample():
    """The bootstrap fits every resample at once; each equals a one-at-a-time least-squares
    fit (written out here) through the fastest transfer of each size (the same draws),
    including fits that fall back to a line through the origin (a negative slope or latency)
    and resamples that hold one size."""
    import statistics

    import numpy as np

    def line(xs, ys):   # α ≥ 0, β > 0, else through the origin
        if len(xs) > 1:
            mx, my = statistics.fmean(xs), statistics.fmean(ys)
            var = sum((x - mx) ** 2 for x in xs)
            beta = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var > 0 else 0.0
            alpha = my - beta * mx
            if beta > 0 and alpha >= 0:
                return alpha, beta
        return 0.0, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)

    def one_at_a_time(sizes, times, resamples, seed=0):
        pts, cid = whatif._size_clusters(sizes, times)
        cid, t = np.asarray(cid), np.asarray([t for _, t in pts])
        size = np.bincount(cid, weights=[s for s, _ in pts]) / np.bincount(cid)
        rng, out = np.random.default_rng(seed), []
        for _ in range(resamples):
            idx = rng.integers(0, len(pts), len(pts))
            mins = np.full(cid[-1] + 1, np.inf)
            np.minimum.at(mins, cid[idx], t[idx])
            have = np.isfinite(mins)
            out.append(line(size[have].tolist(), mins[have].tolist()))
        return np.array(out)

    rng = np.random.default_rng(11)
    fallbacks = 0
    for trial in range(60):
        n = int(rng.integers(1, 30))
        sizes = rng.choice([1e3, 4e3, 1.6e4, 6.4e4, 2.5e5, 1e6], n)
        times = rng.random(n) * 100 + (sizes / 1e3 if trial % 2 else 0.0)
        want = one_at_a_time(sizes, times, 100)
        got = whatif.alpha_beta_resamples(sizes, times, 100)
        assert np.allclose(got, want, rtol=1e-12, atol=0.0), trial
        fallbacks += int((want[:, 0] == 0.0).sum())
    assert fallbacks > 100   # the through-the-origin fallback was exercised


def test_alpha_beta_fit_and_bucketed_tail():
    # t = 50 µs + 1 µs per byte; the fastest transfer of each size is used
    a, b = whatif.fit_alpha_beta([1000, 2000, 4000, 4000], [1050, 2050, 4050, 9000])
    assert a == pytest.approx(50.0) and b == pytest.approx(1.0)
    assert whatif.fit_alpha_beta([1000], [500]) == (0.0, 0.5)
    with pytest.raises(ValueError):
        whatif.fit_alpha_beta([0], [0])
    # 4000 bytes ready linearly over 0–4000 µs; α = 100, β = 0.5 µs/byte
    ready = [(0.0, 0.0), (4000.0, 4000.0)]
    # one bucket: launched at 4000, takes 100 + 2000
    assert whatif.bucketed_allreduce_tail(ready, 4000, 100, 0.5) == 2100
    # buckets of 1000: ready at 1000, 2000, 3000, 4000; each 600 µs; the last ends at 4600
    assert whatif.bucketed_allreduce_tail(ready, 1000, 100, 0.5) == 600
    # buckets of 500: 350 µs each, ready every 500 µs: the last ends 350 µs after 4000
    assert whatif.bucketed_allreduce_tail(ready, 500, 100, 0.5) == 350
    # buckets of 250 (225 µs each, ready every 250 µs): 225
    assert whatif.bucketed_allreduce_tail(ready, 250, 100, 0.5) == 225
    # latency-bound: α = 1000 µs: small buckets queue up
    assert whatif.bucketed_allreduce_tail(ready, 500, 1000, 0.5) == pytest.approx(
        8 * 1250 - (4000 - 500))



def test_fit_takes_near_equal_sizes_as_one_and_ddp_forms_buckets_as_torch():
    # 1000 and 1050 bytes are one size (its fastest transfer, 1100 µs); 3000 bytes: 3100 µs
    assert whatif.fit_alpha_beta([1000, 1050, 3000], [1100, 1500, 3100]) == \
        pytest.approx((100.0, 1.0))
    # a bucket closes once it holds ≥ its cap; a parameter is never split
    assert whatif.ddp_buckets([100, 300, 50, 600, 100], 400) == [400, 650, 100]
    assert whatif.ddp_buckets([100, 300, 50, 600, 100], 400, 100) == [100, 950, 100]
    # explicit bucket sizes: 1000 bytes ready at 1000 µs (ends 1600), 3000 more at 4000 µs
    ready = [(0.0, 0.0), (4000.0, 4000.0)]
    assert whatif.bucketed_allreduce_tail(ready, [1000, 3000], 100, 0.5) == 1600
    # sizes evaluated for 1 MiB buckets of 4 MiB: ¼, ½, 2×, 4×, torch's 25 MiB and 4 MiB / 2,
    # 4, 8 — the current 1 MiB left out, duplicates once
    mib = 2**20
    assert whatif.ddp_cap_candidates(mib, 4 * mib) == [mib // 4, mib // 2, 2 * mib, 4 * mib,
                                                        25 * mib]


def _ddp_run(tmp_path, param_bytes, cap, buckets, alpha, beta, span=10000.0, took=None,
             steps=2):
    """2 CPU ranks, ``steps`` steps of ``span`` µs; per step the ``buckets`` (bytes) are
    all-reduced one after another (each α + β·bytes, arriving together, unless
    ``took[(step, bucket)]`` gives its µs), 1000 µs apart."""
    took = took or {}
    for r in range(2):
        b = TraceBuilder(rank=r, world_size=2, backend="gloo")
        for k in range(steps):
            b.step(k + 1, k * span, span)
        b.write(tmp_path / f"rank{r}.trace.json")
        recs, seq = [], 1
        for k in range(steps):
            t = k * span + 1000
            for i, nb in enumerate(buckets):
                end = t + took.get((k, i), alpha + beta * nb)
                recs.append(record("all_reduce", seq, t, end, ranks=(0, 1), nbytes=int(nb)))
                seq, t = seq + 1, end + 1000
        write_sidecar(tmp_path / f"rank{r}.comms.json", "comms", r, {
            "process_groups": [{"name": "0", "desc": "default_pg", "ranks": [0, 1],
                                "size": 2, "dim": "dp"}], "records": recs})
    write_sidecar(tmp_path / "run.json", "run", None, {"world_size": 2, "layout": {
        "dims": {"dp": 2}, "strategies": ["ddp"], "ddp_bucket_cap_bytes": cap,
        "ddp_param_bytes": param_bytes}})
    return load_traces(tmp_path)


def test_ddp_bucket_sizes_on_cpu_change_the_step_by_the_count_of_all_reduces(tmp_path):
    """Parameters of 1, 1, 2, 4 MiB (in gradient order), bucket_cap_mb = 2: buckets 2, 2, 4 MiB.
    α = 100 µs, 1 MiB in 1000 µs. On CPU the all-reduces' time adds to the step, so a size
    changes it by α per all-reduce: 0.5 MiB → 4 buckets (+100 µs); 4 MiB → 4, 4 (−100);
    8 MiB → one (−200). 1 MiB and 25 MiB form the same buckets as 0.5 and 8: not listed."""
    mib = 2**20
    traces = _ddp_run(tmp_path, [mib, mib, 2 * mib, 4 * mib], 2 * mib, [2 * mib, 2 * mib, 4 * mib],
                      alpha=100.0, beta=1000.0 / mib)
    res = build_report(traces).results["recommendations"]
    ch = {c.params["ddp_bucket_cap_bytes"]: c for c in (*res.recommendations, *res.rejected)
          if c.kind == "ddp_bucket"}
    assert {k / mib: c.predicted_step_us for k, c in ch.items()} == pytest.approx(
        {0.5: 10100.0, 4: 9900.0, 8: 9800.0})
    assert ch[8 * mib].change == "DDP bucket_cap_mb=8 (now 2; 8 MiB of gradients per step)"
    assert ch[8 * mib].evidence[0].startswith("3 all-reduces per step now, 1 with this size; "
                                              "each costs α = 100 µs")


def test_ddp_bucket_size_resting_on_one_lucky_all_reduce_is_not_recommended(tmp_path):
    """The fit's interval (the all-reduces resampled) decides. Buckets of 2, 2, 4 MiB: every 2
    MiB all-reduce takes 2100 µs, the 4 MiB ones 4200 µs except the first step's (3000 µs).
    Through the fastest of each size α = 2·2100 − 3000 = 1200 µs, so 8 MiB buckets (1
    all-reduce, not 3) are predicted 2400 µs faster. A resample of the 6 all-reduces misses the
    lucky one with chance (5/6)⁶ = 33%, and then α = 2·2100 − 4200 = 0: the interval reaches
    the measured step, and the change is not recommended, with the reason. With every 4 MiB
    call at 3000 µs over 6 steps (a resample misses all 6 with chance (2/3)¹⁸ < 0.1%) the fit
    holds in the interval and the change is recommended."""
    mib = 2**20
    traces = _ddp_run(tmp_path, [mib, mib, 2 * mib, 4 * mib], 2 * mib, [2 * mib, 2 * mib, 4 * mib],
                      alpha=100.0, beta=1000.0 / mib,
                      took={(0, 0): 2100.0, (0, 1): 2100.0, (0, 2): 3000.0,
                            (1, 0): 2100.0, (1, 1): 2100.0, (1, 2): 4200.0})
    res = build_report(traces).results["recommendations"]
    assert not [c for c in res.recommendations if c.kind == "ddp_bucket"]
    c = next(c for c in res.rejected if c.params.get("ddp_bucket_cap_bytes") == 8 * mib)
    assert c.predicted_step_us == pytest.approx(10000.0 - 2400.0)
    assert c.predicted_low_us == pytest.approx(7600.0) and c.predicted_high_us == 10000.0
    assert any("may gain nothing, so it is not recommended" in x for x in c.caveats)
    assert any("bootstrap interval (1000 resamples" in e and "α 0–1200 µs" in e
               for e in c.evidence)
    # the same run with every 4 MiB call at 3000 µs: the fit holds in every resample
    (tmp_path / "clean").mkdir()
    clean = _ddp_run(tmp_path / "clean", [mib, mib, 2 * mib, 4 * mib], 2 * mib,
                     [2 * mib, 2 * mib, 4 * mib], alpha=100.0, beta=1000.0 / mib, steps=6,
                     took={(k, i): (3000.0 if i == 2 else 2100.0) for k in range(6)
                           for i in range(3)})
    res = build_report(clean).results["recommendations"]
    c = next(c for c in res.recommendations if c.params.get("ddp_bucket_cap_bytes") == 8 * mib)
    assert (c.predicted_low_us, c.predicted_step_us, c.predicted_high_us) == pytest.approx(
        (7600.0, 7600.0, 7600.0))


#: FSDP2's and FSDP1's range names: forward unshard, backward unshard, backward prefetch
FSDP_RANGES = {2: ("FSDP::pre_forward", "FSDP::pre_backward", "FSDP::backward_prefetch for 1"),
               1: ("FullyShardedDataParallel._pre_forward",
                   "FullyShardedDataParallel._pre_backward_hook",
                   "FullyShardedDataParallel._pre_backward_prefetch")}


def _fsdp_run(tmp_path, gpu: bool, version: int = 2, layout_extra=None):
    """2 ranks, 2 steps of 10000 µs, FSDP (``version`` 2 or 1) with 4 units. Forward: per unit
    a 500 µs all-gather then 1000 µs of compute; backward: per unit a 500 µs gather (inside the
    backward's unshard and prefetch ranges) then 500 µs of compute. Nothing overlaps: every
    gather is exposed. On GPU the same timeline runs as kernels (gathers on their own
    stream)."""
    fwd_name, bwd_name, pre_name = FSDP_RANGES[version]
    for r in range(2):
        b = TraceBuilder(rank=r, world_size=2, backend="nccl" if gpu else "gloo")
        recs, seq = [], 1
        for k, t0 in enumerate((0.0, 10000.0)):
            b.step(k + 1, t0, 10000)
            t = t0
            for phase, compute in (("fwd", 1000), ("bwd", 500)):
                for u in range(4):
                    if phase == "fwd":
                        b.cpu(fwd_name + (f" ({u})" if u and version == 2 else ""), t, 500,
                              cat="user_annotation")
                    else:
                        b.cpu(bwd_name, t, 500, cat="user_annotation")
                        b.cpu(pre_name, t, 500, cat="user_annotation")
                    recs.append(record("all_gather", seq, t, t + 500, ranks=(0, 1)))
                    seq += 1
                    if gpu:
                        b.kernel("ncclDevKernel_AllGather_RING_LL", t, 500, stream=20,
                                 launch_ts=t)
                        b.kernel("sm90_gemm", t + 500, compute, launch_ts=t + 1)
                    else:
                        b.cpu("c10d::_allgather_base_", t, 500)
                        b.cpu("aten::mm", t + 500, compute)
                    t += 500 + compute
        b.write(tmp_path / f"rank{r}.trace.json")
        write_sidecar(tmp_path / f"rank{r}.comms.json", "comms", r, {
            "process_groups": [{"name": "0", "desc": "default_pg", "ranks": [0, 1],
                                "size": 2, "dim": "dp"}], "records": recs})
    write_sidecar(tmp_path / "run.json", "run", None, {"world_size": 2, "layout": {
        "dims": {"dp": 2}, "strategies": [f"fsdp{version}"], "fsdp_reshard_after_forward": True,
        **(layout_extra or {})}})
    return build_report(load_traces(tmp_path)).results["recommendations"]


@pytest.mark.parametrize("version", [2, 1])
@pytest.mark.parametrize("gpu", [False, True])
def test_fsdp_reshard_and_prefetch_predictions(tmp_path, gpu, version):
    """Keeping parameters saves the backward's re-gathers: 4 × 500 µs per step. Prefetching
    (FSDP2: 2 units ahead; FSDP1: forward_prefetch): on GPU the forward's exposed gathers (half
    of the 8, 2000 µs) are hidden except the first unit's: 1500 µs saved; on CPU FSDP waits for
    each gather where it is issued (its backward prefetch ranges, 2000 µs per step, show it):
    nothing is saved."""
    res = _fsdp_run(tmp_path, gpu, version, {"fsdp1_forward_prefetch": False})
    ch = {c.kind: c for c in (*res.recommendations, *res.rejected)}
    assert ch["fsdp_reshard"].measured_step_us == 10000
    assert ch["fsdp_reshard"].predicted_step_us == pytest.approx(8000)
    pf = ch["fsdp_prefetch"]
    if version == 2:
        assert ch["fsdp_reshard"].change == "FSDP reshard_after_forward=False"
        assert pf.params == {"fsdp_prefetch": 2}
    else:
        assert ch["fsdp_reshard"].change == "FSDP sharding_strategy=ShardingStrategy.SHARD_GRAD_OP"
        assert ch["fsdp_reshard"].evidence[1] == ("the backward's unsharding (FullyShardedData"
                                                  "Parallel._pre_backward_hook) takes 2.00 ms "
                                                  "per step")
        assert pf.params == {"fsdp_forward_prefetch": True}
        assert pf.change == "FSDP forward_prefetch=True"
    assert pf.predicted_step_us == pytest.approx(8500 if gpu else 10000)
    if gpu:
        assert pf in res.recommendations
        assert pf.evidence[0].startswith("4 FSDP units gather in the forward; the all-gathers "
                                         "leave 4.00 ms per step exposed, 2.00 ms of it")
    else:
        assert pf in res.rejected
        assert "spends 2.00 ms per step inside those ranges" in pf.evidence[0]


def test_fsdp1_already_prefetching_and_not_resharding_is_left_alone(tmp_path):
    """FSDP1 with forward_prefetch=True and SHARD_GRAD_OP: neither change is evaluated."""
    res = _fsdp_run(tmp_path, False, 1, {"fsdp1_forward_prefetch": True,
                                         "fsdp_reshard_after_forward": False})
    kinds = {c.kind for c in (*res.recommendations, *res.rejected)}
    assert not kinds & {"fsdp_reshard", "fsdp_prefetch"}


class _Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _ctx(steps=2, dims=None, dim_comm=None, nodes=None, groups=None, bandwidth=None,
         settings=None, memory=None, peak=None, capacity=None):
    """A :class:`RuleContext` of a planted run: ``steps`` steps of 10000 µs on rank 0, the
    given layout, per-dimension communication per step and bandwidth."""
    import pandas as pd

    from pardiag.analyzer.analyses.breakdown import TimeBreakdown
    from pardiag.analyzer.analyses.dim_overlap import DimOverlapResult
    from pardiag.analyzer.analyses.layout import LayoutResult
    from pardiag.analyzer.predict.recommend.context import MeasuredPeak, RuleContext, step_noise
    st = pd.DataFrame({"rank": [0] * steps, "step": list(range(steps)),
                       "span_us": [10000.0] * steps})
    summary = pd.DataFrame([{"dim": d, "ranks": 4, "comm_us": c * steps, "exposed_us": e * steps,
                             "overlap_pct": 0.0} for d, (c, e) in (dim_comm or {}).items()])
    lay = LayoutResult(dims=dims or {}, strategies=[], pipeline=None,
                       groups=groups if groups is not None else pd.DataFrame(
                           columns=["dim", "pg", "desc", "ranks", "size", "nodes",
                                    "spans_nodes"]),
                       nodes=nodes or {"h": [0, 1, 2, 3]})
    sync = _Obj(bandwidth=bandwidth if bandwidth is not None else pd.DataFrame(),
                stragglers=pd.DataFrame(), instances=pd.DataFrame())
    return RuleContext(
        traces=_Obj(ranks={r: None for r in range(4)}, rank_meta={}, run_info=None),
        layout=lay, sync=sync,
        breakdown=TimeBreakdown(totals=pd.DataFrame(), steps=st, collectives=pd.DataFrame(
            columns=["rank", "collective", "count", "time_us", "exposed_us"])),
        dim_overlap=DimOverlapResult(pd.DataFrame(), summary), settings=settings or {},
        memory=memory, step=step_noise([10000.0] * steps, f"{steps} planted steps"),
        peak=peak or MeasuredPeak(peak_bytes=None, static_bytes=None, definition="none"),
        capacity=capacity)


def test_degree_predictions_are_exact():
    """dp = 2 × tp = 2 on one node of 4: per step TP 4000 µs (half exposed), DP 1000 µs (all
    exposed); step 10000 µs. dp = 4, tp = 1: no TP, DP × 2 (tp 2 → 1) × 1.5 (ring 1 → 1.5)
    = 3000 exposed: 10000 − 3000 + 3000 = 10000. dp = 1, tp = 4: TP × 2 (dp 2 → 1) × 1.5 =
    12000, half exposed; no DP: 10000 − 3000 + 6000 = 13000."""
    from pardiag.analyzer.predict.recommend.rules.degrees import degrees
    recs = {c.change: c for c in degrees(_ctx(dims={"dp": 2, "tp": 2}, dim_comm={
        "tp": (4000.0, 2000.0), "dp": (1000.0, 1000.0)}))}
    assert recs["dp=4, tp=1 (data parallel only; same global batch)"].predicted_step_us == 10000
    assert recs["dp=1, tp=4 (TP inside each node; same global batch)"].predicted_step_us == 13000
    # two nodes of two ranks: tp = 4 would span nodes and is not evaluated
    recs = degrees(_ctx(dims={"dp": 2, "tp": 2}, nodes={"a": [0, 1], "b": [2, 3]},
                        dim_comm={"tp": (4000.0, 2000.0), "dp": (1000.0, 1000.0)}))
    assert [c.params for c in recs] == [{"dp": 4, "tp": 1}]


def _tp_across_nodes():
    """Layout groups and bandwidth of TP over 2 nodes at busbw 1 GB/s, DP inside a node at 10."""
    import pandas as pd

    groups = pd.DataFrame([
        {"dim": "tp", "pg": "1", "desc": "mesh_tp", "ranks": "0,2", "size": 2, "nodes": 2,
         "spans_nodes": True},
        {"dim": "dp", "pg": "2", "desc": "mesh_dp", "ranks": "0,1", "size": 2, "nodes": 1,
         "spans_nodes": False}])
    bw = pd.DataFrame([{"pg": "1", "op": "all_reduce", "busbw_gbps": 1.0},
                       {"pg": "2", "op": "all_reduce", "busbw_gbps": 10.0}])
    return groups, bw


def test_tp_across_nodes_is_moved_inside():
    """TP groups span two nodes at busbw 1 GB/s, DP groups inside a node reach 10 GB/s; TP
    leaves 3000 µs exposed per step, DP 200: swapping saves 3000 · 0.9 and costs 200 · 9."""
    from pardiag.analyzer.predict.recommend.rules.placement import placement
    groups, bw = _tp_across_nodes()
    (rec,) = placement(_ctx(dims={"dp": 2, "tp": 2}, dim_comm={"tp": (3000.0, 3000.0),
                                                                "dp": (400.0, 200.0)},
                            nodes={"a": [0, 1], "b": [2, 3]}, groups=groups, bandwidth=bw))
    assert rec.kind == "placement" and rec.title == "Keep TP inside a node"
    assert rec.predicted_step_us == pytest.approx(10000 - 2700 + 1800)


def test_tp_across_nodes_is_predicted_by_replaying_the_critical_path():
    """The same swap with the run's critical path: both ranks compute [0, 4000), wait in a tp
    all-reduce to 7000 (its transfer 3000 µs), compute to 9800 and wait in a dp all-reduce to
    10000. Replayed with tp's transfers × 0.1 and dp's × 10: tp releases at 4300, dp's
    arrivals at 7100, its transfer 2000: 9100 µs, 0.91 of the step. The formula, from the
    context's exposed times (tp 2500, dp 200), would give 10000 − 2250 + 1800 = 9550."""
    import dataclasses

    import numpy as np
    import pandas as pd

    from pardiag.analyzer.analyses.critical_path import CriticalPathResult
    from pardiag.analyzer.analyses.exec_graph import Join, StepGraph
    from pardiag.analyzer.predict.recommend.rules.placement import placement
    groups, bw = _tp_across_nodes()
    both = frozenset({0, 1})
    k = np.array([[0.0, 4000.0], [7000.0, 9800.0]])
    step = StepGraph(1, {0: 0.0, 1: 0.0}, {0: 10000.0, 1: 10000.0},
                 (Join("t", "all_reduce", "tp", {0: 4000.0, 1: 4000.0},
                        {0: 7000.0, 1: 7000.0}, both),
                  Join("d", "all_reduce", "dp", {0: 9800.0, 1: 9800.0},
                        {0: 10000.0, 1: 10000.0}, both)),
                 {0: k, 1: k}, {0: np.empty((0, 2)), 1: np.empty((0, 2))})
    empty = pd.DataFrame()
    cp = CriticalPathResult(empty, empty, empty, empty, graphs=(step,))
    ctx = _ctx(dims={"dp": 2, "tp": 2}, dim_comm={"tp": (3000.0, 2500.0), "dp": (400.0, 200.0)},
               nodes={"a": [0, 1], "b": [2, 3]}, groups=groups, bandwidth=bw)
    (rec,) = placement(dataclasses.replace(ctx, critical_path=cp))
    assert rec.predicted_step_us == pytest.approx(9100.0)
    assert rec.evidence[-1] == ("predicted by replaying the critical path as a steady step "
                                "(each rank starting its next step where it ends this one) with "
                                "tp's transfers × 0.10 and dp's × 10.00 (the exposed-"
                                "communication formula gives 9.55 ms)")
    (alone,) = placement(ctx)   # no path: the formula
    assert alone.predicted_step_us == pytest.approx(9550.0)
    assert alone.evidence[-1].startswith("predicted by the exposed-communication formula")


def test_memory_bound_ddp_gets_sharding_that_fits():
    """DDP over dp = 4; per rank 4 GiB parameters, 4 GiB gradients, 8 GiB optimizer state;
    peak 75 GiB of 80 (94%). ZeRO-1 saves 8 · 3/4 = 6 GiB → 69; FSDP saves 16 · 3/4 = 12 → 63.
    With 60 GiB devices neither fits and neither is recommended."""
    import pandas as pd

    from pardiag.analyzer.predict.recommend.context import MeasuredPeak
    from pardiag.analyzer.predict.recommend.rules.memory import memory_sharding
    G = 2**30
    mem = _Obj(per_rank=pd.DataFrame([{
        "rank": 0, "params_bytes": 4 * G, "grads_bytes": 4 * G, "optimizer_state_bytes": 8 * G,
        "static_bytes": 16 * G, "peak_allocated_bytes": 75 * G}]))

    def rule(peak, cap):
        return memory_sharding(_ctx(settings={"dims": {"dp": 4}, "strategies": ["ddp"]},
                                    memory=mem, capacity=cap, peak=MeasuredPeak(
                                        peak_bytes=peak, static_bytes=16 * G, definition="")))
    recs = {c.kind: c for c in rule(75 * G, 80 * G)}
    assert recs["zero1"].predicted_peak_bytes == 69 * G and recs["zero1"].fits_memory
    assert recs["fsdp"].predicted_peak_bytes == 63 * G and recs["fsdp"].fits_memory
    assert [c.fits_memory for c in rule(75 * G, 60 * G)] == [False, False]
    # not memory-bound (peak 50% of the device): nothing proposed
    assert rule(40 * G, 80 * G) == []


def test_run_that_recorded_no_training_step_gets_no_recommendation(tmp_path):
    """--steps 2 under the default --wait 1 --warmup 1: the traces hold only the script's end
    (its final barrier); the verdict says so instead of naming a straggler."""
    for r in range(2):
        b = TraceBuilder(rank=r, world_size=2, backend="gloo")
        b.step(2, 0, 8000).cpu("c10d::barrier", 10, 7000 if r == 0 else 10)
        b.write(tmp_path / f"rank{r}.trace.json")
        write_sidecar(tmp_path / f"rank{r}.meta.json", "rank", r, {"optimizer_steps": 2})
    write_sidecar(tmp_path / "run.json", "run", None, {
        "world_size": 2, "schedule": {"wait": 1, "warmup": 1, "active": 3}})
    res = build_report(load_traces(tmp_path)).results["recommendations"]
    assert res.recommendations == () and res.rejected == ()
    assert res.verdict.startswith("The profiler recorded no training step: the script made 2 "
                                  "optimizer step(s) and recording starts after --wait + "
                                  "--warmup = 2")


def _planted_sleeper(tmp_path, sleep_us):
    """2 ranks (gloo), 3 steps of 10000 µs, all-reduces at 1000, 5000 and 8000 µs into each.
    Rank 1 sleeps ``sleep_us`` at the start of each step (no op, no collective), so it arrives
    last at the first all-reduce only (1 of 3: rank 0 computes 200 µs longer before the other
    two); everything else either rank does is compute or communication."""
    for r in range(2):
        b = TraceBuilder(rank=r, world_size=2, backend="gloo")
        spans = []
        for s in range(3):
            t = 10000 * s
            b.step(s + 1, t, 10000)
            a0 = 1000 if r == 0 else max(1000, sleep_us)       # arrival at the first all-reduce
            e0 = max(1000, sleep_us) + 200
            arrive = [a0, 5200 if r == 0 else 5000, 8200 if r == 0 else 8000]
            ends = [e0, 5400, 8400]
            if r == 0:
                b.cpu("aten::mm", t, 1000)
            b.cpu("aten::mm", t + e0, arrive[1] - e0)
            b.cpu("aten::mm", t + 5400, arrive[2] - 5400)
            b.cpu("aten::mm", t + 8400, 1600)
            spans += [(t + a, t + e) for a, e in zip(arrive, ends)]
        _write_all_reduces(b, tmp_path, r, spans, (0, 1))
    return build_report(load_traces(tmp_path)).results["recommendations"]


def test_a_rank_that_idles_longer_is_a_straggler_however_many_collectives(tmp_path):
    """Rank 1 idles 3000 µs per step more than rank 0 (30% of the step, in 3 of 3 steps) but
    is last at only 3 of 9 all-reduces: it is named, by the idle criterion."""
    res = _planted_sleeper(tmp_path, 3000)
    assert ("rank 1 is a straggler: it idles 3.0 ms per step more than the others (in 3 of 3 "
            "steps) — " in res.verdict)
    # its cause: the planted idle time lies outside any operator
    assert res.verdict.endswith("it spends 3.0 ms more than its peers outside any operator "
                                "(Python, sleeps, host contention).")
    (top,) = [c for c in res.recommendations if c.kind == "straggler"]
    assert top.params == {"without_rank": 1}
    # rank 0 waits 2000 µs per step for it, it waits 2 · 200 µs for rank 0: 1600 µs net, under
    # its 3000 µs of extra idle time
    assert top.predicted_step_us == pytest.approx(10000 - (2000 - 400))


def test_symmetric_or_small_waits_name_nobody(tmp_path):
    """A 300 µs sleep (3% of the step, under the 5% criterion): nobody is named, in the
    verdict or the recommendations."""
    res = _planted_sleeper(tmp_path, 1300)
    assert "straggler" not in res.verdict
    assert not [c for c in (*res.recommendations, *res.rejected) if c.kind == "straggler"]


def test_tp_only_run_gets_dp_with_each_groups_alpha_beta():
    """TP only (tp = 2 on 2 ranks): its all-reduces of 1000 and 101000 bytes take 1100 and
    2100 µs → β = 1000 / 100000 = 0.01 µs/byte, α = 1100 − 10 = 1090 µs; per step TP
    communicates 4000 µs, 3000 exposed. dp = 2, tp = 1: TP goes (−3000 exposed); DDP adds an
    all-reduce of the rank's 50000 parameter bytes × 2 (the TP shards rejoin) in one bucket at
    the TP groups' α–β, all exposed on CPU: 1090 + 0.01 · 100000 = 2090 µs.
    10000 − 3000 + 2090 = 9090."""
    import pandas as pd

    from pardiag.analyzer.predict.recommend.rules.degrees import _traffic, degrees
    groups = pd.DataFrame([{"dim": "tp", "pg": "0", "desc": "default_pg", "ranks": [0, 1],
                            "size": 2, "nodes": 1, "spans_nodes": False}])
    inst = pd.DataFrame([{"instance": i, "group": "0,1|default_pg", "op": "all_reduce",
                          "bytes": b, "transfer_us": t, "complete": True}
                         for i, (b, t) in enumerate([(1000, 1100.0), (101000, 2100.0)] * 2)])
    ctx = _ctx(dims={"tp": 2}, dim_comm={"tp": (4000.0, 3000.0)}, nodes={"h": [0, 1]},
               groups=groups, memory=_Obj(per_rank=pd.DataFrame({"params_bytes": [50000.0]})))
    ctx = __import__("dataclasses").replace(ctx, sync=_Obj(
        instances=inst, bandwidth=pd.DataFrame(), stragglers=pd.DataFrame()))
    t = _traffic(ctx)["tp"]
    assert (t.alpha_us, t.beta_us_per_byte) == pytest.approx((1090.0, 0.01))
    assert t.time_us(2, 1.0) == pytest.approx(3200.0)
    (rec,) = degrees(ctx)
    assert rec.params == {"dp": 2, "tp": 1}
    assert rec.predicted_step_us == pytest.approx(9090.0)
    assert any("DDP: an all-reduce of 0.0954 MiB of gradients in 1 bucket(s)" in e
               for e in rec.evidence)


def _planted_2d():
    """(layout groups, sync instances) of a planted dp = 2 × tp = 2 run on 4 ranks: each TP
    group's all-reduces of 1000 and 101000 bytes take 1100 and 2100 µs, each DP group's 350 and
    650 µs."""
    import pandas as pd
    groups = pd.DataFrame([
        {"dim": d, "pg": str(i), "desc": f"mesh_{d}", "ranks": r, "size": 2, "nodes": 1,
         "spans_nodes": False}
        for i, (d, r) in enumerate([("tp", [0, 1]), ("tp", [2, 3]), ("dp", [0, 2]),
                                    ("dp", [1, 3])])])
    rows = []
    for grp, dim, sizes in [("0,1", "tp", [(1000, 1100.0), (101000, 2100.0)]),
                            ("2,3", "tp", [(1000, 1100.0), (101000, 2100.0)]),
                            ("0,2", "dp", [(1000, 350.0), (101000, 650.0)]),
                            ("1,3", "dp", [(1000, 350.0), (101000, 650.0)])]:
        rows += [{"instance": len(rows) + i, "group": f"{grp}|mesh_{dim}", "op": "all_reduce",
                  "bytes": b, "transfer_us": t, "complete": True}
                 for i, (b, t) in enumerate(sizes)]
    return groups, rows


def test_degrees_scale_the_transfer_and_keep_the_waiting():
    """dp = 2 × tp = 2 on 4 ranks, 2 steps. Each TP group runs all-reduces of 1000 and 101000
    bytes in 1100 and 2100 µs (α 1090 µs, β 0.01 µs/byte): 1600 µs of transfer per rank and
    step, of 4000 µs of TP communication (2000 exposed) — 2400 µs is waiting for late peers.
    Each DP group: 1000 and 101000 bytes in 350 and 650 µs (α 347, β 0.003): 500 µs of
    transfer of 1000 µs (all exposed). dp = 1, tp = 4: TP's α–β time × 3 (3 ring steps instead
    of 1, bytes × 2 · bus factor 1.5): its transfer grows by 2 · 1600 = 3200 µs, half exposed
    (+1600); DP goes (−1000): 10000 + 1600 − 1000 = 10600 (scaling TP's waiting too would say
    13000). dp = 4, tp = 1: TP goes (−2000 exposed); DP's transfer × 3 (+1000, all exposed):
    9000."""
    import dataclasses

    import pandas as pd

    from pardiag.analyzer.predict.recommend.rules.degrees import _traffic, degrees
    groups, rows = _planted_2d()
    ctx = _ctx(dims={"dp": 2, "tp": 2}, groups=groups, dim_comm={
        "tp": (4000.0, 2000.0), "dp": (1000.0, 1000.0)})
    ctx = dataclasses.replace(ctx, sync=_Obj(instances=pd.DataFrame(rows),
                                             bandwidth=pd.DataFrame(),
                                             stragglers=pd.DataFrame()))
    t = _traffic(ctx)
    assert t["tp"].transfer_us == pytest.approx(1600.0)
    assert t["dp"].transfer_us == pytest.approx(500.0)
    assert (t["tp"].alpha_us, t["tp"].beta_us_per_byte) == pytest.approx((1090.0, 0.01))
    recs = {c.change: c for c in degrees(ctx)}
    assert recs["dp=1, tp=4 (TP inside each node; same global batch)"].predicted_step_us == \
        pytest.approx(10600.0)
    assert recs["dp=4, tp=1 (data parallel only; same global batch)"].predicted_step_us == \
        pytest.approx(9000.0)


def test_pipeline_candidates_the_layers_and_batch_rule_out(tmp_path):
    """GPipe over 3 ranks, m = 4 microbatches of 1 sample (global batch 4), stage modules of 2,
    2 and 1 layers (5). Interleaving 2 or 4 stages per rank needs 6 or 12 stages; 8 and 16
    microbatches would be under 1 sample; dp = 3 does not divide 4 samples. Each is listed
    among those not recommended with its reason (JSON, HTML); 2 microbatches of 2 samples are
    evaluated and say what changes for the optimizer."""
    from pardiag.analyzer.render.html import render_html
    layers = {0: [(100.0, 1000)] * 2, 1: [(100.0, 1000)] * 2, 2: [(100.0, 1000)]}
    traces = _pipeline_run(tmp_path, "gpipe", 3, 4, [200, 200, 100], [400, 400, 200],
                           {0: 100, 1: 100, 2: 100}, layers=layers, fixed_share=0.0, samples=1,
                           opt={0: 100, 1: 100, 2: 100})
    rep = build_report(traces)
    data = report_json(rep)
    ruled = {c["change"]: c["ruled_out"] for c in data["not_recommended"] if c["ruled_out"]}
    assert ruled == {
        "microbatches 8 (same global batch)":
            "8 microbatches would be under 1 sample each (global batch of 4 samples)",
        "microbatches 16 (same global batch)":
            "16 microbatches would be under 1 sample each (global batch of 4 samples)",
        "schedule Interleaved1F1B, 2 stages per rank":
            "3 stages × 2 chunks per rank = 6 stages, more than the 5 layers the stage modules "
            "can be split into",
        "schedule Interleaved1F1B, 4 stages per rank":
            "3 stages × 4 chunks per rank = 12 stages, more than the 5 layers the stage modules "
            "can be split into",
        "dp=3, pp=1: every rank runs the whole model on 1/3 of the global batch (DDP, default "
        "buckets) instead of pp=3": "dp=3 does not divide the global batch of 4 samples"}
    assert not any(c["ruled_out"] for c in data["recommendations"])
    (m2,) = [c for c in data["recommendations"] + data["not_recommended"]
             if c["change"] == "microbatches 2 of 2 samples (same global batch)"]
    assert m2["batch"]["microbatch"] == {"now": 1, "after": 2, "factor": 2.0}
    assert m2["optimizer_effect"].startswith("Same global batch of 4 samples and optimizer steps "
                                             "per sample: learning rate and schedule carry over; "
                                             "microbatch 1 → 2 samples")
    page = render_html(rep, include_plotlyjs="cdn")
    for reason in ruled.values():   # each with why, in the table of changes not recommended
        assert (f"<td class='l'>ruled out by the model&#x27;s shapes or batch: {reason}</td>"
                in page)


def test_where_the_skew_arises(tmp_path):
    """The planted sleeper: both ranks start each step together; rank 1 reaches the step's
    first all-reduce 2000 µs after rank 0 (all of its delay), rank 0 reaches the second and
    third 200 µs after rank 1 (400 µs per step, half at each)."""
    _planted_sleeper(tmp_path, 3000)
    skew = build_report(load_traces(tmp_path)).balance.skew.set_index("rank")
    assert skew.loc[1, "start_late_us"] == 0 and skew.loc[0, "start_late_us"] == 0
    assert skew.loc[1, "delay_us"] == pytest.approx(2000.0)
    assert skew.loc[1, "top_collective"] == "all_reduce #1 of the step on 0,1|default_pg"
    assert skew.loc[1, "top_share_pct"] == pytest.approx(100.0)
    assert skew.loc[0, "delay_us"] == pytest.approx(400.0)
    assert skew.loc[0, "top_collective"] == "all_reduce #2 of the step on 0,1|default_pg"
    assert skew.loc[0, "top_share_pct"] == pytest.approx(50.0)


def test_degrees_take_the_links_and_drop_tp_host_work():
    """The run of :func:`test_degrees_scale_the_transfer_and_keep_the_waiting`, on one 2-core
    host with ranks pinned to core rank % 2 (``--pin-cpu``): each DP pair {0, 2}, {1, 3} takes
    turns on one core, each TP pair crosses cores. DTensor's host work is 3000 µs per rank and
    step (more than TP's 2000 exposed).

    dp = 4, tp = 1: the DP ring 0→1→2→3 crosses cores, as TP's pairs do, so it takes TP's α–β
    (1090 µs, 0.01 µs/byte): per rank and step 0.5 × (3 · 1090 + 0.01 · 1000 · 2 · 1.5) +
    0.5 × (3 · 1090 + 0.01 · 101000 · 2 · 1.5) = 4800 µs against 500 at its own: its 500 µs of
    transfer × 9.6 = +4300, all exposed; TP goes with its host work (−3000, not −2000):
    10000 − 3000 + 4300 = 11300. dp = 1, tp = 4: the TP ring crosses cores as before (its own
    α–β) and TP's host work stays: 10600, as without the placement."""
    import dataclasses

    import pandas as pd

    from pardiag.analyzer.predict.recommend.rules.degrees import degrees, hop_kinds, mesh_groups
    groups, rows = _planted_2d()
    meta = {r: _Obj(host="vm", cpu_count=2, cpu_affinity=[r % 2], shapes=None) for r in range(4)}
    assert hop_kinds([0, 2], meta) == {"one core"}
    assert hop_kinds([0, 1, 2, 3], meta) == {"across cores"}
    assert hop_kinds([0, 1], {0: _Obj(host="a", cpu_count=2, cpu_affinity=[0]),
                              1: _Obj(host="b", cpu_count=2, cpu_affinity=[0])}) == {"across nodes"}
    assert hop_kinds([0, 1], {r: _Obj(host="a", cpu_count=2, cpu_affinity=[0, 1])
                              for r in (0, 1)}) == {"same node"}
    assert mesh_groups(4, 2, "dp") == [[0, 2], [1, 3]] and mesh_groups(4, 1, "dp") == [[0, 1, 2, 3]]
    ctx = _ctx(dims={"dp": 2, "tp": 2}, groups=groups, dim_comm={
        "tp": (4000.0, 2000.0), "dp": (1000.0, 1000.0)})
    per_step = pd.DataFrame({"rank": [0, 0], "step": [0, 1], "dtensor_us": [3000.0, 3000.0]})
    ctx = dataclasses.replace(
        ctx, sync=_Obj(instances=pd.DataFrame(rows), bandwidth=pd.DataFrame(),
                       stragglers=pd.DataFrame()),
        traces=_Obj(ranks={r: None for r in range(4)}, rank_meta=meta, run_info=None),
        causes=_Obj(per_step=per_step))
    recs = {c.change: c for c in degrees(ctx)}
    dp4 = recs["dp=4, tp=1 (data parallel only; same global batch)"]
    assert dp4.predicted_step_us == pytest.approx(11300.0)
    assert any("DP's new groups' rings would run across cores, as TP's do" in e
               for e in dp4.evidence)
    assert any("take 3.00 ms per rank and step" in e for e in dp4.evidence)
    assert recs["dp=1, tp=4 (TP inside each node; same global batch)"].predicted_step_us == \
        pytest.approx(10600.0)
    # FSDP2's hooks take 2500 µs per rank and step: at dp=1 they go (a run at dp=1 needs no
    # FSDP), more than DP's 1000 exposed: 10000 + 1600 − 2500 = 9100
    ctx = dataclasses.replace(ctx, settings={"strategies": ["fsdp2", "tp"]}, causes=_Obj(
        per_step=per_step.assign(fsdp_us=[2500.0, 2500.0])))
    tp4 = {c.change: c for c in degrees(ctx)}["dp=1, tp=4 (TP inside each node; same global batch)"]
    assert tp4.predicted_step_us == pytest.approx(9100.0)
    assert any("FSDP's host work goes" in e and "take 2.50 ms" in e for e in tp4.evidence)


def test_tp_only_fsdp_run_gets_dp_per_unit_at_the_contended_links():
    """TP only with FSDP2 over a 1-rank DP mesh (tp = 2 on 2 ranks), 2 steps. The TP all-reduces
    of 1000 and 101000 bytes take 1100 and 2100 µs at best (α 1090 µs, β 0.01 µs/byte) and
    3300 and 6300 the second time: per step 6400 µs of transfer against 3200 at the α–β, × 2.0
    (the contention the links show). dp = 2, tp = 1 with 5 FSDP units, 4 of which reshard after
    the forward: 9 all-gathers and 5 reduce-scatters of 2 · 50000 / 5 = 20000 bytes, each
    1090 + 0.01 · 20000 · 0.5 = 1190 µs at the TP α–β: 16660 × 2.0 = 33320 µs, all exposed;
    TP goes (−3000): 10000 − 3000 + 33320 = 40320."""
    import dataclasses

    import pandas as pd

    from pardiag.analyzer.predict.recommend.rules.degrees import degrees
    groups = pd.DataFrame([{"dim": "tp", "pg": "0", "desc": "default_pg", "ranks": [0, 1],
                            "size": 2, "nodes": 1, "spans_nodes": False}])
    inst = pd.DataFrame([{"instance": i, "group": "0,1|default_pg", "op": "all_reduce",
                          "bytes": b, "transfer_us": t, "complete": True}
                         for i, (b, t) in enumerate([(1000, 1100.0), (101000, 2100.0),
                                                     (1000, 3300.0), (101000, 6300.0)])])
    ctx = _ctx(dims={"tp": 2}, dim_comm={"tp": (8000.0, 3000.0)}, nodes={"h": [0, 1]},
               groups=groups, memory=_Obj(per_rank=pd.DataFrame({"params_bytes": [50000.0]})),
               settings={"strategies": ["fsdp2", "tp"], "fsdp_units": 5,
                         "fsdp_resharding_units": 4})
    ctx = dataclasses.replace(ctx, sync=_Obj(instances=inst, bandwidth=pd.DataFrame(),
                                             stragglers=pd.DataFrame()))
    (rec,) = degrees(ctx)
    assert rec.predicted_step_us == pytest.approx(40320.0)
    assert any("FSDP: 9 all-gather(s) and 5 reduce-scatter(s) per step of 0.0954 MiB of "
               "parameters in 5 unit(s), at the TP groups' α–β × 2.00" in e for e in rec.evidence)


def test_a_pipeline_stage_that_idles_is_named_though_it_waits_more_than_it_causes():
    """2 stages, 3 steps of 100 ms. Rank 1 idles 40 ms per step more than rank 0 (no op, no
    transfer: 45 against 5 ms), yet suffers 180 ms of waiting and causes 60 (a first stage slowed
    by a loaded host makes the last one wait: the bubble). In a pipeline the waiting is the
    schedule's, so the idle criterion alone names rank 1 (40 % of the step ≥ 20 %); outside a
    pipeline the same numbers name nobody (it suffers more waiting than it causes)."""
    import dataclasses

    import pandas as pd

    from pardiag.analyzer.analyses.breakdown import TimeBreakdown
    from pardiag.analyzer.predict.recommend.findings import identify_straggler
    steps = pd.DataFrame([{"rank": r, "step": s, "span_us": 100000.0,
                           "idle_us": 45000.0 if r == 1 else 5000.0} for r in (0, 1)
                          for s in (1, 2, 3)])
    strag = pd.DataFrame([{"rank": 0, "wait_suffered_us": 60000.0, "wait_caused_us": 180000.0,
                           "last_arrivals": 15, "steps_as_top": 2, "instances": 24},
                          {"rank": 1, "wait_suffered_us": 180000.0, "wait_caused_us": 60000.0,
                           "last_arrivals": 9, "steps_as_top": 1, "instances": 24}])
    ctx = _ctx(steps=3)
    ctx = dataclasses.replace(
        ctx, traces=_Obj(ranks={0: None, 1: None}, rank_meta={}, run_info=None),
        sync=_Obj(stragglers=strag, instances=pd.DataFrame(), bandwidth=pd.DataFrame()),
        breakdown=TimeBreakdown(totals=pd.DataFrame(), steps=steps, collectives=pd.DataFrame(
            columns=["rank", "collective", "count", "time_us", "exposed_us"])))
    assert identify_straggler(ctx) is None
    f = identify_straggler(dataclasses.replace(ctx, pipeline=_Obj(chunks=[0])))
    assert (f.rank, f.criterion, f.excess_idle_us, f.steps_over) == (1, "idles longer", 40000.0, 3)


def test_ddp_bucket_interval_on_a_gpu_replays_the_resampled_fits(tmp_path):
    """On a GPU each resample's α–β replays the gradient-ready curves (the first
    GPU_RESAMPLES); the interval holds the point prediction and, with every call of a size
    alike, collapses onto it."""
    import dataclasses

    from pardiag.analyzer.predict.recommend import build_context
    from pardiag.analyzer.predict.recommend.rules.ddp_buckets import ddp_buckets

    mib = 2**20
    traces = _ddp_run(tmp_path, [mib, mib, 2 * mib, 4 * mib], 2 * mib, [2 * mib, 2 * mib, 4 * mib],
                      alpha=100.0, beta=1000.0 / mib, steps=6)
    rep = build_report(traces)
    ctx = dataclasses.replace(build_context(rep.traces, rep.results), on_gpu=True)
    got = {c.params["ddp_bucket_cap_bytes"] // mib: c for c in ddp_buckets(ctx)}
    assert set(got) == {0, 4, 8}   # 0.5 MiB rounds down to 0 here
    for c in got.values():
        assert c.predicted_low_us == pytest.approx(c.predicted_step_us)
        assert c.predicted_high_us == pytest.approx(c.predicted_step_us)
        assert any("bootstrap interval (200 resamples" in e for e in c.evidence)


def test_zero_rules_memory_and_time_are_the_papers():
    """DeepSpeed ZeRO-1 over dp = 64, Ψ = 7.5 B fp16 parameters, K = 12 (the ZeRO paper, Figure 1:
    stage 1 31.4 GB, stage 2 16.6 GB, stage 3 1.9 GB per device). Peak 75 GiB of an 80 GiB
    device (94%): stage 2 is a memory change (``zero_shard``) saving 31.4 − 16.6 GB.

    Time, 2 micro-batches per step, step 10000 µs, collectives all exposed: stage 1 reduces
    once per step (r = 1000 µs) and gathers once (g = 500): stage 2 reduces each micro-batch,
    +1000 µs. Stage 2 (reductions 2000 µs per step, gathers 500): stage 3 gathers before each
    module's forward and backward every micro-batch and not after the step: +3·500 µs; stage 1
    −1000 µs. Stage 3 (reduce-scatters 2000, gathers 2000: g = 500) with 800 µs per step of
    host time outside operators: stage 2 saves 3·500 µs, and its interval reaches 800 µs lower,
    the point halfway."""
    import dataclasses

    import pandas as pd

    from pardiag.analyzer.predict.recommend.context import MeasuredPeak
    from pardiag.analyzer.predict.recommend.rules.zero import static_at, zero_changes
    psi, n, G = 7.5e9, 64, 2**30
    assert [round(static_at(s, psi, 2, 12, n) / 1e9, 1) for s in (0, 1, 2, 3)] == \
        [120.0, 31.4, 16.6, 1.9]

    def ctx(stage, peak, cap, red=0.0, gat=0.0, outside=0.0, **ds_extra):
        p_ = psi * 2 / (n if stage == 3 else 1)
        mem = _Obj(per_rank=pd.DataFrame([{
            "rank": 0, "params_bytes": p_, "grads_bytes": 0.0,
            "optimizer_state_bytes": 12 * psi / n, "static_bytes": 1.0}]))
        c = _ctx(settings={"deepspeed": {"stage": stage, "dp_size": n, "param_dtype": "float16",
                                         "reduce_bucket_size": int(5e8), "overlap_comm": True,
                                         "gradient_accumulation_steps": 2, **ds_extra}},
                 memory=mem, capacity=cap,
                 peak=MeasuredPeak(peak_bytes=peak, static_bytes=None, definition=""))
        coll = c.breakdown.collectives   # two profiled steps
        coll.loc[0] = [0, "all_gather", 2, 2 * gat, 2 * gat]
        coll.loc[1] = [0, "reduce_scatter" if stage == 3 else "all_reduce", 2, 2 * red, 2 * red]
        if outside:
            c = dataclasses.replace(c, causes=_Obj(per_rank=pd.DataFrame([
                {"rank": 0, "other_us": outside}])))
        return {r.params.get("zero_stage", r.kind): r for r in zero_changes(c)}

    recs = ctx(1, 75 * G, 80 * G, red=1000.0, gat=500.0)
    assert set(recs) == {2} and recs[2].kind == "zero_shard"
    assert recs[2].predicted_peak_bytes == pytest.approx(75 * G - 2 * psi * 63 / 64)
    assert recs[2].predicted_step_us == pytest.approx(11000)
    recs = ctx(2, 20 * G, 80 * G, red=2000.0, gat=500.0)
    assert {c.kind for c in recs.values()} == {"zero_stage"}
    assert recs[3].predicted_step_us == pytest.approx(11500)
    assert recs[1].predicted_step_us == pytest.approx(9000)
    assert recs[3].predicted_peak_bytes == pytest.approx(20 * G - 2 * psi * 63 / 64)
    assert not recs[3].interval_known
    recs = ctx(3, 20 * G, 80 * G, red=2000.0, gat=2000.0, outside=800.0)
    assert (recs[2].predicted_low_us, recs[2].predicted_high_us) == pytest.approx((7700, 8500))
    assert recs[2].predicted_step_us == pytest.approx(8100)
    # the all-gather bucket: DeepSpeed gathers the partitions whole whatever its size, so a
    # bucket of the next power of ten above Ψ changes neither the step nor the peak; none at
    # stage 3 (which does not use it)
    gather = ctx(2, 20 * G, 80 * G, red=2000.0, gat=500.0,
                 allgather_bucket_size=int(5e8))["zero_allgather_bucket"]
    assert gather.params == {"allgather_bucket_size": int(1e10)}
    assert (gather.predicted_step_us, gather.predicted_peak_bytes) == (
        gather.measured_step_us, 20 * G)
    assert "zero_allgather_bucket" not in ctx(3, 20 * G, 80 * G, red=2000.0, gat=2000.0,
                                              allgather_bucket_size=int(5e8))


def test_median_of_the_other_ranks_equals_pandas():
    """The straggler finding's per-step median of the other ranks, read from each row sorted
    once: a planted row, then random and tied tables of 2 to 65 ranks against pandas' median of
    the table less each column, bit for bit."""
    import numpy as np
    import pandas as pd

    from pardiag.analyzer.analyses.peers import median_of_others

    # ranks idle 10, 40, 20, 30 µs: the others' medians are 30, 20, 30, 20
    assert median_of_others(np.array([[10.0, 40.0, 20.0, 30.0]])).tolist() == [
        [30.0, 20.0, 30.0, 20.0]]
    rng = np.random.default_rng(7)
    for n in (2, 3, 4, 5, 8, 33, 65):
        for tied in (False, True):
            x = (rng.integers(0, 4, size=(6, n)).astype(float) if tied
                 else rng.random((6, n)) * 1e4)
            df = pd.DataFrame(x)
            want = np.stack([df.drop(columns=c).median(axis=1).to_numpy() for c in df.columns],
                            axis=1)
            assert np.array_equal(median_of_others(x), want), (n, tied)
            by_numpy = np.stack([np.median(np.delete(x, j, axis=1), axis=1) for j in range(n)],
                                axis=1)
            assert np.array_equal(median_of_others(x), by_numpy), (n, tied)


def test_stage_imbalance_in_the_verdict_follows_the_ranking():
    """Stage 1 works 4.0× stage 0 per microbatch (8 vs 2 ms). Moving the boundaries recommended
    at tier 1: the verdict says so; at tier 2 behind a microbatch change: it names that tier-1
    change first; not recommended: it gives the reason."""
    from types import SimpleNamespace as NS

    from pardiag.analyzer.predict.recommend.verdict import stage_text
    ctx = NS(model=NS(fwd_us=[1000.0, 3000.0], bwd_us=[1000.0, 5000.0]))

    def change(kind, tier, gain, text, reason=""):
        return NS(kind=kind, tier=tier, gain_pct=gain, change=text, reason=reason)

    move = change("rebalance_stages", 1, 17.4, "stages [0–5 | 6–11]")
    assert stage_text(ctx, [move]) == (
        "stage 1's forward+backward per microbatch is 4.0× stage 0's (8.00 vs 2.00 ms): moving "
        "the stage boundaries saves 17.4% (tier 1)")
    move2 = change("rebalance_stages", 2, 12.0, "stages [0–5 | 6–11]")
    mb = change("microbatches", 1, 30.5, "microbatches 16")
    other = change("schedule", 1, 28.0, "schedule 1F1B")
    assert stage_text(ctx, [move2, other, mb]).endswith(
        ": moving the stage boundaries saves 12.0% (tier 2), after the tier-1 change "
        "'microbatches 16' (30.5% and 1 more)")
    no = change("rebalance_stages", None, 3.0, "stages [0–5 | 6–11]",
                "the interval of its timings reaches the measured step")
    assert stage_text(ctx, [no]).endswith(
        ", but moving the stage boundaries is not recommended: the interval of its timings "
        "reaches the measured step")


def test_a_failed_run_leaves_out_the_step_it_failed_in(tmp_path):
    """Rank 1 fails in step 3 and rank 0 then waits 700 ms in an all-reduce that never
    completes: both made 3 optimizer steps (0–2), so ProfilerStep#3 is unfinished. Steps 1 and 2
    take 10 ms each: 6 ms compute, 4 ms idle. The verdict's step is 10 ms over 2 steps, step 3
    is named as left out, the failed all-reduce counts neither as exposed communication nor
    as the ranks' time, and the missing layout is unknown, not 'no DDP'."""
    mm = {"Input Dims": [[64, 64], [64, 64]], "Input type": ["float", "float"]}
    for r in range(2):
        b = TraceBuilder(rank=r, world_size=2, backend="gloo")
        for s in (1, 2):
            t = 10000.0 * (s - 1)
            b.step(s, t, 10000).cpu("aten::mm", t, 6000, args=mm)
        b.step(3, 20000, 700000 if r == 0 else 500)
        b.cpu("aten::mm", 20000, 300, args=mm)
        if r == 0:
            b.cpu("c10d::allreduce_", 20300, 699700)
        b.write(tmp_path / f"rank{r}.trace.json")
        write_sidecar(tmp_path / f"rank{r}.meta.json", "rank", r, {
            "optimizer_steps": 3, "ended_unix": 101.0 - r, "status": "error"})
    write_sidecar(tmp_path / "run.json", "run", None, {
        "world_size": 2, "schedule": {"wait": 1, "warmup": 1, "active": 3}, "exit_code": 1,
        "failed_ranks": {"1": "ValueError: planted", "0": (
            "RuntimeError: [/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
            "Connection closed by peer [127.0.0.1]:38040. This is typically caused by a remote "
            "worker crashing. GLHF!")}})
    rep = build_report(load_traces(tmp_path))
    bd = rep.results["time_breakdown"]
    assert sorted(map(tuple, bd.unfinished[["rank", "step"]].to_numpy().tolist())) == [
        (0, 3), (1, 3)]
    assert sorted(bd.steps["step"].unique()) == [1, 2]
    # FLOPs and MFU per step leave it out too
    eff = rep.results["efficiency"].per_step
    assert sorted(map(tuple, eff[["rank", "step"]].to_numpy().tolist())) == [
        (0, 1), (0, 2), (1, 1), (1, 2)]
    tot = bd.totals.set_index("rank")
    assert tot.loc[0, "span_us"] == 20000 and tot.loc[0, "exposed_comm_us"] == 0
    assert tot.loc[0, "compute_only_us"] == 12000 and tot.loc[0, "idle_pct"] == 40.0
    res = rep.results["recommendations"]
    # the consequence in its first sentence, without torch's source location
    assert res.verdict.startswith("The run failed: rank 1 failed first: ValueError: planted; "
                                  "rank 0 failed: RuntimeError: Connection closed by peer "
                                  "[127.0.0.1]:38040. What was recorded: ")
    assert ("What was recorded: Step 10.0 ms (while profiled; IQR 10.0–10.0, range 10.0–10.0 "
            "ms over 2 steps) (step 3 left out: ranks 0, 1 ended inside it without finishing "
            "it): exposed communication 0.0% and idle 40.0% of the ranks' time.") in res.verdict
    assert res.why_none == (
        "nothing to evaluate: the run ended before its profiling window closed (ranks 0, 1 made "
        "3 optimizer step(s); the window closes after 5), so the layout and the DDP, FSDP, ZeRO "
        "and tensor-parallel settings were not recorded: whether any of them could change is "
        "unknown")


def test_why_none_names_changes_whose_interval_reaches_the_step():
    """A change predicted to save 12.1% (margin 4.3%) whose timings' interval reaches the
    measured step is not recommended: the sentence says so instead of 'none saves 4.3%'."""
    from types import SimpleNamespace as NS

    from pardiag.analyzer.predict.recommend import _none_clears
    wide = NS(ruled_out=False, gain_pct=12.1, interval_spans_no_gain=True,
              change="stage boundaries [0–2 | 3–6]")
    small = NS(ruled_out=False, gain_pct=2.0, interval_spans_no_gain=False, change="x")
    assert _none_clears([small], 4.3) == (
        "no modelled change is predicted to save ≥ 4.3% of the step")
    assert _none_clears([small, wide], 4.3) == (
        "no modelled change is predicted to save ≥ 4.3% of the step with an interval that "
        "excludes no gain: 1 predicted more (up to 12.1%, stage boundaries [0–2 | 3–6]), but "
        "the interval of the timings each rests on reaches the measured step")


def test_a_ddp_job_with_a_rank_missing_is_never_told_it_has_no_ddp(tmp_path):
    """Rank 1's trace is missing from a 2-rank DDP run whose metadata shows DDP: nothing can
    be evaluated, and the sentence says why rather than 'no DDP'."""
    b = TraceBuilder(rank=0, world_size=2, backend="gloo")
    b.step(2, 0, 10000).cpu("aten::mm", 10, 5000)
    b.write(tmp_path / "rank0.trace.json")
    lay = {"dims": {"dp": 2}, "strategies": ["ddp"], "ddp_bucket_cap_mb": 25}
    for r in range(2):
        write_sidecar(tmp_path / f"rank{r}.meta.json", "rank", r, {
            "optimizer_steps": 8, "layout": lay})
    write_sidecar(tmp_path / "run.json", "run", None, {
        "world_size": 2, "schedule": {"wait": 1, "warmup": 1, "active": 3}, "layout": lay})
    res = build_report(load_traces(tmp_path)).results["recommendations"]
    assert res.why_none == (
        "nothing to evaluate: ddp is in the layout, but no change to the settings could be "
        "evaluated from these traces: rank(s) 1 of 2 have no trace, so their collectives "
        "cannot be matched across ranks")


def test_a_ddp_job_whose_gradients_fit_one_bucket_says_why_no_size_is_evaluated(tmp_path):
    """Two DDP ranks issue one all-reduce per step (every gradient in one bucket, as the HF
    Trainer's small model does): when gradients become ready cannot be read from one launch,
    and the sentence says so rather than nothing."""
    lay = {"dims": {"dp": 2}, "strategies": ["ddp"], "ddp_bucket_cap_mb": 25}
    for r in range(2):
        b = TraceBuilder(rank=r, world_size=2, backend="gloo")
        b.step(1, 0, 5000).step(2, 5000, 5000)
        b.cpu("aten::mm", 10, 3000).cpu("aten::mm", 5010, 3000)
        _write_all_reduces(b, tmp_path, r, [(3500, 4000), (8500, 9000)], (0, 1))
        write_sidecar(tmp_path / f"rank{r}.meta.json", "rank", r, {
            "optimizer_steps": 8, "layout": lay})
    write_sidecar(tmp_path / "run.json", "run", None, {
        "world_size": 2, "schedule": {"wait": 1, "warmup": 1, "active": 2}, "layout": lay})
    res = build_report(load_traces(tmp_path)).results["recommendations"]
    assert not [c for c in (*res.recommendations, *res.rejected) if c.kind == "ddp_bucket"]
    assert ("DDP issued fewer than two all-reduces in each profiled step (its gradients fit "
            "one bucket), so when its gradients become ready, which a bucket size changes, "
            "cannot be read") in (res.why_none or res.not_evaluated)


def test_a_pipeline_replayed_in_its_own_order_says_what_its_changes_lack():
    """A plain trace of ScheduleZBVZeroBubble (pytorch#138444's shape): the pipeline is replayed
    in the order it ran (V placement, split backward), but the trace holds no per-layer times
    and no order for other microbatch counts, and the report says so instead of a blank."""
    from .paths import REPROS

    case = REPROS / "h43_zbv_zero_bubble_v_schedule"
    if not case.is_dir():
        pytest.skip("the shared repros are not beside this checkout")
    rep = build_report(load_traces(case))
    res = rep.results["recommendations"]
    assert res.recommendations == () and res.rejected == ()
    assert res.why_none == (
        "nothing to evaluate: the pipeline is replayed, but no per-layer times were recorded to "
        "move stage boundaries; V placement, 4 stages on 2 ranks, split backward is replayed in "
        "the order it ran, and its order with other microbatch counts is not known (pardiag "
        "profile records it from torch's schedule class)")


def test_a_deep_captures_pipeline_says_why_it_has_no_changes():
    """A pipeline replayed without per-layer times or recorded orders: a profiled run's report
    says what pardiag profile records; a monitored run's deep capture's says that a capture
    records neither, and what does."""
    import types

    from pardiag.analyzer.predict.recommend import _pipeline_unchangeable
    model = types.SimpleNamespace(layers=[], observed=True, recorded_orders={},
                                  schedule="Schedule1F1B")
    assert _pipeline_unchangeable(model) == (
        "the pipeline is replayed, but no per-layer times were recorded to move stage "
        "boundaries; Schedule1F1B is replayed in the order it ran, and its order with other "
        "microbatch counts is not known (pardiag profile records it from torch's schedule "
        "class)")
    assert _pipeline_unchangeable(model, capture=True) == (
        "the pipeline is replayed, but no per-layer times were recorded to move stage "
        "boundaries; Schedule1F1B is replayed in the order it ran, and its order with other "
        "microbatch counts is not known; a monitored run's deep capture records neither: a "
        "profiled run (pardiag profile without --monitor) times its stages' layers and records "
        "the schedule's orders after its script")


def test_what_a_pipeline_could_not_evaluate_is_said_beside_what_it_did():
    """The shipped GPipe run holds the schedule's orders (microbatch what-ifs evaluated) and no
    per-layer times: the stage boundaries' what-if is not evaluated, and the JSON, the terminal
    and the page say so; a run with per-layer times says nothing of it."""
    import io

    from rich.console import Console

    from pardiag.analyzer.render.html import render_html
    from pardiag.analyzer.render.terminal import render_terminal

    rep = build_report(load_traces(REPO / "sample_traces" / "pp_gpipe_cpu_2rank"))
    res = rep.results["recommendations"]
    assert len(res.recommendations) + len(res.rejected) > 0
    assert res.not_evaluated == "no per-layer times were recorded to move stage boundaries"
    assert report_json(rep)["recommendations_not_evaluated"] == res.not_evaluated
    out = io.StringIO()
    render_terminal(rep, Console(file=out, width=200))
    assert "Not evaluated: no per-layer times were recorded to move stage boundaries." in \
        out.getvalue()
    assert "Not evaluated: no per-layer times were recorded" in render_html(
        rep, include_plotlyjs=False)
    other = build_report(load_traces(REPO / "sample_traces" / "pp_unbalanced_cpu_2rank"))
    assert other.results["recommendations"].not_evaluated == ""
    assert report_json(other)["recommendations_not_evaluated"] is None
    # two stages per rank: data parallel in its place and another schedule are not modelled,
    # and the report says so rather than leave them out in silence
    inter = build_report(load_traces(REPO / "sample_traces" / "pp_interleaved_cpu_2rank"))
    assert inter.results["recommendations"].not_evaluated == (
        "no per-layer times were recorded to move stage boundaries; data parallel in place of "
        "the pipeline: modelled for one stage per rank only (here 4 stages on 2 ranks); another "
        "schedule in place of interleaved (1F1B, or other stages per rank): not modelled")


def test_a_one_step_pipeline_trace_is_its_profiler_steps_span():
    """One step's chunks span [0, 13800) µs; the step (its slowest rank's ProfilerStep) took
    58900, the rest outside every chunk (a sleep, the optimizer). With no next step there is no
    start-to-start period: the step is the profiler step's span, not the chunks' window (a
    monitored run's one-step deep capture read 13.8 ms for a 58.9 ms step). Two steps: their
    start-to-start time."""
    import pandas as pd

    from pardiag.analyzer.predict.replay import _step_times

    one = pd.DataFrame({"step": [84, 84], "start_us": [0.0, 5000.0],
                        "end_us": [6000.0, 13800.0]})
    assert _step_times(one, one, [84], {84: 58900.0}) == (13800.0, 58900.0, [])
    assert _step_times(one, one, [84]) == (13800.0, 13800.0, [])   # no spans: the window
    two = pd.concat([one, one.assign(step=85, start_us=one["start_us"] + 60000.0,
                                     end_us=one["end_us"] + 60000.0)])
    assert _step_times(two, two, [84, 85], {84: 58900.0, 85: 59000.0}) == (
        13800.0, 60000.0, [60000.0])
