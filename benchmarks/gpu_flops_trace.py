"""A small GEMM-heavy training trace for pardiag's FLOP / MFU tests (recorded on a GPU).

    python3 benchmarks/gpu_flops_trace.py --out DIR       # H200: bf16, d=1024, ffn=4096
    python3 benchmarks/gpu_flops_trace.py --out DIR --device cpu --dtype float32 --tiny

Builds a 2-layer pre-norm transformer (QKV / out-proj / FFN as nn.Linear,
torch.nn.functional.scaled_dot_product_attention, causal), random inputs, MSE loss, AdamW.
Runs --warmup untraced then --active traced training steps under torch.profiler
(CPU + CUDA, record_shapes, with_flops, schedule wait=0 warmup=W active=A: one ProfilerStep#N
per step), writes DIR/flops_trace.json.gz (gzipped Chrome trace) and DIR/flops_trace.meta.json
(dims, parameter count, analytic FLOPs, profiler FLOPs, step times, device, versions).
After the profiled steps it times --timed more steps without the profiler (the clean step
time for an MFU).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


class Layer(nn.Module):
    def __init__(self, d: int, ffn: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, ffn)
        self.fc2 = nn.Linear(ffn, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, h, d // h).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Model(nn.Module):
    def __init__(self, d: int, ffn: int, heads: int, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer(d, ffn, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln_f(x))


def analytic_flops(b: int, s: int, d: int, ffn: int, layers: int) -> dict:
    """Matmul FLOPs (2 per multiply-add) of one forward; training = 3x forward."""
    tokens = b * s
    linear_per_layer = 2 * tokens * (d * 3 * d + d * d + 2 * d * ffn)
    attn_per_layer_full = 2 * 2 * b * s * s * d   # QK^T and PV, no causal saving
    head = 2 * tokens * d * d
    fwd_linear = layers * linear_per_layer + head
    fwd_attn_full = layers * attn_per_layer_full
    return {
        "fwd_linear_flops": fwd_linear,
        "fwd_attention_flops_full": fwd_attn_full,
        "fwd_attention_flops_causal_half": fwd_attn_full // 2,
        "fwd_total_flops_full_attention": fwd_linear + fwd_attn_full,
        "train_step_flops_full_attention": 3 * (fwd_linear + fwd_attn_full),
        "train_step_flops_causal_half": 3 * (fwd_linear + fwd_attn_full // 2),
        "train_step_linear_flops": 3 * fwd_linear,
        "convention": "2 FLOPs per multiply-add; backward = 2x forward; "
                      "layernorm/gelu/softmax/optimizer not counted",
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    p.add_argument("--name", default="flops_trace")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--tiny", action="store_true", help="d=64 ffn=256 heads=4 batch=2 seq=32")
    p.add_argument("--d", type=int, default=1024)
    p.add_argument("--ffn", type=int, default=4096)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--active", type=int, default=3)
    p.add_argument("--timed", type=int, default=10, help="unprofiled steps timed afterwards")
    a = p.parse_args()
    if a.tiny:
        a.d, a.ffn, a.heads, a.batch, a.seq = 64, 256, 4, 2, 32
        a.timed = min(a.timed, 3)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    dtype = getattr(torch, a.dtype)
    a.out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    model = Model(a.d, a.ffn, a.heads, a.layers).to(device=dev, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    n_params = sum(q.numel() for q in model.parameters())
    g = torch.Generator().manual_seed(1)
    x = torch.randn(a.batch, a.seq, a.d, generator=g).to(device=dev, dtype=dtype)
    y = torch.randn(a.batch, a.seq, a.d, generator=g).to(device=dev, dtype=dtype)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    def train_step() -> torch.Tensor:
        out = model(x)
        loss = F.mse_loss(out.float(), y.float())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    acts = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    raw = a.out / f"{a.name}.json"
    gz = a.out / f"{a.name}.json.gz"

    def on_ready(prof) -> None:
        prof.export_chrome_trace(str(raw))

    prof_times: list[dict] = []
    total = a.warmup + a.active
    with torch.profiler.profile(
            activities=acts, record_shapes=True, with_flops=True,
            schedule=torch.profiler.schedule(wait=0, warmup=a.warmup, active=a.active,
                                             repeat=1),
            on_trace_ready=on_ready) as prof:
        for i in range(total):
            sync()
            t0 = time.perf_counter()
            loss = train_step()
            sync()
            dt = time.perf_counter() - t0
            prof_times.append({"step": i, "phase": "warmup" if i < a.warmup else "active",
                               "seconds": dt})
            prof.step()
    # the trace is exported when the active window closes; gzip it ourselves (any torch)
    if raw.exists():
        with open(raw, "rb") as src, gzip.open(gz, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        raw_bytes = raw.stat().st_size
        raw.unlink()
    else:
        raw_bytes = None

    prof_flops: dict[str, int] = {}
    try:
        for ev in prof.key_averages():
            f = int(getattr(ev, "flops", 0) or 0)
            if f:
                prof_flops[ev.key] = prof_flops.get(ev.key, 0) + f
    except Exception as exc:  # noqa: BLE001
        prof_flops = {"error": repr(exc)}

    clean: list[float] = []
    for _ in range(a.timed):
        sync()
        t0 = time.perf_counter()
        loss = train_step()
        sync()
        clean.append(time.perf_counter() - t0)

    fl = analytic_flops(a.batch, a.seq, a.d, a.ffn, a.layers)
    med = statistics.median(clean) if clean else None
    info: dict = {
        "model": {"kind": "pre-norm transformer layers: LayerNorm, Linear qkv (d->3d), "
                          "SDPA causal, Linear proj (d->d), LayerNorm, Linear fc1 (d->ffn), "
                          "GELU, Linear fc2 (ffn->d); then LayerNorm + Linear head (d->d)",
                  "d_model": a.d, "ffn": a.ffn, "heads": a.heads, "head_dim": a.d // a.heads,
                  "layers": a.layers, "params": n_params, "bias": True},
        "batch": a.batch, "seq": a.seq, "tokens_per_step": a.batch * a.seq,
        "dtype": a.dtype, "loss": "mse (float32)", "optimizer": "AdamW lr=1e-4",
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if cuda else (platform.processor()
                                                                      or platform.machine()),
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "profiler": {"activities": [str(x) for x in acts], "record_shapes": True,
                     "with_flops": True, "schedule": {"wait": 0, "warmup": a.warmup,
                                                      "active": a.active, "repeat": 1}},
        "trace_file": gz.name if gz.exists() else None,
        "trace_raw_bytes": raw_bytes,
        "trace_gz_bytes": gz.stat().st_size if gz.exists() else None,
        "profiled_step_times": prof_times,
        "clean_step_times_s": clean,
        "clean_step_time_median_s": med,
        "final_loss": float(loss.detach()),
        "analytic_flops": fl,
        "achieved_tflops_causal_half": (fl["train_step_flops_causal_half"] / med / 1e12
                                        if med else None),
        "profiler_flops_by_op": prof_flops,
        "profiler_flops_total_over_active_steps": (sum(prof_flops.values())
                                                   if "error" not in prof_flops else None),
        "profiler_flops_per_active_step": (sum(prof_flops.values()) / a.active
                                           if "error" not in prof_flops and a.active else None),
        "profiler_flops_note": "torch.profiler key_averages() flops (with_flops=True) summed "
                               "over the active steps; SDPA is typically not counted",
    }
    if cuda:
        pr = torch.cuda.get_device_properties(dev)
        info["device_properties"] = {
            "capability": f"{pr.major}.{pr.minor}", "sm_count": pr.multi_processor_count,
            "total_memory_bytes": pr.total_memory}
        info["max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated(dev)
    meta = a.out / f"{a.name}.meta.json"
    meta.write_text(json.dumps(info, indent=1, default=str))
    print(f"flops_trace: {n_params} params, {a.batch}x{a.seq} tokens, {a.dtype} on "
          f"{info['device_name']}; clean step "
          f"{'%.3f ms' % (med * 1e3) if med else 'n/a'}; "
          f"trace {info['trace_gz_bytes']} B gz ({raw_bytes} B raw) -> {gz}; meta -> {meta}")
    return 0 if gz.exists() else 1


if __name__ == "__main__":
    sys.exit(main())
