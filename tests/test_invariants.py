"""Report invariants on every sample run, real trace and repro: one quantity, one value, in the
verdict, the JSON, the terminal and the page; parts add up to their whole; no split or residual
without its evidence; every evaluated change once, with one reason."""

from __future__ import annotations

import html
import json
import math
import re

import pytest

from pardiag.analyzer.render.html import render_html
from pardiag.analyzer.report.registry import build_report
from pardiag.analyzer.trace import load_traces
from pardiag.api import Report, compare

from .paths import REPROS, SAMPLES, SHARED_TRACES

INPUTS = sorted(
    [p for p in SAMPLES.iterdir() if p.is_dir()]
    + ([p for p in SHARED_TRACES.iterdir() if p.is_dir()] if SHARED_TRACES.is_dir() else [])
    + ([p for p in REPROS.iterdir() if p.is_dir()] if REPROS.is_dir() else []),
    key=lambda p: p.name)


@pytest.fixture(scope="module")
def reports():
    cache: dict = {}

    def get(path):
        if path not in cache:
            traces = load_traces(path, cache=False)
            rep = build_report(traces, cls=Report)
            cache[path] = (rep, rep.to_json())
        return cache[path]
    return get


def _close(a, b, rel=1e-6, abs_=1e-6) -> bool:
    return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=abs_)


@pytest.mark.parametrize("path", INPUTS, ids=lambda p: p.name)
def test_one_quantity_one_value(reports, path):
    rep, doc = reports(path)
    verdict = doc["verdict"]
    ranks = doc["ranks"]
    # parts add up to their whole: per rank and per step
    for r in ranks:
        rows = ([r["total"]] if r["total"] else []) + r["steps"]
        for t in rows:
            parts = (t["compute_only_us"] + t["overlap_us"] + t["exposed_comm_us"]
                     + t["memory_only_us"] + t["idle_us"])
            assert t["memory_only_us"] >= 0 and t["idle_us"] >= -1e-6, (r["rank"], t)
            if r["domain"] == "cpu":   # copies are a device's
                assert t["memory_only_us"] == 0.0
            assert _close(parts, t["span_us"], rel=1e-9, abs_=1e-3), (r["rank"], t)
    # the verdict's step is the JSON's step
    m = re.search(r"Step ([\d,.]+) ms", verdict)
    if m and doc.get("step"):
        assert _close(float(m.group(1).replace(",", "")), round(doc["step"]["median_us"] / 1e3, 1),
                      abs_=0.051), (verdict, doc["step"])
    # the verdict's exposed and idle shares are the breakdown's
    span = sum(r["total"]["span_us"] for r in ranks if r["total"])
    m = re.search(r"exposed communication ([\d.]+)% of the ranks' time", verdict)
    if m and span > 0:
        exposed = sum(r["total"]["exposed_comm_us"] for r in ranks if r["total"])
        assert _close(float(m.group(1)), round(100 * exposed / span, 1), abs_=0.051)
    # waiting vs transfer: split only with the evidence, unknown without it
    st = (doc.get("sync") or {}).get("stragglers") or []
    if "% transfer" in verdict:
        assert any(s.get("waiting_us") is not None for s in st), verdict
        # waiting and transfer add up to the exposed share (a part of the waiting, at a
        # window's head, is said inside it, not beside it)
        w = re.search(r"\(([\d.]+)% waiting for ", verdict)
        t = re.search(r"([\d.]+)% transfer", verdict)
        if m and w and t and "split unknown" not in verdict:
            assert _close(float(w.group(1)) + float(t.group(1)), float(m.group(1)),
                          abs_=0.151), verdict
    if "waiting vs transfer unknown" in verdict:
        assert all(s.get("waiting_us") is None for s in st), verdict
    # a critical path is a chain through the step: never longer than the step it crosses
    for st in (doc.get("critical_path") or {}).get("steps") or []:
        assert st["path_us"] <= st["measured_us"] + 1.0, st
    # no residual of collective ends printed without a collective whose ends it compares
    notes = " ".join((doc.get("sync") or {}).get("notes") or [])
    if "collective ends differ by at most" in notes:
        inst = (doc.get("sync") or {}).get("instances") or []
        assert any(i["complete"] and i["semantics"] == "together" for i in inst), notes
    # one peak memory: the recommendations measure the memory section's worst rank
    peaks = [p["peak_bytes"] for p in (doc.get("memory") or {}).get("per_rank") or []
             if p.get("peak_bytes") is not None]
    for c in doc.get("recommendations") or []:
        if c.get("measured_peak_bytes") is not None:
            assert _close(c["measured_peak_bytes"], max(peaks)), c["change"]
    # every evaluated change once, each one not recommended with its reason
    seen = [(c["kind"], c["change"]) for c in (doc.get("recommendations") or [])
            + (doc.get("not_recommended") or [])]
    assert len(seen) == len(set(seen)), seen
    for c in doc.get("not_recommended") or []:
        assert c["reason"], c["change"]
    # the page and the terminal say the verdict the JSON says
    assert html.escape(verdict, quote=True) in render_html(rep, include_plotlyjs="cdn")
    flat = " ".join(rep.summary(width=100).split())
    assert " ".join(verdict.split()) in flat


def test_the_demo_comparison_checks_the_reports_own_numbers(reports):
    """make demo: compare's A step, A's recommendation and B's peak are the ones each run's own
    report states."""
    a, b = SAMPLES / "pp_before_cpu_2rank", SAMPLES / "pp_after_cpu_2rank"
    _, da = reports(a)
    _, db = reports(b)
    doc = json.loads(json.dumps(compare(a, b, cache=False).to_json()))
    check = doc["recommendation_checks"][0]
    top = da["recommendations"][0]
    assert (check["change"], check["rank"]) == (top["change"], 1)
    assert _close(check["predicted_step_us"], top["predicted_step_us"])
    assert _close(check["a_step_us"], da["step"]["median_us"])
    assert _close(check["b_peak_bytes"],
                  max(p["peak_bytes"] for p in db["memory"]["per_rank"]))
    assert _close(check["b_step_us"], db["step"]["median_us"])
