"""Checking a cluster before relying on it: is labkv on the scheduler and on
every worker a store or a run uses, of this process's version and wire
protocol, beside a numpy of this process's major version?

A cluster started from another environment fails in ways that name nothing
useful: a scheduler without labkv refuses the task graph ("Error during
deserialization"), workers without it never start a server (a wait of the
whole timeout), a numpy of another major version cannot read this process's
arrays (a hang until the timeout; the cause only in a worker's log), and an
older labkv fails inside a constructor. :func:`check_cluster` asks every
node first, within a few seconds, and raises one :class:`ClusterMismatchError`
with a line per node that differs, naming what to do.

The probe is plain Python compiled from source here, so that it pickles by
value and runs where labkv cannot be imported. Nodes that passed are
remembered per handle (by address), so a cluster is asked once.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._log import logger
from ..._version import PROTOCOL, __version__
from .._errors import ClusterError

if TYPE_CHECKING:
    from .connect import ClusterHandle

#: How long a node may take to answer the check.
CHECK_TIMEOUT_S = 5.0

_PROBE_SOURCE = '''
def labkv_probe(dask_worker=None, dask_scheduler=None):
    """What this process has of labkv and numpy (a dict of plain values)."""
    import sys
    found = {"python": "%d.%d" % sys.version_info[:2]}
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


def mismatch(found: dict[str, Any]) -> str | None:
    """What differs between a node's probe result and this process, or None.

    >>> mismatch(labkv_probe()) is None
    True
    >>> mismatch({"labkv_error": "ModuleNotFoundError: No module named 'labkv'"})
    "no labkv (ModuleNotFoundError: No module named 'labkv')"
    >>> mismatch({"labkv": "0.0.1", "protocol": None, "numpy": np.__version__})[:37]
    'labkv 0.0.1 (wire protocol none), not'
    """
    problems = []
    if "labkv_error" in found:
        problems.append(f"no labkv ({found['labkv_error']})")
    elif found.get("labkv") != __version__ or found.get("protocol") != PROTOCOL:
        protocol = found.get("protocol")
        problems.append(
            f"labkv {found.get('labkv') or 'of no version'} (wire protocol "
            f"{'none' if protocol is None else protocol}), not {__version__} (protocol {PROTOCOL})"
        )
    if "numpy_error" in found:
        problems.append(f"no numpy ({found['numpy_error']})")
    elif "numpy" in found and _major(found["numpy"]) != _major(np.__version__):
        problems.append(
            f"numpy {found['numpy']}, not {_major(np.__version__)}.x as here ({np.__version__}): "
            "arrays pickled by one major version do not load in the other"
        )
    return "; ".join(problems) or None


def _major(version: str) -> str:
    return str(version).split(".")[0]


async def _ask(coro: Any, timeout: float) -> dict[str, Any]:
    try:
        return await asyncio.wait_for(coro, timeout)
    except asyncio.TimeoutError:
        return {"unanswered": f"did not answer labkv's check within {timeout:g} s"}
    except Exception as exc:
        return {"unanswered": f"could not run labkv's check ({type(exc).__name__}: {exc})"}


async def _probe_all(client: Any, workers: list[str], scheduler: bool, timeout: float) -> dict:
    names: list[str] = []
    asks = []
    if scheduler:
        names.append("scheduler")
        asks.append(_ask(client._run_on_scheduler(labkv_probe), timeout))
    for address in workers:
        names.append(address)
        asks.append(_ask(client._run(labkv_probe, workers=[address], on_error="raise"), timeout))
    answers = await asyncio.gather(*asks)
    found = {}
    for name, answer in zip(names, answers):
        if name != "scheduler" and "unanswered" not in answer:
            answer = answer.get(name, {"unanswered": "is not in the cluster any more"})
        found[name] = answer
    return found


def probe(handle: ClusterHandle, workers: list[str], scheduler: bool = True) -> dict[str, dict]:
    """Each node's probe result: ``{'scheduler' | worker address: {...}}``."""
    client = handle.client
    timeout = CHECK_TIMEOUT_S
    return client.sync(_probe_all, client, list(workers), scheduler, timeout)


def check_cluster(handle: ClusterHandle, workers: list[str]) -> None:
    """Raise :class:`ClusterMismatchError` within seconds unless the scheduler
    and each of ``workers`` run this labkv (version and wire protocol) beside a
    numpy of this major version; nodes that passed are not asked again."""
    checked: set[str] = handle._checked
    todo = [w for w in workers if w not in checked]
    ask_scheduler = "scheduler" not in checked
    if not (todo or ask_scheduler):
        return
    lines = []
    for name, found in probe(handle, todo, ask_scheduler).items():
        problem = found.get("unanswered") or mismatch(found)
        if problem is None:
            checked.add(name)
        else:
            who = f"scheduler {handle.address}" if name == "scheduler" else f"worker {name}"
            lines.append(f"  {who}: {problem}")
    if lines:
        logger.warning("labkv's cluster check failed:\n%s", "\n".join(lines))
        raise ClusterMismatchError(_advice(handle, lines))
    asked = len(todo) + ask_scheduler
    logger.info("labkv's cluster check passed on %d node(s) of %s", asked, handle.address)


def _advice(handle: ClusterHandle, lines: list[str]) -> str:
    text = "\n".join(lines)
    fixes = []
    if "labkv" in text:
        fixes.append(
            f"ship this process's labkv there with labkv.cluster.connect({handle.address!r}, "
            f"upload=True), or install labkv=={__version__} in the cluster's environment"
        )
    if "numpy" in text:
        fixes.append(f"install numpy {_major(np.__version__)}.x in the cluster's environment")
    if "answer" in text:
        fixes.append("check that those workers are alive and not busy")
    return (
        f"the Dask cluster at {handle.address} cannot run this labkv {__version__} "
        f"(protocol {PROTOCOL}, numpy {np.__version__}):\n{text}\nTo fix: " + "; ".join(fixes)
    )
