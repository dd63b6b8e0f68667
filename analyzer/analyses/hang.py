"""Diagnose a hung job from the per-rank dumps written when ``pardiag profile --timeout``
expires (flight-recorder entries, recent point-to-point calls and the main thread's stack of
every rank).

For each process group, a rank's *last entered* collective is the highest ``collective_seq_id``
in its flight recorder. Members that entered the group's highest sequence number wait in that
collective; members whose last entered number is lower — or that wrote no dump — are missing
from it (they never called it). Same idea as PyTorch's flight-recorder analyzer (fr_trace).

Point-to-point calls (:func:`diagnose_p2p`; gloo's flight recorder has none) pair by their
numbers: a sender whose last send to a peer is numbered past the peer's last receive from it
waits on a receive the peer never posted, and the reverse.
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


@dataclasses.dataclass(frozen=True)
class StuckP2P:
    """A send whose receive the peer never posted, or a receive whose send never came, from
    the point-to-point calls the ranks' hang dumps list (pardiag's recorder: ``op``, ``peer``,
    ``pg_name``, ``seq``, each pair's calls numbered in order on both sides).

    Attributes:
        pg_name: the process group.
        waiting: the rank whose call has no counterpart (its send or receive number ``seq``).
        op: ``"send"`` or ``"recv"``: the waiting rank's call.
        seq: its number among the pair's calls of that direction.
        peer: the other rank, which got no further than ``peer_seq`` (its last matching call).
        peer_seq: the peer's last receive (for a send) or send (for a receive) of the pair.
    """

    pg_name: str
    waiting: int
    op: str
    seq: int
    peer: int
    peer_seq: int


def diagnose_p2p(dumps: dict[int, dict]) -> list[StuckP2P]:
    """Point-to-point calls without a counterpart: per process group and direction (sender →
    receiver), the sender's last send number against the receiver's last receive number, both
    from the ranks' recent calls (the dumps' ``p2p``). A pair only one of whose ranks lists
    calls is not judged (the other's may have left its bounded buffer)."""
    last: dict[tuple[str, int, int, str], int] = {}   # (group, rank, peer, op) -> last seq
    for rank, d in dumps.items():
        for c in d.get("p2p") or []:
            try:
                key = (str(c["pg_name"]), int(rank), int(c["peer"]), str(c["op"]))
                last[key] = max(last.get(key, 0), int(c["seq"]))
            except (KeyError, TypeError, ValueError):
                continue
    out = []
    for (pg, src, dst, op), sent in last.items():
        if op != "send" or (pg, dst, src, "recv") not in last:
            continue
        got = last[(pg, dst, src, "recv")]
        if sent > got:
            out.append(StuckP2P(pg, src, "send", sent, dst, got))
        elif got > sent:
            out.append(StuckP2P(pg, dst, "recv", got, src, sent))
    return sorted(out, key=lambda s: (s.pg_name, s.waiting, s.peer))


def describe_p2p(stuck: StuckP2P, stacks: dict[int, list[str]],
                 script: str | None = None) -> str:
    """One line for :class:`StuckP2P`: who waits on which call, and where its peer is.

    Args:
        stuck: the call.
        stacks: ``{rank: main thread's frames}``, outermost first.
        script: the user's script (its frame is named too, as :func:`describe` does).
    """
    frames = [f.strip().splitlines()[0] for f in stacks.get(stuck.peer) or [] if f.strip()]
    at = frame_in_script(frames[::-1], script) if frames else "no dump"
    if stuck.op == "send":
        return (f"rank {stuck.waiting}'s send #{stuck.seq} to rank {stuck.peer} on process "
                f"group {stuck.pg_name} was never received: rank {stuck.peer} received up to "
                f"#{stuck.peer_seq} (at {at})")
    return (f"rank {stuck.waiting} waits on its receive #{stuck.seq} from rank {stuck.peer} on "
            f"process group {stuck.pg_name}, never sent: rank {stuck.peer} sent up to "
            f"#{stuck.peer_seq} (at {at})")
