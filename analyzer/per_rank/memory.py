"""One rank's ``[memory]`` events as a table (:func:`memory_rows`): time, device, allocated and
reserved bytes. :mod:`pardiag.analyzer.analyses.memory` finds static and peak memory over the
ranks."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..trace.classify import memory_events
from ..trace.traceset import RankTrace

MEMORY_COLUMNS = ("ts_us", "device", "allocated_bytes", "reserved_bytes")


#: ``Device Type`` of ``[memory]`` events: torch's ``c10::DeviceType`` enum (c10/core/DeviceType.h).
DEVICE_TYPES = {0: "cpu", 1: "cuda", 2: "mkldnn", 3: "opengl", 4: "opencl", 5: "ideep", 6: "hip",
                7: "fpga", 8: "maia", 9: "xla", 10: "vulkan", 11: "metal", 12: "xpu", 13: "mps",
                14: "meta", 15: "hpu", 16: "ve", 17: "lazy", 18: "ipu", 19: "mtia",
                20: "privateuse1"}


def memory_rows(trace: RankTrace) -> pd.DataFrame:
    """The ``[memory]`` events of a rank as :data:`MEMORY_COLUMNS` (from its summary when it
    has one).

    Device: the name of ``Device Type`` (torch's ``c10::DeviceType`` numbers, :data:`DEVICE_TYPES`:
    0 ``"cpu"``, 1 ``"cuda"``, 12 ``"xpu"``, ...), else the value as text. Bytes are NaN where the
    trace does not hold a number.
    """
    s = trace.summary
    if s is not None:
        return s.memory
    ev = trace.events[memory_events(trace)]
    rows = []
    for ts, args in zip(ev["ts"], ev["args"]):
        if not isinstance(args, dict):
            continue
        dev = DEVICE_TYPES.get(args.get("Device Type"), str(args.get("Device Type")))
        alloc, res = args.get("Total Allocated"), args.get("Total Reserved")
        rows.append((float(ts), dev, _bytes_value(alloc), _bytes_value(res)))
    return pd.DataFrame(rows, columns=list(MEMORY_COLUMNS)).astype(
        {"ts_us": float, "device": object, "allocated_bytes": float, "reserved_bytes": float})


def _bytes_value(v) -> float:
    """A byte count from a ``[memory]`` event's args as float; NaN when it is not a number."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        try:
            return float(v)
        except OverflowError:
            return np.nan
    return np.nan
