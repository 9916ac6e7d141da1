"""What ``docs/design.md`` and ``docs/cluster.md`` name exists in the code, and the
docs' links lead somewhere.

What counts as a code reference (outside fenced code blocks; "span" is the text
between a pair of single backticks):

1. **A file path**, backticked or not: a token ``labkv/...``, ``bench/...``,
   ``tests/...``, ``docs/...``, ``notebooks/...`` or ``binder/...`` ending in
   ``.py``, ``.md``, ``.sh`` or ``.ipynb``, taken from the repository's root; or
   one that starts with a room of the cluster (``_rank/``, ``_server/``,
   ``_runtime/``, ``_transport/``, ``_protocol/``, ``_rows/``, ``replication/``),
   taken under ``labkv/cluster/`` (``replication/`` under ``labkv/cluster/_server/``).
   ``*`` globs must match a file. ``path.py::name`` also needs ``def name`` in it.
2. **A bare file name**: a span that is only ``name.py`` is a module's base name
   under ``labkv/``, ``bench/`` or ``tests/`` (base names are unique in ``labkv/``),
   unless it is one of ``USER_FILES`` (a file of the reader's, as ``mlp.py``).
3. **A test's name**: a span ``test_...`` (an identifier) is a test function in
   ``tests/``.
4. **A dotted name**: a span ``a.b`` or ``a.b.c`` of identifiers, with at most a
   call's parentheses after it (``Shard.apply(batch, owned=True)``), is checked by
   its first part:

   - ``labkv``: imported and resolved attribute by attribute
     (``labkv.cluster._server.ssp_clocks.Clocks``), unless it is a Dask config key
     the code reads (``dask.config.get("labkv.progress")``);
   - a class defined in ``labkv/`` (``Server.promote``): the rest are members
     (methods, class attributes, ``self.x`` attributes, fields; bases' too);
   - a module's base name in ``labkv/`` (``compression.to_wire``): a top-level
     name of that module, then members;
   - a variable the docs use for a labkv object (``RECEIVERS``: ``kv.steps``):
     a member of one of its classes;
   - a name outside labkv (``FOREIGN``: ``np.zeros``, ``Worker.log_event``): not
     checked;
   - anything else fails, so that a renamed class or module cannot pass by
     becoming unknown: add it to one of the lists above if it is not labkv's.

Links: every relative link ``[text](path)`` in ``README.md`` and ``docs/*.md``
points to an existing file, and a ``#anchor`` into a ``docs/*.md`` file (or a
doc's own ``#anchor``) names one of its headings (GitHub's slugs).
"""

from __future__ import annotations

import ast
import builtins
import importlib
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("docs/design.md", "docs/cluster.md")
MAX_CLUSTER_LINES = 700

USER_FILES = {"mlp.py"}
ROOMS = {
    "_rank": "labkv/cluster",
    "_server": "labkv/cluster",
    "_runtime": "labkv/cluster",
    "_transport": "labkv/cluster",
    "_protocol": "labkv/cluster",
    "_rows": "labkv/cluster",
    "replication": "labkv/cluster/_server",
}
# Variables the docs write for labkv objects, and the classes they stand for.
RECEIVERS = {
    "kv": ("KVStore", "DistStore", "LocalStore"),
    "handle": ("ClusterHandle",),
    "step": ("Step",),
    "bus": ("EventBus",),
    "events": ("EventBus",),
    "src": ("MinibatchSource",),
    "mon": ("Monitor",),
}
# First parts of dotted names that are not labkv's: other libraries, their
# classes, and the user's or the reader's variables.
FOREIGN = {
    "np", "numpy", "dask", "distributed", "torch", "os", "cupy", "mx", "asyncio", "itertools",
    "importlib", "logging", "time", "tornado", "socket", "ssl", "signal", "sys", "pickle",
    "client", "worker", "actor", "comm", "model", "opt", "p", "a", "self",
    "Worker", "Client", "Actor", "LocalCluster", "IOStream", "SSLSocket", "Generator",
    "Optimizer", "DistributedOptimizer",
}  # fmt: skip
PATH = re.compile(
    r"(?<![\w/.-])((?:labkv|bench|tests|docs|notebooks|binder|_rank|_server|_runtime"
    r"|_transport|_protocol|_rows|replication)/[\w./*-]*?\.(?:py|md|sh|ipynb))"
    r"(::\w+)?(?![\w/])"
)
IDENT = r"[A-Za-z_]\w*"
DOTTED = re.compile(rf"^({IDENT}(?:\.{IDENT})+)(?:\(.*\))?$")


def read(doc: str) -> str:
    """The doc's text without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", (ROOT / doc).read_text(), flags=re.S | re.M)


def spans(doc: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", read(doc))


def resolve_path(path: str) -> list[Path]:
    first = path.split("/", 1)[0]
    base = ROOT / ROOMS[first] if first in ROOMS else ROOT
    return sorted(base.glob(path)) if "*" in path else [p for p in [base / path] if p.is_file()]


def path_errors(doc: str) -> list[str]:
    errors = []
    for path, test in PATH.findall(read(doc)):
        found = resolve_path(path)
        if not found:
            errors.append(f"{doc}: no file {path}")
        elif test and not re.search(rf"^\s*(async )?def {test[2:]}\b", found[0].read_text(), re.M):
            errors.append(f"{doc}: {path} defines no {test[2:]}")
    return errors


@cache
def modules() -> dict[str, Path]:
    """Every labkv module by its base name (``__init__`` by its package's name)."""
    found = {}
    for path in sorted((ROOT / "labkv").rglob("*.py")):
        name = path.parent.name if path.stem == "__init__" else path.stem
        found.setdefault(name, path)
    return found


@cache
def trees() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text()) for p in (ROOT / "labkv").rglob("*.py")}


def _member_names(cls: ast.ClassDef) -> set[str]:
    names = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Name) and node in cls.body:
                    names.add(t.id)
                elif (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id in ("self", "cls")
                ):
                    names.add(t.attr)
    return names


@cache
def classes() -> dict[str, list[tuple[set[str], list[str]]]]:
    """Each class name in labkv: its members and its bases' names (every class of
    that name)."""
    found: dict[str, list[tuple[set[str], list[str]]]] = {}
    for tree in trees().values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
                found.setdefault(node.name, []).append((_member_names(node), bases))
    return found


def members(cls: str, seen: frozenset = frozenset()) -> set[str]:
    names: set[str] = set()
    for own, bases in classes().get(cls, []):
        names |= own
        for base in bases:
            if base not in seen:
                names |= members(base, seen | {cls})
    return names


@cache
def config_keys() -> set[str]:
    keys = set()
    for path in (ROOT / "labkv").rglob("*.py"):
        keys |= set(re.findall(r"config\.get\(\s*\"(labkv\.[\w.-]+)\"", path.read_text()))
    return keys


def top_level(path: Path) -> set[str]:
    names = set()
    for node in trees()[path].body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {t.id for t in ast.walk(target) if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names |= {a.asname or a.name.split(".")[0] for a in node.names}
    return names


def dotted_error(name: str) -> str | None:
    """None when ``name`` resolves (or is not labkv's), else what is missing."""
    first, *rest = name.split(".")
    if first == "labkv":
        if name in config_keys():
            return None
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for attr in parts[i:]:
                if not hasattr(obj, attr):
                    return f"{'.'.join(parts[:i])} has no {'.'.join(parts[i:])}"
                obj = getattr(obj, attr)
            return None
        return "not importable"
    if first in FOREIGN or hasattr(builtins, first):
        return None
    if first in classes():
        owners = [first]
    elif first in RECEIVERS:
        owners = list(RECEIVERS[first])
    elif first in modules():
        if rest[0] not in top_level(modules()[first]):
            return f"module {first} ({modules()[first].relative_to(ROOT)}) has no {rest[0]}"
        if len(rest) == 1 or rest[0] not in classes():
            return None  # a function's or a constant's attribute is not followed
        owners, rest = [rest[0]], rest[1:]
    else:
        return f"{first} is no labkv class or module (list it in FOREIGN if it is not labkv's)"
    # The first member is checked; what it returns is not followed (``Event.tally``).
    if not any(rest[0] in members(owner) for owner in owners):
        return f"{'/'.join(owners)} has no member {rest[0]}"
    return None


@cache
def defined_tests() -> set[str]:
    names = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        names |= set(re.findall(r"^\s*(?:async )?def (test_\w+)", path.read_text(), re.M))
    return names


def reference_errors(doc: str) -> list[str]:
    errors = path_errors(doc)
    bases = {p.name for d in ("labkv", "bench", "tests") for p in (ROOT / d).rglob("*.py")}
    for span in spans(doc):
        span = span.strip()
        if re.fullmatch(r"\w+\.py", span):
            if span not in bases and span not in USER_FILES:
                errors.append(f"{doc}: no module {span} in labkv/, bench/ or tests/")
        elif re.fullmatch(r"test_\w+", span):
            if span not in defined_tests():
                errors.append(f"{doc}: no test {span} in tests/")
        elif (
            (m := DOTTED.match(span))
            and not re.search(r"\.(py|md|sh|ipynb)$", m.group(1))
            and (problem := dotted_error(m.group(1)))
        ):
            errors.append(f"{doc}: `{span}`: {problem}")
    return errors


@pytest.mark.parametrize("doc", DOCS)
def test_what_the_docs_name_exists_in_the_code(doc):
    assert reference_errors(doc) == []


def test_a_renamed_file_or_function_is_caught(tmp_path, monkeypatch):
    """The rules are not vacuous: a bogus reference of each kind fails."""
    bogus = (
        "`_rank/no_such_module.py` and bench/no_such_bench.py, `tests/test_sparse.py::test_nope`, "
        "`nowhere.py`, `test_no_such_test`, `labkv.cluster._rank.dist_store.NoSuchClass`, "
        "`DistStore._no_such_method`, `compression.no_such_function`, `kv.no_such_call()`, "
        "`RenamedClass.push`, and `_rank/dist_store.py`, `DistStore._push_impl`, `kv.steps(n)`."
    )
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "bogus.md").write_text(bogus)
    monkeypatch.setitem(globals(), "read", lambda doc: (tmp_path / doc).read_text())
    errors = reference_errors("docs/bogus.md")
    assert len(errors) == 10, errors
    for expected in (
        "no file _rank/no_such_module.py",
        "no file bench/no_such_bench.py",
        "tests/test_sparse.py defines no test_nope",
        "no module nowhere.py",
        "no test test_no_such_test",
        "has no NoSuchClass",
        "DistStore has no member _no_such_method",
        "module compression (labkv/compression.py) has no no_such_function",
        "has no member no_such_call",
        "RenamedClass is no labkv class or module",
    ):
        assert any(expected in e for e in errors), (expected, errors)


def test_the_users_guide_is_at_most_700_lines():
    lines = len((ROOT / "docs" / "cluster.md").read_text().splitlines())
    assert lines <= MAX_CLUSTER_LINES, f"docs/cluster.md has {lines} lines"


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    for heading in re.findall(r"^#{1,6} (.*)$", text, flags=re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def link_errors(path: Path) -> list[str]:
    errors = []
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        name = path.relative_to(ROOT)
        if not dest.exists():
            errors.append(f"{name}: ({target}) points to no file")
        elif (
            anchor
            and dest.suffix == ".md"
            and dest.parent == ROOT / "docs"
            and anchor not in anchors(dest)
        ):
            errors.append(f"{name}: ({target}) names no heading of {dest.name}")
    return errors


def test_relative_links_point_to_files_and_headings_that_exist():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert [e for doc in docs for e in link_errors(doc)] == []


def test_the_link_check_sees_a_broken_link(tmp_path, monkeypatch):
    fake = tmp_path / "docs"
    fake.mkdir()
    (fake / "a.md").write_text(
        "# Title\n[ok](a.md#title) [self](#title) [gone](b.md) [bad](a.md#nope) "
        "[web](https://example.com)\n"
    )
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert link_errors(fake / "a.md") == [
        "docs/a.md: (b.md) points to no file",
        "docs/a.md: (a.md#nope) names no heading of a.md",
    ]
