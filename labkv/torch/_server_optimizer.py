"""The servers' optimizer of ``DistributedOptimizer(update_on_kvstore=True)``: a
``torch.optim.SGD`` or ``torch.optim.Adam`` translated into :mod:`labkv.optimizers`
with the same hyper-parameters, or refused, naming the option, where labkv has
no equivalent.

How the formulas compare (``g`` the gradient averaged over the ranks: the
servers' ``rescale_grad`` is ``1/num_workers`` on a synchronous store, where
they sum the ranks' pushes, and 1 where each push is applied alone):

- **SGD**: torch keeps ``buf = momentum*buf + (g + wd*w)`` and steps ``w -= lr*buf``;
  labkv's SGD (MXNet's) keeps ``mom = -lr*buf``: ``mom = momentum*mom - lr*wd*w - lr*g``,
  ``w += mom``. The same numbers, up to float32 rounding, while ``lr`` is constant.
- **SGD with nesterov**: labkv's NAG; the same numbers up to rounding with
  ``weight_decay=0``. With weight decay MXNet's kernel decays the *updated*
  weight in its momentum, torch the weight before the step: refused.
- **Adam**: the same moments and bias corrections (each key's own step count),
  but MXNet adds ``eps`` to ``sqrt(v)`` before the bias correction, torch after:
  labkv steps ``lr*sqrt(1-b2^t)/(1-b1^t) * m/(sqrt(v) + eps)``, torch
  ``lr/(1-b1^t) * m/(sqrt(v)/sqrt(1-b2^t) + eps)``. The same ``eps`` acts as
  ``eps/sqrt(1-b2^t)`` in torch's formula (31.6 ``eps`` at the first step with
  ``b2 = 0.999``, ``eps`` after a few thousand): steps differ by about
  ``30*eps/|g|`` relative at first, negligible where gradients are far above ``eps``.
- **Param groups** may differ in ``lr`` and ``weight_decay``: the servers' rate
  (decay) is the first group's nonzero one (0 where every group's is 0), and the
  keys of a group with another one get the quotient as a multiplier (MXNet's
  ``set_lr_mult`` and ``set_wd_mult``; a group's 0 is a multiplier of 0). The
  servers compute ``rate * multiplier`` in float64, within an ulp of the group's
  value, and round it to float32 as torch rounds the group's. Every other option
  must be the same in every group: the servers run one optimizer.

>>> import torch
>>> w, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
>>> server_optimizer(torch.optim.SGD([w], lr=0.1, momentum=0.9), "dist_sync", 2)
SGD(learning_rate=0.1, wd=0.0, rescale_grad=0.5, begin_num_update=0, momentum=0.9)
>>> groups = [{"params": [w]}, {"params": [b], "lr": 0.01, "weight_decay": 0.0}]
>>> sgd = torch.optim.SGD(groups, lr=0.1, weight_decay=1e-4)
>>> server = server_optimizer(sgd, "local", 1, ["w", "b"])
>>> server.lr, server.wd, sorted(server.lr_mult), sorted(server.wd_mult)
(0.1, 0.0001, ['b'], ['b'])
>>> [(server._get_lr(k), server._get_wd(k)) for k in ("w", "b")]  # what each key gets
[(0.1, 0.0001), (0.01, 0.0)]
>>> server_optimizer(torch.optim.Adam([w], amsgrad=True), "local", 1)
Traceback (most recent call last):
...
ValueError: torch.optim.Adam with amsgrad=True has no equivalent on the servers (update_on_kvstore=True): labkv's Adam has no AMSGrad; use update_on_kvstore=False, where the torch optimizer itself steps on every rank
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch

from .. import optimizers
from .._types import SYNC_KINDS

#: Per supported torch optimizer, the options that decide the servers' optimizer.
OPTIONS: dict[type, tuple[str, ...]] = {
    torch.optim.SGD: (
        "lr",
        "momentum",
        "dampening",
        "weight_decay",
        "nesterov",
        "maximize",
        "differentiable",
    ),
    torch.optim.Adam: (
        "lr",
        "betas",
        "eps",
        "weight_decay",
        "amsgrad",
        "maximize",
        "differentiable",
        "decoupled_weight_decay",
    ),
}
#: How torch would run its own step (kernels, CUDA graphs): no bearing on the servers'.
HOW = ("foreach", "fused", "capturable")
#: The options a param group may set for itself: per-key multipliers on the servers.
PER_KEY = ("lr", "weight_decay")


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return float(value)
    if isinstance(value, (tuple, list)):
        return tuple(_plain(v) for v in value)
    return value


def _supported(optimizer: torch.optim.Optimizer) -> type:
    cls = type(optimizer)
    if cls not in OPTIONS:
        raise ValueError(
            f"update_on_kvstore=True runs the optimizer on the servers, which labkv.torch can "
            f"do for torch.optim.SGD and torch.optim.Adam, not {cls.__module__}.{cls.__qualname__}; "
            "use update_on_kvstore=False, where the torch optimizer itself steps on every rank"
        )
    return cls


def hyperparameters(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Per param group, the options that decide the servers' optimizer (tensors as floats).

    >>> w = torch.nn.Parameter(torch.zeros(1))
    >>> hyperparameters(torch.optim.SGD([w], lr=torch.tensor(0.5)))[0]["lr"]
    0.5
    """
    names = OPTIONS[_supported(optimizer)]
    return [{k: _plain(group.get(k)) for k in names} for group in optimizer.param_groups]


def _refuse(cls: type, option: str, value: Any, why: str) -> None:
    raise ValueError(
        f"torch.optim.{cls.__name__} with {option}={value!r} has no equivalent on the servers "
        f"(update_on_kvstore=True): {why}; use update_on_kvstore=False, where the torch "
        "optimizer itself steps on every rank"
    )


def _check_other_options(optimizer: torch.optim.Optimizer, cls: type) -> None:
    """An option labkv.torch does not know (a later torch's) is refused unless it
    keeps the constructor's default."""
    defaults = inspect.signature(cls.__init__).parameters
    for option in optimizer.defaults:
        if option in OPTIONS[cls] or option in HOW:
            continue
        default = defaults[option].default if option in defaults else inspect.Parameter.empty
        for group in optimizer.param_groups:
            if default is inspect.Parameter.empty or _plain(group.get(option)) != _plain(default):
                _refuse(cls, option, group.get(option), "labkv.torch does not translate it")


def _same_in_every_group(groups: list[dict[str, Any]]) -> dict[str, Any]:
    first = groups[0]
    for i, group in enumerate(groups[1:], 1):
        for option, value in group.items():
            if option not in PER_KEY and value != first[option]:
                raise ValueError(
                    f"param groups 0 and {i} differ in {option} ({first[option]!r} and {value!r}): "
                    "the servers run one labkv (MXNet) optimizer per store, whose learning rate "
                    "and weight decay alone can be scaled per key, so with update_on_kvstore=True "
                    "param groups may differ in lr and weight_decay only; use "
                    "update_on_kvstore=False, where the torch optimizer steps and honours each "
                    "group"
                )
    return first


def _per_key(
    groups: list[dict[str, Any]], keys: list[list[str]], option: str
) -> tuple[float, dict[str, float]]:
    """The servers' ``option`` (the first group's nonzero value, else 0) and the
    multipliers that give each other group's keys their group's value."""
    values = [float(g[option]) for g in groups]
    base = next((v for v in values if v != 0), 0.0)
    mult = {}
    for value, names in zip(values, keys, strict=True):
        if value != base:  # so base != 0: a base of 0 means every group's value is 0
            mult.update(dict.fromkeys(names, value / base))
    return base, mult


def _group_keys(optimizer: torch.optim.Optimizer, names: Sequence[str] | None) -> list[list[str]]:
    """Per param group, the keys of its trained (not frozen) parameters."""
    count = sum(len(g["params"]) for g in optimizer.param_groups)
    names = [f"param.{i}" for i in range(count)] if names is None else list(names)
    if len(names) != count:
        raise ValueError(f"{len(names)} names for the optimizer's {count} parameters")
    keys, start = [], 0
    for group in optimizer.param_groups:
        params = group["params"]
        named = zip(names[start : start + len(params)], params, strict=True)
        keys.append([n for n, p in named if p.requires_grad])
        start += len(params)
    return keys


def server_optimizer(
    optimizer: torch.optim.Optimizer,
    kind: str,
    num_workers: int,
    names: Sequence[str] | None = None,
    lazy_update: bool = True,
) -> optimizers.Optimizer:
    """The labkv optimizer that runs ``optimizer``'s step on the servers of a
    ``kind`` store (``'local'``, ``'dist_sync'``...) shared by ``num_workers`` ranks.
    ``names`` are the keys of ``optimizer``'s parameters in its param groups'
    order (default ``"param.<i>"``); those of frozen parameters get no multiplier.
    ``lazy_update`` goes to labkv's SGD (row-sparse gradients: only their rows
    change; ``False``: every row, torch's sparse momentum, see :mod:`labkv.torch._sparse_grads`)."""
    cls = _supported(optimizer)
    _check_other_options(optimizer, cls)
    groups = hyperparameters(optimizer)
    h = _same_in_every_group(groups)
    if h["maximize"]:
        _refuse(cls, "maximize", True, "labkv's optimizers minimise")
    if h["differentiable"]:
        _refuse(cls, "differentiable", True, "the servers' step is not part of autograd's graph")
    keys = _group_keys(optimizer, names)
    lr, lr_mult = _per_key(groups, keys, "lr")
    wd, wd_mult = _per_key(groups, keys, "weight_decay")
    rescale = 1.0 / num_workers if kind in SYNC_KINDS else 1.0
    momentum = float(h.get("momentum", 0.0))
    if cls is torch.optim.SGD:
        if h["dampening"] != 0:
            _refuse(cls, "dampening", h["dampening"], "labkv's SGD (MXNet's) has no dampening")
        if h["nesterov"] and wd != 0:
            _refuse(
                cls,
                "nesterov",
                True,
                f"with weight_decay={wd!r}, labkv's NAG (MXNet 1.9.1's) decays the updated "
                "weight in its momentum, torch the weight before the step",
            )
        common = {"learning_rate": lr, "momentum": momentum, "wd": wd, "rescale_grad": rescale}
        server: optimizers.Optimizer = (
            optimizers.NAG(**common)  # no lazy update: every row, as torch's sparse Nesterov
            if h["nesterov"]
            else optimizers.SGD(lazy_update=lazy_update, **common)
        )
    else:
        if h["amsgrad"]:
            _refuse(cls, "amsgrad", True, "labkv's Adam has no AMSGrad")
        if h["decoupled_weight_decay"] and wd != 0:
            _refuse(
                cls,
                "decoupled_weight_decay",
                True,
                "labkv's Adam (MXNet's) adds the weight decay to the gradient, as an L2 term",
            )
        beta1, beta2 = (float(b) for b in h["betas"])
        server = optimizers.Adam(
            learning_rate=lr,
            beta1=beta1,
            beta2=beta2,
            epsilon=float(h["eps"]),
            wd=wd,
            rescale_grad=rescale,
        )
    server.set_lr_mult(lr_mult)
    server.set_wd_mult(wd_mult)
    return server
