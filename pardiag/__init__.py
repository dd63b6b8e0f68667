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

import pkgutil

from pardiag.version import __version__

# In a checkout this folder holds only the package's face: pardiag.analyzer and
# pardiag.collectors live in analyzer/ and collectors/ beside it. The editable install
# (``make setup``: ``pip install -e . --config-settings editable_mode=strict``) links the whole
# package into one folder on sys.path (a static .pth entry, which static tools follow too). When
# Python runs inside the checkout, this folder is found first, and extend_path adds the linked
# package's folder, so the subpackages are found there.
__path__ = pkgutil.extend_path(__path__, __name__)

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
