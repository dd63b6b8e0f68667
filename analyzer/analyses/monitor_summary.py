"""The summary of a monitored run (``pardiag profile --monitor``): its JSON (:func:`summary`:
the ranks, the step time, the findings of :mod:`.monitored`, the notes, the deep captures it
asked for) and a finding in one line (:func:`finding_line`), as the terminal, the page and the
trackers print it.
"""

from __future__ import annotations

from pathlib import Path

from pardiag import layout

from .monitor_run import (
    capture_request,
    captures,
    ending_notes,
    mark_open,
    own_record,
    requested_captures,
)
from .monitored import MonitorData, capture_steps, findings


def finding_line(f: dict) -> str:
    """One line per finding, as the terminal and the log print it."""
    span = f"steps {f.get('first_step')}–{f.get('last_step')}"
    if f["kind"] == "straggler":
        what = ("persistent straggler" if f["persistent"] else
                "straggler until the last recorded step" if f.get("until_last_step")
                else "transient straggler")
        where = "over the run" if f.get("baseline_over_run") else "in the run's other steps"
        return (f"rank {f['rank']}: {what}, {span} ({f['steps']} steps late): arrives "
                f"{f['extra_delay_ms']:.1f} ms after the other ranks; step {f['step_ms']:.1f} ms "
                f"against {f['baseline_step_ms']:.1f} ms {where} (lateness counted above "
                f"{f['threshold_ms']:.1f} ms, the noise's bound)")
    if f["kind"] == "slow_steps":
        why = (f"; rank {f['straggler_rank']} was late then" if f["straggler_rank"] is not None
               else f"; DataLoader {f['data_ms']:.1f} ms against {f['baseline_data_ms']:.1f} ms"
               if f["data_ms"] > f["baseline_data_ms"] + 0.5 * (f["step_ms"]
                                                                - f["baseline_step_ms"])
               else "; the run has one rank: no other rank's arrivals to compare"
               if f.get("ranks") == 1
               else "; no rank was late: every rank slowed" if f.get("arrivals_known", True)
               else "; which rank slowed is not known: the ranks shared no collective then to "
                    "compare their arrivals at (a pipeline's sends and receives are not "
                    "monitored)")
        return (f"slow steps {f['first_step']}–{f['last_step']}: {f['step_ms']:.1f} ms against "
                f"{f['baseline_step_ms']:.1f} ms{why}")
    return (f"rank {f['rank']}: {f['memory']} memory grows {f['bytes_per_1k_steps'] / 2**20:.1f} "
            f"MiB per 1,000 steps ({f['first_bytes'] / 2**20:.0f} → "
            f"{f['last_bytes'] / 2**20:.0f} MiB)")


def summary(data: MonitorData, run_dir: Path | None = None) -> dict:
    """The JSON of a monitored run: ``ranks``, ``steps``, ``step_ms`` (median, p10, p90 of the
    per-step median over ranks), ``findings`` (:func:`findings`), ``notes``, and the deep
    captures in ``run_dir`` that the run asked for (:func:`captures`, each with the
    ``last_step`` asked for; none without ``run_dir``)."""
    per = data.steps.groupby("step")["dur_us"].median() / 1e3
    notes = list(data.notes)
    found = findings(data, notes)
    last_step = int(data.steps["step"].max()) if len(data.steps) else None
    caps, late = (_asked_captures(run_dir, notes, last_step) if run_dir is not None
                  else ([], []))
    notes += ending_notes(run_dir, last_step) if run_dir is not None else []
    # a deep capture's own steps are not judged: a finding up to the last judged step is open
    # where the run stopped during or just after a capture
    judged = set(data.steps["step"].astype(int)) - capture_steps(data.captures)
    mark_open(found, max(judged) if judged else last_step, run_dir)
    for c in caps:   # the asked-for captures only, the others left out
        first, last = c["first_step"], c["last_step"]
        if last_step is not None and first <= last_step < last and c["ranks"]:
            notes.append(f"the deep capture of steps {first}–{last} was cut short by the run's "
                         f"end: it holds steps {first}–{last_step} at most")
        inside, line = capture_against(first, last, found)
        if not inside:
            notes.append(f"the deep capture of steps {first}–{last} {line}")
    notes += late
    said = said_findings(run_dir, found, notes) if run_dir is not None else []
    return {
        "ranks": sorted(int(r) for r in data.steps["rank"].unique()),
        "steps": int(data.steps["step"].nunique()),
        "step_ms": ({"median": round(float(per.median()), 3),
                     "p10": round(float(per.quantile(0.1)), 3),
                     "p90": round(float(per.quantile(0.9)), 3)} if len(per) else None),
        "collectives": int(len(data.calls)),
        "findings": found, "notes": notes, "captures": caps, "said": said}


def capture_against(first: int, last: int, found: list[dict]) -> tuple[bool, str]:
    """Where a deep capture of steps ``first``–``last`` lies against the run's ``found``
    (:func:`~.monitored.findings`): whether it overlaps a straggler's or slow steps' period,
    and the words that say so after "the deep capture of steps S–E" (the overlapped
    findings' :func:`finding_line`; else that it lies outside every finding, or that the whole
    run confirms none). A capture starts some steps after the finding that asked for it was
    detected (at a step boundary, after the ranks agreed), so a short finding may be over."""
    periods = [f for f in found if f["kind"] in ("straggler", "slow_steps")]
    if not periods:
        return False, ("was asked for by a finding the whole run does not confirm (the monitor "
                       "judged the steps up to then): it shows the run as it was then")
    # a finding still open at the last recorded step reaches any capture after it
    inside = [f for f in periods if f["first_step"] <= last
              and (first <= f["last_step"] or f.get("until_last_step"))]
    if not inside:
        return False, ("lies outside every finding's steps (the finding that asked for it ended "
                       "first): it shows the run as it was then, not the finding")
    return True, "lies inside the run's finding: " + "; ".join(map(finding_line, inside))


def said_findings(run_dir: Path, found: list[dict], notes: list[str]) -> list[dict]:
    """The findings the launcher said while the run went on
    (:func:`pardiag.layout.said_findings_path`), each with ``confirmed``: a finding of the whole
    run (``found``) of its kind overlaps its steps — a straggler's of the same rank; slow steps
    by any slow period or straggler. The launcher judged the steps up to then against their own
    noise; the whole run's noise and baseline can leave such a period out, and a note (into
    ``notes``) then says so, so that a line the user saw is never silently withdrawn. Lines
    that cannot be read are counted in a note."""
    import orjson

    path = layout.said_findings_path(run_dir)
    try:
        raw = path.read_bytes()
    except OSError:
        return []
    out, bad = [], 0
    for line in raw.splitlines():
        try:
            rec = orjson.loads(line)
            kind, first, last = rec["kind"], int(rec["first_step"]), int(rec["last_step"])
        except (ValueError, KeyError, TypeError):
            bad += 1
            continue
        over = [f for f in found if f["kind"] in ("straggler", "slow_steps")
                and f["first_step"] <= max(first, last) and first <= f["last_step"]
                and (kind != "straggler" or (f["kind"] == "straggler"
                                             and f["rank"] == rec.get("rank")))]
        out.append({**rec, "confirmed": bool(over)})
        if not over:
            notes.append(f"said during the run, \"{rec.get('line', kind)}\", is not a finding of "
                         f"the whole run: judged against every step's noise and baseline, not "
                         f"only those up to then, steps {first}–{max(first, last)} do not stand "
                         f"out")
    if bad:
        notes.append(f"{bad} line(s) of {path} could not be read: the findings said then are "
                     f"not weighed")
    return out


def capture_in_run(capture: dict) -> str | None:
    """Of a deep capture reported alone (:attr:`~pardiag.analyzer.trace.TraceSet.capture`),
    where it lies against its monitored run's findings (:func:`capture_against`, the whole
    run's findings as its report gives them); None when the run is not found, or its monitor
    records cannot be read (the capture's report says so already, or the run's does)."""
    from pardiag.errors import PardiagError

    from .monitored import load_monitor

    if not capture.get("monitored_run_found"):
        return None
    run = Path(capture["monitored_run"])
    try:
        data = load_monitor(run)
    except (PardiagError, OSError):
        return None
    if not len(data.steps):
        return None
    found = findings(data, [])
    mark_open(found, int(data.steps["step"].max()), run)
    return capture_against(int(capture["first_step"]), int(capture["last_step"]), found)[1]


def _asked_captures(run_dir: Path, notes: list[str], last_step: int | None
                    ) -> tuple[list[dict], list[str]]:
    """The deep captures in ``run_dir`` (:func:`captures`) that its request asked for, each
    with its ``last_step``; a folder not asked for (an earlier run's) is left out with a note
    (into ``notes``). Also the notes of each capture asked for and not in the folder: not
    written where the run's last recorded step (``last_step``) is not past the capture's last
    (a rank writes its traces there), else moved, deleted or failed to be written."""
    asked = dict(requested_captures(capture_request(run_dir)))
    problem = layout.capture_request_problem(run_dir)
    if problem:
        notes.append(f"{problem}: each deep capture is taken from its own run file, when that "
                     f"names this run")
    caps = []
    for c in captures(run_dir):
        if c["first_step"] in asked:
            caps.append({**c, "last_step": asked[c["first_step"]]})
            continue
        rec = own_record(run_dir, c["folder"]) if problem else None
        if rec is not None:
            caps.append({**c, "last_step": rec["last_step"]})
            continue
        notes.append(f"{c['folder']} is not this run's deep capture (" + (
            "this run asked for steps " + ", ".join(f"{a}–{b}" for a, b in asked.items())
            if asked else "this run asked for none") + "): left out")
    written = {c["first_step"] for c in caps if c["ranks"]}
    late = [f"the deep capture asked for steps {a}–{b} was not written: the run ended before "
            f"it or while it recorded (a capture's traces are written at its last step)"
            if last_step is None or last_step <= b else
            f"the deep capture asked for steps {a}–{b} is not in the run folder "
            f"({layout.capture_dir(run_dir, a).name}/), though the run went on to step "
            f"{last_step}: moved or deleted since, or the ranks could not write it (their "
            f"lines in the run's output say why)"
            for a, b in asked.items() if a not in written]
    return caps, late
