"""One rank's ``[memory]`` events as a table (:func:`memory_rows`): time, device, allocated and
reserved bytes. :mod:`pardiag.analyzer.analyses.memory` finds static and peak memory over the
ranks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..trace import vocab
from ..trace.classify import memory_events
from ..trace.traceset import RankTrace

MEMORY_COLUMNS = ("ts_us", "device", "allocated_bytes", "reserved_bytes")


#: ``Device Type`` of ``[memory]`` events: torch's ``c10::DeviceType`` enum (c10/core/DeviceType.h).


def memory_rows(trace: RankTrace) -> pd.DataFrame:
    """The ``[memory]`` events of a rank as :data:`MEMORY_COLUMNS`.

    Device: the name of ``Device Type`` (torch's ``c10::DeviceType`` numbers,
    :data:`pardiag.analyzer.trace.vocab.DEVICE_TYPES`: 0 ``"cpu"``, 1 ``"cuda"``, 12 ``"xpu"``,
    ...); a number pardiag does not know is kept as its text (the loader warns). Bytes are NaN
    where the trace does not hold a number.
    """
    ev = trace.events[memory_events(trace)]
    rows = []
    for ts, args in zip(ev["ts"], ev["args"]):
        if not isinstance(args, dict):
            continue
        dev = vocab.DEVICE_TYPE.get(args)
        dev = vocab.DEVICE_TYPES.get(dev, str(dev)) if isinstance(dev, int) else str(dev)
        alloc, res = vocab.TOTAL_ALLOCATED.get(args), vocab.TOTAL_RESERVED.get(args)
        rows.append((float(ts), dev, _bytes_value(alloc), _bytes_value(res)))
    return pd.DataFrame(rows, columns=list(MEMORY_COLUMNS)).astype(
        {"ts_us": float, "device": object, "allocated_bytes": float, "reserved_bytes": float})


def _bytes_value(v: Any) -> float:
    """A byte count from a ``[memory]`` event's args as float; NaN when it is not a number."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        try:
            return float(v)
        except OverflowError:
            return np.nan
    return np.nan
