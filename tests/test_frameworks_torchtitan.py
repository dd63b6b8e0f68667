"""torchtitan, unmodified, on CPU/gloo (``examples/frameworks/train_torchtitan.py``: its own
trainer and Llama 3 debug model, 6 steps): FSDP2 over 2 ranks, FSDP2 × TP over 2 × 2 and an
Interleaved1F1B pipeline over 2 ranks (4 stages, 4 microbatches), each under `pardiag profile`.
The layout is the mesh torchtitan built — its size-1 and internal groups (``mesh_batch``,
``mesh_loss_mesh``, ``mesh_efsdp``) are no dimensions, and its loss and gradient-norm
all-reduces no tensor parallelism; the collectives are the records'; static memory per rank is
what the model and the layout give; the rules see the strategy. The same from the traces alone:
the run's traces without pardiag's records, and torchtitan's own profiler (``--profiling.*``) for
FSDP2 × TP.

Skipped with the reason where torchtitan cannot be imported; under CI (``CI`` set) that is a
failure: the test extra installs it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from .paths import REPO
from .synth import recorded_op_counts

pytestmark = pytest.mark.e2e

SCRIPT = REPO / "examples" / "frameworks" / "train_torchtitan.py"
#: configuration → (ranks, torchtitan options, dims, strategies)
CONFIGS = {
    "fsdp": (2, ["--parallelism.data-parallel-shard-degree", "2"], {"dp": 2}, ["fsdp2"]),
    "fsdp_tp": (4, ["--parallelism.data-parallel-shard-degree", "2",
                    "--parallelism.tensor-parallel-degree", "2"],
                {"dp": 2, "tp": 2}, ["fsdp2", "tp"]),
    "pp": (2, ["--parallelism.pipeline-parallel-degree", "2",
               "--parallelism.pipeline-parallel-schedule", "Interleaved1F1B"],
           {"pp": 2}, ["pipeline"]),
}


def _need_torchtitan() -> None:
    if importlib.util.find_spec("torchtitan") is None:
        if os.environ.get("CI"):
            pytest.fail("torchtitan is not installed in CI (pip install -e '.[test]')")
        pytest.skip("torchtitan is not installed (pip install -e '.[test]')")


def _run(cmd, cwd, timeout=600):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                         timeout=timeout, cwd=cwd, env=env)
    assert res.returncode == 0, (res.stdout[-2000:], res.stderr[-4000:])
    return res


def _report(folder, tmp) -> dict:
    _run([sys.executable, "-m", "pardiag", "report", folder, "-o", tmp / "r.html", "--json",
          tmp / "r.json", "-q"], cwd=tmp, timeout=300)
    return json.loads((tmp / "r.json").read_text())


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """One folder for the example's tokenizer, dataset and torchtitan's dump folder."""
    _need_torchtitan()
    return tmp_path_factory.mktemp("titan_assets")


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def titan_run(request, assets, tmp_path_factory):
    """``(config, run folder, report JSON)`` of the example under `pardiag profile`."""
    name = request.param
    n, opts, _, _ = CONFIGS[name]
    tmp = tmp_path_factory.mktemp(name)
    out = tmp / "run"
    _run([sys.executable, "-m", "pardiag", "profile", SCRIPT, "--nproc-per-node", n, "--out", out,
          "--", "--assets", assets, "--", *opts], cwd=tmp)
    return name, out, _report(out, tmp)


def _model_params() -> list[tuple[str, int, int]]:
    """``(name, elements, dims)`` of every parameter of torchtitan's Llama 3 debug model, built
    on the meta device by torchtitan itself."""
    import torch

    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import train_torchtitan
        with train_torchtitan.import_shims():
            from torchtitan.models.llama3 import Transformer, llama3_args
    finally:
        sys.path.pop(0)
    with torch.device("meta"):
        model = Transformer(llama3_args["debugmodel"])
    return [(k, p.numel(), p.dim()) for k, p in model.named_parameters()]


def _params_bytes(name: str) -> tuple[list[int] | None, int]:
    """(parameter bytes per rank where the layout fixes them, else None; the model's total), in
    fp32: FSDP2 shards every parameter over dp; torchtitan's TP plan shards the matrices over tp
    and replicates the norms (sequence parallel); a pipeline stage holds its layers whole, so
    there only the sum over the ranks is fixed."""
    params = _model_params()
    total = sum(e for _, e, _ in params) * 4
    if name == "fsdp":
        return [total // 2] * 2, total
    if name == "fsdp_tp":
        return [sum(e // (2 * (2 if d > 1 else 1)) for _, e, d in params) * 4] * 4, total
    return None, total


def test_layout_collectives_and_static_memory(titan_run):
    name, out, report = titan_run
    n, _, dims, strategies = CONFIGS[name]
    assert report["layout"]["dims"] == dims
    assert report["layout"]["strategies"] == strategies
    # size-1 and internal mesh groups carry no dimension
    for g in report["layout"]["groups"]:
        if g["size"] == 1:
            assert g["dim"] is None, g
    meta = [json.loads((out / "pardiag" / f"rank{r}.meta.json").read_text()) for r in range(n)]
    assert all(m["optimizer_steps"] == 6 for m in meta)
    # every collective the records hold is counted once on each rank
    for r in report["ranks"]:
        assert ({c["collective"]: c["count"] for c in r["collectives"]}
                == recorded_op_counts(out, r["rank"]))
    # static memory: the truth from the model; torchtitan's optimizers (in its
    # OptimizersContainer) keep AdamW's two moments per parameter and a 4-byte step each
    per_rank, total = _params_bytes(name)
    static = [m["memory"]["static"] for m in meta]
    if per_rank is not None:
        assert [s["params_bytes"] for s in static] == per_rank
    else:
        assert sum(s["params_bytes"] for s in static) == total
    for s in static:
        assert s["grads_bytes"] == s["params_bytes"]
        assert s["optimizer_state_bytes"] == 2 * s["params_bytes"] + 4 * s["params"]


def test_rules_see_the_strategy(titan_run):
    name, _, report = titan_run
    changes = report["recommendations"] + report["not_recommended"]
    kinds = {c["kind"] for c in changes}
    if name == "fsdp":
        assert {"fsdp_reshard", "fsdp_prefetch"} <= kinds and "degrees" not in kinds
    elif name == "fsdp_tp":
        degrees = {tuple(sorted(c["params"].items())) for c in changes if c["kind"] == "degrees"}
        assert (("dp", 4), ("tp", 1)) in degrees and "fsdp_reshard" in kinds
    else:
        # 4 samples a step over 4 microbatches: one sample each, so more are ruled out
        mbs = {c["params"]["microbatches"]: c for c in changes if c["kind"] == "microbatches"}
        assert {m for m, c in mbs.items() if c["ruled_out"]} == {8, 16}
        assert 2 in mbs and not mbs[2]["ruled_out"]
    assert "no DDP, FSDP or tensor-parallel setting" not in (report["recommendations_note"] or "")


def test_run_traces_alone(titan_run, tmp_path):
    """The run's rank traces without pardiag's metadata: the same layout, inferred."""
    name, out, _ = titan_run
    plain = tmp_path / "traces"
    plain.mkdir()
    for t in sorted(out.glob("rank*.trace.json*")):
        (plain / t.name).write_bytes(t.read_bytes())
    report = _report(plain, tmp_path)
    lay = report["layout"]
    assert lay["source"] == "inferred from traces"
    assert (lay["dims"], lay["strategies"]) == (CONFIGS[name][2], CONFIGS[name][3])
    if name == "pp":
        pipe = lay["pipeline"]
        assert (pipe["schedule"], pipe["stages"], pipe["microbatches"]) == (
            "ScheduleInterleaved1F1B", 4, 4)
        # the same advice as the recorded run: the sends show a microbatch of one sample
        changes = report["recommendations"] + report["not_recommended"]
        mbs = {c["params"]["microbatches"]: c for c in changes if c["kind"] == "microbatches"}
        assert {m for m, c in mbs.items() if c["ruled_out"]} == {8, 16}
        assert 2 in mbs and not mbs[2]["ruled_out"]
    elif name == "fsdp":  # the loss and gradient-norm all-reduces are functional, but no TP
        assert any(e.startswith("no tp:") for e in lay["evidence"])


def test_torchtitan_profiler_traces_fsdp_tp(assets, tmp_path):
    """FSDP2 × TP traced by torchtitan's own profiler (steps 5-6): the mesh from pg_config, the
    gloo ops' groups from what issued them (FSDP's c10d calls: the fsdp group; DTensor's
    functional all-gathers and reduce-scatters: the tp group), so every matched instance holds
    the two ranks of one group, and the instance table and the per-rank counts agree; the
    functional scalar reductions, whose group the traces cannot give, are left unmatched with a
    note."""
    n, opts, dims, strategies = CONFIGS["fsdp_tp"]
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", n, SCRIPT, "--",
          "--assets", assets, "--", *opts, "--job.dump-folder", tmp_path / "dump",
          "--profiling.enable-profiling", "--profiling.profile-freq", "6",
          "--profiling.profiler-warmup", "1", "--profiling.profiler-active", "2"], cwd=tmp_path)
    folder = tmp_path / "dump" / "profile_traces" / "iteration_6"
    assert sorted(p.name for p in folder.iterdir()) == [f"rank{r}_trace.json" for r in range(4)]
    report = _report(folder, tmp_path)
    lay = report["layout"]
    assert (lay["dims"], lay["strategies"]) == (dims, strategies)
    assert {g["dim"] for g in lay["groups"] if g["desc"] == "mesh_tp"} == {"tp"}
    assert {g["dim"] for g in lay["groups"] if g["size"] == 1} == {None}
    inst = report["sync"]["instances"]
    assert inst and all(i["ranks"] == 2 and i["expected"] == 2 for i in inst)
    assert {i["group"].split("|")[1] for i in inst} == {"mesh_fsdp", "mesh_tp"}
    members: dict = {}
    for i in inst:
        members[i["op"]] = members.get(i["op"], 0) + i["ranks"]
    counts: dict = {}
    for r in report["ranks"]:
        for c in r["collectives"]:
            counts[c["collective"]] = counts.get(c["collective"], 0) + c["count"]
    unmatched = next(x for x in report["sync"]["notes"] if "were not matched" in x)
    left = int(unmatched.split()[0])
    assert members["all_gather"] == counts["all_gather"]
    assert members["reduce_scatter"] == counts["reduce_scatter"]
    assert members.get("all_reduce", 0) + left == counts["all_reduce"]
