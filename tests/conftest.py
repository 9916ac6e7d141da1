"""Shared fixtures: one real Dask ``LocalCluster`` (2 worker processes, 1 thread
each, as on CI's 2 cores) for the whole session, started on first use."""

from __future__ import annotations

import faulthandler
import signal
import sys
import warnings

import pytest

# Rank functions defined in the test modules travel to the workers by value:
# the workers cannot import ``tests/`` modules by name.
try:
    import cloudpickle
except ImportError:  # pragma: no cover - comes with distributed
    cloudpickle = None

# The CuPy stand-in is imported as ``cupy`` by the tests that ask for it, never by
# collection (``--doctest-modules`` would put it on sys.path for every test).
collect_ignore = ["gpu_standin"]


def pytest_collection_modifyitems(items):
    if cloudpickle is None:
        return
    for module in {item.module for item in items if hasattr(item, "module") and item.module}:
        if module.__name__.startswith("test_cluster"):
            cloudpickle.register_pickle_by_value(sys.modules[module.__name__])


@pytest.fixture(scope="session")
def cluster():
    """A :class:`labkv.cluster.ClusterHandle` on an embedded 2-worker LocalCluster."""
    pytest.importorskip("distributed")
    from labkv.cluster import connect

    # A hung cluster test must fail the job, not stall CI for hours.
    faulthandler.dump_traceback_later(900, exit=True)
    # set_as_default=False: other tests' dask.array computations stay in-process.
    handle = connect(n_workers=2, dashboard_address=None, memory_limit="1GiB", set_as_default=False)
    yield handle
    handle.close()
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture
def handle(cluster):
    """The session cluster, with both workers up (a fault test may have restarted one)."""
    cluster.client.wait_for_workers(2, timeout=60)
    return cluster


@pytest.fixture(scope="session")
def standin_handle():
    """A 2-worker LocalCluster whose workers import the strict CuPy stand-in as
    ``cupy``, with 2 simulated GPUs rotated per worker as dask-cuda does it."""
    pytest.importorskip("distributed")
    from tests._standin import standin_cluster

    handle = standin_cluster(n_workers=2, physical=2)
    yield handle
    handle.close()


@pytest.fixture
def python_s_own_sigint_handler():
    """Each test starts as a notebook does: Python's SIGINT handler installed, no
    section of labkv's holding Ctrl-C. In one whole-suite run an earlier test
    left SIGINT held or wrapped around another handler (every signal of these
    tests then went nowhere, not found since): said as a warning, and undone."""
    from labkv._call import interrupts

    state = dict(interrupts._state)
    handler = signal.getsignal(signal.SIGINT)
    if (
        state["depth"]
        or state["pending"] is not None
        or state["wrapped"]
        not in (
            signal.SIG_DFL,
            signal.default_int_handler,
        )
    ):
        warnings.warn(f"SIGINT left by an earlier test: {state}, handler {handler!r}", stacklevel=1)
    interrupts._state.update(depth=0, pending=None, wrapped=signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, handler)
