"""Launch an unmodified training script under torchrun with every rank profiled.

Used by ``pardiag profile``. This module does not import torch itself (torchrun runs in a child
process), so the CLI starts fast and fails with a clear message when torch is missing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import math
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec

from pardiag import layout
from pardiag.errors import (
    EXIT_INTERRUPTED,
    SIGTERM_EXIT_CODE,
    Interrupted,
    PardiagError,
    env_seconds,
)
from pardiag.version import __version__

from .rank_entry import CONFIG_ENV

#: The most deep captures of a monitored run unless ``--monitor-captures`` says otherwise: a
#: capture's traces take disk (megabytes per rank on CPU, far more on GPUs) and its steps run
#: slower, so a run whose straggler comes and goes many times records its first few.
MONITOR_CAPTURES = 3
#: The shortest ``--stall-timeout`` (s): a rank touches its progress file at most once a second
#: (:data:`pardiag.collectors.rank_entry.PROGRESS_EVERY_S`), so a shorter one stops healthy jobs.
STALL_MIN_S = 2.0


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
        stall_s: stop a job once no rank has made an optimizer step for this many seconds,
            counted from the first step (None: no limit); as ``timeout_s`` (``--stall-timeout``:
            a hang at step 4,000 of a long run, without a limit on the whole run).
        exit_grace_s: once a rank has finished, how long the others may take to finish too
            before they are taken as hung at exit and stopped.
        pin_cpu: give each rank of a node its own cores (cores / local ranks) and as many
            intra-op threads, before the script starts (``--pin-cpu``).
        nnodes: nodes of the job; every node runs the same ``pardiag profile`` command with its
            own ``node_rank`` (torchrun's ``--nnodes``).
        node_rank: this node's rank (torchrun's ``--node-rank``; needed with the static
            rendezvous, torchrun's default, when ``nnodes`` > 1).
        rdzv_backend, rdzv_endpoint, rdzv_id: torchrun's rendezvous options (``static``/``c10d``,
            ``HOST:PORT``, a job id shared by the nodes).
        master_addr, master_port: torchrun's ``--master-addr``/``--master-port`` (the static
            rendezvous' meeting point where no ``rdzv_endpoint`` is given).
        noise_filter: pass the ranks' standard error through :class:`NoiseFilter` (torch's
            profiler lines shown once or not at all).
        monitor_every: monitor every step instead of profiling a window (``--monitor``; no
            Kineto trace): each rank appends its records every ``monitor_every`` steps
            (:mod:`pardiag.collectors.monitor`); None: profile. The launcher then follows the
            records and says each finding once as the job runs
            (:mod:`pardiag.analyzer.analyses.monitor_follow`).
        monitor_capture: with ``monitor_every``, on a finding every rank records a Kineto
            trace of this many steps into ``capture-S/`` (0: never).
        monitor_captures: the most deep captures of a run (each finding that comes once the
            last capture has ended asks for one, until this many).
        monitor_calls: with ``monitor_every``, write every collective call (False: only each
            step's summary, its arrival among them: for large jobs).
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
    stall_s: float | None = None
    exit_grace_s: float = 60.0
    pin_cpu: bool = False
    nnodes: int = 1
    node_rank: int | None = None
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    master_addr: str | None = None
    master_port: int | None = None
    noise_filter: bool = True
    monitor_every: int | None = None
    monitor_capture: int = 0
    monitor_captures: int = MONITOR_CAPTURES
    monitor_calls: bool = True

    @property
    def standalone(self) -> bool:
        """One node, no rendezvous option given: ``torchrun --standalone`` (a free port)."""
        return self.nnodes == 1 and not any((self.rdzv_backend, self.rdzv_endpoint, self.rdzv_id,
                                             self.master_addr, self.master_port))

    def torchrun_args(self) -> list[str]:
        """torchrun's options for the nodes and their rendezvous (not ``--nproc-per-node``)."""
        if self.standalone:
            return ["--standalone", "--nnodes", "1"]
        out = ["--nnodes", str(self.nnodes)]
        for flag, value in (("--node-rank", self.node_rank), ("--rdzv-backend", self.rdzv_backend),
                            ("--rdzv-endpoint", self.rdzv_endpoint), ("--rdzv-id", self.rdzv_id),
                            ("--master-addr", self.master_addr),
                            ("--master-port", self.master_port)):
            if value is not None:
                out += [flag, str(value)]
        return out

    def __post_init__(self) -> None:
        if not Path(self.script).is_file():
            raise PardiagError(f"{self.script}: no such script")
        if self.nproc_per_node < 1:
            raise PardiagError(f"--nproc-per-node must be >= 1, got {self.nproc_per_node}")
        if self.timeout_s is not None and not (0 < self.timeout_s < math.inf):
            raise PardiagError(f"--timeout must be > 0 seconds, got {self.timeout_s}")
        if self.stall_s is not None and not (STALL_MIN_S <= self.stall_s < math.inf):
            raise PardiagError(f"--stall-timeout must be at least {STALL_MIN_S:g} seconds (each "
                               f"rank says it made progress once a second), got {self.stall_s}")
        # the environment's settings, checked before the job starts
        env_seconds("PARDIAG_MONITOR_POLL_S", MONITOR_POLL_S)
        env_seconds("PARDIAG_TEARDOWN_PART_S", 300.0)
        if self.nnodes < 1:
            raise PardiagError(f"--nnodes must be >= 1, got {self.nnodes}")
        if self.node_rank is not None and not 0 <= self.node_rank < self.nnodes:
            raise PardiagError(f"--node-rank must be in 0..{self.nnodes - 1} (--nnodes "
                               f"{self.nnodes}), got {self.node_rank}")
        static = self.rdzv_backend in (None, "static")
        if self.nnodes > 1 and static and self.node_rank is None:
            raise PardiagError(f"--nnodes {self.nnodes} needs --node-rank (0..{self.nnodes - 1}, "
                               f"one per node) with torchrun's static rendezvous; or pass "
                               f"--rdzv-backend c10d")
        if self.nnodes > 1 and not (self.rdzv_endpoint or self.master_addr):
            raise PardiagError(f"--nnodes {self.nnodes} needs where the nodes meet: "
                               f"--rdzv-endpoint HOST:PORT (or --master-addr HOST "
                               f"--master-port PORT), the same on every node")
        if self.monitor_capture and self.monitor_every is None:
            raise PardiagError("--monitor-capture needs --monitor")
        if self.monitor_capture < 0:
            raise PardiagError(f"--monitor-capture must be >= 0 steps, got {self.monitor_capture}")
        if self.monitor_captures < 1:
            raise PardiagError(f"--monitor-captures must be >= 1, got {self.monitor_captures}")
        if self.monitor_capture and self.nnodes > 1 and self.node_rank is None:
            # one launcher asks, or the nodes' launchers would each ask for other steps
            raise PardiagError(f"--monitor-capture on {self.nnodes} nodes needs --node-rank R on "
                               f"each: node 0's launcher asks every rank for the capture, "
                               f"through a run folder the nodes share")
        if self.monitor_every is not None:   # no profiler window at all
            if self.monitor_every < 1:
                raise PardiagError(f"--monitor-every must be >= 1 step, got {self.monitor_every}")
            for name in ("wait", "warmup", "active"):
                object.__setattr__(self, name, 0)
            return
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
        after_window: the fewest optimizer steps a finished rank made after its profiling
            window and the step that exports its trace (the undisturbed steps the step time
            and its noise are measured on), or None when no rank finished with a trace.
        stopped_by: "timeout" (``--timeout``) or "stall" (``--stall-timeout``) when pardiag
            stopped the job, else None.
    """

    exit_code: int
    out: Path
    failed_ranks: dict[int, str]
    missing_ranks: list[int]
    no_trace: dict[int, int] = dataclasses.field(default_factory=dict)
    short_ranks: dict[int, int] = dataclasses.field(default_factory=dict)
    hang: list[str] = dataclasses.field(default_factory=list)
    contention: str | None = None
    after_window: int | None = None
    stopped_by: str | None = None


def _prepare_out(out: Path, overwrite: bool, cfg: ProfileConfig | None = None) -> None:
    try:
        if cfg is not None and cfg.nnodes > 1:   # the folder may be shared with other nodes
            _prepare_node_out(out, overwrite, cfg)
        else:
            _prepare_out_unchecked(out, overwrite)
    except OSError as exc:
        raise PardiagError(f"{out}: cannot create the run folder ({exc.strerror or exc})") from None


def _prepare_node_out(out: Path, overwrite: bool, cfg: ProfileConfig) -> None:
    """A node of a multi-node run: the run folder may be shared with the other nodes, which
    write into it at the same time, so only this node's own part is checked here; each rank
    checks its own files when it starts (:func:`pardiag.collectors.rank_entry.claim_files`)."""
    if out.exists() and not out.is_dir():
        raise PardiagError(f"{out}: exists and is not a folder")
    layout.sidecar_dir(out).mkdir(parents=True, exist_ok=True)
    if cfg.node_rank is None:
        return
    part = layout.node_run_path(out, cfg.node_rank)
    if part.exists():
        if not overwrite:
            raise PardiagError(f"{part}: node {cfg.node_rank}'s part of an earlier run is there "
                               f"(pass --overwrite on every node to replace the nodes' files)")
        part.unlink()
        print(f"pardiag: {out}: --overwrite removed {part.relative_to(out)}", file=sys.stderr)


class NoiseFilter:
    """Passes a child's standard error on, leaving out torch's own noise.

    Every rank prints ``USDT:... profiler_start``/``profiler_stop`` (Kineto) around its
    profiler window and ``[W... CPUAllocator.cpp:...] Memory block of unknown size was allocated
    before the profiling started ...`` once per rank: the first are left out, the second shown
    once. torchrun's own log lines of being stopped, of sending the ranks SIGTERM and of a
    failed rank's exit code are left out (pardiag names the failed ranks). Everything else
    passes unchanged and at once (a line still being written, e.g. a progress bar's ``\\r``
    update, is passed on before its end unless it may be one of these).

    Use: ``Popen(..., stderr=f.write_fd)``, then :meth:`started` and, after the child ended,
    :meth:`close`.
    """

    DROP = re.compile(rb"^((\[rank\d+\]:)?USDT:.*\.cpp:\d+\] "
                      # torchrun's own log of stopping the ranks and of the failed one (pardiag
                      # names the failed ranks itself)
                      rb"|[WE]\d{4} [\d:.]+ +\d+ \S*torch/distributed/elastic/multiprocessing/"
                      rb"api\.py:\d+\] (Sending process \d+ closing signal|failed \(exitcode)"
                      rb"|[WE]\d{4} [\d:.]+ +\d+ \S*torch/distributed/elastic/agent/server/"
                      rb"api\.py:\d+\] Received \d+ death signal)")
    ONCE = (re.compile(rb"^(\[rank\d+\]:)?\[W[^\]]*CPUAllocator\.cpp:\d+\] Memory block of unknown "
                       rb"size"),)
    _PREFIXES = (b"USDT:", b"[W", b"[rank", b"W0", b"W1", b"E0", b"E1")

    def __init__(self, sink=None) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self._sink = sink if sink is not None else sys.stderr.buffer
        self._shown: set[int] = set()
        #: lines left out
        self.hidden = 0
        self._thread = threading.Thread(target=self._run, name="pardiag-stderr", daemon=True)
        self._thread.start()

    def started(self) -> None:
        """The child holds the pipe's write end: close ours (end of file when the child ends)."""
        os.close(self.write_fd)

    def close(self, timeout: float = 5.0) -> None:
        """Wait (at most ``timeout`` s: a left-over grandchild may hold the pipe) for the rest."""
        self._thread.join(timeout)

    def keep(self, line: bytes) -> bool:
        """Whether a whole line is passed on (counts the ones left out)."""
        if self.DROP.match(line):
            self.hidden += 1
            return False
        for i, pat in enumerate(self.ONCE):
            if pat.match(line):
                if i in self._shown:
                    self.hidden += 1
                    return False
                self._shown.add(i)
        return True

    def _maybe_noise(self, part: bytes) -> bool:
        return any(part.startswith(p) or p.startswith(part) for p in self._PREFIXES)

    def _write(self, chunks: list[bytes]) -> None:
        try:
            self._sink.write(b"".join(chunks))
            self._sink.flush()
        except (OSError, ValueError):
            pass

    def _run(self) -> None:
        buf = b""
        passing = False   # the current line's start was passed on: pass the rest too
        while True:
            try:
                chunk = os.read(self.read_fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
            out = []
            while (nl := buf.find(b"\n")) >= 0:
                line, buf = buf[:nl + 1], buf[nl + 1:]
                if passing or self.keep(line):
                    out.append(line)
                passing = False
            if buf and (passing or not self._maybe_noise(buf)):
                out.append(buf)
                buf, passing = b"", True
            if out:
                self._write(out)
        if buf and (passing or self.keep(buf)):
            self._write([buf])
        os.close(self.read_fd)


def _refuse_not_a_run(out: Path, owned: list[Path]) -> None:
    """Raise unless what ``--overwrite`` would remove from ``out`` (``owned``:
    :func:`pardiag.layout.owned_files`) is a previous pardiag run's: the folder holds its run
    file, a rank's metadata or monitor records. A trace of pardiag's name in a folder no run
    wrote (one copied there) is the user's, and so is a ``pardiag/`` folder holding other files
    (a source package of that name).

    Raises:
        PardiagError: naming the file and what to do."""
    ran = any(layout.is_sidecar_name(p.name) or p.name.endswith(".monitor.jsonl")
              for p in owned)
    side = layout.sidecar_dir(out)
    if side.is_dir() and not ran:   # a run's metadata folder may hold a user's file too
        mine = set(owned)
        others = sorted(f for f in side.rglob("*") if f.is_file() and f not in mine)
        if others:
            raise PardiagError(f"{side}: holds files pardiag did not write (e.g. "
                               f"{others[0].relative_to(out)}) and no run's metadata, so it is "
                               f"no run's metadata folder; choose another --out")
    traces = [p for p in owned if layout.is_trace_name(p.name)]
    if traces and not ran:
        raise PardiagError(f"{traces[0]}: no pardiag run wrote it here (the folder holds no "
                           f"run.json or rank metadata); --overwrite replaces only a previous "
                           f"run's files: move it, or choose another --out")


def _prepare_out_unchecked(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise PardiagError(f"{out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise PardiagError(f"{out}: folder exists and is not empty "
                               "(pass --overwrite to replace it)")
        owned = layout.owned_files(out)
        _refuse_not_a_run(out, owned)
        removed = []
        for p in owned:  # remove only what pardiag itself writes; keep the rest
            p.unlink()
            removed.append(str(p.relative_to(out)))
        # folders recreated below, and deep captures' folders; each kept when it holds others
        captures = [d for _, d in layout.capture_folders(out)]
        for d in [*(p for c in captures for p in (layout.sidecar_dir(c), c / layout.SUMMARY_DIR,
                                                  c)), layout.sidecar_dir(out)]:
            try:
                d.rmdir()
            except OSError:
                pass
        if removed:   # nothing the user produced goes silently
            more = f", … ({len(removed) - 8} more)" if len(removed) > 8 else ""
            print(f"pardiag: {out}: --overwrite removed the previous run's {len(removed)} "
                  f"file(s): {', '.join(removed[:8])}{more}", file=sys.stderr)
        # reports of the previous run are the user's to keep, but no longer describe the folder
        stale = [str(p.relative_to(out)) for p in layout.earlier_reports(out)]
        if stale:
            print(f"pardiag: {out}: kept {', '.join(stale)}: report(s) of the previous run, "
                  f"not of this one", file=sys.stderr)
    layout.sidecar_dir(out).mkdir(parents=True, exist_ok=True)


#: Exit code of a job stopped by --timeout (as coreutils' timeout).
TIMEOUT_EXIT_CODE = 124
#: A job whose last optimizer step (any rank's progress file:
#: :data:`pardiag.collectors.rank_entry.PROGRESS_EVERY_S`) ended this recently when
#: ``--timeout`` expired was still running, not hung (seconds).
RUNNING_WITHIN_S = 3.0
#: Every rank has written all its files: how long its processes may take to exit before they
#: are taken as stuck in their teardown and stopped (seconds). The script's exit code stands.
EXIT_STUCK_S = 30.0


def _rank_pids(pid: int) -> list[int]:
    """Rank processes below ``pid`` (their command line runs pardiag's rank entry)."""
    out = []
    for p in _descendants(pid):
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes()
        except OSError:
            continue
        if b"pardiag.collectors.rank_entry" in cmd:
            out.append(p)
    return out


def _main_thread_at(text: str, script: str | None = None) -> str | None:
    """Where the main thread was in a faulthandler dump (it lists the threads newest first: the
    main thread last; each thread's frames innermost first): its innermost frame as
    ``File "...", line N in f``, followed by ``, called from`` the innermost frame of
    ``script`` (the user's script) where that is another one. None without a frame."""
    blocks = [b for b in text.strip().split("\n\n") if "File " in b]
    if not blocks:
        return None
    from ..analyzer.analyses.hang import frame_in_script

    main = next((b for b in blocks if "Current thread" in b), blocks[-1])
    frames = [ln.strip() for ln in main.splitlines() if ln.strip().startswith("File ")]
    return frame_in_script(frames, script) if frames else None


#: The first line of a stack dump faulthandler wrote when a rank's own backstop expired
#: (``rank_entry._guard_teardown``): ``Timeout (0:05:00)!``.
_BACKSTOP_HEADER = re.compile(r"^Timeout \((\d+):(\d\d):(\d\d)\)!", re.M)


def _stacks_of(out: Path, rank: int, script: str | None) -> tuple[str, str] | None:
    """(the rank's stacks file's text, where its main thread was: :func:`_main_thread_at`), or
    None without a file or a frame."""
    try:
        text = layout.stacks_path(out, rank).read_text(errors="replace")
    except OSError:
        return None
    at = _main_thread_at(text, script)
    return (text, at) if at else None


def _stacks_lines(out: Path, ranks: list[int], script: str | None) -> list[str]:
    """One line per rank of ``ranks`` whose stacks file (SIGUSR1's dump, or the backstop's)
    says where its main thread was; ranks without one are left out."""
    lines = []
    for r in ranks:
        found = _stacks_of(out, r, script)
        if found is None:
            continue
        text, at = found
        backstop = _BACKSTOP_HEADER.search(text)
        if backstop:
            h, m, s = map(int, backstop.groups())
            written = (" after writing its files" if layout.rank_meta_path(out, r).is_file()
                       else "")
            lines.append(f"rank {r}: pardiag's work after the script did not end within "
                         f"{h * 3600 + m * 60 + s} s and the rank stopped itself{written}; "
                         f"its main thread was at {at} (all threads: {layout.stacks_path(out, r)})")
        else:
            lines.append(f"rank {r}'s main thread was at {at} (all threads: "
                         f"{layout.stacks_path(out, r)})")
    return lines


def _dump_stacks(pids: list[int]) -> None:
    """SIGUSR1 to ``pids`` (each writes every thread's stack to its stacks file, from the
    signal handler, even while its main thread holds the interpreter), then 2 s for it."""
    import signal

    sent = False
    for pid in pids:
        try:
            os.kill(pid, signal.SIGUSR1)
            sent = True
        except OSError:
            pass
    if sent:
        time.sleep(2.0)


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


#: How long the ranks may take to write their files after SIGTERM before they are killed
#: (seconds); torchrun itself would wait 30 s.
STOP_GRACE_S = 10.0


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


#: ``prctl`` option that makes a process the reaper of its orphaned descendants (Linux 3.4+).
_PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> None:
    """Make this process the parent of its orphaned descendants (Linux), so that ranks whose
    torchrun was killed (torchrun starts each in a session of its own) are still found below
    it by :func:`_stop_orphaned_ranks`; nothing where the platform has no such option."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _stop_orphaned_ranks(returncode: int) -> str | None:
    """After torchrun ended: the rank processes still running below this process (orphaned
    when torchrun was killed: :func:`_become_subreaper`) are stopped as :func:`_stop` stops
    them (SIGTERM, so they write their files; SIGKILL after :data:`STOP_GRACE_S`); a line says
    so. None when there were none."""
    import signal

    left = _rank_pids(os.getpid())
    if not left:
        return None
    _signal_each(left, signal.SIGTERM)
    deadline = time.time() + STOP_GRACE_S
    while time.time() < deadline and any(_alive(p) for p in left):
        time.sleep(0.1)
        _reap()
    _signal_each([p for p in left if _alive(p)], signal.SIGKILL)
    _reap()
    return (f"torchrun ended (exit code {returncode}) while {len(left)} rank process(es) still "
            f"ran (torchrun killed?); they were stopped")


def _signal_each(pids: list[int], sig: int) -> None:
    """Send ``sig`` to each of ``pids``, passing over those that have ended meanwhile."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _reap() -> None:
    """Collect the exit status of this process's ended children that no Popen waits for (the
    orphaned ranks it adopted), so none is left a zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _stop(proc: subprocess.Popen, graceful: bool = True) -> None:
    """Stop torchrun and its ranks, leaving no process behind.

    ``graceful``: SIGTERM to torchrun's process group (torchrun passes it to the ranks, which
    write their files, ``rank_entry._stop_on_sigterm``); after :data:`STOP_GRACE_S` SIGKILL to
    every process that was below torchrun and is still there: torchrun starts each rank in a
    session of its own, and a rank whose main thread holds the interpreter in native code
    never takes the SIGTERM; once torchrun is gone such a rank would be left running (the
    tree is read before anything is signalled: an orphan is no longer torchrun's).
    Not ``graceful``: SIGKILL at once to every process below torchrun and torchrun itself (a
    SIGTERM makes torchrun print a traceback). Where the process tree cannot be read, the
    process group alone is signalled."""
    import signal

    tree = _descendants(proc.pid)
    if graceful:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.time() + STOP_GRACE_S
        while time.time() < deadline and (proc.poll() is None
                                           or any(_alive(p) for p in tree)):
            time.sleep(0.1)
    if tree:
        _signal_each([p for p in reversed(tree) if _alive(p)] + [proc.pid], signal.SIGKILL)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        pass


#: Environment variable naming the ``pardiag profile`` process that started a rank.
LAUNCH_ID_ENV = "PARDIAG_LAUNCH_ID"


class _NodeRanks:
    """The rank metadata in the run folder, read as it appears: all of it (another node's too,
    in a shared run folder) and this launcher's own ranks (their ``launch_id``)."""

    def __init__(self, out: Path, launch_id: str) -> None:
        self.out, self.launch_id = out, launch_id
        self.all: dict[int, layout.RankMeta] = {}
        self._read: dict[str, int] = {}   # file name: modification time (ns) when read
        #: what stopped the job before it ended: "timeout" (--timeout), "stall"
        #: (--stall-timeout), or None
        self.stopped_by: str | None = None
        self._since = time.time()

    def stalled_for(self, now: float) -> float:
        """Seconds since the last optimizer step of any rank whose progress file is in the run
        folder (:func:`pardiag.layout.progress_path`; an earlier run's, older than this
        launch, left out); 0 before any rank has made a step (the stall is counted from the
        first step: the start-up is --timeout's) and once every rank's script has ended (each
        removes its file then: what follows is pardiag's work, or the exit's grace)."""
        try:
            times = [t for p in layout.sidecar_dir(self.out).glob("rank*.progress")
                     if (t := p.stat().st_mtime) >= self._since - 1.0]
        except OSError:
            return 0.0
        return now - max(times) if times else 0.0

    def scan(self) -> None:
        """Decode the metadata files not read yet (each is written once, atomically)."""
        try:
            files = list(layout.sidecar_dir(self.out).glob("rank*.meta.json"))
        except OSError:
            return
        for f in files:
            try:
                mtime = f.stat().st_mtime_ns
                if self._read.get(f.name) == mtime:
                    continue
                meta = layout.decode_sidecar(f.read_bytes(), "rank")
            except (OSError, ValueError):
                continue   # gone, or an earlier run's file of another format
            self._read[f.name] = mtime
            self.all[meta.rank] = meta

    @property
    def mine(self) -> dict[int, layout.RankMeta]:
        return {r: m for r, m in self.all.items() if m.launch_id == self.launch_id}

    def node_rank(self, cfg: ProfileConfig) -> int | None:
        """This node's rank: torchrun's group rank as its ranks recorded it, else --node-rank."""
        got = {m.node_rank for m in self.mine.values() if m.node_rank is not None}
        if len(got) == 1:
            return got.pop()
        return 0 if cfg.standalone else cfg.node_rank

    def expected(self, cfg: ProfileConfig) -> list[int] | None:
        """The global ranks of this node (torchrun numbers a node's ranks from node rank ×
        ranks per node), None where the node's rank is unknown."""
        g = self.node_rank(cfg)
        n = cfg.nproc_per_node
        return None if g is None else list(range(g * n, (g + 1) * n))


def _run_torchrun(cmd: list[str], env: dict, out: Path, cfg: ProfileConfig,
                  ranks: _NodeRanks) -> tuple[int, list | None]:
    """Run torchrun; on timeout ask every rank for a hang dump, stop the job, diagnose it.

    In a multi-node run every node's launcher does this for its own ranks; with a shared run
    folder each reads the other nodes' rank metadata and hang dumps too.

    Returns:
        (torchrun's exit code, None) or (its exit code, lines describing the hang).
    """
    def describe(*args, **kwargs):   # the hang analysis (it loads pandas) only for a hang
        from ..analyzer.analyses.hang import describe
        return describe(*args, **kwargs)

    def diagnose_hang(*args, **kwargs):
        from ..analyzer.analyses.hang import diagnose_hang
        return diagnose_hang(*args, **kwargs)

    noise = NoiseFilter() if cfg.noise_filter else None
    _become_subreaper()
    try:
        proc = subprocess.Popen(cmd, env=env, start_new_session=True,
                                stderr=noise.write_fd if noise else None)
    finally:
        if noise:
            noise.started()
    try:
        return _watch(proc, out, cfg, ranks, describe, diagnose_hang)
    finally:
        if noise:
            noise.close()


#: Seconds between two reads of a monitored run's records by its launcher (the environment
#: variable ``PARDIAG_MONITOR_POLL_S`` sets another).
MONITOR_POLL_S = 2.0


class _MonitorFollow:
    """The launcher's side of ``--monitor``: every :data:`MONITOR_POLL_S` seconds, the new
    findings of the ranks' records (:class:`pardiag.analyzer.analyses.monitor_follow.Follower`)
    on standard error, one line each. With ``--monitor-capture``, a finding asks every rank for
    a deep capture starting a record period (and 5 steps) after the last step written (no rank
    is further ahead than the period, and each looks for the request at every step), when the
    run's last capture has ended and fewer than ``--monitor-captures`` were asked for; a finding
    said while a capture is asked for or recording asks for none, nor one that has ended by
    the time it is read (a capture would show the run after it). A finding that began in the
    run's start-up asks only once it has gone on past it
    (:meth:`~pardiag.analyzer.analyses.monitor_follow.Follower.capture_worthy`). On several
    nodes only node 0's launcher asks (the nodes share the run folder the ranks read)."""

    def __init__(self, out: Path, cfg: ProfileConfig) -> None:
        from pardiag.analyzer.analyses.monitor_follow import Follower

        self.follower = Follower(out)
        self.out, self.cfg = out, cfg
        self.poll_s = env_seconds("PARDIAG_MONITOR_POLL_S", MONITOR_POLL_S)
        self.last = 0.0
        #: (first, last) step of each capture asked for
        self.asked: list[tuple[int, int]] = []
        self.done = False   # no further capture: the most were asked for, or a script ended
        #: findings said in the start-up, each with its line, until known to be worth a capture
        self.waiting: list[tuple[dict, str]] = []
        #: only node 0's launcher asks for captures (every node's reads the same records)
        self.asks = bool(cfg.monitor_capture) and (cfg.node_rank or 0) == 0

    def poll(self, now: float) -> None:
        if now - self.last < self.poll_s:
            return
        self.last = now
        from pardiag.analyzer.analyses.monitor_follow import online_line

        try:
            found = self.follower.new_findings()
        except Exception as exc:   # the job goes on; the report reads the records again
            print(f"pardiag: monitor: could not read the records: {exc}", file=sys.stderr)
            return
        for f, ongoing in found:
            line = online_line(f, ongoing)
            print(f"pardiag: monitor: {line}", file=sys.stderr, flush=True)
            self._keep_said(f, ongoing, line)
            self.waiting.append((f, line))
        if not self.asks:
            self.waiting.clear()
        waiting, self.waiting = self.waiting, []
        for f, line in waiting:   # in the order said
            worthy = self.follower.capture_worthy(f)
            if worthy is None:   # began in the start-up and goes on: asked once it lasts past it
                self.waiting.append((f, line))
            elif worthy and not self.done:
                self._capture(line)

    def _keep_said(self, f: dict, ongoing: bool, line: str) -> None:
        """Append the finding said live to :func:`pardiag.layout.said_findings_path` (node 0's
        launcher only: every node's reads the same records), so that the report says whether
        the whole run confirms it."""
        if (self.cfg.node_rank or 0) != 0:
            return
        import orjson

        rec = {"kind": f["kind"], **({"rank": int(f["rank"])} if "rank" in f else {}),
               "first_step": int(f["first_step"]), "last_step": int(f["last_step"]),
               "ongoing": bool(ongoing), "line": line}
        path = layout.said_findings_path(self.out)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("ab") as fh:
                fh.write(orjson.dumps(rec) + b"\n")
        except OSError as exc:   # the line was said; the report just cannot weigh it
            print(f"pardiag: monitor: could not keep the finding for the report: {exc}",
                  file=sys.stderr)

    def _capture(self, reason: str) -> None:
        """Ask for a deep capture for the finding said as ``reason``, where one may start."""
        from pardiag.analyzer.analyses.monitor_follow import request_capture

        if self.follower.ended:
            self.done = True   # a rank's script has ended: no step is left to record
            print("pardiag: monitor: no deep capture: the script had ended on rank(s) "
                  f"{', '.join(map(str, sorted(self.follower.ended)))} when this was read",
                  file=sys.stderr, flush=True)
            return
        data = self.follower.data()
        top = int(data.steps["step"].max()) if data is not None else 0
        if self.asked and top <= self.asked[-1][1] + 1:
            return   # the last capture is asked for or recording: it shows this too
        start = top + int(self.cfg.monitor_every or 1) + 5
        steps = self.cfg.monitor_capture
        request_capture(self.out, start, steps, reason)
        self.asked.append((start, start + steps - 1))
        self.done = len(self.asked) >= self.cfg.monitor_captures
        where = layout.capture_dir(self.out, start)
        print(f"pardiag: monitor: every rank records a trace of steps {start}–"
              f"{start + steps - 1} into {where}"
              + ("" if not self.done else " (the only deep capture --monitor-captures 1 allows)"
                 if self.cfg.monitor_captures == 1 else f" (the last of the "
                 f"{self.cfg.monitor_captures} deep captures --monitor-captures allows)"),
              file=sys.stderr, flush=True)


def _wait_or_timeout(proc, cfg, ranks) -> tuple[int, list | None] | None:
    """Wait for torchrun to end; stop its ranks when they are stuck at exit (every rank has
    written its files, or one finished and this node's others did not within
    ``cfg.exit_grace_s``). Returns ``(exit code, hang lines or None)``, or None when
    ``cfg.timeout_s`` or ``cfg.stall_s`` expired first (``ranks.stopped_by`` says which). On
    Ctrl-C stops the job and raises again."""
    started = time.time()
    first_done: float | None = None
    all_done = 0.0
    n = cfg.nproc_per_node
    follow = _MonitorFollow(ranks.out, cfg) if cfg.monitor_every else None
    try:
        while True:
            try:
                code = proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
            else:
                orphans = _stop_orphaned_ranks(code)
                if orphans:
                    print(f"pardiag: {orphans}", file=sys.stderr)
                return code, None
            now = time.time()
            if follow is not None:
                follow.poll(now)
            if cfg.timeout_s is not None and now - started > cfg.timeout_s:
                ranks.stopped_by = "timeout"
                return None
            if cfg.stall_s is not None and ranks.stalled_for(now) > cfg.stall_s:
                ranks.stopped_by = "stall"
                return None
            # A rank that finished while another never exits: a hang at teardown (seen with
            # gloo when objects holding a process group are freed). Stop it after a grace.
            ranks.scan()
            done = len(ranks.mine)
            others = any((m.ended_unix or 0) >= started for m in ranks.all.values())
            if (done or others) and first_done is None:
                first_done = now
            world = n * cfg.nnodes
            if sum((m.ended_unix or 0) >= started for m in ranks.all.values()) >= world:
                all_done = all_done or now
                if now - all_done > EXIT_STUCK_S:   # every file is written: nothing is lost
                    _stop(proc, graceful=False)
                    return proc.returncode if proc.returncode is not None else -9, [
                        f"{EXIT_STUCK_S:g} s after every rank had written its files, "
                        f"this node's ranks had not exited; they were stopped (their files "
                        f"are complete)"]
            if first_done is not None and done < n and now - first_done > cfg.exit_grace_s:
                ranks.scan()
                expected = ranks.expected(cfg)
                stuck = [r for r in expected if r not in ranks.mine] if expected else []
                _dump_stacks(_rank_pids(proc.pid))   # where they are, before they are stopped
                _stop(proc, graceful=False)
                which = (f"rank(s) {stuck}" if expected
                         else f"{n - len(ranks.mine)} of this node's {n} ranks")
                return proc.returncode if proc.returncode is not None else -9, [
                    f"{which} did not exit within {cfg.exit_grace_s:g} s after another rank "
                    f"finished (a hang at the end of the script or in its teardown); they were "
                    f"stopped", *_stacks_lines(ranks.out, stuck, str(Path(cfg.script).resolve()))]
    except KeyboardInterrupt:
        _stop(proc)
        raise


def _hang_dumps(out: Path, world: int) -> dict[int, dict]:
    """``{rank: hang dump}`` of the dumps written so far in ``out``."""
    got = {}
    for r in range(world):
        try:   # hang dumps stay plain JSON (flight recorder)
            got[r] = json.loads(layout.hang_path(out, r).read_text())
        except (OSError, ValueError):
            continue
    return got


def _request_hang_dumps(request: Path, out: Path, ranks, n: int, world: int) -> None:
    """Ask every rank for its hang dump (``request``) and wait, at most 15 s, until all are
    written, or this node's are and the other nodes' had 3 s more to appear."""
    deadline = time.time() + 15.0
    mine_done: float | None = None
    while time.time() < deadline:
        request.touch()   # again and again: another node's launcher may remove it meanwhile
        got = _hang_dumps(out, world)
        if len(got) == world:
            break
        if mine_done is None and sum(d.get("launch_id") == ranks.launch_id
                                     for d in got.values()) >= n:
            mine_done = time.time()
        if mine_done is not None and time.time() - mine_done > 3.0:
            break   # this node's dumps are written; the other nodes' had time to appear
        time.sleep(0.2)


def _stack_dump_silent(proc, cfg, ranks, got: dict[int, dict], world: int) -> None:
    """SIGUSR1 to this node's ranks when some wrote neither a hang dump nor their files, then
    2 s for faulthandler to write their stacks."""
    # a rank whose main thread holds the interpreter in native code cannot answer the request
    # (its watchdog thread never runs): faulthandler writes every thread's stack on SIGUSR1
    silent = [r for r in (ranks.expected(cfg) or []) if r not in got and r not in ranks.mine]
    if silent or (ranks.expected(cfg) is None and len(got) < world):
        _dump_stacks(_rank_pids(proc.pid))


def _hang_lines(out: Path, got: dict[int, dict], world: int, ranks, n: int, describe,
                diagnose_hang, script: str | None = None) -> list[str]:
    """The lines describing the hang: the stuck collectives of the dumps ``got``, where the
    main thread of each rank without a dump was (its stacks file; the user's ``script``'s
    frame named too), or why nothing was stuck."""
    from ..analyzer.analyses.hang import describe_p2p, diagnose_p2p

    stuck = diagnose_hang(got, world)
    stacks = {r: d.get("main_stack", []) for r, d in got.items()}
    lines = [describe(s, stacks, script) for s in stuck]
    lines += [describe_p2p(s, stacks, script) for s in diagnose_p2p(got)]
    for r in range(world):
        found = None if r in got else _stacks_of(out, r, script)
        if found is not None:
            lines.append(f"rank {r} wrote no hang dump (its main thread did not let the "
                         f"watchdog run); its main thread was at {found[1]} (all threads: "
                         f"{layout.stacks_path(out, r)})")
    ranks.scan()
    if not lines and len(ranks.mine) == n:
        lines = ["every rank of this node had written its files and was ending when the job "
                 "was stopped; they were stopped (their files are complete)"]
    if not lines:
        from ..analyzer.analyses.hang import frame_in_script

        where = []
        for r in sorted(got):
            frames = [f.strip().splitlines()[0] for f in stacks[r] if f.strip()]
            if frames:
                where.append(f"rank {r} at {frame_in_script(frames[::-1], script)}")
        lines = ["no collective is waiting on a missing rank; "
                 + ("; ".join(where) if where else f"ranks with a dump: {sorted(got)}")]
    return lines


def _watch(proc, out, cfg, ranks, describe, diagnose_hang) -> tuple[int, list | None]:
    """Watch torchrun until it ends (:func:`_wait_or_timeout`); when ``cfg.timeout_s`` or
    ``cfg.stall_s`` expires, collect the ranks' hang dumps, stop the job and describe the hang.
    Returns ``(exit code, hang lines or None)``."""
    ended = _wait_or_timeout(proc, cfg, ranks)
    if ended is not None:
        return ended
    since = ranks.stalled_for(time.time())
    if ranks.stopped_by == "timeout" and 0 < since <= RUNNING_WITHIN_S:
        # a time limit reached: the ranks are stopped as Ctrl-C stops them (they write their
        # files), and no snapshot of their collectives is taken for a hang
        _stop(proc)
        return proc.returncode if proc.returncode is not None else -9, [
            f"{layout.STILL_RUNNING}: a rank's optimizer step ended {since:.1f} s before "
            f"--timeout {cfg.timeout_s:g} s expired; the ranks were stopped and wrote their files"]
    n = cfg.nproc_per_node
    request = layout.dump_request_path(out)
    world = n * cfg.nnodes
    _request_hang_dumps(request, out, ranks, n, world)
    got = _hang_dumps(out, world)
    ranks.scan()
    _stack_dump_silent(proc, cfg, ranks, got, world)
    _stop(proc, graceful=False)  # the dumps are written; nothing left to wait for
    request.unlink(missing_ok=True)
    lines = _hang_lines(out, got, world, ranks, n, describe, diagnose_hang,
                        str(Path(cfg.script).resolve()))
    return proc.returncode if proc.returncode is not None else -9, lines


def _command_and_env(cfg: ProfileConfig, out: Path, script: str,
                     launch_id: str) -> tuple[list[str], dict]:
    """torchrun's command line (every rank runs pardiag's rank entry) and its environment
    (the ranks' configuration, the launch id); returns ``(cmd, env)``."""
    rank_cfg = {"out": str(out), "script": script, "args": list(cfg.args),
                "wait": cfg.wait, "warmup": cfg.warmup, "active": cfg.active,
                "pin_cpu": cfg.pin_cpu, "overwrite": cfg.overwrite,
                "monitor_every": cfg.monitor_every, "monitor_capture": cfg.monitor_capture,
                "monitor_calls": cfg.monitor_calls, "stall_s": cfg.stall_s,
                # each rank's optimizer steps touch its progress file: a job stopped by
                # --timeout while making them was still running (_watch)
                "progress": cfg.timeout_s is not None or cfg.stall_s is not None,
                "hang_dumps": cfg.timeout_s is not None or cfg.stall_s is not None}
    cmd = [sys.executable, "-m", "pardiag.collectors.torchrun_quiet", *cfg.torchrun_args(),
           "--nproc-per-node", str(cfg.nproc_per_node), "-m", "pardiag.collectors.rank_entry"]
    # torchrun sets OMP_NUM_THREADS=1 when unset, with a banner; set the same value quietly.
    # The flight recorder (collectives with group, seq, sizes) holds 2000 entries by default;
    # a profiled window of FSDP or pipeline steps can hold more.
    env = {"OMP_NUM_THREADS": "1", "TORCH_FR_BUFFER_SIZE": "20000", **os.environ,
           CONFIG_ENV: json.dumps(rank_cfg), LAUNCH_ID_ENV: launch_id}
    return cmd, env


@dataclasses.dataclass
class _RankOutcomes:
    """What this node's ranks' metadata say (:func:`_rank_outcomes`).

    Attributes:
        failed: ``{rank: error line}``, first failure first.
        codes: the ranks' exit codes, in the order the ranks ended.
        no_trace: ``{rank: optimizer steps}`` of ranks without a trace.
        short: ``{rank: active steps recorded}`` of ranks with fewer than ``cfg.active``.
    """

    failed: dict[int, str]
    codes: list[int]
    no_trace: dict[int, int]
    short: dict[int, int]


def _rank_outcomes(metas: dict, cfg: ProfileConfig) -> _RankOutcomes:
    """Exit codes, failures, missing and short traces of the ranks' metadata ``metas``."""
    failed: dict[int, str] = {}
    codes: list[int] = []
    no_trace: dict[int, int] = {}
    short: dict[int, int] = {}
    ended_at: dict[int, float] = {}
    for r, meta in sorted(metas.items()):
        codes.append(int(meta.exit_code or 0))
        steps = int(meta.optimizer_steps or 0)
        recorded = max(0, min(cfg.active, steps - cfg.wait - cfg.warmup))
        if not meta.trace_file and cfg.monitor_every is None:
            no_trace[r] = steps
        elif recorded < cfg.active and meta.status == "ok":
            short[r] = recorded
        ended_at[r] = float(meta.ended_unix or 0.0)
        if meta.status == "error" or meta.exit_code:
            failed[r] = meta.error or f"exit code {meta.exit_code}"
    failed = dict(sorted(failed.items(), key=lambda kv: ended_at.get(kv[0], 0.0)))
    # in the order the ranks ended: the first failure's code is the script's, the others' are
    # often torchrun's SIGTERM to the ranks still running (143)
    order = sorted(metas, key=lambda r: (ended_at.get(r, 0.0), r))
    codes = [int(metas[r].exit_code or 0) for r in order]
    return _RankOutcomes(failed, codes, no_trace, short)


def _files_complete(line: str) -> bool:
    """A hang line that says the rank(s) had written every file when they were stopped."""
    return (line.startswith(f"{EXIT_STUCK_S:g} s after every rank")
            or line.startswith("every rank of this node had written")
            or "stopped itself after writing its files" in line)


def _exit_code(codes: list[int], hang: list | None, returncode: int, missing: list[int],
               n_metas: int, cfg: ProfileConfig) -> int:
    """The exit code to pass on: the non-zero one of the rank that ended first (``codes`` in the
    order the ranks ended), one that is not a SIGTERM's (143: torchrun stopping the other ranks
    after a failure) where there is one; 0 where only the exit stuck
    after every file was written; ``TIMEOUT_EXIT_CODE`` on a hang; torchrun's (or 1) where a
    rank is missing; else 0."""
    nonzero = [c for c in codes if c != 0]
    nonzero = [c for c in nonzero if c != SIGTERM_EXIT_CODE] or nonzero
    complete = not missing and n_metas == cfg.nproc_per_node   # every rank wrote its files
    if hang and hang[0].startswith(layout.STILL_RUNNING) and \
            all(c == SIGTERM_EXIT_CODE for c in nonzero):
        return TIMEOUT_EXIT_CODE   # --timeout stopped a running job: its ranks' SIGTERM codes
    if nonzero:
        return nonzero[0]
    if hang is not None and complete and all(_files_complete(line) for line in hang):
        return 0   # the script ended and everything was written; only the exit stuck
    if hang is not None:
        return TIMEOUT_EXIT_CODE
    if returncode != 0 or missing or n_metas < cfg.nproc_per_node:
        return returncode or 1
    return 0


def _load_average() -> list[float] | None:
    """The host's 1, 5 and 15 minute load averages, None where the OS has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


#: Repetitions of the host probe's loop (:func:`host_probe_ms`); its median is kept.
HOST_PROBE_REPEATS = 7
#: Iterations of the probe's loop: about 8 ms on a 2020s x86 core.
HOST_PROBE_ITERATIONS = 150_000


def host_probe_ms() -> float:
    """How long a fixed single-core workload takes on this host now (ms, median of
    :data:`HOST_PROBE_REPEATS` timings of a pure-Python loop of :data:`HOST_PROBE_ITERATIONS`
    multiply-adds; about 60 ms in all).

    A virtual machine's cores slow down as a whole when its neighbours load the physical host,
    which the load average of this host does not show. Timed before and after each run, the
    probe tells a comparison that the host, not the change, was slower (the same probe on the
    same machine took 8.4 ms and, minutes later, 15.4 ms)."""
    times = []
    for _ in range(HOST_PROBE_REPEATS):
        t0 = time.perf_counter()
        acc = 0
        for i in range(HOST_PROBE_ITERATIONS):
            acc += i * i
        times.append((time.perf_counter() - t0) * 1e3)
    return round(statistics.median(times), 3)


def _write_run_file(out: Path, cfg: ProfileConfig, ranks: _NodeRanks, node_rank: int | None,
                    times: tuple[float, float], returncode: int, exit_code: int,
                    hang: list | None, failed: dict[int, str], missing: list[int],
                    loads: tuple[list[float] | None, list[float] | None] = (None, None),
                    probes: tuple[float | None, float | None] = (None, None)) -> None:
    """Write this node's part of the run file (``times``: started, ended; ``loads``: the load
    averages then; ``probes``: :func:`host_probe_ms` then)."""
    metas = ranks.mine
    started, ended = times
    nodes: dict[str, list[int]] = {}
    for r, m in sorted(metas.items()):
        nodes.setdefault(str(m.host), []).append(r)
    run_layout = _run_layout(ranks.all)
    backends = {m.backend for m in metas.values() if m.backend}
    torch_versions = {m.torch_version for m in metas.values() if m.torch_version}
    node_opts = [] if cfg.standalone else cfg.torchrun_args()
    run = layout.RunFile(
        pardiag_version=__version__,
        command=shlex.join(["pardiag", "profile", str(cfg.script),
                            "--nproc-per-node", str(cfg.nproc_per_node), *node_opts,
                            *(["--pin-cpu"] if cfg.pin_cpu else []),
                            *(["--timeout", f"{cfg.timeout_s:g}"] if cfg.timeout_s else []),
                            *(["--stall-timeout", f"{cfg.stall_s:g}"] if cfg.stall_s else []),
                            *(["--monitor", "--monitor-every", str(cfg.monitor_every)]
                              if cfg.monitor_every else []),
                            *(["--monitor-capture", str(cfg.monitor_capture)]
                              if cfg.monitor_every and cfg.monitor_capture else []),
                            *(["--monitor-captures", str(cfg.monitor_captures)]
                              if cfg.monitor_every and cfg.monitor_capture
                              and cfg.monitor_captures != MONITOR_CAPTURES else []),
                            *(["--no-monitor-calls"]
                              if cfg.monitor_every and not cfg.monitor_calls else []),
                            "--", *cfg.args]),
        script=str(cfg.script), script_args=list(cfg.args),
        world_size=cfg.nproc_per_node * cfg.nnodes, nproc_per_node=cfg.nproc_per_node,
        nnodes=cfg.nnodes, node_rank=node_rank,
        schedule=layout.ProfilerSchedule(wait=cfg.wait, warmup=cfg.warmup, active=cfg.active),
        started_unix=started, ended_unix=ended, torchrun_exit_code=returncode,
        exit_code=exit_code,
        timed_out_after_s=cfg.timeout_s if ranks.stopped_by == "timeout" else None,
        stalled_after_s=cfg.stall_s if ranks.stopped_by == "stall" else None, hang=hang or [],
        nodes=nodes, layout=run_layout,
        backend=backends.pop() if len(backends) == 1 else sorted(backends) or None,
        torch_version=(torch_versions.pop() if len(torch_versions) == 1
                       else sorted(torch_versions) or None),
        failed_ranks={str(k): v for k, v in failed.items()}, missing_ranks=missing,
        load_before=loads[0], load_after=loads[1],
        host_probe_before_ms=probes[0], host_probe_after_ms=probes[1],
        monitor_every=cfg.monitor_every)
    part = layout.node_run_path(out, node_rank if node_rank is not None
                                else "-" + re.sub(r"[^\w.-]", "_", socket.gethostname()))
    tmp = part.with_suffix(".json.tmp")
    tmp.write_bytes(layout.encode_sidecar(run))
    os.replace(tmp, part)
    _write_capture_run_files(out, part.name, run, cfg.monitor_capture)


def _run_layout(metas: dict[int, layout.RankMeta]) -> dict | None:
    """The run file's ``layout``: the lowest rank's that has one (its dims, strategies and,
    where known, pipeline, folded dimensions and FSDP's reshard setting), else None."""
    layouts = {r: m.layout for r, m in metas.items() if m.layout}
    if not layouts:
        return None
    first = layouts[min(layouts)]
    return {"dims": first["dims"], "strategies": first["strategies"],
            **({"pipeline": first["pipeline"]} if first.get("pipeline") else {}),
            **({"folded": first["folded"]} if first.get("folded") else {}),
            **({"fsdp_reshard_after_forward": first["fsdp_reshard_after_forward"]}
               if "fsdp_reshard_after_forward" in first else {})}


def _write_capture_run_files(out: Path, name: str, run: layout.RunFile, steps: int) -> None:
    """A monitored run's completed deep captures (``capture-S/`` with a rank's metadata, written at
    the capture's last step) get the run's file too (``name``: this node's part), its schedule
    the capture's: the profiler skipped S steps and recorded the ``steps`` every rank was asked
    for (fewer when the job was stopped while it recorded: the steps its ranks had done), and
    its layout the capture's ranks' metadata's, and its ``capture`` the run and the steps and
    finding the capture was asked for (:attr:`layout.RunFile.capture`). A capture report then
    names the job's command, script and arguments, as a profiled run's does, and still says
    where it comes from when copied away from the run."""
    asked = {first: (last, reason) for first, last, reason
             in layout.asked_captures(layout.read_capture_request(out))}
    for first, cap in layout.capture_folders(out):
        try:
            if steps <= 0 or not any(layout.sidecar_dir(cap).glob(
                    layout.RANK_META_TEMPLATE.format(rank="*"))):
                continue
            metas = {}
            for p in layout.sidecar_dir(cap).glob(layout.RANK_META_TEMPLATE.format(rank="*")):
                meta = layout.decode_sidecar(p.read_bytes(), "rank")
                metas[int(meta.rank)] = meta
            # a capture cut short (Ctrl-C) recorded the steps its ranks had done
            done = [int(m.optimizer_steps) - first for m in metas.values()
                    if m.optimizer_steps is not None]
            active = max(1, min([steps, *done]))
            # the capture's layout: a monitored run records none outside its captures
            last, reason = asked.get(first, (first + active - 1, None))
            mine = msgspec.structs.replace(
                run, schedule=layout.ProfilerSchedule(wait=first, warmup=0, active=active),
                layout=_run_layout(metas) or run.layout,
                capture={"monitored_run": str(out.resolve()), "first_step": first,
                         "last_step": last, "reason": reason})
            path = layout.sidecar_dir(cap) / name
            path.with_suffix(".json.tmp").write_bytes(layout.encode_sidecar(mine))
            os.replace(path.with_suffix(".json.tmp"), path)
        except (OSError, ValueError) as exc:   # the capture is still read without it
            print(f"pardiag: {cap}: could not write its run file: {exc}", file=sys.stderr)


def _kept(out: Path, metas: dict, ranks: list[int] | None) -> str:
    """What a run folder keeps after Ctrl-C stopped its job, in words: the trace files on disk
    of this node's ``ranks`` (None: unknown, the ranks with metadata), and which of them lack
    metadata (a rank stopped before writing it; its trace is still read, with the metadata it
    wrote when its profiling window closed)."""
    traces = [r for r in (sorted(metas) if ranks is None else ranks)
              if layout.trace_path(out, r).is_file()]
    bare = [r for r in traces if r not in metas]
    opened = [r for r in (sorted(metas) if ranks is None else ranks)
              if layout.monitor_path(out, r).is_file()]
    monitored = [r for r in opened if layout.monitor_path(out, r).stat().st_size]
    if opened and not monitored and not traces:   # --monitor, stopped before its first line
        return (f"the job was stopped before any rank wrote a monitor line (one per "
                f"--monitor-every steps): {out} holds no step to report")
    if monitored and not traces:   # --monitor: the records written so far are the run
        caps = [c.name for _, c in layout.capture_folders(out)
                if any(c.glob("rank*.trace.json.gz"))]
        return (f"the job was stopped; {out} keeps the monitor records of rank(s) "
                f"{', '.join(map(str, monitored))} written so far (pardiag report reads them)"
                + (f" and the deep capture(s) {', '.join(caps)}" if caps else ""))
    if not traces:
        kept = "no trace (the profiler's window had not ended)"
    elif not bare:
        kept = f"the traces of rank(s) {', '.join(map(str, traces))} and their metadata"
    else:
        window = [r for r in bare if layout.window_meta_path(out, r).is_file()]
        kept = (f"the traces of rank(s) {', '.join(map(str, traces))}; rank(s) "
                f"{', '.join(map(str, bare))} stopped before writing their metadata"
                + (f" (rank(s) {', '.join(map(str, window))} keep what it held when the "
                   f"profiling window closed)" if window else ""))
    return f"the job was stopped; {out} keeps {kept}"


class _Terminated(KeyboardInterrupt):
    """SIGTERM to ``pardiag profile`` itself (``timeout``, a batch system's cancel, ``kill``):
    the job is stopped as Ctrl-C stops it. torchrun and its ranks run in sessions of their own,
    so a signal to this process alone reaches none of them."""


class _OnSigterm:
    """While entered (in the main thread), SIGTERM raises :class:`_Terminated` once; a second
    one, while the job is being stopped, is ignored so the stop completes."""

    def __init__(self) -> None:
        self.raised = False
        self._old = None

    def _handle(self, signum, frame) -> None:
        if not self.raised:
            self.raised = True
            raise _Terminated()

    def __enter__(self) -> _OnSigterm:
        import signal

        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        import signal

        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)


def run_profile(cfg: ProfileConfig) -> ProfileResult:
    """Run ``cfg.script`` under torchrun with the profiler on every rank.

    Writes ``cfg.out`` as described in :mod:`pardiag.layout`. Output of the script passes
    through (standard error without torch's profiler noise, :class:`NoiseFilter`). In a
    multi-node run (``cfg.nnodes`` > 1) every node runs this with its own ``node_rank``; each
    writes its ranks' files and its part of the run file (:func:`pardiag.layout.node_run_path`).

    Returns:
        ProfileResult with the exit code to pass on (this node's ranks').

    Raises:
        PardiagError: torch is not installed, the script is missing, or ``out`` is not empty.
        Interrupted: Ctrl-C stopped the job (after its ranks wrote their files and the run
            file was written); the message says what the run folder keeps.
    """
    if importlib.util.find_spec("torch") is None:
        raise PardiagError("pardiag profile needs torch: pip install 'pardiag[profile]'")
    out = Path(cfg.out).resolve()
    _prepare_out(out, cfg.overwrite, cfg)
    if cfg.monitor_every:   # an earlier run's request must not start a capture in this one
        layout.capture_request_path(out).unlink(missing_ok=True)
    script = str(Path(cfg.script).resolve())
    launch_id = f"{socket.gethostname()}:{os.getpid()}:{time.time_ns()}"
    cmd, env = _command_and_env(cfg, out, script, launch_id)
    ranks = _NodeRanks(out, launch_id)
    probe_before = host_probe_ms()
    started = time.time()
    load_before = _load_average()
    interrupted = terminated = False
    with _OnSigterm():
        try:
            returncode, hang = _run_torchrun(cmd, env, out, cfg, ranks)
        except KeyboardInterrupt as exc:  # the job is stopped (_wait_or_timeout): its ranks
            terminated = isinstance(exc, _Terminated)   # wrote their files
            returncode = SIGTERM_EXIT_CODE if terminated else EXIT_INTERRUPTED
            hang, interrupted = None, True
    ended = time.time()
    ranks.scan()
    metas = ranks.mine
    node_rank = ranks.node_rank(cfg)
    expected = ranks.expected(cfg)
    missing = [r for r in expected if r not in metas] if expected is not None else []
    if expected is None and len(metas) < cfg.nproc_per_node:
        print(f"pardiag: {cfg.nproc_per_node - len(metas)} of this node's ranks wrote no "
              f"metadata (their numbers are unknown: no rank of the node finished)",
              file=sys.stderr)

    # a rank that stopped itself, hung in pardiag's work after its script (its backstop)
    mine = sorted({*metas, *missing} if expected is None else expected)
    stopped = [ln for ln in _stacks_lines(out, mine, script) if "stopped itself" in ln]
    if stopped:
        hang = [*(hang or []), *stopped]
    for r in mine:   # a rank killed before it could remove its empty stacks file
        with contextlib.suppress(OSError):
            if layout.stacks_path(out, r).stat().st_size == 0:
                layout.stacks_path(out, r).unlink()
    got = _rank_outcomes(metas, cfg)
    exit_code = ((SIGTERM_EXIT_CODE if terminated else EXIT_INTERRUPTED) if interrupted
                 else _exit_code(got.codes, hang, returncode, missing, len(metas), cfg))
    _write_run_file(out, cfg, ranks, node_rank, (started, ended), returncode, exit_code, hang,
                    got.failed, missing, (load_before, _load_average()),
                    (probe_before, None if interrupted else host_probe_ms()))
    if interrupted:  # the run file says so; the command ends with what the folder keeps
        kept = _kept(out, metas, expected)
        raise (Interrupted(f"stopped by SIGTERM; {kept}", SIGTERM_EXIT_CODE) if terminated
               else Interrupted(kept))
    window = cfg.wait + cfg.warmup + cfg.active + 1   # and the step that exports the trace
    after = [int(m.optimizer_steps or 0) - window for m in metas.values()
             if m.trace_file and m.status == "ok" and cfg.monitor_every is None]
    return ProfileResult(exit_code=exit_code, out=out, failed_ranks=got.failed,
                         missing_ranks=missing, no_trace=got.no_trace, short_ranks=got.short,
                         hang=hang or [], contention=layout.contention_note(metas.values()),
                         after_window=max(min(after), 0) if after else None,
                         stopped_by=ranks.stopped_by)
