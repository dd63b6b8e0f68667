"""Training frameworks, unmodified, under `pardiag profile` on CPU/gloo with 2 ranks:
the Hugging Face Transformers ``Trainer``, Lightning ``Trainer(strategy="ddp")`` and an
Accelerate loop (``examples/frameworks/``), each with gradient accumulation (2 micro-batches
of 4 sequences per optimizer step) and its own optimizer wrapper. Each run must count the
optimizer steps (not the micro-batches), record the DDP gradient all-reduces with their group
and bytes, detect DDP over both ranks and give a report that names the DP dimension.

A framework that cannot be imported is skipped, with the reason; under CI (``CI`` set) that
is a failure: the test extra installs all three."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from .paths import REPO

EXAMPLES = REPO / "examples" / "frameworks"
STEPS, BATCH, ACCUM, ACTIVE = 6, 4, 2, 3   # pardiag's default schedule: wait 1, warmup 1, active 3
#: the example script and the module it needs, per framework
FRAMEWORKS = {"hf_trainer": "transformers", "lightning": "lightning", "accelerate": "accelerate"}


def _pardiag(*args, cwd, timeout=600):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-m", "pardiag", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=env)


@pytest.fixture(scope="module", params=sorted(FRAMEWORKS))
def framework_run(request, tmp_path_factory):
    """``(framework, run folder, profile result, report JSON, report stdout)`` of one framework's
    example profiled with 2 ranks, then reported."""
    name = request.param
    for module in {FRAMEWORKS[name], "transformers"}:   # every example builds a GPT-2
        if importlib.util.find_spec(module) is None:
            if os.environ.get("CI"):
                pytest.fail(f"{module} is not installed in CI (pip install -e '.[test]')")
            pytest.skip(f"{module} is not installed (pip install -e '.[test]')")
    tmp = tmp_path_factory.mktemp(name)
    out = tmp / "run"
    res = _pardiag("profile", EXAMPLES / f"train_{name}.py", "--nproc-per-node", 2, "--out", out,
                   "--", "--steps", STEPS, "--batch", BATCH, "--grad-accum", ACCUM, cwd=tmp)
    assert res.returncode == 0, res.stderr[-4000:]
    rep = _pardiag("report", out, "-o", tmp / "report.html", "--json", tmp / "report.json",
                   cwd=tmp)
    assert rep.returncode == 0, rep.stderr[-4000:]
    return name, out, res, json.loads((tmp / "report.json").read_text()), rep.stdout


@pytest.mark.e2e
def test_framework_profiled_unmodified(framework_run):
    name, out, res, report, terminal = framework_run
    # the framework wrote nothing into the working folder but what it was asked to
    assert not (out.parent / "lightning_logs").exists()
    params_bytes = None
    for r in (0, 1):
        meta = json.loads((out / "pardiag" / f"rank{r}.meta.json").read_text())
        assert meta["status"] == "ok" and meta["backend"] == "gloo" and meta["world_size"] == 2
        # steps: the optimizer's (its wrapper's inner step counts once), not the micro-batches
        assert meta["optimizer_steps"] == STEPS
        assert meta["trace_file"] == f"rank{r}.trace.json.gz"
        # the model's per-rank input and the accumulation, from keyword or dict inputs
        assert meta["shapes"]["batch_samples"] == BATCH
        assert meta["shapes"]["batch_calls"] == ACCUM
        # token ids [batch, sequence] (32 tokens): the report's tokens per step
        assert meta["shapes"]["batch_shape"] == [BATCH, 32] and meta["shapes"]["batch_integer"]
        # GPT-2's attention heads (4), read from the modules
        assert {a["heads"] for a in meta["shapes"]["attention"]} == {4}
        lay = meta["layout"]
        assert lay["dims"] == {"dp": 2} and lay["strategies"] == ["ddp"]
        static = meta["memory"]["static"]
        assert static["params_bytes"] > 0 and static["grads_bytes"] == static["params_bytes"]
        assert params_bytes in (None, static["params_bytes"])
        params_bytes = static["params_bytes"]
        assert sum(lay["ddp_param_bytes"]) == params_bytes

        comms = json.loads((out / "pardiag" / f"rank{r}.comms.json").read_text())
        groups = {g["name"]: g for g in comms["process_groups"]}
        grads = [x for x in comms["records"] if x["op"] == "all_reduce"
                 and x["bytes"] == params_bytes]
        # one gradient all-reduce per optimizer step of the window (a single DDP bucket: the
        # model is under 25 MiB): none on the accumulation micro-batches (no_sync honoured)
        assert len(grads) == ACTIVE, [(x["op"], x["bytes"]) for x in comms["records"]]
        for x in grads:
            g = groups[x["pg_name"]]
            assert g["dim"] == "dp" and g["ranks"] == [0, 1] and g["backend"] == "gloo"
            assert x["dtype"] == "Float" and x["start_us"] <= x["end_us"]
        for x in comms["records"]:   # every record has its group and a size
            assert x["pg_name"] in groups and x["bytes"] > 0
    # the report: DDP over 2 ranks, the DP group, the collectives, the steps
    assert report["layout"]["dims"] == {"dp": 2} and report["layout"]["strategies"] == ["ddp"]
    assert [(g["dim"], g["ranks"]) for g in report["layout"]["groups"]] == [("dp", [0, 1])]
    assert "Layout: DP=2 (ddp)" in terminal
    counts = {c["collective"]: c["count"] for c in report["collectives"]}
    assert counts["all_reduce"] == 2 * ACTIVE   # both ranks' gradient all-reduces
    # the step time is over the profiled steps; one slower than 1.5x the median (a loaded
    # machine: two xdist workers on 2 cores) is left out as an outlier
    assert ACTIVE - 1 <= report["step"]["steps"] <= ACTIVE
    # tokens/s from the recorded input: BATCH × 32 tokens × ACCUM calls per step
    assert any(n.startswith("tokens per step from the model's recorded input") and
               f"rank 0: {BATCH * 32 * ACCUM} ({BATCH} × 32 token ids × {ACCUM} call(s))" in n
               for n in report["efficiency"]["notes"])
    assert all(r["tokens_per_s"] > 0 for r in report["efficiency"]["per_rank"])
    # per module: GPT-2's attention projections (Conv1D: an addmm forward, two mm and the bias
    # gradient's sum backward) have their backward linked, under Lightning's closure too; the
    # optimizer's row holds no backward
    rows = {m["module"]: m for m in report["efficiency"]["per_module"]}
    c_attn = [m for name, m in rows.items() if name and name.endswith(".h.0.attn.c_attn")]
    assert len(c_attn) == 1, sorted(n for n in rows if n)[:20]
    fwd, bwd = c_attn[0]["forward_flops"], c_attn[0]["backward_flops"]
    assert fwd > 0 and 2 * fwd <= bwd <= 2.05 * fwd
    assert all(m["backward_flops"] == 0 for m in rows.values()
               if m["module"] == "(optimizer)")


def test_a_second_torch_profiler_is_refused_with_a_clear_error():
    """A script's own torch profiler (Lightning's ``Trainer(profiler="pytorch")``) beside
    pardiag's crashed both ranks with SIGSEGV; under pardiag it raises a clear error instead,
    pardiag's own profiler still records, and uninstalling restores torch's profilers."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from pardiag.collectors.rank_entry import OWN_PROFILER_ERROR, _refuse_other_profilers

    ours = profile(activities=[ProfilerActivity.CPU])
    patched = _refuse_other_profilers(ours)
    try:
        ours.start()
        with pytest.raises(RuntimeError) as err:
            with profile(activities=[ProfilerActivity.CPU]):
                pass
        assert str(err.value) == OWN_PROFILER_ERROR
        with pytest.raises(RuntimeError, match="torch profiler of its own"):
            with torch.autograd.profiler.profile():
                pass
        torch.ones(4, 4).matmul(torch.ones(4, 4))
        ours.stop()
        assert any(e.name == "aten::matmul" for e in ours.events())
    finally:
        for cls, name, orig in patched:
            setattr(cls, name, orig)
    with profile(activities=[ProfilerActivity.CPU]) as other:   # restored: works again
        torch.ones(2).add(1)
    assert any(e.name == "aten::add" for e in other.events())
