"""`pardiag report` on every file of the bad-input corpus (tests/bad_inputs/, made by
make_corpus.py): a correct report with the expected warning, or one line naming the file and exit
code 2 — never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pardiag import cli

CORPUS = Path(__file__).resolve().parent / "bad_inputs"
BASE_OVERLAP = 100.0 / 3  # the corpus' base trace: 20 µs of 60 µs communication overlapped

# name -> (exit code, text that must be in stderr, overlap % of rank 0 or None (no comm) or
#          "skip" when not checked, ranks in the report)
ERR = "error"
EXPECTED: dict[str, tuple] = {
    "truncated.json.gz": (2, "truncated or corrupt gzip", None, None),
    "truncated.json": (2, "truncated (the file ends inside its JSON, at line 1", None, None),
    "empty.json": (2, "empty file", None, None),
    "whitespace_only.json": (2, "empty file", None, None),
    "empty.json.gz": (2, "empty file", None, None),
    "gzip_of_garbage.json.gz": (2, "not valid JSON", None, None),
    "binary_garbage.json": (2, "not valid JSON", None, None),
    "not_a_trace.json": (2, "not a Kineto trace (no traceEvents list)", None, None),
    # the trace format's JSON Array form: its one event has no name, so there is no work
    "top_level_list.json": (0, "a bare array of events", None, [0]),
    "top_level_number.json": (2, "not a Kineto trace (top level is not a JSON object)", None, None),
    "top_level_list_of_numbers.json": (2, "not a Kineto trace (its top level is an array whose "
                                          "entries are not all events (JSON objects))", None, None),
    "top_level_empty_list.json": (2, "not a Kineto trace (its top level is an array with nothing "
                                     "in it)", None, None),
    "unclosed_list_after_whitespace.json": (0, "its closing bracket left out", None, [0]),
    "trace_events_not_list.json": (2, "not a Kineto trace (no traceEvents list)", None, None),
    "deeply_nested.json": (2, "not valid JSON (nested too deeply)", None, None),
    "sidecars_only": (2, "none of 1 file(s) is a readable Kineto trace", None, None),
    "duplicate_ranks": (0, "b.json: rank 0 is already held by a.json, which overlaps it in time",
                        BASE_OVERLAP, [0]),
    "mixed_world_sizes": (0, "the traces disagree on the world size (2 for rank(s) [0]; 4 for "
                             "rank(s) [1])", BASE_OVERLAP, [0, 1]),
    "ts_as_string.json": (0, "10 ts/dur values are strings; read as numbers", BASE_OVERLAP, [0]),
    "ts_scientific.json": (0, "", BASE_OVERLAP, [0]),
    "ns_display_unit.json": (0, "timestamps are epoch nanoseconds; read ts/dur as ns and "
                                "converted to µs", BASE_OVERLAP, [0]),
    "negative_dur.json": (0, "left out 1 events with a missing, non-numeric, non-finite, "
                             "negative or implausibly large ts/dur", BASE_OVERLAP, [0]),
    "missing_fields.json": (0, "left out 2 events with a missing, non-numeric, non-finite, "
                               "negative or implausibly large ts/dur (1 without dur)",
                            BASE_OVERLAP, [0]),
    "nan_inf.json": (0, "read with repairs (bare NaN/Infinity tokens read as null)",
                     BASE_OVERLAP, [0]),
    "int_above_int64.json": (0, "left out 1 events", BASE_OVERLAP, [0]),
    "invalid_utf8.json": (0, "read with repairs (invalid UTF-8 bytes replaced by U+FFFD)",
                          BASE_OVERLAP, [0]),
    "control_characters.json": (0, "read with repairs (raw control characters inside strings "
                                   "accepted)", BASE_OVERLAP, [0]),
    "nul_in_string.json": (0, "", BASE_OVERLAP, [0]),
    "events_at_ts0.json": (0, "left out 1 events with stray timestamps (1 at ts 0 µs)",
                           BASE_OVERLAP, [0]),
    # relu [1039.998, 1044.998) on gemm's stream is clipped to start at 1040: 4.998 µs more
    # compute under the all-reduce [1030, 1060)
    "overlapping_same_stream.json": (0, "", 100 * 24.998 / 60, [0]),
    "no_profiler_step.json": (0, "no ProfilerStep#N annotations; per-step results are empty",
                              BASE_OVERLAP, [0]),
    "single_step.json": (0, "", BASE_OVERLAP, [0]),
    "no_communication.json": (0, "", None, [0]),
    "rank_without_events": (0, "rank1.json: rank 1 has no timed events", BASE_OVERLAP, [0, 1]),
    "only_metadata_events.json": (2, "no trace holds a timed event (e.g. ", None, [0]),
    "events_not_objects.json": (0, "left out 4 traceEvents entries that are not objects",
                                BASE_OVERLAP, [0]),
    "utf8_bom.json": (0, "", BASE_OVERLAP, [0]),
    "gzip_named_json.json": (0, "", BASE_OVERLAP, [0]),
    "plain_named_gz.json.gz": (0, "", BASE_OVERLAP, [0]),
    "rank_not_a_number.json": (0, "distributedInfo.rank 'zero' is not a rank number; treated as "
                                  "rank 0", BASE_OVERLAP, [0]),
    "negative_rank.json": (0, "distributedInfo.rank -3 is not a rank number", BASE_OVERLAP, [0]),
    "args_not_a_dict.json": (0, "", BASE_OVERLAP, [0]),
    "odd_field_types.json": (0, "", BASE_OVERLAP, [0]),
    "bad_memory_event.json": (0, "", BASE_OVERLAP, [0]),
    "one_bad_one_good": (0, "rank1.json.gz: truncated or corrupt gzip", BASE_OVERLAP, [0]),
    "huge_float.json": (0, "left out 1 events with a missing, non-numeric, non-finite, negative "
                           "or implausibly large ts/dur", BASE_OVERLAP, [0]),
    "unsorted_events.json": (0, "", BASE_OVERLAP, [0]),
    "bool_and_word_numbers.json": (0, "left out 2 events", BASE_OVERLAP, [0]),
}


def _run(args: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    code = cli.main(args)  # in-process: main(argv) returns the exit code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_corpus_is_complete():
    on_disk = {p.name for p in CORPUS.iterdir() if p.name not in ("make_corpus.py", "__pycache__")}
    assert on_disk == set(EXPECTED)
    assert sum(1 for p in CORPUS.rglob("*") if p.is_file() and p.suffix != ".py") >= 30


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_input(name, tmp_path, monkeypatch, capsys):
    code, text, overlap, ranks = EXPECTED[name]
    rc, _, err = _run(["report", str(CORPUS / name), "-o", str(tmp_path / "r.html"),
                       "--json", str(tmp_path / "s.json"), "-q", "--no-cache"],
                      monkeypatch, capsys)
    assert "Traceback" not in err
    assert rc == code, err
    assert text in err
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"pardiag: error: {CORPUS / name}")
        assert not (tmp_path / "r.html").exists()
        return
    doc = json.loads((tmp_path / "s.json").read_text())
    assert [r["rank"] for r in doc["ranks"]] == ranks
    got = doc["ranks"][0]["total"].get("overlap_pct")
    if overlap is None:
        assert got is None
    else:
        assert got == pytest.approx(overlap, abs=1e-6)
    if text:  # the warning is in the JSON too (notes for clipping)
        assert any(text in w for w in doc["warnings"])


def test_empty_folder(tmp_path, monkeypatch, capsys):
    (tmp_path / "empty").mkdir()
    rc, _, err = _run(["report", str(tmp_path / "empty"), "-o", str(tmp_path / "r.html"),
                       "--no-cache"],
                      monkeypatch, capsys)
    assert rc == 2
    assert err == (f"pardiag: error: {tmp_path / 'empty'}: no trace files "
                   "(*.json, *.json.gz) found\n")


def test_overlap_clipping_is_a_note():
    from pardiag.analyzer.trace import load_traces
    t = load_traces(CORPUS / "overlapping_same_stream.json").ranks[0]
    assert t.notes == (f"{CORPUS / 'overlapping_same_stream.json'}: clipped 1 same-stream GPU "
                       f"events that ran past the next one's start (by up to 0.002 µs)",)


@pytest.mark.parametrize("name", ["truncated.json.gz", "int_above_int64.json",
                                  "deeply_nested.json"])
def test_no_traceback_in_a_real_process(name, tmp_path):
    """The console script itself (not only main()): stderr has no traceback."""
    exe = Path(sys.executable).parent / "pardiag"
    res = subprocess.run([str(exe), "report", str(CORPUS / name), "-o", str(tmp_path / "r.html"),
                          "-q", "--no-cache"], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in res.stderr
    assert res.returncode == EXPECTED[name][0]


@pytest.mark.parametrize("body,repair", [
    (b'"name": "a\tb"', "raw control characters inside strings accepted"),
    (b'"name": "\\ud800"', "unpaired UTF-16 surrogate escapes kept as they are"),
    (b'"name": "k", "big": 1e400', "numbers beyond the float range read as infinity"),
    (b'"name": NaN', "bare NaN/Infinity tokens read as null"),
])
def test_a_repaired_document_names_the_repair_it_needed(body, repair):
    """What Python's json accepted where orjson refused is named by what orjson refused: a raw
    tab in a string, an unpaired surrogate escape, a number beyond the float range."""
    from pathlib import Path

    from pardiag.analyzer.trace.parse import parse_json

    raw = b'{"traceEvents": [{"ph": "X", ' + body + b', "ts": 1, "dur": 1}]}'
    doc, repairs = parse_json(raw, Path("f.json"))
    assert repairs == [repair]
    assert len(doc["traceEvents"]) == 1


def _kineto_text(names: list[str], desc: str) -> bytes:
    """A trace as torch's Kineto writes it (several keys per line, args on their own lines),
    with ``names`` and a process-group description written as they are: a ``"`` inside stays
    unescaped."""
    events = []
    for i, name in enumerate(names):
        events.append(
            f'  {{\n    "ph": "X", "cat": "user_annotation", "name": "{name}", "pid": 1, '
            f'"tid": 1,\n    "ts": {10 * i}, "dur": 5,\n    "args": {{\n      "External id": {i},'
            f'\n      "Process Group Description": "{desc}", "Ev Idx": {i}\n    }}\n  }}')
    return ('{\n  "schemaVersion": 1,\n  "traceEvents": [\n' + ",\n".join(events)
            + '\n  ]\n}').encode()


def test_a_name_with_a_double_quote_loses_no_run():
    """Kineto writes a record_function name or a process-group description holding ``"``
    without escaping it: the file is read, every name comes back as it was, and the repair is
    named once."""
    from pardiag.analyzer.trace.parse import parse_json

    names = ['block "a"', "plain", 'block "a"', 'say "hi", then', 'x"', 'block "a"']
    raw = _kineto_text(names, 'pg "dp", replica')
    doc, repairs = parse_json(raw, Path("f.json"))
    assert [e["name"] for e in doc["traceEvents"]] == names
    assert {e["args"]["Process Group Description"] for e in doc["traceEvents"]} == {
        'pg "dp", replica'}
    assert [e["args"]["Ev Idx"] for e in doc["traceEvents"]] == list(range(6))
    # three distinct names and the description, each repaired once for all its occurrences
    assert repairs == ["unescaped double quotes inside 4 distinct string(s) escaped (a name "
                       "written as it is, such as 'block \"a\"')"]


def test_json_that_is_not_fixed_by_escaping_quotes_is_still_refused():
    from pardiag.analyzer.trace.parse import parse_json
    from pardiag.errors import TraceError

    with pytest.raises(TraceError, match=r"f\.json: not valid JSON \(Expecting ',' delimiter"):
        parse_json(b'{"traceEvents": [{"ph": "X" "name": 1}]}', Path("f.json"))


def test_a_trace_cut_short_is_called_truncated():
    """A plain .json trace cut inside an event (a copy interrupted) is called truncated, with
    the line it ends at; JSON that is wrong but complete keeps the parser's own words."""
    from pardiag.analyzer.trace.parse import parse_json
    from pardiag.errors import TraceError

    doc = b'{"traceEvents": [\n  {"ph": "X", "name": "a", "ts": 1, "dur": 2},\n  {"ph": "X", "na'
    for cut in (doc, doc[:-3] + b'\n', doc[:-4]):
        with pytest.raises(TraceError, match=r"^t\.json: truncated \(the file ends inside its "
                                             r"JSON, at line 3"):
            parse_json(cut, Path("t.json"))
    with pytest.raises(TraceError, match=r"t\.json: not valid JSON \(Expecting property name"):
        parse_json(b"{not json", Path("t.json"))
