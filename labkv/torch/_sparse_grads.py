"""Sparse gradients in :mod:`labkv.torch`: ``nn.Embedding(sparse=True)`` (and
``nn.EmbeddingBag(sparse=True)``) tables whose gradients travel as their rows.

- **Which parameters**: ``DistributedOptimizer(..., sparse_params=model)`` names
  them: a module (its sparse embeddings' weights) or the parameters themselves. A
  key's storage is fixed at ``init`` (a dist store cuts a row-sparse key by rows
  over every server, a dense one by elements, and a key sliced by elements refuses
  row-sparse pushes), so they must be known before the first gradient.
- **Keys**: each is initialised as a :class:`~labkv.sparse.RowSparseArray` holding
  every row of rank 0's table.
- **Pushes**: ``p.grad`` (a torch sparse COO tensor, one sparse dimension) is
  coalesced; its unique indices are the rows (sorted, host int64) and its values the
  data, on the gradient's device (a numpy view on the CPU, CuPy through DLPack on a
  GPU; float16 and bfloat16 as float32). A dense gradient of such a parameter
  travels as its non-zero rows.
- **Pulls with** ``update_on_kvstore=True`` (the servers step), per key
  (``DistributedOptimizer.sparse_pull``):

  - ``'rows'``: ``step()`` pulls the rows this rank pushed into those rows of the
    table, where those are all the rows that changed: a store with one worker
    (``local``, ``device``, a dist store of one rank) and a lazy update (SGD
    without momentum, MXNet's ``lazy_update``).
  - ``'batch'`` (otherwise, for an embedding of the module given as
    ``sparse_params``): with several ranks this rank does not know which rows the
    others' gradients touched (the servers changed those too), and with momentum
    torch's buffer moves every row it ever held (the servers then run SGD with
    ``lazy_update=False``, torch's numbers). So, as MXNet's sparse training, each
    lookup pulls the rows of its ids before it reads them and ``step()`` pulls
    none: the bytes follow the rows a batch touches (:mod:`labkv.torch._lookups`).
  - ``'table'``: parameters given without their module (no lookup to hook), or a
    weight another module reads too: ``step()`` pulls the whole table, as
    MXNet's Trainer pulls a dense weight with sparse gradients.

  Pushes move the rows touched in every mode.
- **Pulls with** ``update_on_kvstore=False`` (torch steps): one-rank stores only:
  the merged gradient holds exactly the rows pushed; they are pulled into a fresh
  sparse ``p.grad``; the table lives on the rank, which torch steps, so no lookup
  pulls anything. A dist store is refused, as MXNet's Trainer refuses
  ``update_on_kvstore=False`` on a dist store with sparse gradients (a rank cannot
  pull the rows the other ranks pushed); ``update_on_kvstore=None`` (the default)
  picks ``True`` there and ``False`` elsewhere, MXNet's rule.
- **Refused, naming the option**: gradient compression (MXNet refuses it for
  row-sparse pushes); ``torch.optim.Adam`` (torch refuses sparse gradients:
  ``torch.optim.SparseAdam``), SGD's ``weight_decay`` on a sparse parameter (torch
  cannot add a dense weight to a sparse gradient), an embedding's ``max_norm``
  with ``update_on_kvstore=True`` (its renormalised rows never reach the servers).

>>> import torch, labkv.sparse
>>> emb = torch.nn.Embedding(5, 2, sparse=True)
>>> emb(torch.tensor([3, 1, 3])).sum().backward()
>>> g = grad_rows(emb.weight.grad, "emb.weight")
>>> g.indices, g.data.tolist(), g.shape
(array([1, 3]), [[1.0, 1.0], [2.0, 2.0]], (5, 2))
>>> sorted(sparse_names(emb, [("emb.weight", emb.weight)]))
['emb.weight']
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from .. import sparse
from .._types import DIST_KINDS, store_kind
from ..devices import Device, cpu, gpu, is_cupy
from ._tensors import HALF, store_array

#: MXNet 1.9.1's message (gluon/trainer.py) for update_on_kvstore=False with sparse gradients.
MXNET_REFUSAL = (
    "Cannot set update_on_kvstore=False on dist kvstore when sparse gradients are present"
)

SparseParams = torch.nn.Module | Iterable[torch.Tensor] | None


def sparse_names(source: SparseParams, trained: Sequence[tuple[str, torch.Tensor]]) -> set[str]:
    """The keys among ``trained`` (``(name, parameter)``) whose gradients are sparse:
    ``source`` is a module (its ``nn.Embedding``/``nn.EmbeddingBag`` with
    ``sparse=True``) or parameters; a parameter not trained is refused."""
    if source is None:
        return set()
    if isinstance(source, torch.nn.Module):
        kinds = (torch.nn.Embedding, torch.nn.EmbeddingBag)
        params = [m.weight for m in source.modules() if isinstance(m, kinds) and m.sparse]
    else:
        params = list(source)
        for p in params:
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"sparse_params holds a {type(p).__name__}, not a parameter")
    by_id = {id(p): n for n, p in trained}
    missing = [tuple(p.shape) for p in params if id(p) not in by_id and p.requires_grad]
    if missing:
        raise ValueError(
            f"sparse_params names parameters (shapes {missing[:3]}) the optimizer does not "
            "train: give the model (or parameters) the optimizer was made for"
        )
    names = {by_id[id(p)] for p in params if id(p) in by_id}
    for name, p in trained:
        if name in names and p.dim() < 1:
            raise ValueError(f"sparse parameter {name!r} is a scalar: row-sparse values have rows")
    return names


def resolve_update_on_kvstore(update_on_kvstore: bool | None, kind: str, has_sparse: bool) -> bool:
    """MXNet's Trainer's rule: ``None`` is ``True`` on a dist store with sparse
    gradients, else ``False``; ``False`` there is refused."""
    dist = store_kind(kind) in DIST_KINDS
    if update_on_kvstore is None:
        return has_sparse and dist
    if not update_on_kvstore and has_sparse and dist:
        raise ValueError(
            f"update_on_kvstore=False with sparse gradients (sparse_params) on a {kind!r} "
            "store: each rank would need the rows the other ranks pushed, which it does not "
            f"know; MXNet's Trainer refuses it too ({MXNET_REFUSAL!r}); use "
            "update_on_kvstore=True (or None, which picks it here)"
        )
    return bool(update_on_kvstore)


def check_sparse_options(
    names: set[str],
    compression: Any,
    optimizer: torch.optim.Optimizer,
    trained: Sequence[tuple[str, torch.Tensor]],
) -> None:
    """Refuse what sparse gradients cannot do (see module doc), before anything changes."""
    if not names:
        return
    if compression is not None:
        raise ValueError(
            "compression with sparse gradients (sparse_params): gradient compression for "
            "row sparse storage type is not supported (MXNet refuses it too); drop "
            "compression or the sparse parameters"
        )
    if isinstance(optimizer, torch.optim.Adam):
        raise ValueError(
            "torch.optim.Adam with sparse gradients (sparse_params): torch's Adam refuses "
            "sparse gradients (torch.optim.SparseAdam is its sparse form, which labkv.torch "
            "does not translate); use torch.optim.SGD, or nn.Embedding(sparse=False)"
        )
    by_id = {id(p): n for n, p in trained}
    for i, group in enumerate(optimizer.param_groups):
        held = sorted(by_id[id(p)] for p in group["params"] if by_id.get(id(p)) in names)
        if held and float(group.get("weight_decay", 0.0)) != 0.0:
            raise ValueError(
                f"param group {i} has weight_decay={group['weight_decay']!r} and the sparse "
                f"parameters {held[:3]} (sparse_params): torch's SGD cannot decay a weight "
                "with a sparse gradient (add(sparse, dense) is not supported), so there is "
                "no torch number to follow; put them in a param group with weight_decay=0"
            )


def server_is_lazy(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the servers' update of a sparse key changes only its rows: SGD
    without momentum (torch's sparse momentum buffer moves every row it holds)."""
    return all(float(g.get("momentum", 0.0)) == 0.0 for g in optimizer.param_groups)


def grad_rows(grad: torch.Tensor, name: str) -> sparse.RowSparseArray:
    """``grad`` (a sparse COO gradient, or a dense one) as a row-sparse value: its
    unique rows, sorted, the data on ``grad``'s device (see module doc)."""
    if grad.layout == torch.strided:  # a declared parameter with a dense gradient
        dense = store_array(grad, name)
        return sparse.cast_storage(dense, "row_sparse")
    if grad.layout != torch.sparse_coo:
        raise TypeError(f"{name!r} has a {grad.layout} gradient; labkv.torch takes sparse COO")
    if grad.sparse_dim() != 1:
        raise TypeError(
            f"{name!r} has a sparse gradient with {grad.sparse_dim()} sparse dimensions; "
            "row-sparse values have one (the rows), as nn.Embedding's"
        )
    g = grad.detach().coalesce()
    rows = g.indices()[0].cpu().numpy().astype(np.int64, copy=False)
    data = store_array(g.values().contiguous(), name)
    return sparse.RowSparseArray(data, rows, tuple(grad.shape))


def labkv_device(t: torch.Tensor) -> Device:
    """The labkv device of a torch tensor: ``cpu(0)``, or ``gpu(i)`` for ``cuda:i``."""
    if t.device.type == "cuda":
        return gpu(t.device.index or 0)
    return cpu(0)


def _torch_data(data: Any, like: torch.Tensor) -> torch.Tensor:
    """A pulled out's data as a torch tensor on ``like``'s device, in its dtype."""
    tensor = torch.from_dlpack(data) if is_cupy(data) else torch.from_numpy(np.asarray(data))
    return tensor.to(device=like.device, dtype=like.dtype)


def _wire_dtype(t: torch.Tensor) -> Any:
    return np.float32 if t.dtype in HALF else torch.empty(0, dtype=t.dtype).numpy().dtype


def pull_rows_into(
    kvstore: Any,
    names: Sequence[str],
    tensors: Sequence[torch.Tensor],
    rows: Sequence[np.ndarray],
    into_grad: bool,
    divide: int = 1,
) -> None:
    """``row_sparse_pull`` of ``rows[i]`` of each key in one call, on each tensor's
    device; written into those rows of ``tensors[i]`` (the tables), or, with
    ``into_grad``, as each table's new sparse ``grad`` divided by ``divide``."""
    if not names:
        return
    outs = [
        sparse.zeros("row_sparse", tuple(t.shape), device=labkv_device(t), dtype=_wire_dtype(t))
        for t in tensors
    ]
    kvstore.row_sparse_pull(list(names), out=outs, row_ids=list(rows))
    with torch.no_grad():
        for t, out in zip(tensors, outs, strict=True):
            data = _torch_data(out.data, t)
            index = torch.from_numpy(out.indices).to(t.device)
            if into_grad:
                if divide != 1:
                    data = data / divide
                t.grad = torch.sparse_coo_tensor(
                    index[None], data, t.shape, is_coalesced=True, check_invariants=False
                )
            else:
                t.index_copy_(0, index, data)
