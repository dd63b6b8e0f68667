"""The house: the analyzer's six stages, the import contracts that hold them
(``pyproject.toml``'s ``[tool.importlinter]``, checked by import-linter on the installed package),
the packages ``pyproject.toml`` installs, and the tree ``docs/architecture.md`` shows."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .paths import REPO

try:
    import tomllib
except ModuleNotFoundError:   # Python 3.10
    tomllib = pytest.importorskip("tomli")

#: The analyzer's stages, in order: each imports only from itself and those before it.
STAGES = ("trace", "per_rank", "analyses", "predict", "report", "render")
#: The checkout's package folders and the names they install as.
ROOTS = {"pardiag": "pardiag", "analyzer": "pardiag.analyzer",
         "collectors": "pardiag.collectors"}


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_import_contracts_hold(tmp_path):
    """import-linter builds the import graph of the installed package (every import, at any
    depth of the code) and checks each contract: the stage order, rules independent of each
    other, no cycle in any package, no torch in the analyzer, no rendering in the collectors.
    It runs outside the checkout: there Python would find the package face pardiag/ first."""
    lint = Path(sys.executable).with_name("lint-imports")
    res = subprocess.run([str(lint), str(REPO / "pyproject.toml"), "--no-cache"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    n = len(_pyproject()["tool"]["importlinter"]["contracts"])
    assert res.returncode == 0 and f"Contracts: {n} kept, 0 broken." in res.stdout, (
        res.stdout[-4000:] + res.stderr[-2000:])


def test_the_layers_contract_is_the_stage_order():
    contracts = _pyproject()["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    assert layers == [f"pardiag.analyzer.{s}" for s in reversed(STAGES)]


def test_the_analyzer_is_its_stages():
    entries = {p.name.removesuffix(".py") for p in (REPO / "analyzer").iterdir()
               if p.name not in ("__init__.py", "__pycache__")}
    assert entries == set(STAGES)
    doc = ast.get_docstring(ast.parse((REPO / "analyzer" / "__init__.py").read_text()))
    named = re.findall(r"^\d\. :mod:`\.(\w+)`", doc, re.M)
    assert tuple(named) == STAGES


def test_each_stage_says_what_enters_and_leaves():
    for i, stage in enumerate(STAGES, start=1):
        path = REPO / "analyzer" / stage
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert doc.startswith(f"Stage {i}, {stage}:") and re.search(r"Enters:.*Leaves:", doc,
                                                                   re.S), path


def _package_folders() -> set[str]:
    out = set()
    for folder, name in ROOTS.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder).parts
            out.add(".".join((name, *rel)))
    return out


def test_every_package_folder_is_installed():
    tool = _pyproject()["tool"]["setuptools"]
    assert set(tool["packages"]) == _package_folders()
    assert tool["package-dir"] == {name: folder for folder, name in ROOTS.items()}
    # the page's CSS and script travel with the renderer
    data = tool["package-data"]["pardiag.analyzer.render"]
    assert all(list((REPO / "analyzer" / "render").glob(g)) for g in data)


def _documented_tree() -> set[str]:
    """The paths the code block under "## The tree" of docs/architecture.md lists."""
    text = (REPO / "docs" / "architecture.md").read_text()
    block = re.search(r"## The tree\n.*?```\n(.*?)```", text, re.S).group(1)
    out, stack = set(), []
    for line in block.splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 4
        name = line.split()[0]
        stack[depth:] = [name.rstrip("/")]
        out.add("/".join(stack) + ("/" if name.endswith("/") else ""))
    return out


def _checkout_tree() -> set[str]:
    out = set()
    for folder in ROOTS:
        out.add(folder + "/")
        for p in (REPO / folder).rglob("*"):
            rel = p.relative_to(REPO).as_posix()
            if "__pycache__" in rel or p.name == "__init__.py" or p.suffix == ".pyc":
                continue
            out.add(rel + ("/" if p.is_dir() else ""))
    return out


def test_the_documented_tree_is_the_checkout():
    assert _documented_tree() == _checkout_tree()


#: The most lines a module of the analyzer may have: a reader holds one module at a time.
MAX_MODULE_LINES = 800


def test_no_analyzer_module_is_longer_than_a_reader_can_hold():
    long = {str(p.relative_to(REPO)): n for p in sorted((REPO / "analyzer").rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_the_analyses_read_a_rank_through_its_summary_only():
    """After the trace stage, only the per-rank stage reads a rank's raw events or its stored
    summary: every other stage goes through ``summary_of`` (one accessor, no summary-or-events
    fallback of its own)."""
    offenders = []
    for stage in ("analyses", "predict", "report", "render"):
        for path in sorted((REPO / "analyzer" / stage).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and node.attr == "summary" and isinstance(
                        node.value, (ast.Name, ast.Attribute)) and (
                        getattr(node.value, "id", getattr(node.value, "attr", "")) in (
                        "trace", "t", "rank_trace")):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert offenders == []
