"""Diagnose a hung job from the per-rank dumps written when ``pardiag profile --timeout``
expires (flight-recorder entries and the main thread's stack of every rank).

For each process group, a rank's *last entered* collective is the highest ``collective_seq_id``
in its flight recorder. Members that entered the group's highest sequence number wait in that
collective; members whose last entered number is lower — or that wrote no dump — are missing
from it (they never called it). Same idea as PyTorch's flight-recorder analyzer (fr_trace).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class StuckCollective:
    """One collective that some members of a group entered and others did not.

    Attributes:
        pg_name, pg_desc: the process group.
        seq: the group's sequence number of the first collective not all members entered.
        op: its name as the waiting ranks' flight recorder has it (e.g. ``gloo:all_reduce``).
        waiting: ranks that entered it.
        missing: member ranks that did not (or wrote no dump).
        last_seq: ``{rank: last sequence number entered}`` for the missing ranks (None: no dump).
    """

    pg_name: str
    pg_desc: str
    seq: int
    op: str
    waiting: tuple[int, ...]
    missing: tuple[int, ...]
    last_seq: dict


def diagnose_hang(dumps: dict[int, dict], world_size: int) -> list[StuckCollective]:
    """Collectives the job is stuck in, most ranks waiting first.

    Args:
        dumps: ``{rank: hang dump}`` (``flight_recorder`` entries, ``process_groups``).
        world_size: ranks in the job (a rank with no dump counts as missing everywhere).
    """
    members: dict[str, tuple[str, tuple[int, ...]]] = {}
    last: dict[str, dict[int, int]] = {}
    first_op: dict[tuple[str, int], str] = {}
    for rank, d in dumps.items():
        for g in d.get("process_groups", []):
            members.setdefault(str(g["name"]), (g.get("desc", ""), tuple(g.get("ranks") or ())))
        for e in d.get("flight_recorder", []):
            if e.get("is_p2p"):
                continue
            pg = str((e.get("process_group") or [""])[0])
            seq = int(e.get("collective_seq_id", -1))
            last.setdefault(pg, {})
            last[pg][rank] = max(last[pg].get(rank, -1), seq)
            first_op.setdefault((pg, seq), e.get("profiling_name", ""))
    out = []
    for pg, per_rank in last.items():
        desc, ranks = members.get(pg, ("", tuple(range(world_size))))
        ranks = ranks or tuple(range(world_size))
        entered = {r: per_rank.get(r) for r in ranks}
        top = max(v for v in entered.values() if v is not None)
        lagging = {r: v for r, v in entered.items() if v is None or v < top}
        if not lagging:
            continue
        seq = min((v if v is not None else 0) for v in lagging.values()) + 1
        waiting = tuple(sorted(r for r, v in entered.items() if v is not None and v >= seq))
        missing = tuple(sorted(r for r, v in entered.items() if v is None or v < seq))
        out.append(StuckCollective(pg, desc, seq, first_op.get((pg, seq), "?"), waiting, missing,
                                   {r: entered[r] for r in missing}))
    return sorted(out, key=lambda s: (-len(s.waiting), s.pg_name))


def frame_in_script(frames: list[str], script: str | None) -> str:
    """Where a thread is, for a hang line: its innermost frame, and where that is not in the
    user's ``script``, ``", called from "`` the innermost frame that is (the line the user can
    act on, below torch's).

    Args:
        frames: the thread's frames innermost first, each ``File "path", line N...`` (as
            faulthandler writes them; :func:`traceback.format_stack`'s first lines, reversed).
        script: the script's path as its frames name it, or None.
    """
    own = next((f for f in frames if f.startswith(f'File "{script}"')), None)
    if script is None or own is None or own == frames[0]:
        return frames[0]
    return f"{frames[0]}, called from {own}"


def describe(stuck: StuckCollective, stacks: dict[int, list[str]],
             script: str | None = None) -> str:
    """One line: who waits in which collective, and where each missing rank is instead.

    Args:
        stuck: the collective.
        stacks: ``{rank: main thread's frames}`` as :func:`traceback.format_stack` gives them
            (outermost first).
        script: the user's script: its innermost frame is named too where the innermost
            frame of all is elsewhere (in torch, say), as ``..., called from File ...``.
    """
    where = []
    for r in stuck.missing:
        frames = [f.strip().splitlines()[0] for f in stacks.get(r) or [] if f.strip()]
        last = frame_in_script(frames[::-1], script) if frames else "no dump"
        where.append(f"rank {r} (last entered #{stuck.last_seq.get(r)}; at {last})")
    return (f"rank(s) {list(stuck.waiting)} wait in {stuck.op} #{stuck.seq} on process group "
            f"{stuck.pg_name} ({stuck.pg_desc}); missing: {'; '.join(where)}")
