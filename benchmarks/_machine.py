"""The machine a benchmark ran on, recorded with its results: CPU model, cores,
the cores this process may use, load average before and after, versions."""

from __future__ import annotations

import os
import platform
import socket
import time
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, None where the OS has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def machine() -> dict:
    """``{"host", "cpu_model", "cores", "usable_cores", "load_before", "python", "torch",
    "started_utc"}``; :func:`finish` adds ``load_after`` and ``ended_utc``."""
    try:
        import torch
        torch_version = str(torch.__version__)
    except ImportError:  # pragma: no cover
        torch_version = None
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    return {"host": socket.gethostname(), "cpu_model": cpu_model(), "cores": os.cpu_count(),
            "usable_cores": usable, "load_before": load_average(),
            "python": platform.python_version(), "torch": torch_version,
            "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}


def finish(info: dict) -> dict:
    """``info`` with ``load_after`` and ``ended_utc``."""
    return {**info, "load_after": load_average(),
            "ended_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}


def emit(text: str, out: Path | None) -> None:
    """Print a benchmark's result (markdown) and write it to ``out`` too when given."""
    print(text)
    if out is not None:
        out.write_text(text + "\n")


def describe(info: dict) -> str:
    """One line for a table's caption."""
    return (f"{info['cpu_model']}, {info['cores']} cores ({info['usable_cores']} usable), "
            f"load average {info['load_before']} before, {info.get('load_after')} after; "
            f"torch {info['torch']}, Python {info['python']}; "
            f"{info['started_utc']} – {info.get('ended_utc')} UTC")
