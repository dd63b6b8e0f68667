"""Did a change alter any result? The report JSON of every sample run and real trace, written
once before and once after, compared key by key.

    .venv/bin/python benchmarks/json_unchanged.py write OUT_DIR     # one JSON per input
    .venv/bin/python benchmarks/json_unchanged.py compare BEFORE AFTER

``write`` reports, without stored summaries (``cache=False``), every folder of
``sample_traces/``, of ``../shared/real_traces/`` and of ``../shared/repros/`` (where they are;
a repro's ``expect.json`` may name ``--comm-kernel`` patterns; an input refused with a
:class:`~pardiag.errors.PardiagError` is written as ``{"error": message}``), and writes
``OUT_DIR/<set>__<name>.json`` (``report_json``; keys sorted) and, beside it,
``<set>__<name>.figures.json``: every figure of the HTML page as plotly reads it (each spec
passed through ``plotly.graph_objects.Figure`` and its typed arrays decoded, so a figure written
as a plain dict and the same figure built with plotly's objects compare equal), and
``<set>__<name>.page.html``: the page without its time stamp and figure data (compared
exactly). With ``--from-summaries`` each report is a second one, read from the summaries a
first report stored (what a user's second ``pardiag report`` does); compared with a ``write``
without it, this shows that a summary's round trip through its JSON changes nothing. With
``--as-cli`` the reports are made with the pandas settings of the command line's analysis
commands (``pardiag.cli.python_strings``).
``compare``
prints every path whose value differs between two such folders (floats equal to 1e-9
relative; the timing fields of :data:`TIMING_KEYS` skipped) and exits 1 when any does. Speed
work must leave it silent.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SETS = {"sample": REPO / "sample_traces", "real": REPO.parent / "shared" / "real_traces",
        "repro": REPO.parent / "shared" / "repros"}
#: Keys whose values are times of the report itself, not of the run: none are written today;
#: listed here so that a future one is named rather than silently compared.
TIMING_KEYS: frozenset[str] = frozenset()


def inputs() -> list[tuple[str, Path]]:
    """``(name, folder)`` of every sample run and real trace folder present."""
    out = []
    for tag, root in SETS.items():
        if root.is_dir():
            out += [(f"{tag}__{p.name}", p) for p in sorted(root.iterdir()) if p.is_dir()]
    return out


def plain(obj):
    """A figure spec as the browser reads it: plotly's typed arrays (``{"dtype", "bdata"[,
    "shape"]}``) as nested lists, NaN as None (JSON's null; NaN would not equal itself)."""
    if isinstance(obj, dict):
        if "bdata" in obj and "dtype" in obj:
            import base64

            import numpy as np
            a = np.frombuffer(base64.b64decode(obj["bdata"]), dtype=obj["dtype"])
            if "shape" in obj:
                a = a.reshape([int(n) for n in str(obj["shape"]).split(",")])
            return plain(a.tolist())
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    return None if isinstance(obj, float) and math.isnan(obj) else obj


def page_specs(html: str) -> list[dict]:
    """The figure specs of a report page as written (``pd-fig-N-data`` elements, page order)."""
    import re

    return [json.loads(m) for m in re.findall(
        r'<script type="application/json" id="pd-fig-\d+-data">(.*?)</script>', html, re.S)]


def validated(spec: dict) -> dict:
    """``spec`` as plotly's figure objects make it (``go.Figure(spec).to_plotly_json()``),
    without the template."""
    import plotly.graph_objects as go

    out = go.Figure(spec).to_plotly_json()
    out["layout"].pop("template", None)
    return out


def page_figures(html: str) -> list[dict]:
    """Every figure of a report page as plotly reads it: :func:`validated`, then
    :func:`plain`."""
    return [plain(validated(spec)) for spec in page_specs(html)]


def page_text(html: str) -> str:
    """A report page without what may differ between equal reports: the time it was made and
    each figure's data (compared as :func:`page_figures` reads them) — the tables, the text and
    the figures' places, exactly."""
    import re

    html = re.sub(r"pardiag [^ ]+ · \d{4}-\d\d-\d\d \d\d:\d\d", "pardiag · TIME", html)
    return re.sub(r'(<script type="application/json" id="pd-fig-\d+-data">).*?(</script>)',
                  r"\1\2", html, flags=re.S)


def _comm_kernels(folder: Path) -> tuple[str, ...]:
    """The ``--comm-kernel`` pattern a repro's ``expect.json`` names (``with_comm_kernel_regex``),
    else none."""
    expect = folder / "expect.json"
    if not expect.is_file():
        return ()
    pattern = json.loads(expect.read_text()).get("with_comm_kernel_regex")
    return (pattern,) if pattern else ()


def page_compared(html: str) -> str:
    """A page's text as compared: runs of white space as one space, none between tags (a page
    built from templates lays out its markup differently, not its text)."""
    import re

    return re.sub(r">\s+<", "><", re.sub(r"\s+", " ", html)).strip()


def write(out: Path, from_summaries: bool = False, as_cli: bool = False) -> None:
    import os
    import shutil
    import tempfile

    from pardiag.analyzer.report.registry import report_json
    from pardiag.api import analyze
    from pardiag.errors import PardiagError
    from pardiag.layout import SUMMARY_DIR

    out.mkdir(parents=True, exist_ok=True)
    if as_cli:  # the pandas settings of the command line's analysis commands
        from pardiag.cli import python_strings
        with python_strings():
            return write(out, from_summaries)
    for name, folder in inputs():
        if from_summaries:
            # a second report, from the summaries the first one stored: beside the traces
            # where the folder is writable (removed after), else in a cache folder of its own
            mine = not (folder / SUMMARY_DIR).exists()
            with tempfile.TemporaryDirectory() as cache:
                old = os.environ.get("PARDIAG_CACHE_DIR")
                os.environ["PARDIAG_CACHE_DIR"] = cache
                try:
                    analyze(folder, cache=True)
                    rep = analyze(folder, cache=True)
                finally:
                    os.environ.pop("PARDIAG_CACHE_DIR") if old is None else \
                        os.environ.__setitem__("PARDIAG_CACHE_DIR", old)
                    if mine:
                        shutil.rmtree(folder / SUMMARY_DIR, ignore_errors=True)
                # a rank joined from several profiling windows is analysed from its events
                # (it has no summary of its own); every other rank must come from its summary
                unread = [r for r, t in rep.traces.ranks.items()
                          if t.summary is None and not t.windows]
                if unread:
                    raise SystemExit(f"{name}: the second report did not read the summaries "
                                     f"of rank(s) {unread}")
        else:
            try:
                rep = analyze(folder, cache=False, comm_kernels=_comm_kernels(folder))
            except PardiagError as exc:
                (out / f"{name}.json").write_text(json.dumps({"error": str(exc)}))
                print(f"wrote {name} (refused)", flush=True)
                continue
        doc = report_json(rep)
        (out / f"{name}.json").write_text(json.dumps(doc, sort_keys=True, indent=1,
                                                     default=str))
        with tempfile.TemporaryDirectory() as tmp:
            rep.to_html(Path(tmp) / "r.html")
            page = (Path(tmp) / "r.html").read_text()
        figs = page_figures(page)
        (out / f"{name}.figures.json").write_text(json.dumps(figs, sort_keys=True, indent=1))
        (out / f"{name}.page.html").write_text(page_text(page))
        print(f"wrote {name} ({len(figs)} figures)", flush=True)


def diff(a, b, path: str = "") -> list[str]:
    """Paths where ``a`` and ``b`` differ (floats to 1e-9 relative; NaN equals NaN)."""
    if path.rsplit(".", 1)[-1] in TIMING_KEYS:
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only in one" for k in sorted(a.keys() ^ b.keys())]
        for k in sorted(a.keys() & b.keys()):
            out += diff(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} vs {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, (int, float)) or \
            isinstance(b, float) and isinstance(a, (int, float)):
        if math.isnan(a) and math.isnan(b) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12):
            return []
        return [f"{path}: {a!r} vs {b!r}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"[:300]]


def compare(before: Path, after: Path) -> int:
    bad = 0
    names = sorted({p.name for d in (before, after) for p in d.iterdir()
                    if p.suffix in (".json", ".html")})
    for name in names:
        a, b = before / name, after / name
        if not (a.exists() and b.exists()):
            print(f"{name}: only in {'before' if a.exists() else 'after'}")
            bad += 1
            continue
        if name.endswith(".html"):
            d = ([] if page_compared(a.read_text()) == page_compared(b.read_text())
                 else ["the page's text differs"])
        else:
            d = diff(json.loads(a.read_text()), json.loads(b.read_text()))
        for line in d[:20]:
            print(f"{name}: {line}")
        bad += bool(d)
    print(f"{len(names) - bad} of {len(names)} files unchanged (report JSON, page figures, "
          f"page text)")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("out", type=Path)
    w.add_argument("--from-summaries", action="store_true",
                   help="report each input from the summaries a first report stored")
    w.add_argument("--as-cli", action="store_true",
                   help="report with the pandas settings of the command line (python_strings)")
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = ap.parse_args()
    if args.cmd == "write":
        write(args.out, args.from_summaries, args.as_cli)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
