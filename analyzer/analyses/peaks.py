"""The devices' peaks: dense FLOP/s per dtype and memory bandwidth, by the device name a trace's
``deviceProperties`` (or the rank's metadata) gives (:func:`device_peak`).

Values are the vendors' datasheet figures, dense (without 2:4 sparsity), for the boost clock:

* NVIDIA V100 (SXM2, PCIe), A100 (SXM4, PCIe), H100 (SXM5, PCIe), H200 (SXM), B200 (HGX: the
  8-GPU board's figures divided by 8): the Tesla V100, A100, H100, H200 and HGX B200 datasheets.
  ``float32`` is the CUDA-core rate; ``tf32`` the tensor-core rate a float32 matmul runs at when
  TF32 is allowed (``torch.backends.cuda.matmul.allow_tf32``), which the trace does not record.
* AMD MI250X and MI300X: the AMD Instinct datasheets (``float32`` is the matrix-core rate).

A device not listed (or listed without the dtype asked for) has no peak: MFU is then unknown, never
computed against a guessed device, and ``pardiag report --peak-tflops`` gives one. On a CPU the
peak is the one ``pardiag profile`` measured when the rank started (a float32 matmul, the rank's
metadata ``peak_flops``), the rate the rank's own threads reach on its cores.
"""

from __future__ import annotations

import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class DevicePeak:
    """One device's peaks.

    Attributes:
        label: the device as the table names it (``"H100 SXM"``).
        tflops: ``{dtype: dense TFLOP/s}`` (dtypes ``float32``, ``tf32``, ``bfloat16``,
            ``float16``, ``float8``).
        bandwidth_gbps: memory bandwidth (GB/s, 10⁹ bytes/s), None where the variant does not
            say which memory it has.
        source: where the numbers come from.
    """

    label: str
    tflops: dict[str, float]
    bandwidth_gbps: float | None
    source: str

    def of(self, dtype: str | None) -> float | None:
        """The dense peak (TFLOP/s) for a torch dtype name (every ``float8_*`` is ``float8``),
        None when the table has none."""
        if dtype is None:
            return None
        return self.tflops.get("float8" if dtype.startswith("float8") else dtype)


def _nv(label: str, fp32: float, tf32: float | None, half: float, fp8: float | None,
        bw: float | None, sheet: str) -> DevicePeak:
    t = {"float32": fp32, "bfloat16": half, "float16": half}
    if tf32 is not None:
        t["tf32"] = tf32
    if fp8 is not None:
        t["float8"] = fp8
    return DevicePeak(label, t, bw, f"NVIDIA {sheet} datasheet (dense)")


#: (device-name pattern, its peaks); the first match wins, so variants come before families.
PEAKS: tuple[tuple[re.Pattern[str], DevicePeak], ...] = tuple(
    (re.compile(p, re.IGNORECASE), d) for p, d in (
        (r"V100.*SXM2", DevicePeak("V100 SXM2", {"float32": 15.7, "float16": 125.0}, 900.0,
                                   "NVIDIA Tesla V100 datasheet")),
        (r"V100.*PCI", DevicePeak("V100 PCIe", {"float32": 14.0, "float16": 112.0}, 900.0,
                                  "NVIDIA Tesla V100 datasheet")),
        (r"A100.*SXM4?-80GB", _nv("A100 SXM4 80GB", 19.5, 156.0, 312.0, None, 2039.0, "A100")),
        (r"A100.*SXM4?-40GB", _nv("A100 SXM4 40GB", 19.5, 156.0, 312.0, None, 1555.0, "A100")),
        (r"A100 80GB PCIe", _nv("A100 PCIe 80GB", 19.5, 156.0, 312.0, None, 1935.0, "A100")),
        (r"A100-PCIE-40GB", _nv("A100 PCIe 40GB", 19.5, 156.0, 312.0, None, 1555.0, "A100")),
        # every A100 computes at the same rates; its memory is not named
        (r"A100", _nv("A100", 19.5, 156.0, 312.0, None, None, "A100")),
        (r"H100.*PCIe", _nv("H100 PCIe", 51.0, 378.0, 756.0, 1513.0, 2000.0, "H100")),
        (r"H100.*(SXM|HBM3)", _nv("H100 SXM", 67.0, 494.7, 989.4, 1978.9, 3350.0, "H100")),
        (r"H200(?!.*NVL)", _nv("H200 SXM", 67.0, 494.7, 989.4, 1978.9, 4800.0, "H200")),
        (r"B200", _nv("B200", 75.0, 1125.0, 2250.0, 4500.0, 8000.0, "HGX B200")),
        (r"MI250X", DevicePeak("MI250X", {"float32": 95.7, "bfloat16": 383.0, "float16": 383.0},
                               3276.8, "AMD Instinct MI250X datasheet")),
        (r"MI300X", DevicePeak("MI300X", {"float32": 163.4, "tf32": 653.7, "bfloat16": 1307.4,
                                          "float16": 1307.4, "float8": 2614.9}, 5300.0,
                               "AMD Instinct MI300X datasheet")),
    ))


def device_peak(name: str | None) -> DevicePeak | None:
    """The peaks of the device ``name`` (a ``deviceProperties`` name such as ``"NVIDIA H100
    80GB HBM3"``), or None when the table does not know it."""
    if not name:
        return None
    for pattern, peak in PEAKS:
        if pattern.search(name):
            return peak
    return None
