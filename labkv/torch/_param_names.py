"""Keys of :mod:`labkv.torch`: the names of a model's tensors, and what a store
may already hold under them.

- A parameter's key is its name: ``named_parameters``' (the pairs
  ``model.named_parameters()`` gives), else the ``param_names`` of an optimizer
  made from named parameters (torch >= 2.6), else ``"param.<i>"``, ``i``
  counting the optimizer's parameters over its param groups as its
  ``state_dict`` does.
- A key already in the store is used as it is when its shape and stored dtype
  fit; one that holds a ``DistributedOptimizer(update_on_kvstore=False)``'s
  averaged gradients is never read as weights, and two DistributedOptimizers
  never train one key.

>>> import torch
>>> w = torch.nn.Parameter(torch.zeros(2))
>>> param_names(torch.optim.SGD([w], lr=0.1), None)
['param.0']
>>> param_names(torch.optim.SGD([w], lr=0.1), [("w", w)])
['w']
"""

from __future__ import annotations

import weakref
from collections.abc import Container, Iterable, Mapping
from typing import Any

import numpy as np
import torch

from ..sparse import RowSparseArray
from ._tensors import pull_into, store_array, wire_dtype

Named = Iterable[tuple[str, torch.Tensor]]

#: Per store, the keys a DistributedOptimizer(update_on_kvstore=False) pushed
#: gradients to: they no longer hold weights, so no broadcast may pull them as such.
_GRADIENT_KEYS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: Per store, the keys a live DistributedOptimizer trains: two must not share one.
_CLAIMED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def check_keys(
    kvstore: Any,
    names: list[str],
    tensors: list[torch.Tensor],
    what: str,
    sparse: Container[str] | None = None,
) -> None:
    """Everything a store would refuse about these keys, before anything changes;
    ``sparse``: the keys that take sparse gradients (a DistributedOptimizer's: a key
    in the store already must be row-sparse exactly when its parameter is)."""
    kvstore._check_key_kinds(names)
    held = _GRADIENT_KEYS.get(kvstore, set())
    for name, t in zip(names, tensors, strict=True):
        if name in held:
            raise ValueError(
                f"key {name!r} holds the averaged gradients of a DistributedOptimizer "
                f"(update_on_kvstore=False) that has stepped, not weights: {what} must come "
                "before training, or use a new store"
            )
        if name in kvstore:
            shape, dtype = kvstore._meta[name]
            wire = np.dtype(torch.empty(0, dtype=wire_dtype(t)).numpy().dtype)
            if shape != tuple(t.shape) or dtype != wire:
                raise ValueError(
                    f"key {name!r} is in the store with shape {shape} and dtype {dtype}, but "
                    f"the tensor has shape {tuple(t.shape)} and travels as {wire}"
                )
            if sparse is not None and (name in sparse) != (name in kvstore._sparse):
                held = "row_sparse" if name in kvstore._sparse else "dense"
                raise ValueError(
                    f"key {name!r} is in the store as a {held} value, but its parameter "
                    f"{'is' if name in sparse else 'is not'} in sparse_params: a key's "
                    "storage is fixed when it is initialised (make the DistributedOptimizer "
                    "first, or use a new store)"
                )


def _init_value(name: str, t: torch.Tensor, row_sparse: bool) -> Any:
    value = store_array(t, name)
    if not row_sparse:
        return value
    rows = np.arange(value.shape[0], dtype=np.int64)  # every row of the table
    return RowSparseArray(value, rows, tuple(value.shape))


def init_and_pull(
    kvstore: Any, names: list[str], tensors: list[torch.Tensor], sparse: Container[str] = ()
) -> None:
    """Rank 0's values everywhere: initialise the keys not in the store yet (on
    a dist store the owner's values win, the others' ``init`` waits for it; the
    keys of ``sparse`` as row-sparse values), then pull every key into its
    tensor's memory."""
    new = [(n, t) for n, t in zip(names, tensors, strict=True) if n not in kvstore]
    if new:
        kvstore.init([n for n, _ in new], [_init_value(n, t, n in sparse) for n, t in new])
    pull_into(kvstore, names, tensors)


def named_tensors(source: Any) -> list[tuple[str, torch.Tensor]]:
    if isinstance(source, torch.nn.Module):
        source = source.state_dict()  # detached tensors sharing the module's memory
    items = list(source.items()) if isinstance(source, Mapping) else list(source)
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise TypeError(f"expected (name, tensor) pairs, got {item!r:.60}")
        if not isinstance(item[1], torch.Tensor):
            raise TypeError(f"{item[0]!r} is a {type(item[1]).__name__}, not a torch tensor")
    names = [n for n, _ in items]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"names given twice: {twice}")
    return items


def check_unclaimed(kvstore: Any, names: list[str]) -> None:
    """Refuse keys another live DistributedOptimizer trains on this store."""
    taken = [n for n in names if n in _CLAIMED.get(kvstore, set())]
    if taken:
        raise ValueError(
            f"keys {taken[:3]} are trained by another DistributedOptimizer on this store: give "
            "this one other names (named_parameters), or call remove_hooks() on that one"
        )


def claim(kvstore: Any, names: list[str], claimed: bool = True) -> None:
    """Mark ``names`` as a DistributedOptimizer's (``claimed=False``: free them again)."""
    held = _CLAIMED.setdefault(kvstore, set())
    if claimed:
        held.update(names)
    else:
        held.difference_update(names)


def mark_gradients(kvstore: Any, name: str) -> None:
    """Remember that ``name`` now holds averaged gradients, not weights."""
    _GRADIENT_KEYS.setdefault(kvstore, set()).add(name)


def param_names(optimizer: torch.optim.Optimizer, named: Named | None) -> list[str]:
    """The key of every parameter of ``optimizer``, in its param groups' order."""
    groups = optimizer.param_groups
    params = [p for g in groups for p in g["params"]]
    if named is not None:
        by_id: dict[int, str] = {}
        for name, p in named_tensors(named):
            by_id.setdefault(id(p), name)
        missing = [i for i, p in enumerate(params) if id(p) not in by_id]
        if missing:
            shapes = [tuple(params[i].shape) for i in missing[:3]]
            raise ValueError(
                f"named_parameters names {len(params) - len(missing)} of the optimizer's "
                f"{len(params)} parameters; unnamed: positions {missing[:3]} (shapes {shapes}) "
                "in its param groups: pass the named_parameters() of the model the optimizer "
                "was made for"
            )
        return [by_id[id(p)] for p in params]
    if all("param_names" in g for g in groups):  # an optimizer made from named_parameters()
        return [n for g in groups for n in g["param_names"]]
    return [f"param.{i}" for i in range(len(params))]  # its state_dict's numbering
