"""The store types: labkv's names and every name MXNet 1.9.1 gives a local or dist store.

MXNet reads a type name by its parts (``dist`` makes a distributed store,
``_async`` an asynchronous one, ``device`` sums on a GPU), so several names
mean the same store. Each maps here to the labkv store with those semantics;
the store keeps the name as given (lower-cased, as MXNet does) in ``kv.type``.

>>> store_kind("local_allreduce_device")
'device'
>>> store_kind("dist")
'dist_sync'
"""

from __future__ import annotations

from typing import Any

#: a store's key: MXNet takes ints and strs (one kind per store)
Key = int | str

#: name -> the labkv store it makes
STORE_TYPES: dict[str, str] = {
    "local": "local",
    "local_update_cpu": "local",
    "local_allreduce_cpu": "local",
    "device": "device",
    "local_allreduce_device": "device",
    "nccl": "device",  # MXNet's NCCL store sums on the GPUs, as 'device' does with CuPy
    "dist_sync": "dist_sync",
    "dist": "dist_sync",  # no "_async" in the name: synchronous
    "dist_async": "dist_async",
    "dist_device_sync": "dist_device_sync",
    "dist_sync_device": "dist_device_sync",
    "dist_async_device": "dist_async_device",
    "dist_ssp": "dist_ssp",  # labkv's own: bounded staleness (no MXNet name)
}
LOCAL_KINDS = ("local", "device")
SYNC_KINDS = ("dist_sync", "dist_device_sync")
ASYNC_KINDS = ("dist_async", "dist_async_device")
SSP_KINDS = ("dist_ssp",)
DIST_KINDS = SYNC_KINDS + ASYNC_KINDS + SSP_KINDS
# Names MXNet 1.9.1 registers for stores of other libraries.
_ELSEWHERE = {"horovod": "Horovod", "byteps": "BytePS", "teststore": "MXNet's tests"}


def store_kind(name: Any) -> str:
    """The labkv store (``'local'``, ``'device'`` or a ``'dist_*'`` type) that
    the type ``name`` makes; names are case-insensitive.

    >>> store_kind("Local_Update_CPU")
    'local'
    >>> store_kind("nonsense")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: unknown KVStore type 'nonsense'; valid types: 'local', ...
    """
    if not isinstance(name, str):
        raise TypeError(f"the store type must be a str, got {type(name).__name__}")
    kind = STORE_TYPES.get(name.lower())
    if kind is not None:
        return kind
    if name.lower() in _ELSEWHERE:
        raise ValueError(
            f"KVStore type {name!r} is {_ELSEWHERE[name.lower()]}'s store, which labkv does "
            "not provide; use 'local', 'device' or a 'dist_*' type"
        )
    valid = ", ".join(repr(t) for t in STORE_TYPES)
    raise ValueError(f"unknown KVStore type {name!r}; valid types: {valid}")


def dist_kind(name: Any) -> str:
    """:func:`store_kind` for a name that must make a distributed store.

    >>> dist_kind("dist_sync_device")
    'dist_device_sync'
    """
    kind = store_kind(name)
    if kind not in DIST_KINDS:
        raise ValueError(f"not a cluster store type: {name!r} (a {kind!r} store)")
    return kind
