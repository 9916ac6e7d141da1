"""Connecting to Dask: an embedded ``LocalCluster`` or a running scheduler.

:func:`connect` returns a :class:`ClusterHandle` that owns the ``Client``
(and the ``LocalCluster`` when it started one). Closing the handle closes
only what it started: attaching to someone's scheduler never stops it.

:func:`default_handle` is the cluster a store or a run uses when given none:
the one the user attached to (Dask's default client, as Dask's own collections
use it), and an embedded cluster only when there is none.
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import logging
import os
import threading
import weakref
from typing import Any

import dask
import distributed
from dask.utils import parse_timedelta
from distributed import Client, LocalCluster, Nanny, Security
from distributed.core import Status
from distributed.deploy.spec import SpecCluster

from .._errors import ClusterError
from .._transport.scheduler import _gone, raise_if_scheduler_gone
from .waits import announced


class ClusterHandle:
    """A connection to a Dask cluster; a context manager.

    ``client`` is the ``distributed.Client``; ``cluster`` the ``LocalCluster``
    it started (None when attached to an address). ``owns_client=False``: a
    handle on a client made by someone else (Dask's default client), which
    :meth:`close` leaves open.
    """

    def __init__(
        self, client: Client, cluster: LocalCluster | None = None, *, owns_client: bool = True
    ):
        self.client = client
        self.cluster = cluster
        self._owns_client = owns_client
        self._closed = False
        # Nodes that passed labkv's check ('scheduler' and worker addresses; see _compat).
        self._checked: set[str] = set()
        # The modules each node has (looked up for a run or an upload; see _compat).
        self._has_modules: dict[str, set[str]] = {}
        _handles[id(client)] = self

    @property
    def address(self) -> str:
        """The scheduler's address."""
        return self.client.scheduler.address

    @property
    def dashboard_link(self) -> str | None:
        """The Dask dashboard's URL (None without a dashboard)."""
        try:
            return self.client.dashboard_link
        except Exception:  # attached schedulers may run without a dashboard
            return None

    def workers(self) -> list[str]:
        """The addresses of the live Dask workers, sorted (fresh from the scheduler);
        a ``ClusterError`` at once when the scheduler is gone."""
        raise_if_scheduler_gone(self.client)
        # Asked of the scheduler itself: Client.scheduler_info() returns the client's
        # cache, which its periodic refresh may overwrite, while the call waits, with
        # a summary that lists no workers (live workers would then look dead).
        try:
            identity = self.client.sync(self.client.scheduler.identity, n_workers=-1)
        except OSError as exc:  # the connection broke under the call
            raise ClusterError(_gone(self.client, f"its connection broke: {exc}")) from exc
        return sorted(identity["workers"])

    def check(self) -> None:
        """Check that the scheduler and every worker run this labkv (version and
        wire protocol) beside a numpy of the same major version; raise a
        ``ClusterMismatchError`` with one line per node that differs, within
        seconds. ``labkv.create('dist_*')`` and ``run`` check the nodes they use.

        >>> handle.check()  # doctest: +SKIP
        """
        from .compat import check_cluster

        check_cluster(self, self.workers())

    def upload_module(self, path: str | os.PathLike) -> None:
        """Ship a module of your own (a ``.py`` file, or a ``.zip``/``.egg``
        archive of packages) to the scheduler and every worker, those that join
        later included, and import it there, as Dask's ``client.upload_file``
        does, after checking that every node has what it imports (torch for a
        torch model): a node without it fails here, within seconds, in a
        ``ClusterMismatchError`` with one line per node and what to install,
        and nothing is uploaded (``client.upload_file`` would fail on the
        scheduler's import and leave a plugin that fails on every worker).
        Uploading the same file name again replaces the earlier upload.

        >>> handle.upload_module("mlp.py")  # doctest: +SKIP
        """
        from .compat import check_cluster
        from .upload import upload_module

        path = os.fspath(path)
        if not os.path.isfile(path) or not path.endswith((".py", ".zip", ".egg")):
            raise ValueError(
                f"upload_module ships a .py file or a .zip/.egg archive; {path!r} is not one"
            )
        from .needs import file_needs

        name = os.path.basename(path)
        check_cluster(self, self.workers(), file_needs(path), subject=name)
        upload_module(self.client, path)

    def close(self) -> None:
        """Close the client and, if this handle started it, the cluster (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            self.client.close()
        if self.cluster is not None:
            self.cluster.close()

    def __enter__(self) -> ClusterHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "embedded" if self.cluster is not None else "attached"
        return f"<labkv.cluster.ClusterHandle {kind} {self.address}>"

    def _repr_html_(self) -> str:
        """A notebook's view: address, kind, workers, dashboard link (and
        labkv's pages), and each node's labkv, protocol and numpy, checked."""
        from .reprs import handle_html

        return handle_html(self)


#: The handles made in this process, by ``id`` of their client.
_handles: weakref.WeakValueDictionary[int, ClusterHandle] = weakref.WeakValueDictionary()


def _on_jupyterhub() -> bool:
    """Whether this kernel runs under JupyterHub (Binder is one): a container
    of 1-2 GB shared by the Jupyter server, every open notebook's kernel and
    their workers."""
    return bool(os.environ.get("JUPYTERHUB_SERVICE_PREFIX") or os.environ.get("BINDER_LAUNCH_HOST"))


def _default_workers() -> int:
    """One single-threaded worker process per core this process may use (Dask's
    ``CPU_COUNT``: the container's CPU quota, where ``os.cpu_count()`` gives the
    host's cores); at least 2, so that a 2-rank run fits; at most 8, a
    notebook's share of a big machine; 2 under JupyterHub (Binder).

    >>> 2 <= _default_workers() <= 8
    True
    """
    from dask.system import CPU_COUNT

    most = 2 if _on_jupyterhub() else 8
    return max(2, min(most, CPU_COUNT or 2))


def _default_memory_limit(n_workers: int) -> int:
    """Bytes each embedded worker may hold: the memory this process may use
    (``distributed.system.MEMORY_LIMIT``: the container's limit where there is
    one), shared by the workers and one more share for the kernel itself, which
    runs the scheduler and the client (Dask's own default gives the workers all
    of it). A worker past it is restarted by its nanny, instead of the kernel
    being killed.

    >>> from distributed.system import MEMORY_LIMIT
    >>> _default_memory_limit(3) == MEMORY_LIMIT // 4
    True
    """
    from distributed.system import MEMORY_LIMIT

    return int(MEMORY_LIMIT // (n_workers + 1))


# glibc settings for the embedded workers (read once, at process start). Dask sets
# MALLOC_TRIM_THRESHOLD_ (which also freezes the mmap threshold at 128 KiB), so
# every receive buffer above that is a fresh mmap whose pages fault in one by one
# (4 KiB each: numpy asks for huge pages only from 4 MiB); a 4 x 2 MiB message
# took 4,500 page faults per iteration and ran 1.7x slower than one 8 MiB array.
# Buffers up to 64 MiB come from the heap and are reused instead, and up to
# 128 MiB of free heap is kept: a server's working set is the same every step.
_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": 64 << 20, "MALLOC_TRIM_THRESHOLD_": 128 << 20}

# Dask wakes every worker's loop 100 times a second to sample its task threads (a
# rank's among them) for the dashboard's profile page, and 50 times to check that
# the loop is not blocked. With a worker per rank on a laptop's few cores, those
# wake-ups cost a tenth to a fifth of a dist_sync round at 8 ranks (performance.md,
# "Dask's sampling"); the embedded workers sample 10 times a second and check
# their loop 5 times, which still fills the profile page and still warns of a
# loop blocked for seconds.
_SAMPLING = {
    "distributed.worker.profile.interval": "100ms",
    "distributed.admin.tick.interval": "200ms",
}


class _EmbeddedCluster(LocalCluster):
    """The embedded ``LocalCluster``, whose nannies bring back every worker
    that dies.

    Dask's ``SpecCluster`` closes a worker's nanny for good when no worker of
    that name is registered ``distributed.deploy.lost-worker-timeout`` (15 s)
    after one was removed (right for a batch job that lost its worker). A nanny
    restarts its killed worker itself, so a restart slower than that (a busy
    machine), or the same worker killed again just before that moment (its
    second restart under way then), lost the worker for the rest of the
    session: with replicas, each lost worker is one place fewer to re-seed a
    server on. Here a nanny is closed only when it has stopped itself (it
    closed, or failed to restart its worker); one that runs is restarting.
    """

    def _update_worker_status(self, op: str, msg: Any) -> None:
        if op == "remove" and msg in self.scheduler_info["workers"]:
            name = self.scheduler_info["workers"][msg]["name"]
            if isinstance(self.workers.get(name), Nanny):
                delay = parse_timedelta(dask.config.get("distributed.deploy.lost-worker-timeout"))
                asyncio.get_running_loop().call_later(delay, self._close_if_stopped, name)
                # Dask's bookkeeping of the removed worker, without SpecCluster's close.
                super(SpecCluster, self)._update_worker_status(op, msg)
                return
        super()._update_worker_status(op, msg)

    def _close_if_stopped(self, name: Any) -> None:
        """Forget the nanny ``name`` once it stopped itself with no worker back."""
        nanny = self.workers.get(name)
        back = any(w.get("name") == name for w in self.scheduler_info["workers"].values())
        if nanny is not None and not back and nanny.status in _STOPPED:
            self._futures.add(asyncio.ensure_future(nanny.close()))
            del self.workers[name]


_STOPPED = (Status.closing, Status.closed, Status.failed)


def _worker_environ() -> dict[str, Any]:
    """Dask's pre-spawn environment with :data:`_MALLOC_ENV`, unless the user
    configured ``MALLOC_MMAP_THRESHOLD_`` there (their choice wins; as always
    with Dask, variables set in this process's environment win over both)."""
    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {})
    if "MALLOC_MMAP_THRESHOLD_" not in environ:
        environ.update(_MALLOC_ENV)
    return environ


def _sampling_config() -> dict[str, str]:
    """:data:`_SAMPLING`, but for the keys the user configured (any value other
    than Dask's default, a ``DASK_...`` variable included: theirs wins).

    >>> with dask.config.set({"distributed.admin.tick.interval": "50ms"}):
    ...     sorted(_sampling_config())
    ['distributed.worker.profile.interval']
    """
    defaults = dask.config.merge(*dask.config.defaults)
    return {
        key: value
        for key, value in _SAMPLING.items()
        if dask.config.get(key) == dask.config.get(key, config=defaults)
    }


def connect(
    address: str | None = None,
    n_workers: int | None = None,
    security: Security | None = None,
    *,
    set_as_default: bool = True,
    upload: bool = False,
    **kw: Any,
) -> ClusterHandle:
    """Start an embedded ``LocalCluster`` (``address=None``) or attach to a
    running scheduler (``'tcp://...'``, or ``'tls://...'`` with ``security``: a
    ``distributed.Security`` with the cluster's CA and a certificate it trusts,
    refused at once without one).

    Embedded: ``n_workers`` (default: one per core this process may use, its
    container's CPU quota included, 2 to 8; 2 under JupyterHub or Binder) worker
    processes on 127.0.0.1, each with a memory limit of an equal share of this
    process's memory with one share left for the kernel, one thread each (ranks run one per
    worker; servers are actors on the workers' event loops and need no thread),
    dashboard on a free port of 127.0.0.1 (pass ``dashboard_address`` to choose), Dask's logs shown from level ERROR (``silence_logs``), and
    glibc told to reuse big buffers (see
    ``_MALLOC_ENV``; configure ``distributed.nanny.pre-spawn-environ`` to
    override), Dask's profiler sampling every 100 ms and its loop check every 200 ms
    instead of 10 and 20 (see ``_SAMPLING``; configure
    ``distributed.worker.profile.interval`` and ``distributed.admin.tick.interval``
    to override); a worker process that dies is restarted by its nanny, however
    long the restart takes (Dask's ``LocalCluster`` gives up on a nanny whose
    worker has not come back within ``distributed.deploy.lost-worker-timeout``;
    see :class:`_EmbeddedCluster`); ``kw`` go to ``LocalCluster``. Attached: ``kw`` go to ``Client``. ``set_as_default=False`` keeps the client from becoming
    Dask's default scheduler (dask.array ``compute()`` then stays local). In a script that starts a cluster, call this under
    ``if __name__ == "__main__":`` (worker processes are spawned).

    The handle becomes the default cluster of ``labkv.create('dist_*')`` and
    :func:`labkv.cluster.run` called without ``cluster=`` (its client is Dask's
    default client; with ``set_as_default=False`` pass it as ``cluster=``).
    Before a store's servers or a run's ranks start, labkv checks that the
    scheduler and those workers run this labkv (same version and wire protocol)
    beside a numpy of the same major version, and fails within seconds naming
    each node that differs. ``upload=True`` (attached only) ships this
    process's labkv to the scheduler and to every worker, those that join later
    included, unless all of them already have it, and raises if a node still
    differs (a numpy of another major version cannot be shipped); your own
    modules travel with :meth:`ClusterHandle.upload_module` (scheduler and
    workers too, after checking that they have what the module imports: torch
    cannot be shipped).

    >>> with connect(n_workers=2) as handle:  # doctest: +SKIP
    ...     len(handle.workers())
    2
    >>> handle = connect("tcp://10.0.0.5:8786", upload=True)  # doctest: +SKIP
    """
    if upload and address is None:
        raise ValueError("upload=True ships labkv to an attached cluster; the embedded one has it")
    if address is not None:
        _check_tls(address, security)
    cluster = None
    # The client talks to server actors directly (bulk data never goes through
    # the scheduler): without direct_to_workers a client's actor calls are
    # proxied by the scheduler.
    client_kw: dict[str, Any] = {
        "direct_to_workers": True,
        "security": security,
        "set_as_default": set_as_default,
    }
    if address is None:
        n_workers = n_workers or _default_workers()
        options = {
            "n_workers": n_workers,
            "memory_limit": _default_memory_limit(n_workers),
            "threads_per_worker": 1,
            "processes": True,
            "host": "127.0.0.1",
            # ":0" would bind every interface; the embedded cluster is this machine's own.
            "dashboard_address": "127.0.0.1:0",
            # Dask's warnings about its own routine (a nanny restarting a worker, the
            # scheduler removing one) land in the notebook under whichever cell runs;
            # labkv raises the error that matters at the call it breaks (a lost server,
            # a failed rank), so the embedded cluster only shows errors.
            "silence_logs": logging.ERROR,
            **kw,
        }
        if security is not None:
            options.setdefault("security", security)
            options.setdefault("protocol", "tls://")
        # labkv's dashboard pages: registered before the scheduler (in this
        # process) builds its dashboard, so that it lists them (labkv.dashboard)
        from ...dashboard import register_pages

        register_pages()
        with (
            announced(f"starting a local Dask cluster of {_workers(options['n_workers'])}"),
            dask.config.set(
                {"distributed.nanny.pre-spawn-environ": _worker_environ(), **_sampling_config()}
            ),
        ):
            cluster = _EmbeddedCluster(**options)
        target: Any = cluster
    else:
        target = address
        client_kw.update(kw)
    try:
        client = Client(target, **client_kw)
    except BaseException:
        # distributed 2026.8 can hang the *next* Client if the failed one is
        # collected inside its LoopRunner.start(): collect it now.
        gc.collect()
        if cluster is not None:
            cluster.close()
        raise
    if address is not None and n_workers:
        with announced(f"waiting for {_workers(n_workers)} of {address}"):
            client.wait_for_workers(n_workers, timeout=60)
    handle = ClusterHandle(client, cluster)
    # labkv's records made on the workers (a rank's failover) reach this process
    # as Dask forwards its own
    client.forward_logging("labkv")
    if cluster is not None:
        from ...dashboard import _install_on_scheduler

        client.run_on_scheduler(_install_on_scheduler)
    if upload:
        try:
            ship_labkv(handle)
        except BaseException:
            handle.close()
            raise
    return handle


def _workers(n: int) -> str:
    return f"{n} worker" if n == 1 else f"{n} workers"


def _check_tls(address: str, security: Security | None) -> None:
    """Refuse a ``tls://`` address with no certificates, from ``security`` or
    from Dask's config (``distributed.comm.tls``), before Dask's own TypeError
    about an ``ssl_context``.

    >>> _check_tls("tls://10.0.0.5:8786", None)
    Traceback (most recent call last):
    ...
    TypeError: tls://10.0.0.5:8786 is a TLS scheduler: pass security=distributed.Security(tls_ca_file=..., tls_client_cert=..., tls_client_key=..., require_encryption=True) with the cluster's CA and a certificate it trusts (or set them in Dask's config, distributed.comm.tls)
    """
    if not str(address).startswith("tls://"):
        return
    configured = security if security is not None else Security()  # Dask's config
    if configured.get_connection_args("client").get("ssl_context") is None:
        raise TypeError(
            f"{address} is a TLS scheduler: pass security=distributed.Security("
            "tls_ca_file=..., tls_client_cert=..., tls_client_key=..., require_encryption=True) "
            "with the cluster's CA and a certificate it trusts (or set them in Dask's config, "
            "distributed.comm.tls)"
        )


def ship_labkv(handle: ClusterHandle) -> None:
    """Upload this process's labkv to ``handle``'s scheduler and workers unless
    they all have it (see :mod:`labkv.cluster._runtime.upload`), then check them again."""
    from .compat import ClusterMismatchError
    from .upload import upload_labkv

    try:
        handle.check()
        return
    except ClusterMismatchError:
        pass
    upload_labkv(handle.client)
    handle._checked.clear()
    handle.check()


_default: ClusterHandle | None = None
_default_lock = threading.Lock()


def attached_handle() -> ClusterHandle | None:
    """A handle on Dask's default client (the latest :func:`connect` made with
    ``set_as_default=True``, or a ``distributed.Client`` of the user's), or None."""
    try:
        client = distributed.default_client()
    except ValueError:
        return None
    if client.status in ("closing", "closed"):
        return None
    handle = _handles.get(id(client))
    if handle is None or handle._closed or handle.client is not client:
        handle = ClusterHandle(client, owns_client=False)
    return handle


def default_handle() -> ClusterHandle:
    """The cluster to use when none is given: the attached one
    (:func:`attached_handle`), else the process-wide embedded cluster, started
    on first use and closed at exit."""
    global _default
    attached = attached_handle()
    if attached is not None:
        return attached
    with _default_lock:
        if _default is None or _default._closed:
            _default = connect()
            atexit.register(_default.close)
        return _default
