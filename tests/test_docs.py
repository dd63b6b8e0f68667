"""docs/json-schema.md documents every key that ``pardiag report --json`` writes, and exactly the
fields of the report's types (:mod:`pardiag.analyzer.report.schema`).

The page has one table per JSON object, under a heading naming the object's path in backticks
(``ranks[].total``: ``[]`` is an element of a list; several paths in one heading share the
table; the heading ``Top level`` is the document itself), and one row per key, the key in
backticks in the first cell. A row whose type cell starts with ``map`` is an object whose keys are
data (dimension names, host names, ranks): what lies under it is not schema. ``not_recommended[]``
entries are documented once, as ``recommendations[]``.

The reports are built in-process, as ``pardiag report --json`` builds them, on every sample run,
on two synthetic runs that hold what the samples do not (an inferred pipeline, an input-bound
run), on real GPU traces and, with ``--hta``, on one of them; every key at every nesting level
must be in the page's table for its object. The page's tables and the Structs of
:class:`~pardiag.analyzer.report.schema.ReportDocument` name the same keys, object by object,
and each Struct's docstring gives every field its line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import orjson
import pytest

from pardiag.analyzer.per_rank import REDUCER
from pardiag.analyzer.report import (
    REPORT_SCHEMA_VERSION,
    AnalysisOptions,
    build_report,
    report_json,
    schema,
)
from pardiag.analyzer.report.compare import COMPARE_SCHEMA_VERSION
from pardiag.analyzer.trace import load_traces

from .paths import REPO, SAMPLES
from .synth import TraceBuilder

#: The page under test.
DOC = REPO / "docs" / "json-schema.md"
#: Where the report's part of the page ends (the comparison JSON follows).
COMPARE_HEADING = "## The comparison JSON"
#: Real GPU traces (in ../shared/real_traces) reported on, and the one also reported with --hta.
REAL_GPU = ("dlrm_8rank_v100", "ddp_2rank_v100_rank0", "amd_mi250_single", "newest_format_h100")
HTA_TRACE = "ddp_2rank_v100_rank0"
#: Collected paths documented under another path: (prefix, documented as).
ALIASES = (("not_recommended[]", "recommendations[]"),)
#: Documented objects whose type is a plain dict, not a Struct (``run.json``'s ``layout``, as
#: :class:`pardiag.layout.RunFile` holds it): their keys are checked on real reports only.
UNTYPED = {"run.layout", "run.layout.pipeline"}


# ------------------------------------------------------------------------------ the page's tables


def documented(text: str) -> tuple[dict[str, set[str]], set[str]]:
    """``({object path: keys in its table}, {paths of map-valued keys})`` of the page (the
    report's part: up to :data:`COMPARE_HEADING`); the top level's path is ``""``."""
    tables: dict[str, set[str]] = {}
    maps: set[str] = set()
    paths: list[str] | None = None
    for line in text.split("\n" + COMPARE_HEADING)[0].splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip()
            found = [p for p in re.findall(r"`([^`]+)`", title)
                     if re.fullmatch(r"[a-z0-9_\[\].]+", p)]
            paths = [""] if title.lower() == "top level" else (found or None)
        elif paths is not None and line.startswith("| `"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
            names = re.findall(r"`([^`]+)`", cells[0])
            is_map = len(cells) > 1 and cells[1].lower().startswith("map")
            for p in paths:
                tables.setdefault(p, set()).update(names)
                if is_map:
                    maps.update(f"{p}.{n}" if p else n for n in names)
    return tables, maps


def headings(text: str) -> list[list[str]]:
    """The object paths of each table heading of the report's part of the page (several paths
    share one table)."""
    out = []
    for line in text.split("\n" + COMPARE_HEADING)[0].splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip()
            found = [p for p in re.findall(r"`([^`]+)`", title)
                     if re.fullmatch(r"[a-z0-9_\[\].]+", p)]
            if title.lower() == "top level":
                out.append([""])
            elif found:
                out.append(found)
    return out


def struct_fields(t=schema.ReportDocument, path: str = "",
                  out: dict | None = None) -> dict[str, tuple[type, set[str]]]:
    """``{object path: (Struct class, its JSON keys)}`` of every Struct reachable from ``t``
    (a list's elements at ``path[]``; nothing under a map)."""
    out = {} if out is None else out
    info = t if isinstance(t, msgspec.inspect.Type) else msgspec.inspect.type_info(t)
    if isinstance(info, msgspec.inspect.UnionType):
        for x in info.types:
            struct_fields(x, path, out)
    elif isinstance(info, msgspec.inspect.ListType):
        struct_fields(info.item_type, path + "[]", out)
    elif isinstance(info, msgspec.inspect.StructType):
        if path in out:
            return out
        out[path] = (info.cls, {f.encode_name for f in info.fields})
        for f in info.fields:
            struct_fields(f.type, f"{path}.{f.encode_name}" if path else f.encode_name, out)
    return out


def collect(doc, maps: set[str], path: str = "", out: set | None = None) -> set[tuple[str, str]]:
    """Every ``(object path, key)`` of a JSON document: the keys of each dict at every nesting
    level (a list's elements at ``path[]``: the union of their keys); nothing under a map."""
    out = set() if out is None else out
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.add((path, k))
            child = f"{path}.{k}" if path else k
            if _alias(child) not in maps:
                collect(v, maps, child, out)
    elif isinstance(doc, list):
        for x in doc:
            collect(x, maps, path + "[]", out)
    return out


def _alias(path: str) -> str:
    for prefix, as_ in ALIASES:
        if path == prefix or path.startswith(prefix + "."):
            return as_ + path[len(prefix):]
    return path


def undocumented(keys: set[tuple[str, str]], tables: dict[str, set[str]]) -> list[str]:
    """``"path: key"`` of each key that its object's table does not name."""
    return sorted(f"{p or '(top level)'}: {k}" for p, k in keys
                  if k not in tables.get(_alias(p), ()))


def _shown(path: Path) -> Path:
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def _page() -> str:
    assert DOC.is_file(), f"{DOC} is missing"
    return DOC.read_text(encoding="utf-8")


# ------------------------------------------------------------------------------ building reports


def report(path: Path, options: AnalysisOptions | None = None) -> dict:
    """The JSON summary of ``path`` as ``pardiag report --no-cache --json`` writes it (through
    orjson, as the CLI serializes it)."""
    traces = load_traces(path, reducer=REDUCER, cache=False, workers=1)
    data = orjson.dumps(report_json(build_report(traces, options or AnalysisOptions())),
                        option=orjson.OPT_SERIALIZE_NUMPY)
    return orjson.loads(data)


def _p2p(b: TraceBuilder, op: str, peer: int, ts: float) -> None:
    """A c10d::send / c10d::recv_ to group rank ``peer`` (Concrete Inputs[2]); a receive waits
    2 µs in gloo:recv."""
    b.cpu("c10d::send" if op == "send" else "c10d::recv_", ts, 1,
          args={"Concrete Inputs": ["", "", str(peer), "0"],
                "Input Dims": [[[8, 256]], [], [], []]})
    if op == "recv":
        b.cpu("gloo:recv", ts + 1, 2, cat="user_annotation")


def inferred_pipeline_run(folder: Path) -> Path:
    """Two gloo ranks recorded without pardiag running a 1F1B pipeline that marks no
    microbatch (the layout and pipeline are inferred, the microbatches estimated from the
    sends), whose DataLoader takes 12% of the step on each rank (input-bound)."""
    folder.mkdir(parents=True, exist_ok=True)
    pg = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1]}]
    messages = {0: (("send", 5), ("send", 15), ("recv", 25), ("send", 35), ("recv", 45),
                    ("recv", 60)),
                1: (("recv", 6), ("send", 12), ("recv", 16), ("send", 30), ("recv", 36),
                    ("send", 50))}
    for rank, peer in ((0, 1), (1, 0)):
        b = TraceBuilder(rank=rank, world_size=2, backend="gloo", pid=100 + rank,
                         main_tid=100 + rank)
        b.step(1, 0, 100)
        for op, ts in messages[rank]:
            _p2p(b, op, peer, ts)
        b.cpu("aten::mm", 0 if rank == 0 else 20, 5)
        b.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 88, 12,
              cat="user_annotation")
        d = b.doc()
        d["distributedInfo"].update(pg_config=pg, pg_count=1)
        (folder / f"rank{rank}.json").write_text(json.dumps(d))
    return folder


def _sample_runs() -> list[Path]:
    return sorted(p for p in SAMPLES.iterdir() if p.is_dir())


# ------------------------------------------------------------------------------------------ tests


def test_every_key_of_the_sample_and_synthetic_reports_is_documented(tmp_path):
    tables, maps = documented(_page())
    keys: set[tuple[str, str]] = set()
    runs = _sample_runs()
    assert len(runs) >= 8, f"expected the sample runs in {SAMPLES}"
    for run in runs:
        collect(report(run), maps, out=keys)
    synthetic = report(inferred_pipeline_run(tmp_path / "inferred_1f1b"))
    assert synthetic["layout"]["pipeline"]["stage_ranks"], "the pipeline was not inferred"
    assert synthetic["pipeline"]["schedule"]["microbatches_estimated"] is True
    assert synthetic["causes"]["input_bound"] is not None
    collect(synthetic, maps, out=keys)
    # what the rare cases must hold, so the check below covers them
    for must in (("routing", "groups"), ("layout", "evidence"), ("layout.pipeline", "stage_ranks"),
                 ("layout.pipeline", "local_stages"), ("pipeline.schedule", "source"),
                 ("causes.input_bound", "share_pct"), ("run", "layout"),
                 ("recommendations[]", "batch")):
        assert must in keys, f"no input gave {must}"
    missing = undocumented(keys, tables)
    assert not missing, (f"{len(missing)} key(s) the report JSON writes are not in "
                         f"{_shown(DOC)}: " + "; ".join(missing))


def test_every_key_of_real_gpu_reports_and_hta_is_documented(real_traces):
    tables, maps = documented(_page())
    keys: set[tuple[str, str]] = set()
    folders = [real_traces / n for n in REAL_GPU if (real_traces / n).is_dir()]
    if not folders:
        pytest.skip(f"none of {REAL_GPU} in {real_traces}")
    for folder in folders:
        collect(report(folder), maps, out=keys)
    if not (real_traces / HTA_TRACE).is_dir():
        pytest.skip(f"{HTA_TRACE} not in {real_traces}")
    pytest.importorskip("hta", reason="--hta needs Holistic Trace Analysis (traceinsight)")
    with_hta = report(real_traces / HTA_TRACE, AnalysisOptions(hta=True))
    assert with_hta["hta"]["idle"] and with_hta["hta"]["launches"], with_hta["hta"]["messages"]
    collect(with_hta, maps, out=keys)
    assert ("hta.launches[]", "launch_delay_us_p95") in keys
    missing = undocumented(keys, tables)
    assert not missing, (f"{len(missing)} key(s) the report JSON writes are not in "
                         f"{_shown(DOC)}: " + "; ".join(missing))


def test_the_documented_top_level_is_what_report_json_writes():
    """The page's top-level table names exactly the keys of a report (plus ``hta``, written
    only with ``--hta``), and the schema versions it states are the code's."""
    text = _page()
    tables, _ = documented(text)
    written = set(report(SAMPLES / "ddp_cpu_2rank"))
    assert "hta" not in written
    assert tables.get("") == written | {"hta"}, (
        f"documented but not written: {sorted(tables.get('', set()) - written - {'hta'})}; "
        f"written but not documented: {sorted(written - tables.get('', set()))}")
    assert f"`schema_version` {REPORT_SCHEMA_VERSION}" in text
    assert f"`schema_version` {COMPARE_SCHEMA_VERSION}" in text.split(COMPARE_HEADING)[1]


def test_the_page_and_the_report_types_name_the_same_keys():
    """Every Struct of the typed report has a table on the page naming exactly its fields (a
    table shared by several objects names the union of theirs), and every table is a Struct's
    (or one of :data:`UNTYPED`)."""
    text = _page()
    tables, maps = documented(text)
    types = struct_fields()
    problems = []
    for path, (cls, keys) in sorted(types.items()):
        table = tables.get(_alias(path))
        if table is None:
            problems.append(f"{path or '(top level)'} ({cls.__name__}): no table on the page")
        elif keys - table:
            problems.append(f"{path or '(top level)'}: fields of {cls.__name__} not on the page: "
                            f"{sorted(keys - table)}")
    for paths in headings(text):
        typed = [p for p in paths if _alias(p) in {_alias(q) for q in types} and p not in UNTYPED]
        if not typed:
            if not set(paths) <= UNTYPED:
                problems.append(f"table {paths}: no Struct of the report has this path")
            continue
        have = set().union(*(types[q][1] for q in types if _alias(q) in map(_alias, typed)))
        extra = tables[_alias(typed[0])] - have
        if extra:
            problems.append(f"table {paths}: keys no Struct has: {sorted(extra)}")
    assert not problems, "\n".join(problems)


def test_every_field_of_the_report_types_has_its_line_in_the_docstring():
    """Each Struct of the typed report says what every field holds (and its unit) in the
    ``Attributes:`` section of its docstring."""
    missing = []
    for cls, keys in struct_fields().values():
        doc = cls.__doc__ or ""
        for k in sorted(keys):
            if not re.search(rf"^\s+{re.escape(k)}(,[^:]*)?:", doc, re.M) and not re.search(
                    rf"^\s+[a-z_, ]*\b{re.escape(k)}\b[a-z_, ]*:", doc, re.M):
                missing.append(f"{cls.__name__}.{k}")
    assert not missing, f"fields without a docstring line: {missing}"


def test_a_report_round_trips_through_its_type_unchanged(tmp_path):
    """The JSON ``pardiag report --json`` writes decodes into the typed report and encodes to
    the same values, key for key (an inferred pipeline's and a recorded run's)."""
    for run in (SAMPLES / "pp_1f1b_cpu_2rank", SAMPLES / "moe_ep_cpu_2rank",
                inferred_pipeline_run(tmp_path / "inferred_1f1b")):
        written = orjson.dumps(report_json(build_report(load_traces(
            run, reducer=REDUCER, cache=False, workers=1))), option=orjson.OPT_SERIALIZE_NUMPY)
        doc = schema.decode_report(written, run)
        assert isinstance(doc, schema.ReportDocument)
        again = orjson.dumps(schema.to_builtins(doc), option=orjson.OPT_SERIALIZE_NUMPY)
        assert again == written, run


def test_the_readme_tour_quotes_the_demo_as_it_reads():
    """The tour's italic quotes of `make demo`'s verdict and critical path are the report's own
    words on the demo's traces (the numbers in them included): a change to what the report
    says must change the README with it."""
    from pardiag.analyzer.report.registry import build_report

    readme = (REPO / "README.md").read_text()
    tour = readme[readme.index("## A five-minute tour of a report"):]
    tour = tour[:tour.index("2. **Recommendations**")]
    quotes = [" ".join(q.split()) for q in re.findall(r"(?<!\*)\*([^*]+)\*(?!\*)", tour)]
    assert len(quotes) >= 2
    rep = build_report(load_traces(SAMPLES / "pp_before_cpu_2rank"))
    said = " ".join(f"{rep.recommendations.verdict} {rep.critical_path.describe()}".split())
    for q in quotes:
        for part in (p.strip() for p in q.split("…")):
            assert part in said, part
