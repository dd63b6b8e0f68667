"""Synthetic runs for the report tests: a large run (size limits) and a hostile one (escaping)."""

from __future__ import annotations

import json
from pathlib import Path

from .synth import TraceBuilder, record, write_sidecar

#: Strings a hostile trace carries: a script, an image whose error handler runs code, a
#: javascript: link, and a bare javascript: URL. Each sets window.__pwned if it ever runs.
PAYLOADS = (
    "<script>window.__pwned=1</script>",
    '<img src=x onerror="window.__pwned=1">',
    '<a href="javascript:window.__pwned=1">click</a>',
    "javascript:window.__pwned=1",
)
#: Usable in a file or folder name (no slash).
NAME_PAYLOAD = "<img src=x onerror=window.__pwned=1>"


def big_run(out: Path, ranks: int = 64, steps: int = 10, tp: int = 8) -> Path:
    """A pardiag-style CPU run of ``ranks`` ranks × ``steps`` profiler steps with a dp × tp
    layout (tp consecutive ranks per tp group), two nodes, comms records for every collective
    (per step 4 tp all-reduces and 2 dp all-reduces; rank 13 arrives late), static memory and
    100 memory events per rank."""
    out.mkdir(parents=True, exist_ok=True)
    dp = ranks // tp
    tp_groups = [list(range(g * tp, (g + 1) * tp)) for g in range(dp)]
    dp_groups = [list(range(i, ranks, tp)) for i in range(tp)]
    pgs = ([{"name": f"tp{g}", "desc": "mesh_tp", "ranks": m, "dim": "tp"}
            for g, m in enumerate(tp_groups)]
           + [{"name": f"dp{g}", "desc": "mesh_dp", "ranks": m, "dim": "dp"}
              for g, m in enumerate(dp_groups)])
    write_sidecar(out / "run.json", "run", None, {
        "command": "pardiag profile train.py", "world_size": ranks, "exit_code": 0,
        "nodes": {"node0": list(range(ranks // 2)), "node1": list(range(ranks // 2, ranks))},
        "layout": {"dims": {"dp": dp, "tp": tp}, "strategies": ["fsdp2", "tp"]},
        "backend": "gloo"})
    for r in range(ranks):
        b = TraceBuilder(rank=r, world_size=ranks, backend="gloo", pid=1000 + r)
        b.thread_name(1, "thread 1 (python3)").thread_name(2, "thread 2 (pt_gloo_runloop)")
        recs = []
        my_tp = f"tp{r // tp}"
        my_dp = f"dp{r % tp}"
        late = 40.0 if r == 13 else 0.0
        for s in range(steps):
            t0 = 1000.0 * s
            b.step(s + 1, t0, 1000)
            b.cpu("aten::mm", t0 + 5, 300 + (r % 7) * 10)
            for j in range(4):
                a, e = t0 + 320 + 80 * j + late + r % 3, t0 + 390 + 80 * j  # all leave at e
                b.cpu("gloo:all_reduce", a, e - a, tid=2, cat="user_annotation")
                recs.append(record("all_reduce", s * 4 + j, a, e, pg=my_tp,
                                   ranks=tp_groups[r // tp], nbytes=1 << 20))
            for j in range(2):
                a, e = t0 + 700 + 120 * j + late + r % 5, t0 + 800 + 120 * j
                b.cpu("gloo:all_reduce", a, e - a, tid=2, cat="user_annotation")
                recs.append(record("all_reduce", s * 2 + j, a, e, pg=my_dp,
                                   ranks=dp_groups[r % tp], nbytes=4 << 20))
            b.cpu("aten::add_", t0 + 720, 150)
            for k in range(10):
                b.events.append({"ph": "i", "s": "t", "cat": "cpu_instant_event",
                                 "name": "[memory]", "pid": b.pid, "tid": 1,
                                 "ts": t0 + 100 * k,
                                 "args": {"Total Allocated": (1 << 20) * (10 + k + r % 4),
                                          "Total Reserved": 0, "Bytes": 1 << 20,
                                          "Device Type": 0, "Device Id": -1}})
        b.write(out / f"rank{r}.trace.json.gz", gz=True)
        write_sidecar(out / f"rank{r}.comms.json", "comms", r,
                      {"process_groups": pgs, "records": recs})
        write_sidecar(out / f"rank{r}.meta.json", "rank", r, {
            "world_size": ranks, "host": "node0" if r < ranks // 2 else "node1",
            "memory": {"static": {"params_bytes": 4 << 20, "grads_bytes": 4 << 20,
                                  "optimizer_state_bytes": 8 << 20, "total_bytes": 16 << 20},
                       "peak_rss_bytes": 300 << 20}})
    return out


def hostile_run(parent: Path) -> Path:
    """Two ranks whose folder, file names, thread names, event names, process groups, layout,
    pipeline phases, run command and failure messages carry :data:`PAYLOADS`."""
    out = parent / f"run {NAME_PAYLOAD}"
    out.mkdir(parents=True)
    p_script, p_img, p_link, p_js = PAYLOADS
    groups = [{"name": p_script, "desc": p_img, "ranks": [0, 1], "dim": p_link}]
    write_sidecar(out / "run.json", "run", None, {
        "command": f"train.py {p_script} {p_link}", "world_size": 2, "exit_code": 1,
        "failed_ranks": {"1": f"RuntimeError: {p_img}"},
        "layout": {"dims": {p_js: 2}, "strategies": [p_script],
                   "pipeline": {"schedule": p_img, "stages": 2, "microbatches": 2}},
        "nodes": {p_img: [0, 1]}})
    for r in range(2):
        b = TraceBuilder(rank=r, world_size=2, backend=p_script, pid=100 + r)
        b.thread_name(1, p_img).thread_name(2, f"{p_script} gloo")
        info = b.doc()["distributedInfo"]
        info["pg_config"] = [{"pg_name": p_link, "pg_desc": f"mesh_{p_script}",
                              "ranks": [0, 1]}]
        recs = []
        for s in range(3):
            t0 = 1000.0 * s
            b.step(s + 1, t0, 1000)
            b.cpu(p_img, t0 + 10, 300)
            b.cpu(f"aten::{p_script}", t0 + 320, 50)
            a, e = t0 + 400 + 30 * r, t0 + 600
            b.cpu(f"gloo:{p_script}", a, e - a, tid=2, cat="user_annotation")
            b.cpu(f"c10d::{p_link}", a, 5)
            recs.append(record(p_script, s, a, e, pg=p_script, ranks=(0, 1), nbytes=1 << 20))
            recs.append(record(p_link, 100 + s, t0 + 700, t0 + 750 + 20 * r, pg=p_script,
                               ranks=(0, 1), nbytes=1 << 16))
        doc = b.doc()
        doc["distributedInfo"]["pg_config"] = info["pg_config"]
        doc["traceName"] = p_link
        name = f"rank{r} {NAME_PAYLOAD}.json"
        (out / name).write_text(json.dumps(doc))
        write_sidecar(out / f"rank{r}.comms.json", "comms", r,
                      {"process_groups": groups, "records": recs})
        write_sidecar(out / f"rank{r}.pipeline.json", "pipeline", r, {"records": [
            {"stage": r, "microbatch": m, "phase": ph, "optimizer_step": s,
             "start_us": 1000.0 * s + 10 + 100 * m + (200 if ph != "F" else 0) + 50 * r,
             "end_us": 1000.0 * s + 60 + 100 * m + (200 if ph != "F" else 0) + 50 * r,
             "profiled": True}
            for s in range(3) for m in range(2) for ph in ("F", p_script)]})
        write_sidecar(out / f"rank{r}.meta.json", "rank", r, {
            "world_size": 2, "host": p_img,
            "memory": {"static": {"params_bytes": 1 << 20, "grads_bytes": 1 << 20,
                                  "optimizer_state_bytes": 2 << 20, "total_bytes": 4 << 20}}})
    return out


def hostile_recommendations():
    """A RecommendationResult whose every string field carries the payloads."""
    from pardiag.analyzer.predict.recommend import Recommendation, RecommendationResult

    p_script, p_img, p_link, p_js = PAYLOADS
    rec = Recommendation(kind="straggler", title=f"Fix {p_script}", change=p_link,
                         evidence=(p_img, p_js), caveats=(p_script,),
                         measured_step_us=1000.0, predicted_step_us=800.0, gain_pct=20.0,
                         measured_peak_bytes=float(3 << 20), predicted_peak_bytes=None)
    return RecommendationResult(verdict=f"verdict {p_img}", recommendations=(rec,),
                                rejected=(rec,), why_none="")
