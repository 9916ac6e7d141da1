"""The tutorial notebooks: each runs top to bottom in a real kernel, is committed without
outputs, and uses only documented public API."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest

import labkv

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9]*.ipynb"))


def code_of(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "code")


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert not cell.outputs, f"cell {i} has outputs: strip them"
            assert cell.execution_count is None, f"cell {i} has an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_uses_only_documented_public_api(path):
    tree = ast.parse(code_of(path))
    used = set()
    for node in ast.walk(tree):
        is_attr = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        if is_attr and node.value.id == "labkv":
            used.add(node.attr)
    for name in sorted(used):
        assert name in labkv.__all__, f"labkv.{name} is not public API"
        obj = getattr(labkv, name)
        assert (obj.__doc__ or "").strip(), f"labkv.{name} has no docstring"
    for method in set(re.findall(r"\bkv\d?\.(\w+)\(", code_of(path))):
        if hasattr(labkv.KVStore, method):
            doc = getattr(labkv.KVStore, method).__doc__
            assert (doc or "").strip(), f"KVStore.{method} has no docstring"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path):
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=120,  # per cell; every notebook is meant to finish in well under 60 s
        kernel_name="python3",
        startup_timeout=60,
        allow_errors=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    assert not errors
