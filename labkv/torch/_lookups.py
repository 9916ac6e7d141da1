"""Pulling an embedding table's rows before each lookup (:mod:`labkv.torch`,
``sparse_pull`` ``'batch'``), as MXNet's sparse training pulls a batch's rows
(``row_sparse_pull`` of its ids) before the forward pass: the bytes a step moves
grow with the rows a batch touches, not with the table.

- **Where**: a forward pre-hook on each ``nn.Embedding``/``nn.EmbeddingBag`` with
  ``sparse=True`` of the module given as ``sparse_params``, when the servers step
  (``update_on_kvstore=True``) and ``step()`` cannot pull the rows that changed
  (several ranks: the others' rows changed too; or momentum, which moves every row
  it holds). ``step()`` then pulls nothing of that table.
- **Which rows**: the lookup's ids (``input``: EmbeddingBag's ``offsets`` and
  ``per_sample_weights`` name no rows; duplicates count once; ids on a GPU are
  made unique there and moved to the host), less the rows already pulled since the
  last ``step()`` (a module called twice in one step pulls each row once). They go
  through the store's own ``row_sparse_pull``, so inside ``for step in
  kv.steps(n)`` each pull carries its step, as any pull does.
- **Exact**: a lookup reads the servers' rows as of the start of the step (a
  dist_sync pull waits for the round this rank pushed last), which are the rows
  one process would read. Pulled rows are written through ``weight.data``: rows a
  lookup already read in this step are never written again, so what an earlier
  lookup kept for its backward pass (EmbeddingBag's ``per_sample_weights``
  gradient keeps the weight) is unchanged, and its version counter must not move.
  A lookup *outside* any step (an evaluation) pulls its rows the same way.
- **Refused**: a lookup of rows not pulled yet after this rank pushed the table's
  gradient and before ``step()`` (the servers may have applied the step already, so
  those rows cannot be read as one process would read them: before its update);
  ``max_norm`` with ``update_on_kvstore=True`` (torch renormalises the looked-up
  rows in place in the forward pass, which the servers holding the weights never
  see), checked when the DistributedOptimizer is made.
- **The whole table** on this rank (rows other ranks changed since this rank last
  looked them up are older there): ``DistributedOptimizer.pull_tables()``,
  ``state_dict()`` of any module holding the embedding (a checkpoint holds every
  row as the servers do), and ``remove_hooks()`` pull it. A copy of the module
  (``copy.deepcopy``, pickling) keeps its rows as they were and pulls nothing.
- **The servers hold the table**: a value written into the rank's table (a
  ``load_state_dict``) is read over by the next lookup's pull; load a checkpoint
  before making the DistributedOptimizer (its keys start from rank 0's tables).
- **Not per lookup**: a weight another module holds too (tied weights are read
  outside the lookups), and parameters given to ``sparse_params`` without their
  module: ``step()`` pulls their whole table (``sparse_pull`` ``'table'``).

>>> import numpy as np, torch, labkv
>>> emb = torch.nn.Embedding(100, 2, sparse=True)
>>> kv = labkv.create()
>>> kv.init("emb", labkv.sparse.cast_storage(np.full((100, 2), 5, np.float32), "row_sparse"))
>>> pulls = BatchPulls(kv, {"emb": [emb]})
>>> emb(torch.tensor([3, 7, 3])).tolist()  # rows 3 and 7 pulled first
[[5.0, 5.0], [5.0, 5.0], [5.0, 5.0]]
>>> emb.weight[0].tolist() == [5.0, 5.0]  # not looked up: not pulled
False
>>> pulls.remove()  # the whole table, and no more hooks
>>> emb.weight[0].tolist()
[5.0, 5.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ._sparse_grads import pull_rows_into
from ._tensors import pull_into

_KINDS = (torch.nn.Embedding, torch.nn.EmbeddingBag)


def lookup_modules(
    source: Any, names: set[str], trained: Sequence[tuple[str, torch.Tensor]], servers_step: bool
) -> dict[str, list[torch.nn.Module]]:
    """Per key of ``names``, the sparse embeddings of ``source`` (a module) that
    look it up, for keys no other module holds; ``{}`` for parameters. Refuses
    ``max_norm`` on them when the servers step (``servers_step``)."""
    if not isinstance(source, torch.nn.Module):
        return {}
    by_id = {id(p): n for n, p in trained if n in names}
    lookups: dict[str, list[torch.nn.Module]] = {}
    tied: set[str] = set()
    for module in source.modules():
        for p in module._parameters.values():
            name = by_id.get(id(p)) if p is not None else None
            if name is None:
                continue
            if isinstance(module, _KINDS) and module.sparse:
                lookups.setdefault(name, []).append(module)
            else:
                tied.add(name)
    for name, modules in lookups.items():
        renorm = [m for m in modules if m.max_norm is not None]
        if renorm and servers_step:
            raise ValueError(
                f"{type(renorm[0]).__name__} {name!r} has max_norm={renorm[0].max_norm!r} and "
                "sparse gradients with update_on_kvstore=True: torch renormalises the looked-up "
                "rows in place during the forward pass, which the servers holding the weights "
                "never see, so the numbers would not be torch's; drop max_norm, or use "
                "update_on_kvstore=False on a one-rank store (torch steps the table there)"
            )
    return {n: ms for n, ms in lookups.items() if n not in tied}


class _Hook:
    """A module's hook calling ``BatchPulls``; a copy of the module gets a no-op
    (it holds its own rows, which no store writes)."""

    def __init__(self, pulls: BatchPulls, name: str, method: str):
        self._pulls, self._name, self._method = pulls, name, method

    def __call__(self, module: torch.nn.Module, *args: Any) -> None:
        if module.weight is self._pulls.weights.get(self._name):
            getattr(self._pulls, self._method)(self._name, *args)

    def __reduce__(self) -> tuple:
        return (_copied_hook, ())

    def __deepcopy__(self, memo: dict) -> Any:
        return _copied_hook()


def _copied_hook() -> Any:
    return _noop


def _noop(*args: Any) -> None:
    return None


class BatchPulls:
    """The per-lookup pulls of ``modules`` (per key, the embeddings that look it
    up) from ``kvstore`` (see module doc); hooks installed at once."""

    def __init__(self, kvstore: Any, modules: dict[str, list[torch.nn.Module]]):
        self._kvstore = kvstore
        self.weights = {n: ms[0].weight for n, ms in modules.items()}
        # per key: the rows pulled since the last step() (sorted), and whether this
        # rank pushed the key's gradient since then
        self._pulled: dict[str, np.ndarray] = {}
        self._pushed: set[str] = set()
        self._handles = []
        for name, ms in modules.items():
            for m in ms:
                lookup = _Hook(self, name, "_before_lookup")
                self._handles.append(m.register_forward_pre_hook(lookup, with_kwargs=True))
                whole = _Hook(self, name, "_before_state_dict")
                self._handles.append(m.register_state_dict_pre_hook(whole))

    @property
    def names(self) -> set[str]:
        """The keys whose rows each lookup pulls."""
        return set(self.weights)

    # -- what the optimizer tells it ---------------------------------------------------
    def pushed(self, name: str) -> None:
        """This rank pushed ``name``'s gradient: the servers may apply it any time now."""
        if name in self.weights:
            self._pushed.add(name)

    def stepped(self) -> None:
        """A step (or ``zero_grad``) ended the step: every row is pulled afresh."""
        self._pulled, self._pushed = {}, set()

    # -- the hooks -----------------------------------------------------------------------
    def _before_lookup(self, name: str, args: tuple, kwargs: dict) -> None:
        ids = args[0] if args else kwargs.get("input")
        if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.is_complex():
            return  # torch's own error follows
        if ids.dtype == torch.bool:
            return
        rows = torch.unique(ids.detach()).cpu().numpy().astype(np.int64, copy=False)
        pulled = self._pulled.get(name)
        if pulled is not None:
            rows = rows[~np.isin(rows, pulled, assume_unique=True)]
        if not len(rows):
            return
        if name in self._pushed:
            raise RuntimeError(
                f"a lookup of {name!r} after this rank pushed its gradient and before step() "
                f"reads {len(rows)} rows not looked up in this step (e.g. row {int(rows[0])}): "
                "the servers may have applied the step to them already, so they cannot be read "
                "as of before it, as the rows looked up earlier are; call step() first"
            )
        weight = self.weights[name]
        pull_rows_into(self._kvstore, [name], [weight.data], [rows], into_grad=False)
        self._pulled[name] = rows if pulled is None else np.union1d(pulled, rows)

    def _before_state_dict(self, name: str, prefix: str, keep_vars: bool) -> None:
        self.pull_tables([name])

    # -- whole tables ----------------------------------------------------------------------
    def pull_tables(self, names: Sequence[str] | None = None) -> None:
        """Pull the whole of each table (of ``names``, default all) into its weight."""
        names = sorted(self.weights) if names is None else list(names)
        pending = [n for n in names if n in self._pushed]
        if pending:
            raise RuntimeError(
                f"{pending[:3]}: this rank pushed their gradients and has not called step(): "
                "the servers may have applied the step to some rows already, so the table "
                "cannot be read as of before it; call step() first"
            )
        if names:
            pull_into(self._kvstore, names, [self.weights[n].data for n in names])
            for n in names:
                self._pulled[n] = np.arange(self.weights[n].shape[0], dtype=np.int64)

    def remove(self) -> None:
        """Remove the hooks, after pulling every table as the servers hold it now."""
        self._pushed = set()
        self.pull_tables()
        for handle in self._handles:
            handle.remove()
        self._handles, self.weights = [], {}
