"""The run folder layout (pardiag/layout.py): only the ranks' traces at the top, pardiag's sidecars
in ``pardiag/``, so that Holistic Trace Analysis loads exactly the ranks (the committed
sample_traces/ are in this layout); run folders of the older layout (sidecars beside the traces)
still read the same."""

import json
import re
import subprocess
import sys

import pytest

from pardiag import layout
from pardiag.analyzer.per_rank import REDUCER
from pardiag.analyzer.report.registry import build_report, report_json
from pardiag.analyzer.trace import load_traces

from .paths import REPO
from .synth import relayout

SAMPLES = REPO / "sample_traces"


def _without_paths(doc: dict, *folders) -> str:
    """The report JSON as text, with the run folder's path (source, warnings, files) left out."""
    text = json.dumps({k: v for k, v in doc.items() if k != "source"}, sort_keys=True)
    for f in folders:
        text = text.replace(str(f), "RUN")
    return text


@pytest.mark.parametrize("name", ["pp_unbalanced_cpu_2rank", "fsdp_tp_2d_cpu_4rank"])
def test_old_and_new_layout_give_the_same_report(tmp_path, name):
    new = SAMPLES / name
    old = relayout(new, tmp_path / name, old=True)
    assert sorted(p.name for p in new.iterdir() if p.is_file()) == sorted(
        p.name for p in old.glob("rank*.trace.json.gz"))
    a, b = (load_traces(d) for d in (old, new))
    assert a.run_info == b.run_info and a.rank_meta == b.rank_meta and a.sidecars == b.sidecars
    assert a.run_info is not None and set(a.rank_meta) == set(a.ranks)
    assert _without_paths(report_json(build_report(a)), old) == _without_paths(
        report_json(build_report(b)), new)


def test_hta_lists_exactly_the_ranks_traces(tmp_path):
    """HTA's own file listing (hta.common.trace_file, what TraceAnalysis(trace_dir=) uses): in the
    old layout rank 1's metadata is taken as its trace (FACTS §5); in this one the traces only."""
    from hta.common.trace_file import create_rank_to_trace_dict_from_dir

    old = relayout(SAMPLES / "ddp_cpu_2rank", tmp_path / "old", old=True)
    ok, mapping = create_rank_to_trace_dict_from_dir(str(old))
    assert ok and not all(v.endswith(".trace.json.gz") for v in mapping.values())
    new = relayout(old, tmp_path / "ddp")
    load_traces(new, reducer=REDUCER, cache=True)   # writes .pardiag-cache/ as `report` does
    assert (new / layout.SUMMARY_DIR).is_dir()
    ok, mapping = create_rank_to_trace_dict_from_dir(str(new))
    assert ok and mapping == {r: str(new / f"rank{r}.trace.json.gz") for r in (0, 1)}


def test_named_trace_files_use_the_sidecars_of_their_run(tmp_path):
    new = relayout(SAMPLES / "pp_1f1b_cpu_2rank", tmp_path / "pp")
    ts = load_traces([new / "rank0.trace.json.gz", new / "rank1.trace.json.gz"])
    assert any("using the pardiag run's run.json and sidecars" in w for w in ts.warnings)
    assert ts.run_info is not None and set(ts.sidecars["pipeline"]) == {0, 1}


def test_run_without_traces_says_so(tmp_path):
    """A run folder of this layout whose ranks wrote no trace: the hint names the optimizer
    steps, not the pardiag/ subfolder as one holding traces."""
    from pardiag.errors import TraceError
    new = relayout(SAMPLES / "ddp_cpu_2rank", tmp_path / "d")
    for f in new.glob("rank*.trace.json.gz"):
        f.unlink()
    with pytest.raises(TraceError, match=r"this pardiag run wrote no trace \(optimizer steps"):
        load_traces(new)


def test_report_never_writes_over_a_sidecar_of_this_layout(tmp_path):
    new = relayout(SAMPLES / "ddp_cpu_2rank", tmp_path / "run")
    before = {p: p.read_bytes() for p in new.rglob("*") if p.is_file()}
    for target in (new / "pardiag" / "run.json", new / "pardiag" / "rank1.comms.json"):
        res = subprocess.run([sys.executable, "-m", "pardiag", "report", str(new), "-q",
                              "--no-cache", "-o", str(target)], capture_output=True, text=True)
        assert res.returncode == 2 and re.search(rf"{target.name}: would overwrite",
                                                 res.stderr.strip().splitlines()[-1]), res.stderr
    assert {p: p.read_bytes() for p in new.rglob("*") if p.is_file()} == before


def test_find_sidecars_and_owned_files(tmp_path):
    (tmp_path / "pardiag").mkdir()
    for name in ("run.json", "rank0.meta.json", "pardiag/run.json", "pardiag/rank0.comms.json",
                 "pardiag/notes.json", "rank0.trace.json.gz", "other.json"):
        (tmp_path / name).write_text("{}")
    assert [str(p.relative_to(tmp_path)) for p in layout.find_sidecars(tmp_path)] == [
        "rank0.meta.json", "run.json", "pardiag/rank0.comms.json", "pardiag/run.json"]
    assert [str(p.relative_to(tmp_path)) for p in layout.owned_files(tmp_path)] == [
        "pardiag/rank0.comms.json", "pardiag/run.json", "rank0.meta.json",
        "rank0.trace.json.gz", "run.json"]


def test_every_committed_sidecar_decodes_into_its_type():
    import orjson
    n = 0
    for f in sorted(SAMPLES.glob("*/pardiag/*.json")):
        doc = orjson.loads(f.read_bytes())
        if doc.get("kind") in layout.TYPED_SIDECARS:
            typed = layout.decode_sidecar(doc, doc["kind"])
            assert layout.decode_sidecar(layout.encode_sidecar(typed), doc["kind"]) == typed
            n += 1
    assert n == 16 + 36   # 16 runs, 36 ranks
    run_json = SAMPLES / "ddp_cpu_2rank" / "pardiag" / "run.json"
    run = layout.decode_sidecar(orjson.loads(run_json.read_bytes()), "run")
    assert run.schedule == layout.ProfilerSchedule(wait=1, warmup=1, active=3)
    assert run.started_unix < run.ended_unix and run.layout["dims"] == {"dp": 2}


def test_a_wrong_value_names_the_field_and_the_file_is_ignored(tmp_path):
    new = relayout(SAMPLES / "ddp_cpu_2rank", tmp_path / "d")
    run = json.loads((new / "pardiag" / "run.json").read_text())
    run["world_size"] = "two"
    (new / "pardiag" / "run.json").write_text(json.dumps(run))
    ts = load_traces(new)
    assert ts.run_info is None and set(ts.rank_meta) == {0, 1}
    assert any(w.endswith("run.json: pardiag sidecar with a wrong value, ignored (Expected `int "
                          "| null`, got `str` - at `$.world_size`)")
               for w in ts.warnings), ts.warnings


def test_the_report_shows_when_the_run_started(tmp_path):
    """run.json holds ``started_unix``; the summary once read an absent ``start_time``."""
    import datetime

    from pardiag.analyzer.render.html import render_html
    ts = load_traces(SAMPLES / "ddp_cpu_2rank")
    page = render_html(build_report(ts), include_plotlyjs=False)
    when = datetime.datetime.fromtimestamp(ts.run_info.started_unix, datetime.timezone.utc)
    assert f"<th class='l'>started</th><td>{when:%Y-%m-%d %H:%M:%S} UTC</td>" in page
    assert report_json(build_report(ts))["run"]["started_unix"] == ts.run_info.started_unix


def test_contention_note_says_when_cpu_ranks_share_cores():
    """Two CPU ranks that may both run on cores 0–1 share them; 2 ranks × 2 threads on 2 cores
    oversubscribe; disjoint pinned ranks, GPU ranks and ranks without thread counts are not
    judged contended."""
    from pardiag.layout import RankMeta, contention_note

    def m(rank, threads, aff, device="cpu", host="h"):
        return RankMeta(rank=rank, host=host, cpu_count=2, device=device,
                        intra_op_threads=threads, cpu_affinity=aff)
    assert contention_note([m(0, 1, [0, 1]), m(1, 1, [0, 1])]) == (
        "timings are contended: ranks 0,1 may run on the same cores on this host (each may use "
        "2 of cores 0–1) — pin each rank to its own cores (pardiag profile --pin-cpu) or give "
        "each fewer threads (torch.set_num_threads)")
    assert contention_note([m(0, 2, [0]), m(1, 2, [1])]).startswith(
        "timings are contended: ranks 0,1 run 4 intra-op threads on 2 core(s) on this host —")
    assert contention_note([m(0, 1, [0]), m(1, 1, [1])]) is None
    assert contention_note([m(0, 1, [0, 1], "cuda:0"), m(1, 1, [0, 1], "cuda:1")]) is None
    assert contention_note([m(0, None, [0, 1]), m(1, None, [0, 1])]) is None
    # two hosts: each judged alone, and named
    assert "on b" in contention_note([m(0, 1, [0]), m(1, 1, [1]), m(2, 1, [0, 1], host="b"),
                                      m(3, 1, [0, 1], host="b")])


def test_the_parts_of_a_multi_node_run_file_are_joined():
    """run.json (node 0: the job and its part) and run.node{N}.json (node N's part) become one
    run file: hosts, failed and missing ranks joined, the first failing node's exit code, and
    the nodes below nnodes without a part named."""
    from pardiag.layout import RunFile, join_run_files
    job = dict(command="pardiag profile t.py", world_size=6, nproc_per_node=2, nnodes=3)
    n0 = RunFile(**job, node_rank=0, nodes={"a": [0, 1]}, started_unix=10.0, ended_unix=20.0,
                 exit_code=0)
    n2 = RunFile(**job, node_rank=2, nodes={"c": [4, 5]}, started_unix=9.5, ended_unix=25.0,
                 exit_code=1, failed_ranks={"5": "RuntimeError: x"}, missing_ranks=[4],
                 hang=["h"])
    run = join_run_files([n2, n0])
    assert run.command == "pardiag profile t.py" and run.node_rank == 0
    assert run.nodes == {"a": [0, 1], "c": [4, 5]}
    assert run.failed_ranks == {"5": "RuntimeError: x"} and run.missing_ranks == [4]
    assert (run.exit_code, run.started_unix, run.ended_unix, run.hang) == (1, 9.5, 25.0, ["h"])
    assert run.missing_nodes == [1]
    assert join_run_files([]) is None
    single = RunFile(**{**job, "nnodes": 1}, node_rank=0)
    assert join_run_files([single]) is single
    import pardiag.layout as L
    assert L.is_sidecar_name("run.node2.json") and L.is_sidecar_name("run.node-gpu07.json")
    assert L.node_run_path("r", 0).name == "run.json" and L.node_run_path("r", 3).name == \
        "run.node3.json"


def test_one_job_is_one_definition_for_parts_repeats_and_compare():
    """The parts of a multi-node run differ only in their node; parts of another job are refused
    with what differs, in the words ``compare`` of monitored runs uses too."""
    from pathlib import Path

    from pardiag.analyzer.trace.load import _different_run_parts
    from pardiag.layout import RunFile
    job = dict(script="t.py", script_args=["--steps", "6"], world_size=4, nnodes=2)
    n0, n1 = RunFile(**job, node_rank=0), RunFile(**job, node_rank=1)
    assert n0.job_differences(n1) == []
    files = [Path("a/pardiag/run.json"), Path("b/pardiag/run.node1.json")]
    assert _different_run_parts([n0, n1], files) is None
    wider = RunFile(**{**job, "world_size": 8}, node_rank=1)
    assert n0.job_differences(wider) == [("world sizes", 4, 8)]
    assert _different_run_parts([n0, wider], files).startswith(
        "a and b are different runs (world sizes 4 vs 8); to analyse them as one anyway")
    other = RunFile(**{**job, "script_args": ["--steps", "9"]}, node_rank=1)
    assert n0.job_differences(other) == [("script arguments", "--steps 6", "--steps 9")]
    assert "(t.py --steps 6 vs t.py --steps 9)" in _different_run_parts([n0, other], files)
    again = RunFile(**job, node_rank=0, started_unix=86_400.0)
    assert "(one job started at ? and at 1970-01-02 00:00:00 UTC)" in _different_run_parts(
        [n0, again], files)


@pytest.mark.parametrize("name", sorted(p.name for p in SAMPLES.iterdir() if p.is_dir()))
def test_hta_loads_every_sample_run_as_it_is(name):
    """The shipped runs are in today's layout: Holistic Trace Analysis' TraceAnalysis loads each
    folder as it is, with the ranks pardiag finds and each rank's CPU operators."""
    from hta.trace_analysis import TraceAnalysis

    folder = SAMPLES / name
    hta = TraceAnalysis(trace_dir=str(folder))
    ranks = sorted(load_traces(folder).ranks)
    assert hta.t.get_ranks() == ranks and len(ranks) >= 2
    for r in ranks:
        assert len(hta.t.get_trace(r)) > 100
    assert sorted(p.name for p in folder.iterdir() if p.is_file()) == [
        f"rank{r}.trace.json.gz" for r in ranks]


# --------------------------------------------------------------------------- the typed sidecars


def test_comms_and_pipeline_sidecars_are_decoded_once_into_their_types():
    """The loader hands every reader the typed sidecars: a sample run's comms and pipeline
    files as :class:`layout.CommsSidecar` and :class:`layout.PipelineSidecar`, every entry of
    every list typed, no warning."""
    ts = load_traces(SAMPLES / "pp_1f1b_cpu_2rank")
    comms, pipe = ts.sidecars["comms"][1], ts.sidecars["pipeline"][1]
    assert isinstance(comms, layout.CommsSidecar) and comms.rank == 1
    assert all(isinstance(r, layout.CommRecord) for r in comms.records) and comms.records
    assert [g.name for g in comms.process_groups][:1] == ["0"]
    assert isinstance(pipe, layout.PipelineSidecar) and pipe.schedule["schedule"]
    assert {r.phase for r in pipe.records} == {"F", "B"}
    assert all(isinstance(r.stage, int) and r.end_us > r.start_us for r in pipe.records)
    assert not [w for w in ts.warnings if "sidecar" in w or "malformed" in w]


def test_bad_sidecar_content_is_a_warning_naming_the_file():
    """A malformed entry is left out with the first reason; a required list that is not a list,
    or a field of the file with the wrong type, makes the file unusable; an optional list that
    is not a list is left out; an all-gather of an older run gets its full buffer."""
    good = {"op": "all_gather", "pg_name": "0", "seq": 1, "pg_ranks": [0, 1], "in_bytes": 512,
            "out_bytes": 512, "bytes": 512, "issue_us": 1.0, "start_us": 2.0, "end_us": 3.0}
    doc = {**layout.sidecar_header("comms"), "rank": 0,
           "process_groups": [{"name": "0", "ranks": [0, 1], "dim": "dp"}, {"name": "1"}],
           "records": [good, {**good, "seq": "two"}, {**good, "start_us": "x"}]}
    side, notes = layout.decode_rank_sidecar(doc, "r/rank0.comms.json")
    assert [r.seq for r in side.records] == [1] and side.records[0].bytes == 1024
    assert [g.dim for g in side.process_groups] == ["dp"]
    assert notes == [
        "r/rank0.comms.json: left out 2 malformed 'records' entries (Expected `int`, got `str` - "
        "at `$.seq`)",
        "r/rank0.comms.json: left out 1 malformed 'process_groups' entries (Object missing "
        "required field `ranks`)"]
    chunk = {"stage": 0, "microbatch": 0, "phase": "F", "start_us": 1.0, "end_us": 2.0,
             "optimizer_step": 3}
    pipe = {**layout.sidecar_header("pipeline"), "rank": 1, "records": [chunk],
            "layers": {"not": "a list"}, "ddp_calibration": {}}
    side, notes = layout.decode_rank_sidecar(pipe, "p.json")
    assert side.records == [layout.ChunkRecord(**chunk)] and side.layers == []
    assert side.ddp_calibration == layout.DdpCalibration()
    assert notes == ["p.json: 'layers' is not a list; left out"]
    assert layout.decode_rank_sidecar({**pipe, "records": 3}, "p.json") == (
        None, ["p.json: 'records' is not a list; the file is ignored"])
    side, notes = layout.decode_rank_sidecar({**pipe, "layers": [], "schedule": 5}, "p.json")
    assert side is None and notes == [
        "p.json: pardiag sidecar with a wrong value, ignored (Expected `object | null`, got "
        "`int` - at `$.schedule`)"]


def test_a_run_that_failed_before_its_trace_names_the_failure(tmp_path):
    """A script that raised before its profiler's window (a SyntaxError): the error names the
    first failure, not 'profile with more steps'."""
    import json

    from pardiag.errors import TraceError
    new = relayout(SAMPLES / "ddp_cpu_2rank", tmp_path / "d")
    for f in new.glob("rank*.trace.json.gz"):
        f.unlink()
    run = new / "pardiag" / "run.json"
    doc = json.loads(run.read_text())
    doc["failed_ranks"] = {"0": "SyntaxError: invalid syntax (train.py, line 3)"}
    run.write_text(json.dumps(doc))
    want = (r"the profiled run failed before a trace was written: rank 0: SyntaxError: invalid "
            r"syntax \(train.py, line 3\)")
    with pytest.raises(TraceError, match=want):
        load_traces(new)


def test_an_sp_mesh_dimension_is_named_by_what_runs_over_it():
    """``mesh_sp`` is Megatron's sequence parallelism (over the tensor-parallel group) in one
    code base and Ulysses (context parallelism by all-to-all: verl, DeepSpeed) in another: its
    name says no dimension, its ops do."""
    from pardiag.analyzer.analyses.mesh import dim_of, role_of

    assert dim_of("mesh_sp") is None and dim_of("mesh_tp") == "tp" and dim_of("mesh_cp") == "cp"
    assert role_of({"all_to_all": 8}, 0.0, "cp") == "cp"


def test_torchtitans_unflattened_meshes_give_the_data_mesh():
    """Newer torchtitan (``_unflatten``) on 16 ranks: a data mesh dp 4 × cp 2 × tp 2 whose dp
    is dp_replicate 2 × dp_shard 2, its flattened dp_cp, and a compute mesh's dp_replicate and
    dp_shard_cp (no dp_shard group, and tp twice). dp is the dp group's 4, not dp_replicate ×
    dp × dp_shard_cp = 32 (the degrees multiplied to 128 on 16 ranks: layout unknown)."""
    from pardiag.analyzer.analyses.mesh import mesh_dims

    def rank(rep, shard, c, t):
        return ((rep * 2 + shard) * 2 + c) * 2 + t
    coords = [(a, b, c, d) for a in (0, 1) for b in (0, 1) for c in (0, 1) for d in (0, 1)]
    groups = []
    for a, b, c, d in coords:
        groups += [
            ("mesh_dp", sorted(rank(x, y, c, d) for x in (0, 1) for y in (0, 1))),
            ("mesh_cp", sorted(rank(a, b, z, d) for z in (0, 1))),
            ("mesh_tp", sorted(rank(a, b, c, z) for z in (0, 1))),
            ("mesh_tp", sorted(rank(a, b, c, z) for z in (0, 1))),
            ("mesh_dp_cp", sorted(rank(x, y, z, d) for x in (0, 1) for y in (0, 1)
                                  for z in (0, 1))),
            ("mesh_dp_replicate", sorted(rank(x, b, c, d) for x in (0, 1))),
            ("mesh_dp_shard_cp", sorted(rank(a, y, z, d) for y in (0, 1) for z in (0, 1)))]
    m = mesh_dims(groups, world=16)
    assert m.dims == {"dp": 4, "cp": 2, "tp": 2}
    assert "mesh_dp (4 ranks) holds mesh_dp_replicate: one dimension, of 4" in m.notes
    assert "mesh_dp_shard_cp (4 ranks) lies within mesh_cp × mesh_dp: not a further " \
           "dimension" in m.notes
