"""The records of a monitored run (``pardiag profile --monitor``), as read by
:func:`~.monitored.load_monitor` and shared by its analyses."""

from __future__ import annotations

import dataclasses

import pandas as pd


@dataclasses.dataclass
class MonitorData:
    """A monitored run's records, every time in epoch µs.

    Attributes:
        steps: one row per rank and step: ``rank``, ``step``, ``end_us``, ``dur_us``,
            ``optimizer_us``, ``data_us`` (µs).
        calls: one row per call: ``rank``, ``step``, ``group``, ``op``, ``bytes``,
            ``issue_us``, ``return_us``, ``done_us`` (NaN: not known).
        memory: one row per rank and written line: ``rank``, ``step`` (the line's last),
            ``rss_bytes``, ``device_bytes``.
        hosts: ``{rank: host name}`` from the ranks' metadata (empty where none).
        notes: what could not be read (a torn last line of a killed rank, dropped calls).
        captures: (first, last) step of each deep capture the run asked for, in the order
            asked.
    """

    steps: pd.DataFrame
    calls: pd.DataFrame
    memory: pd.DataFrame
    hosts: dict[int, str]
    notes: list[str]
    captures: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    #: :func:`arrival_delays` once computed (the findings, the page and TensorBoard share it)
    delays: pd.DataFrame | None = None
    #: :func:`join_delays` once computed
    joins: pd.DataFrame | None = None
