"""The embedded cluster's workers: glibc told to reuse big buffers, and Dask's
profiler and loop check waking them less often, unless the user configured
either otherwise."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("distributed")

import dask

from labkv.cluster import connect

MALLOC_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def _malloc_env() -> tuple[str | None, str | None]:
    return tuple(os.environ.get(name) for name in MALLOC_VARS)


@pytest.fixture
def clean_environ():
    """A Nanny copies its pre-spawn environment into this process's os.environ,
    where it would win over the config: start without it, and restore it after."""
    saved = dict(os.environ)
    for name in MALLOC_VARS:
        os.environ.pop(name, None)
    yield
    os.environ.clear()
    os.environ.update(saved)


def _on_embedded_workers(fn, n_workers: int = 1) -> set:
    """The distinct results of ``fn`` run on every worker of a fresh embedded cluster."""
    with connect(n_workers=n_workers, dashboard_address=None, set_as_default=False) as handle:
        return set(handle.client.run(fn).values())


def _worker_malloc_env() -> set[tuple[str | None, str | None]]:
    return _on_embedded_workers(_malloc_env)


def test_embedded_workers_keep_big_buffers_for_reuse(clean_environ):
    assert _worker_malloc_env() == {(str(64 << 20), str(128 << 20))}


def test_a_configured_mmap_threshold_wins(clean_environ):
    key = "distributed.nanny.pre-spawn-environ.MALLOC_MMAP_THRESHOLD_"
    with dask.config.set({key: 1 << 20}):
        got = _worker_malloc_env()
    # Dask's own trim setting is left as Dask configures it.
    trim = dask.config.get("distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_")
    assert got == {(str(1 << 20), str(trim))}


def _sampling(dask_worker) -> tuple[float, float]:
    """The worker's profiler and loop-check periods, ms, as its callbacks run them."""
    callbacks = dask_worker.periodic_callbacks
    return callbacks["profile"].callback_time, callbacks["tick"].callback_time


def _worker_sampling() -> set[tuple[float, float]]:
    return _on_embedded_workers(_sampling, n_workers=2)


def test_embedded_workers_sample_and_check_their_loop_less_often():
    assert _worker_sampling() == {(100.0, 200.0)}


def test_a_configured_profile_interval_wins_and_the_other_key_stays_quieter():
    with dask.config.set({"distributed.worker.profile.interval": "10ms"}):
        # 10 ms is Dask's default: taken for the user's own choice only when set
        # otherwise, so this one is made quieter too; 30 ms is the user's.
        assert _worker_sampling() == {(100.0, 200.0)}
    with dask.config.set({"distributed.worker.profile.interval": "30ms"}):
        assert _worker_sampling() == {(30.0, 200.0)}


def test_the_embedded_dashboard_listens_on_loopback_only():
    with connect(n_workers=1, set_as_default=False) as handle:
        assert handle.dashboard_link.startswith("http://127.0.0.1:")
        sockets = handle.cluster.scheduler.http_server._sockets.values()
        hosts = {s.getsockname()[0] for s in sockets}
        assert hosts == {"127.0.0.1"}, hosts  # not 0.0.0.0 or ::


def test_a_tls_address_without_security_names_the_argument():
    # Refused before any connection is tried: nothing listens on this port.
    with pytest.raises(TypeError, match=r"pass security=distributed\.Security\(tls_ca_file="):
        connect("tls://127.0.0.1:9", timeout="2s")


def test_cluster_mismatch_error_is_public_and_a_cluster_error():
    import labkv.cluster
    from labkv.cluster._runtime import compat

    assert labkv.cluster.ClusterMismatchError is compat.ClusterMismatchError
    assert issubclass(labkv.cluster.ClusterMismatchError, labkv.cluster.ClusterError)
    assert "ClusterMismatchError" in labkv.cluster.__all__
