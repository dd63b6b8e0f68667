"""The keys of matched instances (:mod:`.matching`), read and written in this one place.

A point-to-point transfer's key is ``"p2p:<group>:<a>><b>:<k>"``: the k-th transfer from rank
a to rank b in the group, its send and its receive alike. A collective's key is anything else
(``"<group>:<seq>"`` or the aligned position in its group's sequence).
"""

from __future__ import annotations

import re

import pandas as pd

#: What every point-to-point key starts with.
P2P_PREFIX = "p2p:"
_P2P_KEY = re.compile(r":(\d+)>(\d+):\d+$")


def p2p_keys(group: pd.Series, src: pd.Series, dst: pd.Series, nth: pd.Series) -> pd.Series:
    """Point-to-point keys, element-wise (``group``: the group's id as text; ``src``, ``dst``:
    ranks; ``nth``: the transfer's number from 1 between those ranks in that group)."""
    return (P2P_PREFIX + group + ":" + src.astype(str) + ">" + dst.astype(str) + ":"
            + nth.astype(str))


def is_p2p(keys: pd.Series) -> pd.Series:
    """Which of ``keys`` (any dtype; None and NaN are not) are point-to-point keys (bool)."""
    return keys.astype(str).str.startswith(P2P_PREFIX)


def is_p2p_key(key: object) -> bool:
    """Whether one key is a point-to-point key."""
    return str(key).startswith(P2P_PREFIX)


def p2p_endpoints(keys: pd.Series) -> pd.DataFrame:
    """The sending and receiving rank of each point-to-point key: columns ``src``, ``dst``
    (int), one row per key, in order. Raises ValueError on a key that is not one."""
    ends = keys.str.extract(_P2P_KEY)
    if ends.isna().any().any():
        bad = keys[ends.isna().any(axis=1)].iloc[0]
        raise ValueError(f"not a point-to-point instance key: {bad!r}")
    return pd.DataFrame({"src": ends[0].astype(int).to_numpy(),
                         "dst": ends[1].astype(int).to_numpy()}, index=keys.index)


def p2p_sender(key: str) -> int | None:
    """The sending rank of a point-to-point key, None for any other key."""
    m = _P2P_KEY.search(key) if is_p2p_key(key) else None
    return int(m.group(1)) if m else None
