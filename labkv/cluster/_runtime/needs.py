"""What a rank function, or a user's module, needs on the cluster's nodes:
the top-level modules it imports (torch first), found here before anything
is sent, so that :mod:`~labkv.cluster._runtime.compat`'s check can name each
node that lacks one.

A Dask node needs a module wherever it unpickles something that names it: the
scheduler unpickles the task graph (a rank function of ``mlp.py`` names the
module ``mlp``, which imports torch; one defined in ``__main__`` travels by
value and names the modules and classes it uses), and so does each worker
that runs a rank. Without the module the failure is Dask's, late and vague
("Error during deserialization of the task graph"; the cause only in the
scheduler's log). The search:

- a function of an importable module needs that module, and whatever the
  module imports when it loads: its file's import statements at top level
  (those under ``if``/``try`` may not run, and are left out);
- a function that travels by value (``__main__``, a lambda, a closure) needs
  what its code names from its globals, its closure cells and defaults
  (modules, and the modules of classes and functions, walked the same way);
- an argument needs its type's module;
- labkv's own modules and the user's (files outside the installed packages)
  are followed through their imports (``labkv.torch`` imports torch); an
  installed package counts as itself.

labkv and numpy are left to the check's own probe (versions matter there);
dask, distributed and what distributed imports are on every Dask node. The
nodes look the modules up (``importlib.util.find_spec``) without importing
them, so the check stays within seconds.

>>> import labkv.torch
>>> def train(kv):
...     return labkv.torch.DistributedOptimizer
>>> needs = modules_needed(train)
>>> needs["torch"]
'train needs it, through labkv.torch'
>>> list(needs)[0]
'torch'
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import site
import sys
import sysconfig
import types
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: Modules the check's own probe covers (labkv, numpy), and those on every Dask
#: node (dask, distributed and what distributed itself imports).
_NOT_ASKED = frozenset(
    {"labkv", "numpy", "dask", "distributed", "__main__", "__future__"}
    | {"cloudpickle", "msgpack", "psutil", "tblib", "tlz", "toolz", "tornado", "yaml", "zict"}
)
#: How deep a walk through functions, classes and containers goes.
_MAX_DEPTH = 6


def _top(name: str) -> str:
    return name.split(".")[0]


@functools.cache
def _installed_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots.update(getattr(site, "getsitepackages", list)())
    roots.add(getattr(site, "getusersitepackages", lambda: "")() or "")
    return tuple(str(Path(r).resolve()) for r in roots if r)


def is_installed(path: str | None) -> bool:
    """Whether a module's file lies in the standard library or an installed
    package's directory (site-packages), not among the user's own files.

    >>> import json
    >>> is_installed(json.__file__), is_installed("/home/me/mlp.py")
    (True, False)
    """
    if not path:
        return True  # built in, or frozen
    resolved = str(Path(path).resolve())
    return any(resolved.startswith(root + "/") for root in _installed_roots())


def _is_followed(top: str) -> bool:
    """labkv's modules and the user's own (outside the installed packages) are
    followed through their imports; looking a top-level module up imports nothing."""
    if top == "labkv":
        return True
    return local_file(top) is not None


def _module_file(name: str) -> str | None:
    """The file of a module of a followed package (its parent packages are imported)."""
    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "__file__", None)
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        return None
    return spec.origin if spec is not None and spec.has_location else None


def _top_level_imports(tree: ast.Module, package: str) -> list[str]:
    """The modules a module's top-level statements import (relative imports
    resolved against ``package``, ``''`` for a plain file)."""
    names = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if not package:
                    continue
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            names.append(module)
            # "from . import x" and "from pkg import sub" may name submodules
            names.extend(f"{module}.{alias.name}" for alias in node.names if alias.name != "*")
    return [n for n in names if n]


@functools.lru_cache(maxsize=512)
def _parsed(path: str, mtime: float) -> ast.Module | None:
    try:
        return ast.parse(Path(path).read_bytes(), path)
    except (OSError, SyntaxError, ValueError):
        return None


def file_imports(path: str | Path, package: str = "") -> list[str]:
    """The modules a ``.py`` file imports at top level (an archive, ``.zip`` or
    ``.egg``: its ``.py`` members', less those it holds itself).

    >>> import tempfile, os
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = os.path.join(d, "mlp.py")
    ...     _ = open(p, "w").write("import torch.nn as nn\\ntry:\\n    import cupy\\nexcept ImportError:\\n    pass\\n")
    ...     file_imports(p)
    ['torch.nn']
    """
    path = Path(path)
    if path.suffix in (".zip", ".egg"):
        return _archive_imports(path)
    tree = _parsed(str(path), path.stat().st_mtime)
    return [] if tree is None else _top_level_imports(tree, package)


def _archive_imports(path: Path) -> list[str]:
    names: list[str] = []
    with zipfile.ZipFile(path) as archive:
        members = [m for m in archive.namelist() if m.endswith(".py")]
        held = {_top(m.split("/")[0].removesuffix(".py")) for m in members}
        for member in members:
            parts = member.removesuffix(".py").split("/")
            package = ".".join(parts if parts[-1] == "__init__" else parts[:-1])
            package = package.removesuffix(".__init__")
            try:
                tree = ast.parse(archive.read(member), member)
            except (SyntaxError, ValueError):
                continue
            names.extend(n for n in _top_level_imports(tree, package) if _top(n) not in held)
    return names


class _Walk:
    """One search: ``needs`` maps each top-level module to why it is needed."""

    def __init__(self) -> None:
        self.needs: dict[str, str] = {}
        self._seen: set[int] = set()
        self._modules: set[str] = set()

    def need(self, name: str, why: str) -> None:
        top = _top(name)
        if top and top not in _NOT_ASKED and top not in sys.stdlib_module_names:
            self.needs.setdefault(top, why)

    def module(self, name: str, why: str) -> None:
        """``name`` is imported on the node: it, and what it imports when followed."""
        if name in self._modules or _top(name) == "__main__":
            return
        self._modules.add(name)
        self.need(name, why)
        if not _is_followed(_top(name)):
            return  # an installed package counts as itself; nothing of it is imported here
        path = _module_file(name)
        if path is None or not path.endswith(".py"):
            return
        package = name if Path(path).name == "__init__.py" else name.rpartition(".")[0]
        if ", through " not in why:
            why = f"{why}, through {name}"
        for imported in file_imports(path, package):
            if _top(imported) != _top(name) or _module_file(imported) is not None:
                self.module(imported, why)  # "from pkg import x": x may be an attribute

    def obj(self, value: Any, why: str, depth: int = 0) -> None:
        if depth > _MAX_DEPTH or id(value) in self._seen:
            return
        if isinstance(value, (str, bytes, int, float, complex, bool, type(None))):
            return
        self._seen.add(id(value))
        if isinstance(value, types.ModuleType):
            self.module(value.__name__, why)
        elif isinstance(value, types.FunctionType):
            self.function(value, why, depth)
        elif isinstance(value, types.MethodType):
            self.obj(value.__func__, why, depth + 1)
            self.obj(value.__self__, why, depth + 1)
        elif isinstance(value, functools.partial):
            for part in (value.func, *value.args, *value.keywords.values()):
                self.obj(part, why, depth + 1)
        elif isinstance(value, type):
            self.cls(value, why, depth)
        elif isinstance(value, (list, tuple, set, frozenset)):
            for item in list(value)[:100]:
                self.obj(item, why, depth + 1)
        elif isinstance(value, dict):
            for item in list(value.items())[:100]:
                self.obj(item, why, depth + 1)
        else:
            self.cls(type(value), why, depth + 1)

    def cls(self, cls: type, why: str, depth: int) -> None:
        module = getattr(cls, "__module__", None) or "builtins"
        if module != "__main__" and _by_name(cls, module):
            self.module(module, why)
            return
        for base in cls.__mro__[1:]:  # the class travels by value, its bases by name
            self.obj(base, why, depth + 1)
        for attribute in vars(cls).values():
            if isinstance(attribute, (types.FunctionType, staticmethod, classmethod, property)):
                func = getattr(attribute, "__func__", None) or getattr(attribute, "fget", None)
                self.obj(func or attribute, why, depth + 1)

    def function(self, fn: types.FunctionType, why: str, depth: int) -> None:
        module = getattr(fn, "__module__", None)
        if module != "__main__" and _by_name(fn, module):
            self.module(module, why)  # pickled by name: its module loads
            return
        namespace, names = fn.__globals__, set(_code_names(fn.__code__))
        for name in sorted(names):
            if name in namespace:
                value = namespace[name]
                self.obj(value, why, depth + 1)
                if isinstance(value, types.ModuleType):  # labkv.torch.X: the submodule loads
                    for attribute in sorted(names):
                        sub = getattr(value, attribute, None)
                        if isinstance(sub, types.ModuleType):
                            self.obj(sub, why, depth + 1)
        for cell in fn.__closure__ or ():
            with contextlib.suppress(ValueError):  # an empty cell
                self.obj(cell.cell_contents, why, depth + 1)
        for default in (*(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values()):
            self.obj(default, why, depth + 1)


def _by_name(value: Any, module: str | None) -> bool:
    """Whether pickle sends ``value`` by name (its module holds it under its
    qualified name, and the module is not registered to travel by value), as
    cloudpickle decides; else it travels by value."""
    try:
        from cloudpickle import cloudpickle as _cloudpickle

        return bool(_cloudpickle._should_pickle_by_reference(value))
    except Exception:  # another cloudpickle: the rule it documents
        pass
    found = sys.modules.get(module) if module else None
    for part in getattr(value, "__qualname__", "<locals>").split("."):
        found = getattr(found, part, None)
    return found is value


def _code_names(code: types.CodeType) -> Iterable[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_names(const)


def _ordered(needs: dict[str, str]) -> dict[str, str]:
    """torch first (the module a cluster most often lacks), then by name."""
    return dict(sorted(needs.items(), key=lambda item: (item[0] != "torch", item[0])))


def modules_needed(fn: Any, args: tuple = (), kwargs: dict | None = None) -> dict[str, str]:
    """The top-level modules the nodes need to unpickle and run ``fn(kv, *args,
    **kwargs)``, each with why (torch first); best effort: a search that fails
    on something unusual returns what it found."""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    walk = _Walk()
    try:
        walk.obj(fn, f"{name} needs it")
        for value in (*args, *(kwargs or {}).values()):
            walk.obj(value, f"an argument of {name} needs it")
    except Exception:  # the search is an aid: it must never stop a run that would work
        pass
    return _ordered(walk.needs)


def file_needs(path: str | Path) -> dict[str, str]:
    """The top-level modules a user's module file (``.py``, ``.zip``, ``.egg``)
    needs on a node that imports it, with why (torch first)."""
    path = Path(path)
    walk = _Walk()
    own = path.name.removesuffix(path.suffix)
    walk._modules.add(own)
    why = f"{path.name} imports it"
    for imported in file_imports(path):
        if _top(imported) != own:
            walk.module(imported, why)
    return _ordered(walk.needs)


def local_file(name: str) -> str | None:
    """Where this process finds the user's top-level module ``name`` when it is
    the user's own (outside the installed packages), else None."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.has_location or spec.origin is None:
        return None
    if is_installed(spec.origin):
        return None
    if spec.submodule_search_locations:  # a package: its directory
        return str(Path(spec.origin).parent)
    return spec.origin
