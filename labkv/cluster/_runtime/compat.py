"""Checking a cluster before relying on it: is labkv on the scheduler and on
every worker a store or a run uses, of this process's version and wire
protocol, beside a numpy of this process's major version? And, for a run or
a user's module, are the modules it needs there (torch for ``labkv.torch``;
:mod:`~labkv.cluster._runtime.needs` finds them)?

A cluster started from another environment fails in ways that name nothing
useful: a scheduler without labkv refuses the task graph ("Error during
deserialization"), workers without it never start a server (a wait of the
whole timeout), a numpy of another major version cannot read this process's
arrays (a hang until the timeout; the cause only in a worker's log), and an
older labkv fails inside a constructor, and a rank function of a torch model
on a scheduler without torch fails as a scheduler without labkv does.
:func:`check_cluster` asks every node first, within a few seconds, and raises
one :class:`ClusterMismatchError` with a line per node that differs, naming
what to do. Modules are looked up (``importlib.util.find_spec``), not
imported: importing torch on a scheduler takes seconds and memory.

The probe is plain Python compiled from source here, so that it pickles by
value and runs where labkv cannot be imported. Nodes that passed, and the
modules each has, are remembered per handle (by address), so a cluster is
asked once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._logger import logger
from ..._version import PROTOCOL, __version__
from .._errors import ClusterError

if TYPE_CHECKING:
    from .connect import ClusterHandle

#: How long a node may take to answer the check.
CHECK_TIMEOUT_S = 5.0
# How long a worker that could not be asked may take to leave the scheduler's list
# (a killed worker's connection breaks at once; the scheduler drops it just after).
_LOST_GRACE_S = 2.0

_PROBE_SOURCE = '''
def labkv_probe(modules=(), dask_worker=None, dask_scheduler=None):
    """What this process has of labkv and numpy (a dict of plain values), and
    which of ``modules`` it cannot find (looked up, not imported)."""
    import importlib.util
    import sys
    found = {"python": "%d.%d" % sys.version_info[:2]}
    missing = []
    for name in modules:
        try:
            if name not in sys.modules and importlib.util.find_spec(name) is None:
                missing.append(name)
        except Exception:
            missing.append(name)
    found["missing"] = missing
    try:
        import numpy
        found["numpy"] = numpy.__version__
    except Exception as exc:
        found["numpy_error"] = "%s: %s" % (type(exc).__name__, exc)
    try:
        import labkv
    except Exception as exc:
        found["labkv_error"] = "%s: %s" % (type(exc).__name__, exc)
        return found
    found["labkv"] = getattr(labkv, "__version__", None)
    found["protocol"] = getattr(labkv, "PROTOCOL", None)
    found["labkv_file"] = getattr(labkv, "__file__", None)
    return found
'''


def by_value(source: str, name: str) -> Any:
    """The function ``name`` defined by ``source``, compiled in a namespace named
    after no importable module: cloudpickle then sends its code itself, not a
    reference to a labkv module, so it runs where labkv cannot be imported.

    >>> by_value("def two(): return 2", "two")()
    2
    """
    namespace: dict[str, Any] = {"__name__": f"labkv_by_value_{name}"}
    exec(compile(source, f"<labkv {name}>", "exec"), namespace)
    return namespace[name]


labkv_probe = by_value(_PROBE_SOURCE, "labkv_probe")


class ClusterMismatchError(ClusterError):
    """The scheduler or a worker cannot run this labkv (see :func:`check_cluster`)."""


def mismatch(found: dict[str, Any], needs: Mapping[str, str] | None = None) -> str | None:
    """What differs between a node's probe result and this process, or None;
    ``needs``: why each module the node was asked for is needed.

    >>> mismatch(labkv_probe()) is None
    True
    >>> mismatch({"labkv_error": "ModuleNotFoundError: No module named 'labkv'"})
    "no labkv (ModuleNotFoundError: No module named 'labkv')"
    >>> mismatch({"labkv": "0.0.1", "protocol": None, "numpy": np.__version__})[:37]
    'labkv 0.0.1 (wire protocol none), not'
    >>> mismatch({**labkv_probe(), "missing": ["torch"]}, {"torch": "train needs it"})
    'no torch (train needs it)'
    """
    problems = list(labkv_mismatch(found).values())
    why = needs or {}
    problems += [f"no {name} ({why.get(name, 'needed')})" for name in found.get("missing", ())]
    return "; ".join(problems) or None


def labkv_mismatch(found: dict[str, Any]) -> dict[str, str]:
    """What differs in labkv (version, protocol) and numpy between a node's
    probe result and this process: ``{'labkv' | 'numpy': what}``."""
    problems = {}
    if "labkv_error" in found:
        problems["labkv"] = f"no labkv ({found['labkv_error']})"
    elif found.get("labkv") != __version__ or found.get("protocol") != PROTOCOL:
        protocol = found.get("protocol")
        problems["labkv"] = (
            f"labkv {found.get('labkv') or 'of no version'} (wire protocol "
            f"{'none' if protocol is None else protocol}), not {__version__} (protocol {PROTOCOL})"
        )
    if "numpy_error" in found:
        problems["numpy"] = f"no numpy ({found['numpy_error']})"
    elif "numpy" in found and _major(found["numpy"]) != _major(np.__version__):
        problems["numpy"] = (
            f"numpy {found['numpy']}, not {_major(np.__version__)}.x as here ({np.__version__}): "
            "arrays pickled by one major version do not load in the other"
        )
    return problems


def _major(version: str) -> str:
    return str(version).split(".")[0]


async def _ask(coro: Any, timeout: float) -> dict[str, Any]:
    try:
        return await asyncio.wait_for(coro, timeout)
    except asyncio.TimeoutError:
        return {"unanswered": f"did not answer labkv's check within {timeout:g} s"}
    except Exception as exc:
        return {"unanswered": f"could not run labkv's check ({type(exc).__name__}: {exc})"}


async def _probe_all(client: Any, asked: dict[str, tuple[str, ...]], timeout: float) -> dict:
    names = list(asked)
    asks = []
    for name, modules in asked.items():
        if name == "scheduler":
            asks.append(_ask(client._run_on_scheduler(labkv_probe, modules), timeout))
        else:
            run = client._run(labkv_probe, modules, workers=[name], on_error="raise")
            asks.append(_ask(run, timeout))
    answers = await asyncio.gather(*asks)
    found = {}
    for name, answer in zip(names, answers):
        if name != "scheduler" and "unanswered" not in answer:
            answer = answer.get(name, {"unanswered": "is not in the cluster any more"})
        found[name] = answer
    return found


def probe(
    handle: ClusterHandle,
    workers: list[str],
    scheduler: bool = True,
    modules: Mapping[str, Iterable[str]] | None = None,
) -> dict[str, dict]:
    """Each node's probe result: ``{'scheduler' | worker address: {...}}``;
    ``modules``: per node, the modules to look for."""
    client = handle.client
    names = (["scheduler"] if scheduler else []) + list(workers)
    asked = {n: tuple((modules or {}).get(n, ())) for n in names}
    return client.sync(_probe_all, client, asked, CHECK_TIMEOUT_S)


def check_cluster(
    handle: ClusterHandle,
    workers: list[str],
    needs: Mapping[str, str] | None = None,
    needs_on: Collection[str] | None = None,
    subject: str = "the rank function",
) -> None:
    """Raise :class:`ClusterMismatchError` within seconds unless the scheduler
    and each of ``workers`` run this labkv (version and wire protocol) beside a
    numpy of this major version, and the scheduler and each of ``needs_on``
    (default: ``workers``) can find the modules of ``needs`` (name: why, see
    :mod:`~labkv.cluster._runtime.needs`; ``subject`` is what needs them).
    What passed is not asked again."""
    needs = dict(needs or {})
    on = set(workers if needs_on is None else needs_on) | {"scheduler"}
    checked: set[str] = handle._checked
    has: dict[str, set[str]] = handle._has_modules

    def wanted(node: str) -> tuple[str, ...]:
        return tuple(m for m in needs if m not in has.get(node, ())) if node in on else ()

    todo = [w for w in workers if w not in checked or wanted(w)]
    ask_scheduler = "scheduler" not in checked or bool(wanted("scheduler"))
    if not (todo or ask_scheduler):
        return
    asked = {n: wanted(n) for n in [*todo, "scheduler"]}
    lines: list[str] = []
    missing: dict[str, list[str]] = {}  # module: the nodes without it
    kinds: set[str] = set()  # what else differs: "labkv", "numpy", "unanswered"
    answers = probe(handle, todo, ask_scheduler, asked)
    _raise_if_lost(handle, [n for n, found in answers.items() if "unanswered" in found])
    for name, found in answers.items():
        if "unanswered" in found:
            kinds.add("unanswered")
            problem = found["unanswered"]
        else:
            differs = labkv_mismatch(found)
            kinds.update(differs)
            if not differs:
                checked.add(name)
            lacks = found.get("missing", [])
            has.setdefault(name, set()).update(set(asked[name]) - set(lacks))
            for module in lacks:
                missing.setdefault(module, []).append(name)
            problem = mismatch(found, needs)
        if problem is not None:
            who = f"scheduler {handle.address}" if name == "scheduler" else f"worker {name}"
            lines.append(f"  {who}: {problem}")
    if lines:
        logger.warning("labkv's cluster check failed:\n%s", "\n".join(lines))
        raise ClusterMismatchError(_advice(handle, lines, missing, kinds, subject))
    nodes = len(todo) + ask_scheduler
    logger.info("labkv's cluster check passed on %d node(s) of %s", nodes, handle.address)


def _raise_if_lost(handle: ClusterHandle, unanswered: list[str]) -> None:
    """A worker that did not answer because it left the cluster (killed, or
    restarted by its nanny under a new address) is a lost worker, not one of
    another labkv: raise a ``ClusterError`` naming it once the scheduler has
    dropped it (it looks for ``_LOST_GRACE_S``)."""
    workers = [n for n in unanswered if n != "scheduler"]
    if not workers:
        return
    deadline = time.monotonic() + _LOST_GRACE_S
    while True:
        live = set(handle.workers())
        lost = [w for w in workers if w not in live]
        if lost or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    if lost:
        raise ClusterError(
            f"Dask worker(s) {lost} are not in the cluster (lost before anything started "
            f"there, or never in it): try again (the cluster's workers now: {sorted(live)})"
        )


def _install_line(module: str) -> str:
    """How to get a package labkv cannot ship onto the cluster's nodes."""
    import importlib.metadata

    dists = importlib.metadata.packages_distributions().get(module, [module])
    dist = dists[0]
    try:  # a local version label (2.13.0+cpu) names a build, not a release on an index
        pin = f"{dist}=={importlib.metadata.version(dist).split('+')[0]}"
    except importlib.metadata.PackageNotFoundError:
        pin = dist
    line = f"install {pin} in the cluster's environment (labkv cannot ship {module}"
    if module == "torch":
        line += (
            f"; on nodes without a GPU the CPU-only build: pip install {pin} "
            "--index-url https://download.pytorch.org/whl/cpu"
        )
    return line + ")"


def _ship_line(module: str, path: str) -> str:
    """How to get a module of the user's own onto the cluster's nodes."""
    if Path(path).is_dir():
        return (
            f"zip the package {module} ({path}) and ship the archive with "
            "handle.upload_module('<archive>.zip')"
        )
    return f"ship {module} with handle.upload_module({path!r}) (it checks the nodes first)"


def _advice(
    handle: ClusterHandle,
    lines: list[str],
    missing: dict[str, list[str]],
    kinds: set[str],
    subject: str,
) -> str:
    from .needs import local_file

    fixes = []
    for module in missing:
        path = local_file(module)
        fixes.append(_ship_line(module, path) if path else _install_line(module))
    if "labkv" in kinds:
        fixes.append(
            f"ship this process's labkv there with labkv.cluster.connect({handle.address!r}, "
            f"upload=True), or install labkv=={__version__} in the cluster's environment"
        )
    if "numpy" in kinds:
        fixes.append(f"install numpy {_major(np.__version__)}.x in the cluster's environment")
    if "unanswered" in kinds:
        fixes.append("check that those workers are alive and not busy")
    if kinds - {"unanswered"} or not missing:
        head = (
            f"the Dask cluster at {handle.address} cannot run this labkv {__version__} "
            f"(protocol {PROTOCOL}, numpy {np.__version__})"
        )
    else:
        head = f"the Dask cluster at {handle.address} lacks what {subject} needs"
    return f"{head}:\n" + "\n".join(lines) + "\nTo fix: " + "; ".join(fixes)
