"""torchtitan 0.2.2: its Llama 3 debug model on CPU with gloo, torchtitan itself unmodified.

The script builds a tiny tokenizer and text dataset (once, offline), applies the CPU shims
listed below, and calls torchtitan's own entry point (``torchtitan.train.main(Trainer)``, what
``python -m torchtitan.train`` runs) with the options after ``--``, on top of defaults that
keep a run short: ``llama3`` ``debugmodel`` (dim 256, 6 layers, 16 heads, vocab 2048, SDPA),
6 steps, 4 sequences of 128 tokens per rank, seed 0, no activation checkpointing, no checkpoints,
no compile, float32 compute under FSDP (not bfloat16, slow on most CPUs), torchtitan's profiler
off. Any torchtitan option given overrides the default.

    pip install torchtitan==0.2.2

FSDP2, 2 ranks::

    torchrun --nproc-per-node 2 examples/frameworks/train_torchtitan.py -- \\
        --parallelism.data-parallel-shard-degree 2

FSDP2 x tensor parallel, 4 ranks (2 x 2)::

    torchrun --nproc-per-node 4 examples/frameworks/train_torchtitan.py -- \\
        --parallelism.data-parallel-shard-degree 2 --parallelism.tensor-parallel-degree 2

Pipeline parallel, 2 ranks, 2 stages per rank (4 stages), 4 microbatches::

    torchrun --nproc-per-node 2 examples/frameworks/train_torchtitan.py -- \\
        --parallelism.pipeline-parallel-degree 2 \\
        --parallelism.pipeline-parallel-schedule Interleaved1F1B

Under pardiag: ``pardiag profile examples/frameworks/train_torchtitan.py --nproc-per-node 2
-- <the same options>``. With torchtitan's own profiler instead (steps 5-6 recorded), add
``--job.dump-folder DIR --profiling.enable-profiling --profiling.profile-freq 6
--profiling.profiler-warmup 1 --profiling.profiler-active 2``; the traces are
``DIR/profile_traces/iteration_6/rank{R}_trace.json`` (``pardiag report`` takes that folder).

``train_torchtitan.py --assets DIR -- <options>`` puts the tokenizer, the dataset and
torchtitan's dump folder in DIR instead of ``~/.cache/pardiag-examples/torchtitan``.

CPU shims (monkeypatches made before torchtitan is imported or the trainer is built):

1. device type: ``torchtitan.tools.utils`` picks ``_get_available_device_type() or "cuda"`` at
   import, i.e. "cuda" on a CPU-only torch; it gets "cpu" (so CPU tensors and gloo).
2. device module: torchtitan's memory monitor calls ``torch.cuda``-only functions
   (``get_device_name``, ``get_device_properties``, ``memory_stats``, ...) on its device
   module; it gets ``torch.cpu`` plus those (peak memory: the process's peak RSS).
3. triton: ``torchtitan.models.moe.kernels`` (imported by every model) imports triton for CUDA
   MoE kernels the dense Llama never runs; CPU torch has no triton. That one module gets a stub.
4. FSDP2 on gloo: torchtitan sets the gradient divide factor to 1, so FSDP2 reduce-scatters
   with ``PREMUL_SUM``, which gloo lacks (as it lacks ``AVG``); FSDP2 is told to reduce with
   ``SUM`` and scale separately (same gradients).
5. profiler: torchtitan's profiler passes ``[CPU, None]`` as activities when there is no GPU;
   ``torch.profiler.profile`` rejects ``None``, so ``None`` entries are dropped.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import platform
import random
import resource
import shutil
import sys
import tempfile
import types
from pathlib import Path

import torch

# no network: the tokenizer and the dataset are local
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

DEFAULT_ASSETS = Path.home() / ".cache" / "pardiag-examples" / "torchtitan"


def defaults(assets: Path) -> list[str]:
    """torchtitan options for a short CPU run; the user's options override them."""
    return [
        "--model.name", "llama3", "--model.flavor", "debugmodel",
        "--model.hf-assets-path", str(assets / "tokenizer"),
        "--training.dataset", "c4_test", "--training.dataset-path", str(assets / "c4_test"),
        "--training.steps", "6", "--training.local-batch-size", "4", "--training.seq-len", "128",
        "--lr-scheduler.warmup-steps", "2",
        "--activation-checkpoint.mode", "none",
        # FSDP computes in bfloat16 by default: on a CPU without bfloat16 units a matmul is
        # an order of magnitude slower than in float32 (8 vs 128 ms for 512×256 @ 256×768)
        "--training.mixed-precision-param", "float32",
        "--metrics.log-freq", "1", "--metrics.disable-color-printing",
        "--debug.seed", "0",
        "--job.dump-folder", str(assets / "outputs"),
    ]


# ----------------------------------------------------------------------------- CPU shims
class _CpuDeviceModule(types.ModuleType):
    """Shim 2: torch.cpu plus the memory queries torchtitan makes of torch.cuda. Peak memory is
    the process's peak resident set size (it cannot be reset), capacity the machine's RAM."""

    def __init__(self) -> None:
        super().__init__("torchtitan_cpu_device_module")

    def __getattr__(self, name: str):
        return getattr(torch.cpu, name)

    @staticmethod
    def current_device() -> int:  # torch.cpu's says "cpu"; barrier(device_ids=[...]) wants an int
        return 0

    @staticmethod
    def get_device_name(device=None) -> str:
        return platform.processor() or platform.machine() or "cpu"

    @staticmethod
    def get_device_properties(device=None) -> types.SimpleNamespace:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return types.SimpleNamespace(name=_CpuDeviceModule.get_device_name(), total_memory=ram)

    @staticmethod
    def memory_stats(device=None) -> dict:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return {"active_bytes.all.peak": peak, "reserved_bytes.all.peak": peak}

    @staticmethod
    def reset_peak_memory_stats(device=None) -> None:
        pass

    @staticmethod
    def empty_cache() -> None:
        pass


class _WithTritonStub(importlib.abc.MetaPathFinder):
    """Shim 3: finds module ``name`` as usual, but executes it with a stub ``triton`` in
    ``sys.modules`` (removed right after), so torch itself never mistakes it for triton."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        exec_module = spec.loader.exec_module

        def exec_with_stub(module) -> None:
            triton = types.ModuleType("triton")
            triton.jit = lambda fn=None, **kw: fn if fn is not None else (lambda f: f)
            triton.language = types.ModuleType("triton.language")
            triton.language.__getattr__ = lambda attr: None  # tl.constexpr in annotations
            sys.modules.update({"triton": triton, "triton.language": triton.language})
            try:
                exec_module(module)
            finally:
                del sys.modules["triton"], sys.modules["triton.language"]

        spec.loader.exec_module = exec_with_stub
        return spec


@contextlib.contextmanager
def import_shims():
    """Shims 1-3, active while torchtitan is imported. ``torchtitan.tools.utils`` keeps the
    device functions it imported, so torchtitan (and only torchtitan) stays on "cpu"."""
    from torch import _utils

    real_type, real_module = _utils._get_available_device_type, _utils._get_device_module
    # 1: "cpu", not torchtitan's fallback "cuda", when there is no accelerator
    _utils._get_available_device_type = lambda: real_type() or "cpu"
    # 2: torch.cpu plus the torch.cuda memory queries torchtitan's memory monitor makes
    _utils._get_device_module = lambda device_type=None: (
        _CpuDeviceModule() if device_type == "cpu" else real_module(device_type))
    stub = None
    if importlib.util.find_spec("triton") is None:  # 3: a stub triton for the MoE kernels module
        stub = _WithTritonStub("torchtitan.models.moe.kernels")
        sys.meta_path.insert(0, stub)
    try:
        yield
    finally:
        _utils._get_available_device_type = real_type
        _utils._get_device_module = real_module
        if stub is not None:
            sys.meta_path.remove(stub)


def runtime_shims() -> None:
    """Shims 4 and 5 (CPU runs only)."""
    from torch.distributed.fsdp import FSDPModule

    set_factor = FSDPModule.set_gradient_divide_factor

    @functools.wraps(set_factor)
    def set_gradient_divide_factor(self, factor: float) -> None:
        set_factor(self, factor)
        self.set_force_sum_reduction_for_comms(True)  # 4: SUM, not PREMUL_SUM (gloo)

    FSDPModule.set_gradient_divide_factor = set_gradient_divide_factor

    profile_init = torch.profiler.profile.__init__

    @functools.wraps(profile_init)
    def profile(self, *args, activities=None, **kwargs) -> None:
        if activities is not None:  # 5: torchtitan's [CPU, None] without a GPU
            activities = [a for a in activities if a is not None]
        profile_init(self, *args, activities=activities, **kwargs)

    torch.profiler.profile.__init__ = profile


# ----------------------------------------------------------------------------- assets
WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at "
         "which but have an they you were her she there been one all we their has would when if "
         "so no will more out up into do any your what time can only other new some could these "
         "two may first then them over such like our also after back most made well way even "
         "model train token layer shard tensor pipeline stage gradient memory rank step").split()


def build_assets(root: Path) -> None:
    """Write, once, a byte-level BPE tokenizer (256 bytes + BOS/EOS, no merges, so nothing to
    train) in the Hugging Face layout ``--model.hf-assets-path`` expects, and a JSON-lines text
    dataset that torchtitan's ``c4_test`` loader reads from ``--training.dataset-path``.
    Ranks starting together each build into a private folder; the first rename wins."""
    if (root / "done").exists():
        return
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        tmp.chmod(0o755)
        alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
        tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>"])
        (tmp / "tokenizer").mkdir()
        tok.save(str(tmp / "tokenizer" / "tokenizer.json"))
        (tmp / "tokenizer" / "tokenizer_config.json").write_text(json.dumps({
            "bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
            "add_bos_token": True, "add_eos_token": True}))

        rng = random.Random(0)
        (tmp / "c4_test").mkdir()
        with open(tmp / "c4_test" / "data.json", "w") as f:
            for _ in range(2000):
                text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 160)))
                f.write(json.dumps({"text": text.capitalize() + "."}) + "\n")
        (tmp / "done").touch()
        with contextlib.suppress(OSError):  # OSError: another rank renamed first
            tmp.rename(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not (root / "done").exists():
        raise RuntimeError(f"{root} exists but is not an assets folder of this script")


# ----------------------------------------------------------------------------- main
def _option(arg: str) -> str:
    return arg.split("=", 1)[0].replace("_", "-")


def with_defaults(args: list[str], default: list[str]) -> list[str]:
    """``default`` without the options ``args`` gives, then ``args``."""
    given = {_option(a) for a in args if a.startswith("--")}
    kept, i = [], 0
    while i < len(default):
        j = i + 1
        while j < len(default) and not default[j].startswith("--"):
            j += 1
        if _option(default[i]) not in given:
            kept += default[i:j]
        i = j
    return kept + args


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--"]:  # torchrun passes the "--" on
        args = args[1:]
    assets = DEFAULT_ASSETS
    if args[:1] == ["--assets"]:
        assets, args = Path(args[1]).absolute(), args[2:]
    elif args[:1] and args[0].startswith("--assets="):
        assets, args = Path(args[0].split("=", 1)[1]).absolute(), args[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    build_assets(assets)

    # ConfigManager.parse_args has `args=sys.argv[1:]` as its default, evaluated when
    # torchtitan.config.manager is first imported: set sys.argv before importing torchtitan
    sys.argv = [sys.argv[0], *with_defaults(args, defaults(assets))]
    with import_shims():
        import torchtitan.tools.utils
        from torchtitan.train import Trainer
        from torchtitan.train import main as torchtitan_main
    if torchtitan.tools.utils.device_type == "cpu":
        runtime_shims()
    torchtitan_main(Trainer)


if __name__ == "__main__":
    main()
