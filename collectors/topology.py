"""The rank's host: name, CPU count and, on GPU hosts, NCCL version and ``nvidia-smi topo -m``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from typing import Any

import torch


def topology(local_rank: int) -> dict:
    """Host, CPU count and, on GPU hosts, device, NCCL version and ``nvidia-smi topo -m``."""
    out: dict[str, Any] = {"host": socket.gethostname(), "cpu_count": os.cpu_count()}
    if torch.cuda.is_available():
        try:
            out["nccl_version"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except (AttributeError, RuntimeError, TypeError):
            out["nccl_version"] = None
        if local_rank == 0 and shutil.which("nvidia-smi"):
            try:
                out["nvidia_smi_topo"] = subprocess.run(
                    ["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                    timeout=20).stdout
            except (OSError, subprocess.TimeoutExpired):
                out["nvidia_smi_topo"] = None
    return out
