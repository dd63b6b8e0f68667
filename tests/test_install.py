"""The install as a user meets it: ``import pardiag`` wherever Python starts, and the package's
public names unchanged."""

from __future__ import annotations

import subprocess
import sys


def _python(code: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True)


def test_import_works_in_the_folder_that_holds_a_clone_named_pardiag(tmp_path):
    # A notebook started beside a clone: the clone's root (a folder named pardiag, without an
    # __init__.py) must not become an empty namespace package that hides the installed one.
    clone = tmp_path / "pardiag"
    (clone / "analyzer").mkdir(parents=True)
    (clone / "pyproject.toml").write_text("[project]\nname = 'pardiag'\n")
    res = _python("import pardiag, pardiag.analyzer.report as r\n"
                  "print(pardiag.analyze.__module__, pardiag.Report.__name__,\n"
                  "      pardiag.compare.__module__, r.Report.__name__)", tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["pardiag.api", "Report", "pardiag.api", "Report"]


def test_the_installed_package_is_one_folder_on_sys_path(tmp_path):
    # static tools (pyright, grimp) follow a path entry; they cannot follow an import hook
    res = _python("import importlib.util, pathlib\n"
                  "spec = importlib.util.find_spec('pardiag')\n"
                  "root = pathlib.Path(spec.submodule_search_locations[0])\n"
                  "print((root / 'analyzer' / 'trace' / 'load.py').is_file(),\n"
                  "      (root / 'collectors' / 'rank_entry.py').is_file(),\n"
                  "      (root / 'analyzer' / 'render' / 'static' / 'report.css').is_file())",
                  tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["True", "True", "True"]


def test_public_names_a_user_imports():
    import pardiag

    assert {"analyze", "compare", "Report", "Comparison", "PardiagError", "TraceError",
            "__version__"} <= set(pardiag.__all__)
    assert pardiag.analyze.__module__ == "pardiag.api"
    assert issubclass(pardiag.TraceError, pardiag.PardiagError)
    from pardiag.cli import main

    assert callable(main)
