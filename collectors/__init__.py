"""Collectors: code that runs inside each training rank (needs torch).

``pardiag.collectors.launch`` starts a script under torchrun; every rank then runs
``pardiag.collectors.rank_entry``, which wraps the unmodified script in the torch profiler.
"""
