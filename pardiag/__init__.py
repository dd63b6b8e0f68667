"""pardiag: profiling and diagnostics analyzer for distributed PyTorch training.

The distribution installs three packages: ``pardiag`` (CLI and on-disk run layout),
``pardiag.analyzer`` (trace loading and analyses, no torch needed) and
``pardiag.collectors`` (runs inside each training rank, needs torch).
"""

__version__ = "0.1.0"
