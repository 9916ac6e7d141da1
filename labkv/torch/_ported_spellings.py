"""Horovod's and BytePS's spellings of :mod:`labkv.torch`'s calls, read into
labkv's, so that code ported from them runs or is refused naming labkv's
spelling:

- ``DistributedOptimizer(opt, model.named_parameters())``: their second
  positional argument is ``named_parameters``, labkv's is the store. Pairs of
  ``(name, tensor)`` there are taken as ``named_parameters``; the store may
  then come third (``DistributedOptimizer(opt, model.named_parameters(), kv)``),
  and without one the call is refused with labkv's signature: Horovod finds its
  communicator in ``hvd.init()``'s global state, labkv takes the store
  explicitly (the ``kv`` a rank of ``labkv.cluster.run`` gets, or
  ``labkv.create(...)``), so two stores in one process never mix.
- ``broadcast_parameters(params, root_rank=0)`` and
  ``broadcast_optimizer_state(opt, root_rank=0)``: ``root_rank`` is accepted
  when it is 0 (also as their second positional argument); another root is
  refused: labkv's broadcast gives every rank the values of the store's owner,
  rank 0 of a run, which initialises every key (MXNet's rule).
- ``compression=Compression.none`` maps to no compression;
  ``Compression.fp16`` is refused, naming what labkv has instead (MXNet's
  2-bit and 1-bit compression). Horovod's and BytePS's own compressor classes
  are read by their names.

>>> import torch
>>> model = torch.nn.Linear(2, 1)
>>> kv_or_named(model.named_parameters(), None, "(...)")[0] is None
True
>>> compression_params(Compression.none) is None
True
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from typing import Any

import torch

#: labkv's call for each function whose store may be missing, as the errors show it.
_SPELLING = {
    "DistributedOptimizer": "DistributedOptimizer(opt, kv, named_parameters=model.named_parameters())"
    " or DistributedOptimizer(opt, model.named_parameters(), kv)",
    "broadcast_parameters": "broadcast_parameters(model.state_dict(), kv, root_rank=0)",
    "broadcast_optimizer_state": "broadcast_optimizer_state(opt, kv, root_rank=0)",
}


def plain_signature(function: Any) -> str:
    """``function``'s parameters with their defaults, without ``self`` and
    annotations, as an error shows a signature.

    >>> def f(self, a, b=1, *, c=None): pass
    >>> plain_signature(f)
    '(a, b=1, *, c=None)'
    """
    params = [p for p in inspect.signature(function).parameters.values() if p.name != "self"]
    return str(inspect.Signature([p.replace(annotation=inspect.Parameter.empty) for p in params]))


def is_store(value: Any) -> bool:
    """Whether ``value`` is a labkv store (local or distributed)."""
    return all(hasattr(value, a) for a in ("push", "pull", "init", "type", "num_workers"))


def looks_named(value: Any) -> bool:
    """Whether ``value`` is ``named_parameters`` (Horovod's second positional
    argument): an iterator (``model.named_parameters()`` is a generator), a
    list or tuple of ``(name, tensor)`` pairs, or a mapping of names to
    tensors. An iterator is not consumed (its items are checked later).

    >>> import torch
    >>> m = torch.nn.Linear(1, 1)
    >>> looks_named(m.named_parameters()), looks_named(list(m.named_parameters())), looks_named(3)
    (True, True, False)
    """
    if isinstance(value, Iterator):  # a generator, or iter(pairs): looked at, not consumed
        return True
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        return False
    return bool(items) and all(
        isinstance(i, tuple)
        and len(i) == 2
        and isinstance(i[0], str)
        and isinstance(i[1], torch.Tensor)
        for i in items
    )


def _missing_store(call: str, signature: str, why: str) -> TypeError:
    return TypeError(
        f"{call}{signature} needs the store the values go through, and {why}; labkv takes "
        f"it explicitly (the kv a rank of labkv.cluster.run gets, or labkv.create(...)): "
        f"{_SPELLING[call]}"
    )


def kv_or_named(kvstore: Any, named_parameters: Any, signature: str) -> tuple[Any, Any]:
    """A DistributedOptimizer's ``(kvstore, named_parameters)`` from its second
    and third arguments in either order (labkv's, or Horovod's with the store
    after); ``kvstore`` None only when the caller's message is not needed
    (``signature`` is the constructor's, for the error)."""
    if kvstore is not None and not is_store(kvstore) and looks_named(kvstore):
        if named_parameters is None:
            return None, kvstore
        if is_store(named_parameters):
            return named_parameters, kvstore
        raise TypeError(
            "named_parameters given twice: as the second argument (Horovod's and BytePS's "
            f"place for it) and as named_parameters; labkv's signature: DistributedOptimizer{signature}"
        )
    return kvstore, named_parameters


def optimizer_store(kvstore: Any, named_parameters: Any, signature: str) -> tuple[Any, Any]:
    """:func:`kv_or_named`, then the store required: refused naming labkv's
    signature and spelling when missing or not a store."""
    given = kvstore
    kvstore, named_parameters = kv_or_named(kvstore, named_parameters, signature)
    if kvstore is None:
        why = (
            "the second argument was named_parameters (Horovod's and BytePS's second "
            "positional argument) with no store after it"
            if given is not None
            else "none was given"
        )
        raise _missing_store("DistributedOptimizer", signature, why)
    if not is_store(kvstore):
        raise TypeError(
            f"kvstore must be a labkv store (labkv.create(...), or the kv a rank of "
            f"labkv.cluster.run gets), got {type(kvstore).__name__}; labkv's signature: "
            f"DistributedOptimizer{signature}"
        )
    return kvstore, named_parameters


def broadcast_store(call: str, kvstore: Any, root_rank: Any, signature: str) -> Any:
    """The store of a broadcast called as labkv's ``(x, kvstore, root_rank=0)``
    or as Horovod's ``(x, root_rank)``; a root other than 0 is refused.

    >>> broadcast_store("broadcast_parameters", None, 1, "(x, kvstore=None, root_rank=0)")
    Traceback (most recent call last):
    ...
    ValueError: broadcast_parameters(root_rank=1): labkv broadcasts the values of the store's owner, rank 0 of a run (it initialises every key, MXNet's rule), so root_rank must be 0; to start from rank 1's values, load them on rank 0 first (e.g. the checkpoint rank 1 would read) and broadcast from there
    """
    if isinstance(kvstore, int) and not isinstance(kvstore, bool):  # Horovod's (x, root_rank)
        kvstore, root_rank = None, kvstore
    if isinstance(root_rank, bool) or not isinstance(root_rank, int):
        raise TypeError(f"root_rank must be an int (0), got {root_rank!r}")
    if root_rank != 0:
        raise ValueError(
            f"{call}(root_rank={root_rank}): labkv broadcasts the values of the store's owner, "
            "rank 0 of a run (it initialises every key, MXNet's rule), so root_rank must be 0; "
            f"to start from rank {root_rank}'s values, load them on rank 0 first (e.g. the "
            f"checkpoint rank {root_rank} would read) and broadcast from there"
        )
    if kvstore is None:
        raise _missing_store(call, signature, "none was given (Horovod's call passes none)")
    if not is_store(kvstore):
        raise TypeError(
            f"kvstore must be a labkv store (labkv.create(...), or the kv a rank of "
            f"labkv.cluster.run gets), got {type(kvstore).__name__}; labkv's signature: "
            f"{call}{signature}"
        )
    return kvstore


class _Name:
    """One of Horovod's and BytePS's compression names."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"labkv.torch.Compression.{self.name}"


class Compression:
    """Horovod's and BytePS's compression names, for ``DistributedOptimizer(...,
    compression=Compression.none)``: ``none`` is no compression; ``fp16`` is
    refused, naming MXNet's 2-bit and 1-bit compression, which labkv has
    (``compression={'type': '2bit', 'threshold': 0.5}``)."""

    none = _Name("none")
    fp16 = _Name("fp16")


# Horovod's and BytePS's compressor classes, by name (neither package is needed here).
_FOREIGN = {"NoneCompressor": "none", "FP16Compressor": "fp16"}


def _horovod_name(value: Any) -> str | None:
    if isinstance(value, _Name):
        return value.name
    cls = value if isinstance(value, type) else type(value)
    module = (getattr(cls, "__module__", "") or "").split(".")[0]
    if module in ("horovod", "byteps"):
        return _FOREIGN.get(cls.__name__, cls.__name__)
    return None


def compression_params(compression: Any) -> dict[str, Any] | None:
    """MXNet's compression dict (or None) for ``compression``: that dict, None,
    or a Horovod/BytePS name (``Compression.none``; ``fp16`` is refused).

    >>> compression_params({"type": "2bit", "threshold": 0.5})
    {'type': '2bit', 'threshold': 0.5}
    >>> compression_params(Compression.fp16)
    Traceback (most recent call last):
    ...
    ValueError: compression=Compression.fp16 (Horovod's and BytePS's float16 gradients): labkv has no float16 compression (a float16 value travels and is kept as float32); it has MXNet's: compression={'type': '2bit', 'threshold': 0.5} (16x fewer bytes than float32, quantised with the residual fed back) or {'type': '1bit', 'threshold': 0.0} (32x), or none (compression=None)
    """
    if compression is None or isinstance(compression, dict):
        return compression
    name = _horovod_name(compression)
    if name == "none":
        return None
    if name == "fp16":
        raise ValueError(
            "compression=Compression.fp16 (Horovod's and BytePS's float16 gradients): labkv "
            "has no float16 compression (a float16 value travels and is kept as float32); it "
            "has MXNet's: compression={'type': '2bit', 'threshold': 0.5} (16x fewer bytes than "
            "float32, quantised with the residual fed back) or {'type': '1bit', 'threshold': "
            "0.0} (32x), or none (compression=None)"
        )
    if name is not None:
        raise ValueError(
            f"compression={compression!r}: labkv has no such compression; it has MXNet's "
            "{'type': '2bit', 'threshold': 0.5} and {'type': '1bit', 'threshold': 0.0}, "
            "or none (compression=None)"
        )
    raise TypeError(
        "compression must be MXNet's dict ({'type': '2bit', 'threshold': 0.5}), None, or "
        f"labkv.torch.Compression.none, got {compression!r}"
    )
