"""labkv: an interactive, MXNet-compatible KVStore lab.

>>> import labkv
>>> kv = labkv.create("local")
>>> kv.init(3, labkv.ones((2, 3)) * 2)
>>> kv.push(3, [labkv.ones((2, 3), device=d) for d in labkv.devices(4)])
>>> kv.pull(3)
array([[4., 4., 4.],
       [4., 4., 4.]], dtype=float32)
"""

from __future__ import annotations

from typing import Any

from . import lr_scheduler, optimizers, sparse
from ._arrays import array, full, ones, zeros
from ._call.args import LengthMismatchError
from ._types import LOCAL_KINDS, store_kind
from ._version import PROTOCOL, __version__
from .devices import Device, cpu, device_of, devices, gpu, num_gpus, to_device
from .events import Event, EventBus
from .store import KVStore


def create(name: str = "local", **kwargs: Any) -> KVStore:
    """Make a KVStore: ``'local'`` (values summed on the CPU) or ``'device'``
    (summed on a GPU when the values are CuPy arrays), or a distributed one on
    Dask, ``'dist_sync'``, ``'dist_async'``, ``'dist_device_sync'``,
    ``'dist_async_device'`` or ``'dist_ssp'`` (bounded staleness), whose keyword
    arguments (``cluster``, ``num_servers``, ``bigarray_bound``, ``timeout``,
    ``server_workers``, ``server_device``, ``staleness``, ``replicas``) are those
    of :func:`labkv.cluster.create_store`; ``replicas=2`` keeps a copy of every
    server on another Dask worker, so that training goes on when one dies.

    Names are case-insensitive, and every name MXNet 1.9.1 gives a local or
    dist store works too (``'local_allreduce_cpu'``, ``'local_update_cpu'``,
    ``'local_allreduce_device'``, ``'nccl'``, ``'dist'``, ``'dist_sync_device'``);
    ``kv.type`` is the name given, lower-cased, as in MXNet.

    >>> create("Local").type
    'local'
    >>> create("local_allreduce_device").type
    'local_allreduce_device'
    >>> create("dist_sync", num_servers=2, server_device="cpu")  # doctest: +SKIP
    <labkv.KVStore type='dist_sync' rank=0/1 servers=2 keys=0 id=dist_sync-...>
    >>> create("dist_async", num_servers=2, replicas=2).num_servers  # doctest: +SKIP
    2
    """
    kind = store_kind(name)
    if kind in LOCAL_KINDS:
        if kwargs:
            raise TypeError(f"unexpected arguments for a {kind!r} store: {sorted(kwargs)}")
        from .local import LocalStore

        return LocalStore(kind, name=name.lower())
    from .cluster import create_store

    return create_store(name.lower(), **kwargs)


__all__ = [
    "Device",
    "Event",
    "EventBus",
    "KVStore",
    "LengthMismatchError",
    "PROTOCOL",
    "__version__",
    "array",
    "cpu",
    "create",
    "device_of",
    "devices",
    "full",
    "gpu",
    "lr_scheduler",
    "num_gpus",
    "ones",
    "optimizers",
    "sparse",
    "to_device",
    "zeros",
]
