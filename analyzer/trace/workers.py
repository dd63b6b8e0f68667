"""Trace files parsed in worker processes (:func:`parse_files`): when the input is large
(:func:`default_workers`), a fresh process per large file or per batch of small ones
(:data:`WORKER_BATCH_BYTES`), forked ahead of need; each hands back its
:class:`~pardiag.analyzer.trace.files.ParsedFile` (with a reducer, only the rank's summary)."""

from __future__ import annotations

import dataclasses
import math
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pardiag.errors import PardiagError

from . import classify
from .files import ParsedFile, parse_file

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

#: Below this many bytes of input, files are parsed in this process (workers cost ~0.1 s).
PARALLEL_MIN_BYTES = 8_000_000


def default_workers(files: list[Path]) -> int:
    """Worker processes for parsing ``files``: one per CPU core (at most one per file), or 1
    (this process) when the input is small."""
    try:
        total = sum(f.stat().st_size for f in files)
    except OSError:
        total = 0
    if len(files) < 2 or total < PARALLEL_MIN_BYTES:
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(len(files), cpus or 1))


#: A worker process parses files until they add up to this many bytes (on disk), then exits
#: and a fresh process takes the next ones. A process's heap keeps the high-water mark of the
#: largest file it parsed (freed memory is fragmented and seldom returned to the system), so a
#: process per large file bounds each worker by one file's peak, while small files share a
#: process (a fork costs a few ms); see ``benchmarks/bench_report.py``.
WORKER_BATCH_BYTES = 1_000_000


def _batches(files: list[Path], budget: int) -> list[list[int]]:
    """Consecutive indices of ``files`` in groups of at least one file and, beyond the first,
    at most ``budget`` bytes in all."""
    out: list[list[int]] = []
    size = budget
    for i, f in enumerate(files):
        try:
            n = f.stat().st_size
        except OSError:
            n = 0
        if not out or size + n > budget:
            out.append([])
            size = 0
        out[-1].append(i)
        size += n
    return out


def _parse_batch(conn, files: list[Path], kw: dict, inherited: list, go=None) -> None:
    """Worker process: :func:`parse_file` for each of ``files``, the list sent on ``conn``
    (or the exception raised, which :func:`parse_file` does only for a bug).

    ``inherited`` are the pipe ends this process got by fork and must not hold: result read
    ends (its own and other workers') and the parent's ends of start pipes. Closed first, so
    that each pipe's only reader (or writer) is the parent: were the parent killed, a worker's
    send fails instead of blocking forever on a pipe no one reads, and a worker waiting on
    ``go`` (a start pipe: :func:`parse_files` forks the next worker before it is needed) reads
    end-of-file instead of waiting forever; either way the worker exits."""
    for c in inherited:
        c.close()
    if go is not None:
        try:
            started = go.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        finally:
            go.close()
        if not started:
            return
    out: tuple[bool, list[ParsedFile] | BaseException, dict]
    try:
        # with the name tests' answers, which workers forked later inherit from the parent
        out = (True, [parse_file(f, **kw) for f in files], classify.name_tests_known())
    except BaseException as exc:  # noqa: BLE001 - handed to the parent, which raises it
        out = (False, exc, {})
    try:
        try:
            conn.send(out)
        except OSError:  # the parent is gone
            return
        except Exception as exc:  # noqa: BLE001 - an exception that cannot be pickled
            conn.send((False, RuntimeError(f"parsing {files[0]}: {exc!r}"), {}))
    except OSError:
        return
    finally:
        conn.close()


@dataclasses.dataclass
class _Worker:
    """A worker process of :func:`parse_files` and the parent's ends of its pipes."""

    batch: list[int]
    proc: BaseProcess
    results: Connection      # read end of the result pipe
    go: Connection | None    # write end of the start pipe (None: started when forked)


def _start_worker(ctx, files: list[Path], batch: list[int], kw: dict, others: list[_Worker],
                  *, fork: bool, wait: bool) -> _Worker:
    """Fork (or spawn) the process for ``batch``; with ``wait`` it waits for
    :func:`_release` before parsing. ``others`` are the workers alive now, whose pipe ends the
    new process closes (:func:`_parse_batch`)."""
    recv, send = ctx.Pipe(duplex=False)
    go_recv, go_send = ctx.Pipe(duplex=False) if wait else (None, None)
    inherited = [recv, *([go_send] if wait else [])]
    for w in others:
        inherited += [w.results, *([w.go] if w.go is not None else [])]
    proc = ctx.Process(target=_parse_batch, daemon=True,
                       args=(send, [files[i] for i in batch], kw,
                             inherited if fork else [], go_recv))
    # the worker starts with SIGINT blocked: a Ctrl-C reaches this process, which stops the
    # workers itself, instead of printing a traceback from each of them
    masked = hasattr(signal, "pthread_sigmask")
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if masked else set()
    try:
        proc.start()
    finally:
        if masked:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
    send.close()
    if go_recv is not None:
        go_recv.close()
    return _Worker(batch, proc, recv, go_send)


def _release(w: _Worker, start: bool = True) -> None:
    """Let a waiting worker parse (or, ``start=False``, exit without parsing)."""
    if w.go is not None:
        try:
            w.go.send(start)
        except OSError:  # it died meanwhile: its result pipe says so
            pass
        w.go.close()
        w.go = None


def parse_files(files: list[Path], workers: int, progress, **kw) -> list[ParsedFile]:
    """:func:`parse_file` for every file, in ``workers`` processes at a time; results in file
    order. ``progress(done, total)`` is called from this process as files are done.

    Each worker process is forked (where the platform can) from this thread for a batch of
    files (:data:`WORKER_BATCH_BYTES`) and exits after it. The next ``workers`` processes are
    forked ahead and wait, so a worker starts the moment one finishes, before its result is read
    (a fork and a result's unpickling cost a core ~10 ms per file otherwise). (The standard pools
    cannot do this safely: ``ProcessPoolExecutor`` refuses ``max_tasks_per_child`` with fork,
    since it would fork from a thread; ``multiprocessing.Pool`` forks from a thread and waits
    forever for a worker that was killed.) Where fork is not available, spawned workers take a
    quarter of each worker's share of the files at a time.

    Raises:
        PardiagError: a worker process died (killed, out of memory).
    """
    total = len(files)
    if workers <= 1 or total <= 1:
        out = []
        for i, f in enumerate(files):
            out.append(parse_file(f, **kw))
            if progress:
                progress(i + 1, total)
        return out
    import gc
    import multiprocessing as mp
    from multiprocessing.connection import wait

    fork = "fork" in mp.get_all_start_methods()
    ctx = mp.get_context("fork" if fork else "spawn")
    if fork:
        batches = _batches(files, WORKER_BATCH_BYTES)
        gc.freeze()  # forked workers: the collector does not touch (and so copy) parent pages
    else:
        per = max(1, math.ceil(total / (4 * workers)))
        batches = [list(range(i, min(total, i + per))) for i in range(0, total, per)]
    results: list[Any] = [None] * total
    running: dict[Connection, _Worker] = {}  # result read end -> parsing worker
    ahead: list[_Worker] = []    # forked, waiting to start (fork only)
    succeeded: set[Connection] = set()  # result ends of finished workers whose successor started
    done = 0

    def start(wait_: bool) -> _Worker:
        return _start_worker(ctx, files, batches.pop(0), kw, [*running.values(), *ahead],
                             fork=fork, wait=wait_)

    try:
        while batches or running or ahead:
            while len(running) < workers and (ahead or batches):
                w = ahead.pop(0) if ahead else start(False)
                _release(w)
                running[w.results] = w
            while fork and batches and len(ahead) < workers:
                ahead.append(start(True))
            # wait() hands back the objects it was given: result read ends
            ready = cast("list[Connection]", wait(list(running)))
            for r in ready:  # a finished worker's successor starts before its result is read
                if r not in succeeded:
                    succeeded.add(r)
                    if ahead:
                        nxt = ahead.pop(0)
                        _release(nxt)
                        running[nxt.results] = nxt
            recv = ready[0]  # one result, then wait again: others may finish meanwhile
            w = running.pop(recv)
            succeeded.discard(recv)
            try:
                ok, value, known = recv.recv()
            except EOFError:
                others = (f" and {len(w.batch) - 1} other file(s) after it"
                          if len(w.batch) > 1 else "")
                raise PardiagError(
                    f"a process parsing {files[w.batch[0]]}{others} died (out of memory?); "
                    f"try fewer workers (--workers 1)", exit_code=1) from None
            finally:
                recv.close()
                w.proc.join()
            if not ok:
                raise value
            classify.learn_name_tests(known)
            for i, p in zip(w.batch, value):
                results[i] = p
            done += len(w.batch)
            if progress:
                progress(done, total)
    finally:
        for w in ahead:
            _release(w, start=False)
        for w in [*running.values(), *ahead]:
            w.proc.terminate()
            w.proc.join()
            w.results.close()
        if fork:
            gc.unfreeze()
    return results
