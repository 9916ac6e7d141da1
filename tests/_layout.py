"""The rooms of ``labkv/cluster`` and the imports between them, and for all of
``labkv/`` the modules' names, sizes and import circles, read from the source (no
import runs): the checks of ``tests/test_cluster_layout.py`` use it."""

from __future__ import annotations

import ast
from pathlib import Path

CLUSTER = Path(__file__).resolve().parent.parent / "labkv" / "cluster"

#: Each room's level: a module may import its own room or a lower level's, never a
#: higher one; rank and server share a level and never import each other.
LEVELS = {"_runtime": 3, "_rank": 2, "_server": 2, "_transport": 1, "base": 0}
#: The only modules that may import Dask (``distributed``, ``dask``, ``tornado``).
DASK_ROOMS = ("labkv.cluster._runtime.", "labkv.cluster.__init__")
DASK_MODULES = {
    "labkv.cluster._transport.dask",
    "labkv.cluster._transport.framing",
    "labkv.cluster._transport.sockets",
    "labkv.cluster._transport.stream",
}
DASK = {"distributed", "dask", "tornado"}


def module_name(path: Path) -> str:
    parts = path.relative_to(CLUSTER.parent.parent).with_suffix("").parts
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(CLUSTER.rglob("*.py"))}


def room(module: str) -> str:
    """``labkv.cluster._rank.dist_store`` -> ``_rank``; the shared bottom modules
    (``_protocol``, ``_errors``, ``_placement``, ...) -> ``base``."""
    parts = module.split(".")
    if len(parts) > 2 and parts[2] in LEVELS:
        return parts[2]
    if module == "labkv.cluster.__init__":
        return "__init__"
    return "base"


def _type_only(tree: ast.AST) -> set[int]:
    """The ids of the import nodes inside ``if TYPE_CHECKING:`` blocks."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            found |= {id(n) for child in node.body for n in ast.walk(child)}
    return found


def imports(module: str, path: Path, typing: bool = True) -> list[tuple[int, str]]:
    """Every module ``module`` imports, anywhere in it (functions included, and
    ``TYPE_CHECKING`` blocks unless ``typing`` is False), as absolute names,
    with their lines."""
    package = module.split(".")[:-1]
    found = []
    tree = ast.parse(path.read_text())
    skip = set() if typing else _type_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            # ``from . import x`` names a module too
            found += [(node.lineno, f"{target}.{a.name}") for a in node.names]
    return found


def violations() -> list[str]:
    """Every import that breaks the rooms' order, and every Dask import outside
    the adapter and the driver."""
    known = modules()
    out = []
    for module, path in known.items():
        mine = room(module)
        for line, target in imports(module, path):
            where = f"{path.relative_to(CLUSTER.parent.parent)}:{line}"
            if target.split(".")[0] in DASK:
                allowed = module in DASK_MODULES or module.startswith(DASK_ROOMS)
                if not allowed:
                    out.append(
                        f"{where} imports {target} (only the Dask adapter and the driver may)"
                    )
                continue
            if not target.startswith("labkv.cluster.") or mine == "__init__":
                continue
            if target not in known and f"{target}.__init__" not in known:
                continue  # a name imported from a module, already counted
            theirs = room(target)
            if theirs == mine:
                continue
            if LEVELS.get(theirs, 0) >= LEVELS.get(mine, 0):
                out.append(f"{where} ({mine}) imports {target} ({theirs})")
    return out


#: Code lines (not blank, not comments, not docstrings) a module may have: past it,
#: it holds two concepts. Rooms have no module count: a room holds the modules of
#: one concern, however many, and a module goes where its concern is.
MAX_CODE_LINES = 500


def code_lines(path: Path) -> int:
    """The lines of ``path`` that are code: not blank, not comments, not docstrings."""
    text = path.read_text()
    lines = set()
    docstrings = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstrings |= set(range(value.lineno, value.end_lineno + 1))
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and number not in docstrings:
            lines.add(number)
    return len(lines)


def too_long() -> list[str]:
    """Modules of ``labkv/`` over ``MAX_CODE_LINES`` lines of code."""
    return [
        f"{p.relative_to(CLUSTER.parent.parent)}: {n} lines of code"
        for p in sorted(CLUSTER.parent.rglob("*.py"))
        if (n := code_lines(p)) > MAX_CODE_LINES
    ]


def bases(name: str) -> dict[str, list[str]]:
    """Per module defining class ``name``: its base classes, as written."""
    found = {}
    for module, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name == name:
                found[module] = [ast.unparse(b) for b in node.bases]
    return found


def probes() -> list[str]:
    """``getattr``/``hasattr`` calls whose object is a link, a call or a future
    (by its name): the seam's interface is declared, never probed."""
    out = []
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            is_probe = (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and node.args
            )
            if is_probe:
                target = ast.unparse(node.args[0]).lower()
                if any(word in target for word in ("link", "future", "call")):
                    out.append(f"{path.relative_to(CLUSTER)}:{node.lineno} {ast.unparse(node)}")
    return out


def cycles() -> list[list[str]]:
    """Import circles among the cluster's modules, counting every import that
    runs (module level or in a function; type-only imports do not run)."""
    known = modules()
    graph = {
        m: sorted({t for _, t in imports(m, p, typing=False) if t in known and t != m})
        for m, p in known.items()
    }
    return _circles(graph)


LABKV = CLUSTER.parent


def labkv_modules() -> dict[str, Path]:
    """Every module of ``labkv/``, by its dotted name (a package by its
    ``__init__``'s: ``labkv.events.__init__``)."""
    return {module_name(p): p for p in sorted(LABKV.rglob("*.py"))}


def repeated_names() -> dict[str, list[str]]:
    """Module names that appear more than once in ``labkv/``, a leading
    underscore aside (``_log`` and ``log`` are one name), with where:
    ``__init__`` is a package, not a name."""
    where: dict[str, list[str]] = {}
    for p in sorted(LABKV.rglob("*.py")):
        if p.name != "__init__.py":
            where.setdefault(p.stem.lstrip("_"), []).append(str(p.relative_to(LABKV.parent)))
    return {name: paths for name, paths in where.items() if len(paths) > 1}


def labkv_cycles() -> list[list[str]]:
    """Import circles among all of ``labkv/``'s modules, counting every import
    that runs; importing a package runs its ``__init__``, so an import of
    ``labkv.events`` is an edge to ``labkv.events.__init__``."""
    known = labkv_modules()

    def resolve(target: str) -> str | None:
        if target in known:
            return target
        if f"{target}.__init__" in known:
            return f"{target}.__init__"
        return None

    graph = {}
    for m, p in known.items():
        package = m.split(".")[:-1]
        edges = set()
        skip = _type_only(tree := ast.parse(p.read_text()))
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                edges |= {resolve(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    # ``from pkg import submodule`` needs the submodule; a name
                    # defined in ``pkg/__init__`` needs the package's __init__
                    edges.add(resolve(f"{target}.{alias.name}") or resolve(target))
        graph[m] = sorted(e for e in edges if e is not None and e != m)
    return _circles(graph)


def _circles(graph: dict[str, list[str]]) -> list[list[str]]:
    state: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in graph[m]:
            if state.get(t) == 1:
                found.append(stack[stack.index(t) :] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m)
    return found
