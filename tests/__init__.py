"""pardiag's tests, a package: helpers are imported relatively (``from .synth import
TraceBuilder``), paths come from :mod:`tests.paths`, shared resources from fixtures
(``conftest.py``).

Tests that launch a training job (``pardiag profile``, ``torchrun``, ``srun``) carry the ``e2e``
marker: ``pytest -m "not e2e"`` is the fast inner loop, ``make test`` runs everything. The
marker is enforced: a test without it that starts a job fails and says so.
"""
