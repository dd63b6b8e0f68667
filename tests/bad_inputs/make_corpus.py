"""Write the bad-input corpus next to this script (the files are committed; rerun to rebuild).

    .venv/bin/python tests/bad_inputs/make_corpus.py

Each case is one file or one folder in ``tests/bad_inputs/``; what ``pardiag report`` must do with
it is the table in ``tests/test_bad_inputs.py``. Every file is small (< 4 kB). The good trace the
cases start from is :func:`base`: two profiler steps, a compute kernel and an all-reduce kernel
overlapping by 10 µs per step (overlap 33.33 % of communication).
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent


def base(rank: int | None = 0, world: int = 2, t0: float = 1000.0) -> dict:
    """A tiny, valid GPU trace: steps #1 [t0, t0+100) and #2 [t0+100, t0+200); per step a
    compute kernel of 30 µs and an NCCL all-reduce of 30 µs overlapping it by 10 µs."""
    ev = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}}]
    corr = 0
    for s in (1, 2):
        lo = t0 + (s - 1) * 100
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 1,
                   "tid": 1, "ts": lo, "dur": 100})
        for name, k0, stream in (("void gemm_kernel<float>(float*)", lo + 10, 7),
                                 ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)", lo + 30,
                                  20)):
            corr += 1
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
                       "tid": 1, "ts": lo + corr, "dur": 1, "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream,
                       "ts": k0, "dur": 30.0,
                       "args": {"stream": stream, "correlation": corr, "device": 0}})
    doc = {"schemaVersion": 1, "traceEvents": ev, "displayTimeUnit": "ms"}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world}
    return doc


def dumps(doc) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def cases() -> dict[str, bytes | dict[str, bytes]]:
    """``{name: bytes}`` for a single file, ``{name: {file: bytes}}`` for a folder."""
    good = dumps(base())
    c: dict[str, bytes | dict[str, bytes]] = {}

    # -- files that cannot be read: one-line error, exit 2 ----------------------------------------
    c["truncated.json.gz"] = gzip.compress(good)[:-40]
    c["truncated.json"] = good[: len(good) // 2]
    c["empty.json"] = b""
    c["whitespace_only.json"] = b" \n\t\n"
    c["empty.json.gz"] = gzip.compress(b"")
    c["gzip_of_garbage.json.gz"] = gzip.compress(b"\x00\x01 this is not json")
    c["binary_garbage.json"] = bytes(range(256)) * 4
    c["not_a_trace.json"] = dumps({"name": "a config file", "values": [1, 2, 3]})
    c["top_level_list.json"] = dumps([{"ph": "X", "ts": 1, "dur": 1}])
    c["top_level_number.json"] = b"42"
    c["top_level_list_of_numbers.json"] = b"[1, 2, 3]"
    c["top_level_empty_list.json"] = b"[]"
    # the Array form's closing bracket may be left out, after any amount of leading whitespace
    c["unclosed_list_after_whitespace.json"] = (b" " * 100 + b"\n" + dumps(
        [{"ph": "X", "ts": 1, "dur": 1}])[:-1] + b",\n")
    c["trace_events_not_list.json"] = dumps({"traceEvents": {"ph": "X"}})
    c["deeply_nested.json"] = b'{"traceEvents": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    c["sidecars_only"] = {"readme.txt": b"no traces here\n",
                          "settings.json": dumps({"lr": 0.1})}

    # -- readable with something wrong: a report plus a warning ------------------------------------
    d = base(rank=0)
    d2 = base(rank=0)
    c["duplicate_ranks"] = {"a.json": dumps(d), "b.json": dumps(d2)}
    c["mixed_world_sizes"] = {"rank0.json": dumps(base(rank=0, world=2)),
                              "rank1.json": dumps(base(rank=1, world=4))}
    d = base()
    for e in d["traceEvents"]:
        if "ts" in e:
            e["ts"] = str(e["ts"])
    c["ts_as_string.json"] = dumps(d)
    d = base()
    c["ts_scientific.json"] = dumps(d).replace(b'"ts":1000.0', b'"ts":1.0e3').replace(
        b'"ts":1100.0', b'"ts":1.1E+3')
    d = base(t0=1_700_000_000_000_000.0)
    for e in d["traceEvents"]:
        if "ts" in e:
            e["ts"] = int(e["ts"] * 1000)
            e["dur"] = int(e["dur"] * 1000)
    d["displayTimeUnit"] = "ns"
    c["ns_display_unit.json"] = dumps(d)
    d = base()
    d["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "bad_kernel", "pid": 0, "tid": 7,
                             "ts": 1050, "dur": -30, "args": {"stream": 7}})
    c["negative_dur.json"] = dumps(d)
    d = base()
    d["traceEvents"] += [
        {"ph": "X", "cat": "kernel", "name": "no_ts", "pid": 0, "tid": 7, "dur": 5},
        {"ph": "X", "cat": "kernel", "name": "no_dur", "pid": 0, "tid": 7, "ts": 1199},
        {"ph": "X", "cat": "kernel", "ts": 1190, "dur": 1, "pid": 0, "tid": 7},  # no name
        {"name": "no_ph", "ts": 1100, "dur": 1},
        {"ph": "X", "name": "no_cat_no_pid", "ts": 1101, "dur": 1},
    ]
    c["missing_fields.json"] = dumps(d)
    text = dumps(base()).decode()
    text = text.replace('"traceEvents":[', '"traceEvents":[{"ph":"X","cat":"kernel","name":"k_nan",'
                        '"pid":0,"tid":7,"ts":NaN,"dur":1,"args":{"stream":7}},{"ph":"X",'
                        '"cat":"kernel","name":"k_inf","pid":0,"tid":7,"ts":1001,"dur":Infinity,'
                        '"args":{"stream":7,"occupancy":-inf}},', 1)
    c["nan_inf.json"] = text.encode()
    text = dumps(base()).decode().replace(
        '"traceEvents":[', '"traceEvents":[{"ph":"X","cat":"kernel","name":"k_huge","pid":0,'
        '"tid":7,"ts":123456789012345678901234567890,"dur":1,"args":{"stream":7,'
        '"correlation":99999999999999999999999}},{"ph":"X","cat":"cpu_op","name":"op_huge_pid",'
        '"pid":18446744073709551616,"tid":1,"ts":1001,"dur":1},', 1)
    c["int_above_int64.json"] = text.encode()
    c["invalid_utf8.json"] = good.replace(b"gemm_kernel", b"gemm\xff\xfe_kernel", 1)
    c["control_characters.json"] = good.replace(b"gemm_kernel", b"gemm\x01\x07\x1f_kernel", 1)
    c["nul_in_string.json"] = good.replace(b"gemm_kernel", b"gemm\\u0000_kernel", 1)
    d = base(t0=1_694_128_201_000_000.0)
    d["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "void gemm_kernel<float>(float*)",
                             "pid": 0, "tid": 7, "ts": 0, "dur": 0, "args": {"stream": 7}})
    c["events_at_ts0.json"] = dumps(d)
    d = base()
    d["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "void relu_kernel(float*)",
                             "pid": 0, "tid": 7, "ts": 1039.998, "dur": 5,
                             "args": {"stream": 7}})
    c["overlapping_same_stream.json"] = dumps(d)
    d = base()
    d["traceEvents"] = [e for e in d["traceEvents"] if not e["name"].startswith("ProfilerStep")]
    c["no_profiler_step.json"] = dumps(d)
    d = base()
    d["traceEvents"] = [e for e in d["traceEvents"] if e.get("ts", 0) < 1100]
    c["single_step.json"] = dumps(d)
    d = base()
    d["traceEvents"] = [e for e in d["traceEvents"] if "nccl" not in e["name"]]
    c["no_communication.json"] = dumps(d)
    empty = base(rank=1)
    empty["traceEvents"] = []
    c["rank_without_events"] = {"rank0.json": good, "rank1.json": dumps(empty)}
    d = base()
    d["traceEvents"] = [e for e in d["traceEvents"] if e["ph"] != "X"]
    c["only_metadata_events.json"] = dumps(d)
    d = base()
    d["traceEvents"] += [1, "text", None, [1, 2]]
    c["events_not_objects.json"] = dumps(d)
    c["utf8_bom.json"] = b"\xef\xbb\xbf" + good
    c["gzip_named_json.json"] = gzip.compress(good)
    c["plain_named_gz.json.gz"] = good
    d = base()
    d["distributedInfo"]["rank"] = "zero"
    c["rank_not_a_number.json"] = dumps(d)
    d = base()
    d["distributedInfo"]["rank"] = -3
    c["negative_rank.json"] = dumps(d)
    d = base()
    for e in d["traceEvents"]:
        if e.get("cat") == "kernel":
            e["args"] = ["not", "a", "dict"]
    c["args_not_a_dict.json"] = dumps(d)
    d = base()
    for e in d["traceEvents"]:
        if e.get("ph") == "X":
            e["pid"], e["tid"] = {"x": 1}, [2]
            e["name"] = 12345 if e["cat"] == "cuda_runtime" else e["name"]
    c["odd_field_types.json"] = dumps(d)
    d = base()
    d["traceEvents"].append({"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]",
                             "pid": 1, "tid": 1, "ts": 1050,
                             "args": {"Total Allocated": "lots", "Device Type": "gpu"}})
    c["bad_memory_event.json"] = dumps(d)
    c["one_bad_one_good"] = {"rank0.json": good, "rank1.json.gz": gzip.compress(good)[:30]}
    d = base()
    d["traceEvents"][1]["dur"] = 1e308
    d["traceEvents"][1]["ts"] = 1e308
    c["huge_float.json"] = dumps(d)
    d = base()
    d["traceEvents"] = list(reversed(d["traceEvents"]))
    c["unsorted_events.json"] = dumps(d)
    d = base()
    d["traceEvents"][1]["ts"] = True
    d["traceEvents"][2]["dur"] = "ten"
    c["bool_and_word_numbers.json"] = dumps(d)
    return c


def main() -> None:
    for p in HERE.iterdir():
        if p.name in ("make_corpus.py", "__pycache__", "README.md"):
            continue
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    for name, content in cases().items():
        if isinstance(content, dict):
            (HERE / name).mkdir()
            for fname, data in content.items():
                (HERE / name / fname).write_bytes(data)
        else:
            (HERE / name).write_bytes(content)
    print(f"wrote {len(cases())} cases to {HERE}")


if __name__ == "__main__":
    main()
