"""pardiag: profiling and diagnostics analyzer for distributed PyTorch training.

The distribution installs three packages: ``pardiag`` (CLI, on-disk run layout and the Python
API), ``pardiag.analyzer`` (trace loading and analyses, no torch needed) and
``pardiag.collectors`` (runs inside each training rank, needs torch).

Python API (:mod:`pardiag.api`, imported on first use so that ``import pardiag`` inside a
training rank stays light)::

    import pardiag
    rep = pardiag.analyze("pardiag_runs/ddp")      # -> pardiag.Report
    cmp = pardiag.compare("runs/before", "runs/after")   # -> pardiag.Comparison
"""

from pardiag.version import __version__

__all__ = ["analyze", "Report", "compare", "Comparison", "PardiagError", "TraceError",
           "__version__"]


def __getattr__(name: str):
    if name in ("analyze", "Report", "compare", "Comparison"):
        from pardiag import api

        return getattr(api, name)
    if name in ("PardiagError", "TraceError"):
        from pardiag import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'pardiag' has no attribute {name!r}")
