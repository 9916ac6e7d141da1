"""PyTorch on labkv's stores: a ``torch.optim`` optimizer whose gradients go
through a parameter server (Horovod's and BytePS's ``DistributedOptimizer``
shape, with MXNet's ``update_on_kvstore``), and broadcasts of rank 0's values.

Importing :mod:`labkv` never imports torch; this module does. Keys are the
parameters' names, so the monitor shows a torch run like any other. Tensors
travel without a copy where memory allows (numpy views of CPU tensors, CuPy
views of CUDA ones through DLPack); float16 and bfloat16 travel and are stored
as float32 (see :mod:`labkv.torch._tensors`). With ``update_on_kvstore=True``
the servers run labkv's (MXNet's) SGD, NAG or Adam: where their numbers differ
from torch's, and what is refused, is in :mod:`labkv.torch._server_optimizer`. Sparse gradients
(``nn.Embedding(sparse=True)``, named with ``sparse_params``) travel as their rows,
and each lookup pulls the rows it reads first, so a step moves the rows a batch
touches, not the table (:mod:`labkv.torch._sparse_grads`, :mod:`labkv.torch._lookups`).

Inside ``for step in kv.steps(n)`` of ``labkv.cluster.run(..., on_rank_loss="replace")``
on a dist_sync store, a lost rank's replacement resumes bit-identically in both
``update_on_kvstore`` modes: the weights come from the servers (``True``) or from a
live rank's copy of the weights and torch optimizer state (``False``); what neither
holds (module buffers, an lr scheduler's count, torch's random generator) is not
restored (:mod:`labkv.torch._resume`).

>>> import torch, labkv, labkv.torch as lkt
>>> _ = torch.manual_seed(0)
>>> model = torch.nn.Linear(3, 1)
>>> kv = labkv.create("local")
>>> opt = lkt.DistributedOptimizer(
...     torch.optim.SGD(model.parameters(), lr=0.1), kv, named_parameters=model.named_parameters()
... )
>>> kv.keys()
['weight', 'bias']
>>> for _ in range(3):
...     opt.zero_grad()
...     model(torch.ones(4, 3)).pow(2).mean().backward()
...     opt.step()
>>> bool(model(torch.ones(1, 3)).abs() < 0.5)
True
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from .._types import ASYNC_KINDS, SSP_KINDS, store_kind
from ..compression import GradientCompression
from ._lookups import BatchPulls, lookup_modules
from ._param_names import (
    Named,
    check_keys,
    check_unclaimed,
    claim,
    init_and_pull,
    mark_gradients,
    named_tensors,
    param_names,
)
from ._ported_spellings import (
    Compression,
    broadcast_store,
    compression_params,
    optimizer_store,
    plain_signature,
)
from ._resume import Resume
from ._server_optimizer import hyperparameters, server_optimizer
from ._sparse_grads import (
    SparseParams,
    check_sparse_options,
    grad_rows,
    pull_rows_into,
    resolve_update_on_kvstore,
    server_is_lazy,
    sparse_names,
)
from ._state_broadcast import broadcast_state
from ._tensors import pull_into, store_array

__all__ = [
    "Compression",
    "DistributedOptimizer",
    "broadcast_optimizer_state",
    "broadcast_parameters",
]


def broadcast_parameters(model_or_state_dict: Any, kvstore: Any = None, root_rank: int = 0) -> None:
    """Give every rank rank 0's values of a module's ``state_dict()`` (parameters
    and buffers), a state dict, or ``(name, tensor)`` pairs (``named_parameters()``),
    written into each rank's tensors in place. Keys are the names: a name not in
    the store yet is initialised (on a dist store the owner's values win, MXNet's
    rule: rank 0 of a run), then every rank pulls it; a name in the store already
    (a DistributedOptimizer's weights) is pulled as it is. ``root_rank`` is
    Horovod's and BytePS's: 0 (also as their second positional argument); another
    root, or no store, is refused naming why (:mod:`labkv.torch._ported_spellings`).

    >>> import torch, labkv
    >>> model = torch.nn.Linear(2, 1)
    >>> kv = labkv.create()
    >>> broadcast_parameters(model, kv)
    >>> kv.keys()
    ['weight', 'bias']
    """
    signature = "(model_or_state_dict, kvstore=None, root_rank=0)"
    kvstore = broadcast_store("broadcast_parameters", kvstore, root_rank, signature)
    items = named_tensors(model_or_state_dict)
    names, tensors = [n for n, _ in items], [t for _, t in items]
    check_keys(kvstore, names, tensors, "broadcast_parameters")
    init_and_pull(kvstore, names, tensors)


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer, kvstore: Any = None, root_rank: int = 0
) -> None:
    """Load rank 0's torch optimizer state (its per-parameter tensors and values,
    and its param groups' options) on every rank, e.g. after rank 0 alone read a
    checkpoint. Every rank calls it; rank 0's state travels under fresh keys
    ``optimizer_state.<n>/...``. With ``update_on_kvstore=True`` the state lives
    on the servers, one copy for all ranks, and there is nothing to do.
    ``root_rank``: as :func:`broadcast_parameters`'s.

    >>> import torch, labkv
    >>> w = torch.nn.Parameter(torch.ones(2))
    >>> opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    >>> w.grad = torch.ones(2); opt.step()
    >>> kv = labkv.create()
    >>> broadcast_optimizer_state(opt, kv)
    >>> opt.state[w]["momentum_buffer"]
    tensor([1., 1.])
    """
    signature = "(optimizer, kvstore=None, root_rank=0)"
    kvstore = broadcast_store("broadcast_optimizer_state", kvstore, root_rank, signature)
    if isinstance(optimizer, DistributedOptimizer):
        if optimizer.update_on_kvstore:
            return
        optimizer = optimizer._optimizer
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"expected a torch.optim optimizer, got {type(optimizer).__name__}")
    broadcast_state(optimizer, kvstore)


def _hooked_by(p: torch.Tensor) -> DistributedOptimizer | None:
    for hook in (getattr(p, "_post_accumulate_grad_hooks", None) or {}).values():
        owner = getattr(getattr(hook, "func", None), "__self__", None)
        if isinstance(owner, DistributedOptimizer):
            return owner
    return None


class DistributedOptimizer(torch.optim.Optimizer):
    """``optimizer`` (a ``torch.optim`` optimizer) training through ``kvstore``.

    - ``update_on_kvstore=False``: as each parameter's gradient is ready (a
      ``register_post_accumulate_grad_hook``, so communication overlaps the rest
      of the backward pass) it is pushed; ``step()`` pulls the sum of the ranks'
      gradients into ``p.grad``, divides it by ``kvstore.num_workers`` and runs
      ``optimizer.step()`` on every rank. Needs a store that sums the ranks'
      pushes (``local``, ``device``, ``dist_sync``, ``dist_device_sync``);
      dist_async and dist_ssp apply each push alone and are refused, as MXNet's
      Trainer refuses them.
    - ``update_on_kvstore=None`` (the default) is ``False``, except with sparse
      gradients on a dist store, where it is ``True`` (MXNet's Trainer's rule).
    - ``update_on_kvstore=True``: the servers run ``optimizer``'s step (SGD with
      momentum, weight decay or Nesterov, and Adam, translated with the same
      hyper-parameters; see :mod:`labkv.torch._server_optimizer` for where the formulas
      differ and what is refused), the ranks push gradients and ``step()`` pulls
      the weights into the parameters. Param groups may differ in ``lr`` and
      ``weight_decay`` (per-key multipliers on the servers), not in the other
      options, and none may change afterwards (a torch lr scheduler is
      followed with ``update_on_kvstore=False`` only).

    Keys are ``named_parameters``' names (the pairs ``model.named_parameters()``
    gives), else the ``param_names`` of an optimizer made from named
    parameters, else ``"param.<i>"``, ``i`` counting the optimizer's parameters
    over its param groups as its ``state_dict`` does. Each key is initialised
    with rank 0's value and pulled into every rank's parameter here, so all
    ranks start alike (frozen parameters and buffers: :func:`broadcast_parameters`).
    Frozen parameters (``requires_grad=False``) get no key; a parameter whose
    gradient is ``None`` at ``step()`` is skipped, as torch skips it (on
    dist_sync every rank must skip the same ones, or the others wait for its
    push). ``compression`` goes to ``kvstore.set_gradient_compression``
    (MXNet's ``{'type': '2bit', 'threshold': 0.5}``; ``Compression.none``
    is no compression, as Horovod's and BytePS's; their ``fp16`` is refused).
    Horovod's and BytePS's positional order works too: the second argument may
    be ``named_parameters`` (``model.named_parameters()``), the store then
    third (:mod:`labkv.torch._ported_spellings`).
    With ``backward_passes_per_step=N`` a gradient is pushed after its N-th
    backward pass (torch sums the passes); ``step()`` pushes what is left.

    ``sparse_params`` (a module: its ``nn.Embedding``/``nn.EmbeddingBag`` with
    ``sparse=True``; or the parameters) makes those parameters' keys row-sparse:
    each push carries the rows its sparse gradient touched (coalesced, on its
    device). With the servers stepping and several ranks (or momentum), each
    lookup of such an embedding pulls the rows of its ids first (a forward
    pre-hook, as MXNet pulls a batch's rows before the forward pass) and
    ``step()`` pulls none; with one rank and SGD, ``step()`` pulls the rows
    pushed (:attr:`sparse_pull`; the whole table on this rank: :meth:`pull_tables`
    or the module's ``state_dict()``; the rules, and what sparse gradients refuse,
    naming the option: :mod:`labkv.torch._sparse_grads`, :mod:`labkv.torch._lookups`).

    >>> import torch, labkv
    >>> w = torch.nn.Parameter(torch.ones(2))
    >>> opt = DistributedOptimizer(torch.optim.SGD([w], lr=0.5), labkv.create(), update_on_kvstore=True)
    >>> (w * w).sum().backward(); opt.step()
    >>> w
    Parameter containing:
    tensor([0., 0.], requires_grad=True)
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        kvstore: Any = None,
        named_parameters: Named | None = None,
        update_on_kvstore: bool | None = None,
        compression: dict[str, Any] | Compression | None = None,
        backward_passes_per_step: int = 1,
        sparse_params: SparseParams = None,
    ):
        if not isinstance(optimizer, torch.optim.Optimizer) or isinstance(
            optimizer, DistributedOptimizer
        ):
            raise TypeError(f"expected a torch.optim optimizer, got {type(optimizer).__name__}")
        signature = plain_signature(type(self).__init__)
        kvstore, named_parameters = optimizer_store(kvstore, named_parameters, signature)
        compression = compression_params(compression)
        passes = backward_passes_per_step
        if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
            raise ValueError(f"backward_passes_per_step must be an int >= 1, got {passes!r}")
        kind = store_kind(kvstore.type)
        params = [p for g in optimizer.param_groups for p in g["params"]]
        all_names = param_names(optimizer, named_parameters)
        trained = [(n, p) for n, p in zip(all_names, params, strict=True) if p.requires_grad]
        sparse = sparse_names(sparse_params, trained)
        update_on_kvstore = resolve_update_on_kvstore(update_on_kvstore, kvstore.type, bool(sparse))
        if not update_on_kvstore and kind in ASYNC_KINDS + SSP_KINDS:
            raise ValueError(
                f"update_on_kvstore=False averages the ranks' gradients through the store, which "
                f"a {kvstore.type!r} store does not do: it applies each push alone (with no "
                "optimizer, each push replaces the value); use update_on_kvstore=True"
            )
        check_sparse_options(sparse, compression, optimizer, trained)
        Resume.check(update_on_kvstore, kvstore)
        lookups = lookup_modules(sparse_params, sparse, trained, update_on_kvstore)
        lazy = server_is_lazy(optimizer)  # torch's sparse momentum moves every row it holds
        server = (
            server_optimizer(optimizer, kind, kvstore.num_workers, all_names, lazy_update=lazy)
            if update_on_kvstore
            else None
        )
        if compression is not None:
            GradientCompression.from_params(compression)  # refuses bad settings now
        if kvstore._optimizer is not None or kvstore._updater is not None:
            raise ValueError(
                "the store already runs an optimizer or updater: a DistributedOptimizer needs "
                "a store of its own (update_on_kvstore=False sums gradients with none)"
            )
        for name, p in trained:
            if _hooked_by(p) is not None:
                raise ValueError(
                    f"parameter {name!r} already pushes for another DistributedOptimizer: "
                    "call remove_hooks() on that one first"
                )
        names, tensors = [n for n, _ in trained], [p for _, p in trained]
        check_keys(kvstore, names, tensors, "a DistributedOptimizer over them", sparse)
        check_unclaimed(kvstore, names)
        # Nothing has changed so far; from here on the store and the parameters do.
        state = {"defaults": optimizer.defaults, "state": optimizer.state}
        self.__setstate__({**state, "param_groups": optimizer.param_groups})  # torch's own restore
        self._optimizer, self._kvstore = optimizer, kvstore
        self._update_on_kvstore = update_on_kvstore
        self._trained, self._passes_per_step, self._num_params = trained, passes, len(params)
        self._hyper = hyperparameters(optimizer) if update_on_kvstore else None
        self._passes: dict[str, int] = {}
        self._pushed: dict[str, torch.Tensor] = {}
        # Sparse keys: the rows each pushed since the last step, and whether a step
        # pulls those rows alone (see labkv.torch._sparse_grads), or each lookup its rows
        # (labkv.torch._lookups), or the step the whole table.
        self._sparse, self._rows = sparse, {}
        self._rows_only = not update_on_kvstore or (kvstore.num_workers == 1 and lazy)
        init_and_pull(kvstore, names, tensors, sparse)
        if compression is not None:
            kvstore.set_gradient_compression(compression)
        if server is not None:
            kvstore.set_optimizer(server)
        self._hooks = [p.register_post_accumulate_grad_hook(self._hook(n)) for n, p in trained]
        self._lookups = BatchPulls(kvstore, {} if self._rows_only else lookups)
        claim(kvstore, names)
        # a dist store's step loops: a replacement of this rank resumes there
        pull = functools.partial(pull_into, kvstore, names, tensors)
        self._resume = Resume(self, kvstore, pull) if hasattr(kvstore, "_steps") else None

    def _hook(self, name: str) -> Callable[[torch.Tensor], None]:
        return functools.partial(self._on_grad, name)

    # -- what it is ------------------------------------------------------------------
    @property
    def kvstore(self) -> Any:
        """The store the gradients go through."""
        return self._kvstore

    @property
    def update_on_kvstore(self) -> bool:
        """Whether the servers run the optimizer (else the torch optimizer steps on every rank)."""
        return self._update_on_kvstore

    @property
    def sparse_pull(self) -> dict[str, str]:
        """Per key of a sparse parameter (``sparse_params``), what is pulled:
        ``'batch'`` (each lookup of the embedding pulls its rows first, the step
        none: the bytes follow the rows a batch touches), ``'rows'`` (a step pulls
        the rows this rank pushed, all that changed: one rank, SGD without momentum,
        or torch stepping) or ``'table'`` (a step pulls the whole table: parameters
        given without their module, or tied to another one). Why:
        :mod:`labkv.torch._sparse_grads`, :mod:`labkv.torch._lookups`.

        >>> import torch, labkv
        >>> emb = torch.nn.Embedding(10, 2, sparse=True)
        >>> sgd = torch.optim.SGD(emb.parameters(), lr=0.1, momentum=0.9)
        >>> opt = DistributedOptimizer(sgd, labkv.create(), None, True, sparse_params=emb)
        >>> opt.sparse_pull
        {'param.0': 'batch'}
        >>> opt.remove_hooks()
        >>> sgd = torch.optim.SGD(emb.parameters(), lr=0.1)
        >>> DistributedOptimizer(sgd, labkv.create(), sparse_params=emb).sparse_pull
        {'param.0': 'rows'}
        """
        how = "rows" if self._rows_only else "table"
        batch = self._lookups.names
        return {n: "batch" if n in batch else how for n, _ in self._trained if n in self._sparse}

    @property
    def names(self) -> list[str]:
        """The keys of the trained parameters, in the param groups' order."""
        return [n for n, _ in self._trained]

    def __repr__(self) -> str:
        return (
            f"DistributedOptimizer({type(self._optimizer).__name__}, kvstore={self._kvstore.type!r}, "
            f"update_on_kvstore={self._update_on_kvstore}, keys={len(self._trained)})"
        )

    # -- pushing as gradients are ready, pulling in step -----------------------------------
    def _on_grad(self, name: str, p: torch.Tensor) -> None:
        if not self._passes:  # the first gradient since the last step: before anything is pushed
            self._check_unchanged()
        count = self._passes.get(name, 0) + 1
        if count > self._passes_per_step:
            raise RuntimeError(
                f"{name!r} has gradients from {count} backward passes since the last step(), "
                f"more than backward_passes_per_step={self._passes_per_step}: call step() "
                "after that many, or raise it"
            )
        self._passes[name] = count
        if count == self._passes_per_step:
            self._push(name, p)

    def _push(self, name: str, p: torch.Tensor) -> None:
        if name in self._sparse:
            value = grad_rows(p.grad, name)  # its rows, coalesced, on the gradient's device
            self._rows[name] = value.indices
        elif p.grad.layout != torch.strided:
            raise TypeError(
                f"{name!r} has a sparse gradient (nn.Embedding(sparse=True)?) but its key is "
                "dense: pass sparse_params=model (or the parameter) to the DistributedOptimizer"
            )
        else:
            value = store_array(p.grad, name)
        self._kvstore.push(name, value)
        self._pushed[name] = p
        self._lookups.pushed(name)
        if not self._update_on_kvstore:
            mark_gradients(self._kvstore, name)

    def _check_unchanged(self) -> None:
        if sum(len(g["params"]) for g in self.param_groups) != self._num_params:
            raise RuntimeError(
                "the optimizer's param groups changed after the DistributedOptimizer was made: "
                "make a new one (after remove_hooks() on this one)"
            )
        if self._hyper is not None:
            now = hyperparameters(self._optimizer)
            for i, (was, is_) in enumerate(zip(self._hyper, now, strict=True)):
                for option in was:
                    if was[option] != is_[option]:
                        raise RuntimeError(
                            f"param group {i}'s {option} changed from {was[option]!r} to "
                            f"{is_[option]!r} (a torch lr scheduler?): with update_on_kvstore=True "
                            "the servers keep the hyper-parameters they were given; use "
                            "update_on_kvstore=False to follow changes"
                        )

    def synchronize(self) -> None:
        """Push the gradients not pushed yet and wait for the results: the ranks'
        averaged gradients in ``p.grad`` (``update_on_kvstore=False``), or the
        servers' weights in the parameters. ``step()`` calls it."""
        self._check_unchanged()
        for name, p in self._trained:
            if p.grad is not None and name not in self._pushed:
                self._push(name, p)
        batch = self._lookups.names  # each lookup pulls its rows: nothing to pull here
        pushed = [(n, p) for n, p in self._pushed.items() if p.grad is not None and n not in batch]
        rows, self._rows = self._rows, {}
        self._pushed, self._passes = {}, {}
        by_rows = [(n, p) for n, p in pushed if n in rows and self._rows_only]
        whole = [(n, p) for n, p in pushed if not (n in rows and self._rows_only)]
        names = [n for n, _ in whole]
        sparse_names, sparse_params = [n for n, _ in by_rows], [p for _, p in by_rows]
        kv, rows_of = self._kvstore, [rows[n] for n, _ in by_rows]
        if self._update_on_kvstore:
            pull_into(kv, names, [p for _, p in whole])
            pull_rows_into(kv, sparse_names, sparse_params, rows_of, into_grad=False)
        else:
            divide = kv.num_workers
            pull_into(kv, names, [p.grad for _, p in whole], divide=divide)
            pull_rows_into(kv, sparse_names, sparse_params, rows_of, True, divide)
        self._lookups.stepped()

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Synchronise (see :meth:`synchronize`), then, with ``update_on_kvstore=False``,
        run the torch optimizer's step; ``closure`` (re-evaluating the loss) runs
        first and its loss is returned."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.synchronize()
        if not self._update_on_kvstore:
            self._optimizer.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The torch optimizer's ``zero_grad``; gradient accumulation starts again."""
        self._optimizer.zero_grad(set_to_none=set_to_none)
        self._passes, self._pushed, self._rows = {}, {}, {}
        self._lookups.stepped()

    def pull_tables(self) -> None:
        """Pull the whole of each table whose rows each lookup pulls (``sparse_pull``
        ``'batch'``) into its parameter: rows other ranks changed since this rank
        last looked them up are older here. ``state_dict()`` of a module holding
        such a table does it itself, so a checkpoint holds every row."""
        self._lookups.pull_tables()

    def remove_hooks(self) -> None:
        """Stop pushing gradients from the backward pass (the parameters' hooks go)
        and pulling rows before lookups (after pulling those tables whole), and
        free the keys for another DistributedOptimizer."""
        self._lookups.remove()
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        if self._resume is not None:
            self._resume.remove()
        claim(self._kvstore, self.names, claimed=False)

    # -- the torch optimizer's state and groups ------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The torch optimizer's ``state_dict`` (with ``update_on_kvstore=True`` the
        state lives on the servers: ``kvstore.save_optimizer_states``)."""
        return self._optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The torch optimizer's ``load_state_dict``."""
        self._optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Refused: add the group to the torch optimizer before wrapping it."""
        raise NotImplementedError(
            "a DistributedOptimizer keeps the parameters it was made with: add the group to "
            "the torch optimizer, then make a new DistributedOptimizer (after remove_hooks())"
        )
