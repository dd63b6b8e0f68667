"""Which rank each trace file holds: a pure function of what the files say about themselves.

:func:`assign_ranks` takes one :class:`FileFacts` per parsed file (or per rank of a file that
holds several ranks, see :func:`split_merged`) and returns the ranks with their files and one
warning line per decision a user should know about. It reads nothing from disk.

Rules, in order:

1. A file's rank is ``distributedInfo.rank`` (or, for a rank cut out of a merged file, the rank
   its process name gives), else a rank or worker number in its file name (``rank3``,
   ``worker_3``), else none yet.
2. Files that claim the same rank and whose time ranges do not overlap are **windows** of that
   rank (``schedule(repeat=N)``, ``tensorboard_trace_handler``'s ``<worker>.<time>.pt.trace.json``
   names): one rank, its windows in time order. Never new ranks.
3. Files that claim the same rank and overlap in time cannot be windows of one process. A file
   whose name gives another rank that no file claims takes that rank (its ``distributedInfo``
   was wrong); otherwise the later one (in file-name order) is left out with a warning.
4. Files with no rank, those one process recorded together (its pid in each, apart in time)
   as one rank's windows, take the rank their communication records name as the caller's own
   (``Rank`` at its place in ``Process Group Ranks``, where every record agrees and no file
   claims it), else the lowest rank no file claims; either with a warning.

A merged multi-rank file (``pardiag merge`` output, or another tool's merge that names each
rank's processes ``rank N``) is split back into its ranks by :func:`split_merged`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any, TypeGuard

from . import vocab

_RANK_IN_NAME_RE = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
_RANK_PROCESS_RE = re.compile(r"^\s*\[?\s*rank\s*(\d+)\b", re.IGNORECASE)
#: pid stride of ``pardiag merge`` output (``pardiag.analyzer.render.merge.PID_STRIDE``).
MERGE_PID_STRIDE = 1000


@dataclasses.dataclass(frozen=True)
class FileFacts:
    """What rank assignment reads of one parsed trace file (or one rank's part of a merged file).

    Attributes:
        key: the caller's index of the file.
        path: the file.
        dist_rank: ``distributedInfo.rank`` as found (any JSON value; None when absent).
        start_us, end_us: the time range of its events (µs, trace clock; NaN when it has none).
        rank_hint: the rank a merged file's process names give to this part, else None.
        processes: the host processes that recorded it (their pids as its thread names give
            them; empty when they give none).
        records_ranks: the global ranks its communication records name as the caller's own
            (:func:`pardiag.analyzer.trace.comm_records.ranks_in_records`; read only for a file
            that names no rank otherwise).
    """

    key: int
    path: Path
    dist_rank: object = None
    start_us: float = math.nan
    end_us: float = math.nan
    rank_hint: int | None = None
    processes: frozenset[str] = frozenset()
    records_ranks: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class RankFiles:
    """One rank and the files that hold it.

    Attributes:
        rank: global rank.
        keys: the files' keys (:attr:`FileFacts.key`), one per profiling window, in time order.
        source: ``"distributedInfo"``, ``"merged file"``, ``"file name"``, ``"records"`` or
            ``"assigned"``.
    """

    rank: int
    keys: tuple[int, ...]
    source: str


def rank_from_name(name: str) -> int | None:
    """The rank or worker number in a file name (``rank3.json``, ``worker_3...``), else None."""
    m = _RANK_IN_NAME_RE.search(name)
    return int(m.group(1)) if m else None


def states_rank(metadata: dict | None, path: Path) -> bool:
    """Whether a file states its rank itself: a ``distributedInfo.rank``, or a rank or worker
    number in its name (:func:`rank_from_name`)."""
    return (vocab.DIST_RANK.get(vocab.DISTRIBUTED_INFO.get(metadata)) is not None
            or rank_from_name(Path(path).name) is not None)


def _valid_rank(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _overlaps(a: FileFacts, b: FileFacts) -> bool:
    if any(math.isnan(x) for x in (a.start_us, a.end_us, b.start_us, b.end_us)):
        return True  # no time range: cannot be told apart from the other
    return a.start_us < b.end_us and b.start_us < a.end_us


def _names_another_free(f: FileFacts, r: int | None, taken: set) -> bool:
    """Whether ``f``'s file name gives a rank other than ``r`` and not ``taken`` (a set: one
    lookup, not a scan of every taken rank per file)."""
    named = rank_from_name(f.path.name)
    return named is not None and named != r and named not in taken


def assign_ranks(files: list[FileFacts]) -> tuple[list[RankFiles], list[str]]:
    """Assign every file to a rank (see the module docstring for the rules).

    Args:
        files: one entry per parsed file or merged-file part, in file-name order.

    Returns:
        (ranks in rank order, warning lines). A file left out is named in a warning.
    """
    warnings: list[str] = []
    claim: dict[int, tuple[int, str]] = {}  # key -> (rank, source)
    pending: list[tuple[FileFacts, str | None]] = []
    by_key = {f.key: f for f in files}
    for f in files:
        if f.rank_hint is not None:
            claim[f.key] = (f.rank_hint, "merged file")
        elif _valid_rank(f.dist_rank):
            claim[f.key] = (int(f.dist_rank), vocab.DISTRIBUTED_INFO.name)
        else:
            why = None if f.dist_rank is None else \
                f"distributedInfo.rank {f.dist_rank!r} is not a rank number"
            r = rank_from_name(f.path.name)
            if r is not None:
                claim[f.key] = (r, "file name")
                if why:
                    warnings.append(f"{f.path}: {why}; using rank {r} from the file name")
            else:
                pending.append((f, why))

    groups: dict[int, list[FileFacts]] = {}
    for key, (r, _) in claim.items():
        groups.setdefault(r, []).append(by_key[key])
    taken = set(groups)
    out: dict[int, tuple[list[FileFacts], str]] = {}
    for r in sorted(groups):
        # a file whose name gives another, free rank yields the claimed one (it moves there on
        # a clash), so a file whose name agrees with its claim keeps it
        # and a rank's own file before a merged file's copy of it
        members = sorted(groups[r], key=lambda f: (
            _names_another_free(f, r, taken), f.rank_hint is not None,
            f.start_us if not math.isnan(f.start_us) else math.inf, f.key))
        kept: list[FileFacts] = []
        for f in members:
            clash = next((k for k in kept if _overlaps(k, f)), None)
            if clash is None:
                kept.append(f)
                continue
            alt = rank_from_name(f.path.name)
            if alt is not None and alt not in taken:
                taken.add(alt)
                out[alt] = ([f], "file name")
                warnings.append(f"{f.path}: rank {r} from {claim[f.key][1]} is also claimed by "
                                f"{clash.path.name}, which overlaps it in time; using rank {alt} "
                                f"from the file name")
            else:
                warnings.append(f"{f.path}: rank {r} is already held by {clash.path.name}, which "
                                f"overlaps it in time (not a second profiling window: the same "
                                f"trace twice, or another run?); left out")
        kept.sort(key=lambda f: (f.start_us if not math.isnan(f.start_us) else math.inf, f.key))
        src = claim[kept[0].key][1]
        out[r] = (kept, src)
        if len(kept) > 1:
            # files of one name in folders of their own are named with their folder
            names = [f.path.name for f in kept]
            if len(set(names)) < len(names):
                names = [f"{f.path.parent.name}/{f.path.name}" for f in kept]
            warnings.append(f"rank {r}: {len(kept)} files are {len(kept)} profiling windows of "
                            f"that rank ({', '.join(names)}); their steps are analysed together, "
                            f"the gaps between them left out")
    alone = _one_process_each(pending)
    recorded = _records_rank_of(alone, taken)
    named = set(recorded.values())   # one lookup per candidate, not a scan of the dict's values
    for i, (fs, why) in enumerate(alone):
        said = why or "no rank in distributedInfo or in the file name"
        r = recorded.get(i)
        if r is not None:
            how = f"rank {r} from its collectives' records (Rank in Process Group Ranks)"
            src = "records"
        else:
            r = 0
            while r in taken or r in named:
                r += 1
            how, src = f"treated as rank {r}", "assigned"
        taken.add(r)
        out[r] = (fs, src)
        if len(fs) == 1:
            warnings.append(f"{fs[0].path}: {said}; {how}")
        else:
            warnings.append(f"{', '.join(f.path.name for f in fs)}: {said}; one process's "
                            f"{len(fs)} profiling windows (its pid in each, apart in time), "
                            f"{how}")
    warnings.extend(_fewer_windows({r: fs for r, (fs, _) in out.items()}))
    ranks = [RankFiles(r, tuple(f.key for f in fs), src) for r, (fs, src) in sorted(out.items())]
    return ranks, warnings


#: ``tensorboard_trace_handler``'s file name: ``<worker>.<ms>.pt.trace.json[.gz]``, the worker
#: name ``<host>_<pid>`` by default.
_HANDLER_NAME_RE = re.compile(r"^(.*)\.\d+\.pt\.trace\.json(?:\.gz)?$")


def _one_process_each(pending: list[tuple[FileFacts, str | None]]
                      ) -> list[tuple[list[FileFacts], str | None]]:
    """The files that name no rank, those one process recorded together: files recorded by the
    same processes (:attr:`FileFacts.processes`, not empty) whose times do not overlap, and
    whose ``tensorboard_trace_handler`` worker names (where both have one) agree, are that
    process's profiling windows; every other file is one of its own. In file order."""
    groups: list[tuple[list[FileFacts], str | None]] = []
    for f, why in pending:
        worker = _HANDLER_NAME_RE.match(f.path.name)
        home = next((g for g in groups if f.processes and g[0][0].processes == f.processes
                     and not any(_overlaps(f, h) for h in g[0])
                     and (worker is None or (m := _HANDLER_NAME_RE.match(g[0][0].path.name))
                          is None or m.group(1) == worker.group(1))), None)
        if home is None:
            groups.append(([f], why))
        else:
            home[0].append(f)
    for fs, _ in groups:
        fs.sort(key=lambda f: (f.start_us if not math.isnan(f.start_us) else math.inf, f.key))
    return groups


def _records_rank_of(groups: list[tuple[list[FileFacts], str | None]], taken: set[int]
                     ) -> dict[int, int]:
    """``{group index: rank}`` for the groups of files (:func:`_one_process_each`) whose
    communication records name one rank as the caller's own (:attr:`FileFacts.records_ranks`,
    every file of the group agreeing) that no file claims and no other group's records name."""
    named: dict[int, int] = {}
    for i, (fs, _) in enumerate(groups):
        ranks = {r for f in fs for r in f.records_ranks}
        if len(ranks) == 1:
            named[i] = ranks.pop()
    count: dict[int, int] = {}
    for r in named.values():
        count[r] = count.get(r, 0) + 1
    return {i: r for i, r in named.items() if r not in taken and count[r] == 1}


def _fewer_windows(files: dict[int, list[FileFacts]]) -> list[str]:
    """One line per rank with fewer profiling windows (files) than the most any rank has: the
    files of the others were not found (lost, or never written), and where each window has a
    folder of its own, the folders that lack one of its files are named."""
    most = max((len(fs) for fs in files.values()), default=0)
    if most < 2:
        return []
    full = min(r for r, fs in files.items() if len(fs) == most)
    folders = [f.path.parent for f in files[full]]
    out = []
    for r, fs in sorted(files.items()):
        if len(fs) == most:
            continue
        lacking = ""
        if len(set(folders)) == most:
            have = {f.path.parent for f in fs}
            lacking = f" (no file of it in {', '.join(d.name for d in folders if d not in have)})"
        out.append(f"rank {r}: {len(fs)} profiling window(s) where rank {full} has {most}"
                   f"{lacking}: the steps of the other window(s) are not in its trace")
    return out


def merged_rank_of_pids(process_names: dict[str, list[str]], pids: list[str],
                        pardiag_merge: bool) -> dict[str, int] | None:
    """``{pid: rank}`` for a file that holds several ranks, else None.

    A process is a rank's when its ``process_name`` or ``process_labels`` starts with
    ``rank N`` or ``[rank N]`` (``pardiag merge`` and other merge tools name them so; torchrun
    prefixes a rank's lines with ``[rankN]:``); in ``pardiag merge``
    output (``pardiagMerge`` key) every pid ``R * 1000 + k`` is rank R's. A file is merged when
    two or more ranks are named this way.

    Args:
        process_names: ``{pid: [process_name and process_labels values]}``.
        pids: every pid that holds events.
        pardiag_merge: the file carries ``pardiagMerge``.
    """
    out: dict[str, int] = {}
    for pid, names in process_names.items():
        for n in names:
            m = _RANK_PROCESS_RE.match(str(n))
            if m:
                out[str(pid)] = int(m.group(1))
                break
    if pardiag_merge:
        for pid in pids:
            try:
                out.setdefault(str(pid), int(float(pid)) // MERGE_PID_STRIDE)
            except ValueError:
                pass
    return out if len(set(out.values())) >= 2 else None


#: A pid that a merge tool suffixed with the rank: ByteDance's Triton-distributed / flux
#: ``group_profile`` writes ``f"{pid}_{rank}"`` for every process of each rank (its GPU's too:
#: ``"1_1"``).
_SUFFIXED_PID_RE = re.compile(r"^(\d+)_(\d+)$")


def suffixed_rank_of_pids(pids: list[Any]) -> tuple[dict[str, int], dict[str, str]] | None:
    """``({pid: rank}, {pid: the process's own pid})`` for a file whose every pid carries a
    merge tool's rank suffix (:data:`_SUFFIXED_PID_RE`) for two or more ranks, else None."""
    got = [(_SUFFIXED_PID_RE.match(str(p)), str(p)) for p in pids]
    if not got or any(m is None for m, _ in got):
        return None
    ranks = {str(p): int(m.group(2)) for m, p in got if m is not None}
    if len(set(ranks.values())) < 2:
        return None
    return ranks, {str(p): m.group(1) for m, p in got if m is not None}


#: A pid that a merge tool prefixed with the rank's coordinates: SGLang's ProfileMerger writes
#: ``[TP00-DP01-PP02-EP03] 50211`` for each process of the rank with those tensor-, data-,
#: pipeline- and expert-parallel ranks (only the kinds the run has).
_LABEL_PID_RE = re.compile(r"^\[((?:TP|DP|PP|EP)\d+(?:-(?:TP|DP|PP|EP)\d+)*)\] (.*)$")
_LABEL_KINDS = ("dp", "ep", "pp", "tp")


def labelled_rank_of_pids(pids: list[Any]) -> tuple[dict[str, int], dict[str, str], str] | None:
    """``({pid: rank}, {pid: the process's own pid}, note)`` for a file whose pids carry a
    merge tool's rank label (:data:`_LABEL_PID_RE`) for two or more ranks, else None.

    The labels give each rank's coordinates, not its global rank. Where one coordinate
    varies (a tensor-parallel server: ``[TP00]`` .. ``[TP03]``) it is the rank; where several
    do, the ranks are numbered in the merge tool's own order (data, expert, pipeline, then
    tensor parallel), and ``note`` says that this numbering is not recorded in the file."""
    coords: dict[str, dict[str, int]] = {}
    own: dict[str, str] = {}
    for pid in pids:
        m = _LABEL_PID_RE.match(str(pid))
        if m is None:
            continue
        c = {part[:2].lower(): int(part[2:]) for part in m.group(1).split("-")}
        coords[str(pid)] = c
        own[str(pid)] = m.group(2)
    labels = {tuple(c.get(k, 0) for k in _LABEL_KINDS) for c in coords.values()}
    if len(labels) < 2:
        return None
    varying = [i for i, k in enumerate(_LABEL_KINDS) if len({lab[i] for lab in labels}) > 1]
    if len(varying) == 1:
        rank_of = {lab: lab[varying[0]] for lab in labels}
        note = ""
    else:
        rank_of = {lab: r for r, lab in enumerate(sorted(labels))}
        note = (f"the ranks' labels give their {', '.join(_LABEL_KINDS[i] for i in varying)} "
                f"coordinates, not their global ranks: numbered in the labels' order "
                f"(dp, ep, pp, tp)")
    mapping = {pid: rank_of[tuple(c.get(k, 0) for k in _LABEL_KINDS)]
               for pid, c in coords.items()}
    return mapping, own, note
