"""Launch an unmodified training script under torchrun with every rank profiled.

Used by ``pardiag profile``. This module does not import torch itself (torchrun runs in a child
process), so the CLI starts fast and fails with a clear message when torch is missing.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from pardiag import __version__, layout
from pardiag.collectors.rank_entry import CONFIG_ENV
from pardiag.errors import PardiagError


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProfileConfig:
    """What ``pardiag profile`` runs and how.

    Attributes:
        script: path of the user's training script (run as ``__main__``, unmodified).
        args: the script's own command-line arguments.
        out: run folder to write (must not exist or be empty unless ``overwrite``).
        nproc_per_node: processes (ranks) started on this node by torchrun.
        wait: optimizer steps skipped before the profiler warms up.
        warmup: optimizer steps profiled but discarded.
        active: optimizer steps recorded in the trace.
        overwrite: allow writing into a non-empty ``out``.
        timeout_s: stop a job still running after this many seconds (None: no limit); ranks
            first write what they were doing (``rank{R}.hang.json``).
        exit_grace_s: once a rank has finished, how long the others may take to finish too
            before they are taken as hung at exit and stopped.
        pin_cpu: give each rank of a node its own cores (cores / local ranks) and as many
            intra-op threads, before the script starts (``--pin-cpu``).
    """

    script: Path
    args: tuple[str, ...] = ()
    out: Path
    nproc_per_node: int = 1
    wait: int = 1
    warmup: int = 1
    active: int = 3
    overwrite: bool = False
    timeout_s: float | None = None
    exit_grace_s: float = 60.0
    pin_cpu: bool = False

    def __post_init__(self) -> None:
        if not Path(self.script).is_file():
            raise PardiagError(f"{self.script}: no such script")
        if self.nproc_per_node < 1:
            raise PardiagError(f"--nproc-per-node must be >= 1, got {self.nproc_per_node}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise PardiagError(f"--timeout must be > 0 seconds, got {self.timeout_s}")
        if self.wait < 0 or self.warmup < 0 or self.active < 1:
            raise PardiagError(
                f"profiler schedule needs wait >= 0, warmup >= 0, active >= 1; "
                f"got wait={self.wait} warmup={self.warmup} active={self.active}")


@dataclasses.dataclass(frozen=True)
class ProfileResult:
    """Outcome of a profiled run.

    Attributes:
        exit_code: the script's exit code (first non-zero over the ranks), or torchrun's.
        out: the run folder.
        failed_ranks: ranks that raised or exited non-zero, with their error line.
        missing_ranks: ranks that wrote no metadata (killed before they finished).
        hang: one line per collective the job was stuck in when ``timeout_s`` expired, or the
            ranks stopped after ``exit_grace_s``.
        contention: a sentence when the CPU ranks contended for cores
            (:func:`pardiag.layout.contention_note`), else None.
        no_trace: ``{rank: optimizer steps seen}`` for ranks that finished without a trace
            (too few optimizer steps for the profiler schedule).
        short_ranks: ``{rank: active steps recorded}`` for ranks whose trace holds fewer steps
            than ``active``. Failed ranks come first-failure first.
    """

    exit_code: int
    out: Path
    failed_ranks: dict[int, str]
    missing_ranks: list[int]
    no_trace: dict[int, int] = dataclasses.field(default_factory=dict)
    short_ranks: dict[int, int] = dataclasses.field(default_factory=dict)
    hang: list[str] = dataclasses.field(default_factory=list)
    contention: str | None = None


def _prepare_out(out: Path, overwrite: bool) -> None:
    try:
        _prepare_out_unchecked(out, overwrite)
    except OSError as exc:
        raise PardiagError(f"{out}: cannot create the run folder ({exc.strerror or exc})") from None


def _prepare_out_unchecked(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise PardiagError(f"{out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise PardiagError(f"{out}: folder exists and is not empty (pass --overwrite to replace it)")
        removed = []
        for p in layout.owned_files(out):  # remove only what pardiag itself writes; keep the rest
            p.unlink()
            removed.append(str(p.relative_to(out)))
        try:
            layout.sidecar_dir(out).rmdir()  # recreated below; kept when it holds other files
        except OSError:
            pass
        if removed:   # nothing the user produced goes silently
            more = f", … ({len(removed) - 8} more)" if len(removed) > 8 else ""
            print(f"pardiag: {out}: --overwrite removed the previous run's {len(removed)} "
                  f"file(s): {', '.join(removed[:8])}{more}", file=sys.stderr)
    layout.sidecar_dir(out).mkdir(parents=True, exist_ok=True)


#: Exit code of a job stopped by --timeout (as coreutils' timeout).
TIMEOUT_EXIT_CODE = 124


def _descendants(pid: int) -> list[int]:
    """Process ids below ``pid`` (Linux /proc); ``[]`` where /proc is unavailable."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _stop(proc: subprocess.Popen, graceful: bool = True) -> None:
    """Stop torchrun and its ranks: SIGTERM, then SIGKILL. Not ``graceful``: SIGKILL every
    process below torchrun and torchrun itself (a SIGTERM makes torchrun print a traceback);
    where the process tree cannot be read, fall back to the graceful way."""
    import signal

    if not graceful:
        tree = _descendants(proc.pid)
        if tree:
            for pid in [*reversed(tree), proc.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                proc.wait(timeout=5.0)
                return
            except subprocess.TimeoutExpired:
                pass
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _run_torchrun(cmd: list[str], env: dict, out: Path, cfg: ProfileConfig) -> tuple[int, list | None]:
    """Run torchrun; on timeout ask every rank for a hang dump, stop the job, diagnose it.

    Returns:
        (torchrun's exit code, None) or (its exit code, lines describing the hang).
    """
    from pardiag.analyzer.hang import describe, diagnose_hang

    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    started = time.time()
    first_done: float | None = None
    n = cfg.nproc_per_node
    try:
        while True:
            try:
                return proc.wait(timeout=0.5), None
            except subprocess.TimeoutExpired:
                pass
            now = time.time()
            if cfg.timeout_s is not None and now - started > cfg.timeout_s:
                break
            # A rank that finished while another never exits: a hang at teardown (seen with
            # gloo when objects holding a process group are freed). Stop it after a grace.
            done = sum(layout.rank_meta_path(out, r).exists() for r in range(n))
            if done and first_done is None:
                first_done = now
            if first_done is not None and done < n and now - first_done > cfg.exit_grace_s:
                _stop(proc, graceful=False)
                return proc.returncode if proc.returncode is not None else -9, [
                    f"rank(s) {[r for r in range(n) if not layout.rank_meta_path(out, r).exists()]}"
                    f" did not exit within {cfg.exit_grace_s:g} s after another rank finished "
                    f"(a hang at the end of the script or in its teardown); they were stopped"]
    except KeyboardInterrupt:
        _stop(proc)
        raise
    request = layout.dump_request_path(out)
    request.touch()
    deadline = time.time() + 15.0
    while time.time() < deadline and not all(layout.hang_path(out, r).exists() for r in range(n)):
        time.sleep(0.2)
    _stop(proc, graceful=False)  # the dumps are written; nothing left to wait for
    request.unlink(missing_ok=True)
    dumps = {}
    for r in range(n):
        p = layout.hang_path(out, r)
        if p.exists():
            dumps[r] = json.loads(p.read_text())   # hang dumps stay plain JSON (flight recorder)
    stuck = diagnose_hang(dumps, n)
    stacks = {r: d.get("main_stack", []) for r, d in dumps.items()}
    lines = [describe(s, stacks) for s in stuck]
    if not lines:
        lines = [f"no collective is waiting on a missing rank; ranks with a dump: {sorted(dumps)}"]
    return proc.returncode if proc.returncode is not None else -9, lines


def run_profile(cfg: ProfileConfig) -> ProfileResult:
    """Run ``cfg.script`` under torchrun with the profiler on every rank.

    Writes ``cfg.out`` as described in :mod:`pardiag.layout`. Output of the script passes through.

    Returns:
        ProfileResult with the exit code to pass on.

    Raises:
        PardiagError: torch is not installed, the script is missing, or ``out`` is not empty.
    """
    if importlib.util.find_spec("torch") is None:
        raise PardiagError("pardiag profile needs torch: pip install 'pardiag[profile]'")
    out = Path(cfg.out).resolve()
    _prepare_out(out, cfg.overwrite)
    script = str(Path(cfg.script).resolve())
    rank_cfg = {"out": str(out), "script": script, "args": list(cfg.args),
                "wait": cfg.wait, "warmup": cfg.warmup, "active": cfg.active,
                "pin_cpu": cfg.pin_cpu}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
           "--nproc-per-node", str(cfg.nproc_per_node), "-m", "pardiag.collectors.rank_entry"]
    # torchrun sets OMP_NUM_THREADS=1 when unset, with a banner; set the same value quietly.
    # The flight recorder (collectives with group, seq, sizes) holds 2000 entries by default;
    # a profiled window of FSDP or pipeline steps can hold more.
    env = {"OMP_NUM_THREADS": "1", "TORCH_FR_BUFFER_SIZE": "20000", **os.environ,
           CONFIG_ENV: json.dumps(rank_cfg)}
    started = time.time()
    returncode, hang = _run_torchrun(cmd, env, out, cfg)
    ended = time.time()

    failed: dict[int, str] = {}
    metas: dict[int, layout.RankMeta] = {}
    missing: list[int] = []
    codes: list[int] = []
    no_trace: dict[int, int] = {}
    short: dict[int, int] = {}
    ended_at: dict[int, float] = {}
    for r in range(cfg.nproc_per_node):
        p = layout.rank_meta_path(out, r)
        if not p.is_file():
            missing.append(r)
            continue
        meta = layout.decode_sidecar(p.read_bytes(), "rank")
        metas[r] = meta
        codes.append(int(meta.exit_code or 0))
        steps = int(meta.optimizer_steps or 0)
        recorded = max(0, min(cfg.active, steps - cfg.wait - cfg.warmup))
        if not meta.trace_file:
            no_trace[r] = steps
        elif recorded < cfg.active and meta.status == "ok":
            short[r] = recorded
        ended_at[r] = float(meta.ended_unix or 0.0)
        if meta.status == "error" or meta.exit_code:
            failed[r] = meta.error or f"exit code {meta.exit_code}"
    failed = dict(sorted(failed.items(), key=lambda kv: ended_at.get(kv[0], 0.0)))
    nonzero = [c for c in codes if c != 0]
    if nonzero:
        exit_code = nonzero[0]
    elif hang is not None:
        exit_code = TIMEOUT_EXIT_CODE
    elif returncode != 0 or missing:
        exit_code = returncode or 1
    else:
        exit_code = 0
    nodes: dict[str, list[int]] = {}
    for r, m in sorted(metas.items()):
        nodes.setdefault(str(m.host), []).append(r)
    run_layout = None
    layouts = {r: m.layout for r, m in metas.items() if m.layout}
    if layouts:
        first = layouts[min(layouts)]
        run_layout = {"dims": first["dims"], "strategies": first["strategies"],
                      **({"pipeline": first["pipeline"]} if first.get("pipeline") else {}),
                      **({"fsdp_reshard_after_forward": first["fsdp_reshard_after_forward"]}
                         if "fsdp_reshard_after_forward" in first else {})}
    backends = {m.backend for m in metas.values() if m.backend}
    torch_versions = {m.torch_version for m in metas.values() if m.torch_version}
    run = layout.RunFile(
        pardiag_version=__version__,
        command=shlex.join(["pardiag", "profile", str(cfg.script),
                            "--nproc-per-node", str(cfg.nproc_per_node),
                            *(["--pin-cpu"] if cfg.pin_cpu else []), "--", *cfg.args]),
        script=str(cfg.script), script_args=list(cfg.args),
        world_size=cfg.nproc_per_node, nproc_per_node=cfg.nproc_per_node, nnodes=1,
        schedule=layout.ProfilerSchedule(wait=cfg.wait, warmup=cfg.warmup, active=cfg.active),
        started_unix=started, ended_unix=ended, torchrun_exit_code=returncode,
        exit_code=exit_code,
        timed_out_after_s=cfg.timeout_s if hang is not None else None, hang=hang or [],
        nodes=nodes, layout=run_layout,
        backend=backends.pop() if len(backends) == 1 else sorted(backends) or None,
        torch_version=(torch_versions.pop() if len(torch_versions) == 1
                       else sorted(torch_versions) or None),
        failed_ranks={str(k): v for k, v in failed.items()}, missing_ranks=missing)
    tmp = layout.run_file_path(out).with_suffix(".json.tmp")
    tmp.write_bytes(layout.encode_sidecar(run))
    os.replace(tmp, layout.run_file_path(out))
    return ProfileResult(exit_code=exit_code, out=out, failed_ranks=failed, missing_ranks=missing,
                         no_trace=no_trace, short_ranks=short, hang=hang or [],
                         contention=layout.contention_note(metas.values()))
