"""The four "Extending pardiag" examples of ``docs/architecture.md``, run as written: a per-rank
quantity (a field of ``RankSummary`` and its function), an analysis that reads it from the ranks'
summaries, a rule and an output. Each code block is executed as the module its first line names,
on a synthetic run with a planted answer; a doc example that no longer runs fails here."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
import textwrap
import types

import numpy as np
import pytest

from pardiag.analyzer.per_rank import REDUCER
from pardiag.analyzer.per_rank import store as store_mod
from pardiag.analyzer.per_rank import summary as summary_mod
from pardiag.analyzer.trace import load_traces

from .paths import REPO, SAMPLES
from .synth import TraceBuilder

DOC = REPO / "docs" / "architecture.md"


def blocks() -> dict[str, str]:
    """``{first-line comment: code}`` of every Python block of the doc (dedented)."""
    out = {}
    for code in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S):
        code = textwrap.dedent(code)
        first, _, rest = code.partition("\n")
        out[first.lstrip("# ").strip()] = rest
    return out


def load_as(path: str, code: str, monkeypatch) -> types.ModuleType:
    """``code`` executed as the module at ``path`` (``analyzer/x/y.py``: relative imports
    resolve in its package), registered in ``sys.modules`` for the test only."""
    name = "pardiag." + path.removesuffix(".py").replace("/", ".")
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
    mod.__package__ = name.rpartition(".")[0]
    monkeypatch.setitem(sys.modules, name, mod)
    exec(compile(code, path, "exec"), mod.__dict__)
    return mod


@pytest.fixture
def with_launches(monkeypatch):
    """``RankSummary`` with the doc's ``launches`` quantity: the field line of the doc added to
    the record (as editing ``per_rank/summary.py`` would), the store reading it by its type."""
    code = blocks()
    quantity_mod = load_as("analyzer/per_rank/launches.py",
                           code["analyzer/per_rank/launches.py"], monkeypatch)
    field_line = code["analyzer/per_rank/summary.py, a field of RankSummary"].strip()
    name, _, rest = field_line.partition(":")
    type_expr, _, default_expr = rest.partition("=")
    env = {"np": np, "quantity": summary_mod.quantity, **vars(quantity_mod)}
    cls = type("RankSummary", (summary_mod.RankSummary,), {
        "__annotations__": {name.strip(): eval(type_expr, env)},
        name.strip(): eval(default_expr, env), "__module__": summary_mod.__name__})
    extended = summary_mod._stored_tables(dataclasses.dataclass(frozen=True)(cls))
    quantities = tuple((f.name, f.metadata["compute"], f.metadata["patterns"])
                       for f in dataclasses.fields(extended) if "compute" in f.metadata)
    for mod in (summary_mod, store_mod):
        monkeypatch.setattr(mod, "RankSummary", extended)
        monkeypatch.setattr(mod, "QUANTITIES", quantities)
    store_mod._quantity_types.cache_clear()
    yield name.strip()
    store_mod._quantity_types.cache_clear()


def _launch_run(tmp_path):
    """Two GPU ranks: rank 0 launches at 100, 130, 190 µs (gaps 30, 60), rank 1 at 100, 200
    (gap 100)."""
    for rank, launches in ((0, (100.0, 130.0, 190.0)), (1, (100.0, 200.0))):
        b = TraceBuilder(rank=rank)
        for i, t in enumerate(launches):
            b.kernel(f"gemm_{i}", t + 10.0, 5.0, launch_ts=t)
        b.write(tmp_path / f"rank{rank}.json")
    return tmp_path


def test_a_per_rank_quantity_is_one_field_and_one_function(tmp_path, with_launches):
    run = _launch_run(tmp_path)
    traces = load_traces(run, reducer=REDUCER)
    s = traces.ranks[0].summary
    assert getattr(s, with_launches).tolist() == [100.0, 130.0, 190.0]
    back = store_mod.from_json(store_mod.to_json(s))   # stored and read back by its type
    assert getattr(back, with_launches).tolist() == [100.0, 130.0, 190.0]
    assert back.parts.lo == s.parts.lo


def test_the_analysis_reads_the_quantity_from_the_summaries(tmp_path, monkeypatch,
                                                            with_launches):
    mod = load_as("analyzer/analyses/launch_gaps.py",
                  blocks()["analyzer/analyses/launch_gaps.py"], monkeypatch)
    traces = load_traces(_launch_run(tmp_path), reducer=REDUCER)
    got = mod.compute_launch_gaps(traces).per_rank
    assert got["launches"].tolist() == [3, 2]
    assert got["median_gap_us"].tolist() == [45.0, 100.0]
    assert got["max_gap_us"].tolist() == [60.0, 100.0]


def test_the_rule_predicts_the_exposed_time_hidden(monkeypatch):
    from .test_recommend import _ctx

    mod = load_as("analyzer/predict/recommend/rules/overlap_comm.py",
                  blocks()["analyzer/predict/recommend/rules/overlap_comm.py"], monkeypatch)
    (rec,) = mod.overlap_comm(_ctx(dims={"dp": 4}, dim_comm={"dp": (3000.0, 1200.0)}))
    assert rec.measured_step_us == 10000.0 and rec.predicted_step_us == 8800.0
    assert mod.overlap_comm(_ctx(dims={"dp": 4}, dim_comm={"dp": (3000.0, 0.0)})) == []


def test_the_output_formats_the_report(monkeypatch):
    import pardiag

    mod = load_as("analyzer/render/markdown.py", blocks()["analyzer/render/markdown.py"],
                  monkeypatch)
    rep = pardiag.analyze(SAMPLES / "ddp_cpu_2rank", cache=False)
    text = mod.render_markdown(rep)
    lines = text.splitlines()
    assert lines[0] == f"# {rep.traces.source}"
    tot = rep.time_breakdown.totals
    assert lines[-2:] == [f"| {r.rank} | {r.span_us / 1000:.2f} | {r.exposed_comm_us / 1000:.2f} |"
                          for r in tot.itertuples()]
